//! Begin, End and Denial records.

use serde::{Deserialize, Serialize};
use soulbase_errors::ErrorCode;
use soulbase_types::{CallId, Envelope, EnvelopeId, ToolId};

/// Written before a call executes. Its envelope id is the call's evidence reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceBegin {
    /// The call.
    pub call_id: CallId,
    /// The tool.
    pub tool_id: ToolId,
    /// The exact registered version executed.
    pub tool_version: String,
    /// Digest of the registered manifest.
    pub manifest_digest: String,
    /// Hash of the capability profile the call ran under.
    pub profile_hash: String,
    /// Hash of the authorization policy that allowed it.
    pub policy_hash: String,
    /// Hash of the configuration snapshot in force.
    pub config_hash: String,
    /// Digest of the arguments (never the arguments themselves).
    pub args_digest: String,
    /// The idempotency key, when the call carried one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The skill that made the call, for cross-skill audit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calling_skill: Option<String>,
    /// The consent the call ran under, for a tool that requires it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consent: Option<ConsentUsed>,
    /// The agent-loop conversation that made the call, and the model turn (boxed:
    /// most calls are made by no conversation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation: Option<Box<ConversationRef>>,
}

/// Which agent-loop conversation made a call, at which model turn (1-based):
/// every call of one conversation names the same id, so its evidence can be read
/// back in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationRef {
    /// The conversation's id (`conv_…`, answered to the caller in `soulbase.conversation_id`).
    pub id: String,
    /// The model turn whose tool calls this call is one of.
    pub iteration: u32,
}

/// The consent a call ran under: which token (never the token itself), whose
/// and until when — enough to answer "who approved this?" and to find calls made
/// with a token that was later revoked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsentUsed {
    /// The token's id (`None` for tokens minted without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_id: Option<String>,
    /// Digest of the whole token.
    pub token_digest: String,
    /// When the consent was given (Unix ms), when the token says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<i64>,
    /// When it expires (Unix ms).
    pub expires_at: i64,
    /// Whether it was bound to these exact arguments.
    pub args_bound: bool,
}

/// How a call that began has ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndStatus {
    /// Completed and its output passed the output schema.
    Ok,
    /// Failed (see the error code).
    Error,
    /// Did not finish within its timeout.
    Timeout,
    /// The caller went away while it ran.
    Cancelled,
    /// Closed on recovery: the process died while it ran.
    Aborted,
}

/// A side effect the executor reports (e.g. a file written, a host contacted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideEffectRecord {
    /// The kind: `fs.write`, `net.request`, `proc.spawn`, …
    pub kind: String,
    /// A redacted description of the target (path, host).
    pub target: String,
}

/// Resources a call consumed, settled against quotas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetUsage {
    /// Calls (1 for an executed call).
    pub calls: u64,
    /// Bytes of arguments.
    pub bytes_in: u64,
    /// Bytes of output.
    pub bytes_out: u64,
    /// CPU milliseconds, when the executor can measure them.
    pub cpu_ms: u64,
}

/// Written after a call that began, whatever happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceEnd {
    /// The call.
    pub call_id: CallId,
    /// The Begin envelope this End closes.
    pub begin_id: EnvelopeId,
    /// How it ended.
    pub status: EndStatus,
    /// The stable error code when it did not end `Ok`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// Digest of the raw output, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_digest: Option<String>,
    /// Side effects reported by the executor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub side_effects: Vec<SideEffectRecord>,
    /// What it consumed.
    pub usage: BudgetUsage,
    /// Wall-clock duration of execution in microseconds.
    pub duration_us: u64,
}

/// A call refused before execution (no Begin/End exists for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// The call.
    pub call_id: CallId,
    /// The tool as requested (it may not exist).
    pub tool: String,
    /// Why.
    pub code: ErrorCode,
}

/// Either half of a call's evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EvidenceEvent {
    /// The call began.
    Begin(EvidenceBegin),
    /// The call ended.
    End(EvidenceEnd),
    /// The call was refused in preflight.
    Denied(Denial),
}

/// An evidence event in its envelope (tenant, actor, origin, trace, time).
pub type EvidenceRecord = Envelope<EvidenceEvent>;
