//! What a call carries in, and what it gets back.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use soulbase_errors::{ErrorCode, PublicError, SoulError};
use soulbase_qos::BudgetSnapshot;
use soulbase_sandbox::Reporter;
use soulbase_types::{CallId, EnvelopeId, Origin, Subject, ToolId, TraceContext};

use crate::manifest::Obligation;

/// One tool call (R4): who, from where, which tool, with what.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The call id (a model's `tool_call.id`, or minted).
    pub call_id: CallId,
    /// The authenticated caller.
    pub subject: Subject,
    /// Where the call came from.
    pub origin: Origin,
    /// The tool.
    pub tool: ToolId,
    /// The arguments, checked against the input schema.
    pub args: Value,
    /// Required for `idempotency: keyed` tools; replays return the stored result.
    pub idempotency_key: Option<String>,
    /// A consent token, for tools that require consent.
    pub consent: Option<String>,
    /// The caller's trace context.
    pub trace: Option<TraceContext>,
    /// The skill making the call, for cross-skill checks and audit.
    pub calling_skill: Option<String>,
    /// The agent-loop conversation making the call, and its model turn
    /// (recorded in the Begin).
    pub conversation: Option<soulbase_observe::ConversationRef>,
    /// The surface the call came through (recorded in the Begin; `None` for a
    /// call made by linking the crates directly).
    pub surface: Option<soulbase_types::Surface>,
    /// Where the tool's progress and log messages go while it runs (given to the
    /// executor; [`Reporter::none`] unless the caller's surface delivers them).
    pub reporter: Reporter,
}

impl ToolCall {
    /// An API call with a fresh call id and nothing optional set.
    pub fn new(subject: Subject, tool: ToolId, args: Value) -> Self {
        Self {
            call_id: CallId::generate(),
            subject,
            origin: Origin::Api,
            tool,
            args,
            idempotency_key: None,
            consent: None,
            trace: None,
            calling_skill: None,
            conversation: None,
            surface: None,
            reporter: Reporter::none(),
        }
    }

    /// Sets the call id.
    pub fn with_call_id(mut self, id: CallId) -> Self {
        self.call_id = id;
        self
    }

    /// Sets the origin.
    pub fn with_origin(mut self, origin: Origin) -> Self {
        self.origin = origin;
        self
    }

    /// Sets the idempotency key.
    pub fn with_idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Sets the consent token.
    pub fn with_consent(mut self, token: impl Into<String>) -> Self {
        self.consent = Some(token.into());
        self
    }

    /// Sets where the tool's progress and log messages go.
    pub fn with_reporter(mut self, reporter: Reporter) -> Self {
        self.reporter = reporter;
        self
    }

    /// Sets the trace context.
    pub fn with_trace(mut self, trace: TraceContext) -> Self {
        self.trace = Some(trace);
        self
    }
}

/// The outcome class of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CallStatus {
    /// Executed and returned a conforming output.
    Ok,
    /// Refused before execution, for any reason (unknown tool, bad input,
    /// authorization, consent, quota or its backend, sandbox guard, evidence that
    /// cannot be recorded): the tool did not run, and the call's evidence is a
    /// denial only, no Begin (`evidence_ref` is empty).
    Denied,
    /// The tool ran (its Begin is `evidence_ref`) and the call failed: execution
    /// failure, timeout, cancellation, an output that does not conform — or its End
    /// is not durable yet (`EVIDENCE.UNAVAILABLE` with `executed: true`).
    Error,
}

/// Whether `code` means "governance said no" rather than "something failed", for
/// the surfaces that see a refusal's code without a pipeline result: the gRPC
/// client (failures without an outcome trailer) and the metrics. The pipeline's
/// own results are `Denied` exactly when the tool did not run (see [`CallStatus`]).
pub fn is_denial(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::AuthUnauthenticated
            | ErrorCode::AuthForbidden
            | ErrorCode::PolicyDenyTool
            | ErrorCode::ConsentRequired
            | ErrorCode::SubscriptionRequired
            | ErrorCode::SkillNotImported
            | ErrorCode::ToolDisabled
            | ErrorCode::QuotaBudgetExceeded
            | ErrorCode::QuotaRateLimited
            | ErrorCode::QuotaUnavailable
            | ErrorCode::SandboxCapabilityBlocked
    )
}

/// The normalized result of a call (R4): `{status, error_code, output, evidence_ref}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallResult {
    /// The call.
    pub call_id: CallId,
    /// Ok, denied or error.
    pub status: CallStatus,
    /// The stable code, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// The public view of the error, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<PublicError>,
    /// The output (after obligations), when ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// The Begin envelope of the call's evidence, when it reached execution.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence_ref: Option<EnvelopeId>,
    /// True when this is a stored result returned for a repeated idempotency key.
    #[serde(default)]
    pub replayed: bool,
    /// What the caller should know about a call that succeeded: the tool's
    /// deprecation notes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What the call was charged — its End's usage, settled into budgets — when
    /// it executed here; `None` for a refusal and for a stored result answered
    /// again (a replay charges nothing). Not serialized: metrics read it
    /// (`CallObserver::usage_charged`).
    #[serde(skip)]
    pub usage: Option<soulbase_observe::BudgetUsage>,
}

impl CallResult {
    pub(crate) fn ok(call_id: CallId, output: Value, evidence_ref: Option<EnvelopeId>) -> Self {
        Self {
            call_id,
            status: CallStatus::Ok,
            error_code: None,
            error: None,
            output: Some(output),
            evidence_ref,
            replayed: false,
            warnings: Vec::new(),
            usage: None,
        }
    }

    /// A call that failed: `Error` when it ran (its Begin is `evidence_ref`),
    /// `Denied` when it was refused before execution (no Begin), whatever the code.
    pub(crate) fn failed(
        call_id: CallId,
        err: &SoulError,
        evidence_ref: Option<EnvelopeId>,
    ) -> Self {
        let public = err.public();
        Self {
            call_id: call_id.clone(),
            status: if evidence_ref.is_some() {
                CallStatus::Error
            } else {
                CallStatus::Denied
            },
            error_code: Some(err.code()),
            error: Some(PublicError {
                correlation_id: public
                    .correlation_id
                    .clone()
                    .or_else(|| Some(call_id.to_string())),
                ..public
            }),
            output: None,
            evidence_ref,
            replayed: false,
            warnings: Vec::new(),
            usage: None,
        }
    }

    /// The result of a call refused before execution with `err` (status
    /// `denied`, no evidence reference). Only the pipeline decides refusals; this is
    /// for answering one it decided (e.g. a stored replay) in the same shape.
    pub fn refused(call_id: CallId, err: &SoulError) -> Self {
        Self::failed(call_id, err, None)
    }

    /// The error as a [`SoulError`] (public view only), when not ok.
    pub fn error(&self) -> Option<SoulError> {
        self.error.clone().map(SoulError::from_public)
    }

    /// Whether the call succeeded.
    pub fn is_ok(&self) -> bool {
        self.status == CallStatus::Ok
    }
}

/// What a dry run found: the call would be allowed, under this profile and budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreflightReport {
    /// The tool.
    pub tool: ToolId,
    /// The registered version that would run.
    pub version: String,
    /// Hash of the profile the call would run under.
    pub profile_hash: String,
    /// Hash of the policy that allowed it.
    pub policy_hash: String,
    /// The budget snapshot (nothing consumed).
    pub budget: BudgetSnapshot,
    /// Whether the tool requires consent (and the call's token was valid).
    pub consent_required: bool,
    /// Obligations that will be applied to the output.
    pub obligations: Vec<Obligation>,
}
