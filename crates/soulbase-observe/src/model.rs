//! Begin, End and Denial records.

use serde::{Deserialize, Serialize};
use soulbase_errors::ErrorCode;
use soulbase_types::{CallId, Envelope, EnvelopeId, Surface, ToolId};

/// Written before a call executes. Its envelope id is the call's evidence reference.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
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
    /// The surface the call came through (`None` for calls made by linking the
    /// crates directly, and for records written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface: Option<Surface>,
}

/// Which agent-loop conversation made a call, at which model turn (1-based):
/// every call of one conversation names the same id, so its evidence can be read
/// back in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ConversationRef {
    /// The conversation's id (`conv_…`, answered to the caller in `soulbase.conversation_id`).
    pub id: String,
    /// The model turn whose tool calls this call is one of.
    pub iteration: u32,
}

/// The consent a call ran under: which token (never the token itself), whose
/// and until when — enough to answer "who approved this?" and to find calls made
/// with a token that was later revoked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
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

impl EndStatus {
    /// Every status, in order.
    pub const ALL: [EndStatus; 5] = [
        EndStatus::Ok,
        EndStatus::Error,
        EndStatus::Timeout,
        EndStatus::Cancelled,
        EndStatus::Aborted,
    ];

    /// Its name in records and in the stores' `status` column.
    pub fn as_str(self) -> &'static str {
        match self {
            EndStatus::Ok => "ok",
            EndStatus::Error => "error",
            EndStatus::Timeout => "timeout",
            EndStatus::Cancelled => "cancelled",
            EndStatus::Aborted => "aborted",
        }
    }

    /// The status named `name` ([`as_str`](Self::as_str)), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// A side effect the executor reports (e.g. a file written, a host contacted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SideEffectRecord {
    /// The kind: `fs.write`, `net.request`, `proc.spawn`, …
    pub kind: String,
    /// A redacted description of the target (path, host).
    pub target: String,
}

/// The kind of a request a running tool makes to its caller's client (MCP's
/// server-to-client requests).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ClientRequestKind {
    /// Asking the user for input (MCP `elicitation/create`).
    Elicitation,
    /// Asking the client's model for a completion (MCP `sampling/createMessage`).
    Sampling,
}

impl ClientRequestKind {
    /// Every kind, in order.
    pub const ALL: [ClientRequestKind; 2] =
        [ClientRequestKind::Elicitation, ClientRequestKind::Sampling];

    /// The name used in manifests and evidence (`elicitation`, `sampling`).
    pub fn as_str(self) -> &'static str {
        match self {
            ClientRequestKind::Elicitation => "elicitation",
            ClientRequestKind::Sampling => "sampling",
        }
    }
}

/// A request a tool made to its caller's client while it ran, as its End records
/// it: digests and sizes of what was asked and answered, never the text — what
/// the user typed or the client's model answered is an input of the call's
/// result that the evidence must account for without keeping it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct ClientRequestRecord {
    /// Elicitation or sampling.
    pub kind: ClientRequestKind,
    /// Digest of the request as the tool made it (canonical JSON).
    pub request_digest: String,
    /// How it ended: `accept`, `decline` or `cancel` (elicitation), `answered`
    /// (sampling), or `refused` / `failed` with [`error_code`](Self::error_code).
    pub outcome: String,
    /// Digest of the answer (canonical JSON), when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_digest: Option<String>,
    /// Bytes of the answer's canonical JSON.
    #[serde(default)]
    pub response_bytes: u64,
    /// The model the client says answered (sampling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Why a refused or failed request did not get an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
}

/// Resources a call consumed, settled against quotas.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[schemars(deny_unknown_fields)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
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
    /// What the tool asked its caller's client while it ran, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_requests: Vec<ClientRequestRecord>,
}

/// A call refused before execution (no Begin/End exists for it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct Denial {
    /// The call.
    pub call_id: CallId,
    /// The tool as requested (it may not exist).
    pub tool: String,
    /// Why.
    pub code: ErrorCode,
}

/// Either half of a call's evidence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EvidenceEvent {
    /// The call began.
    Begin(EvidenceBegin),
    /// The call ended.
    End(EvidenceEnd),
    /// The call was refused in preflight.
    Denied(Denial),
    /// A step of an agent-loop conversation (boxed: rare, and larger than the rest).
    Conversation(Box<ConversationEvent>),
}

impl EvidenceEvent {
    /// The call the event belongs to (a conversation's id for its own events).
    pub fn call_id(&self) -> &CallId {
        match self {
            EvidenceEvent::Begin(b) => &b.call_id,
            EvidenceEvent::End(e) => &e.call_id,
            EvidenceEvent::Denied(d) => &d.call_id,
            EvidenceEvent::Conversation(c) => &c.conversation_id,
        }
    }
}

/// The agent loop's own evidence (seed 003): a conversation's start, each model
/// turn, and its end. Stored beside the calls it made, keyed by the conversation
/// id in the call-id column, so replaying the id rebuilds the conversation; the
/// calls themselves are evidenced as any call (their Begins name the
/// conversation, [`ConversationRef`]). Digests only, never the messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ConversationEvent {
    /// The conversation (`conv_…`).
    pub conversation_id: CallId,
    /// Which step.
    #[serde(flatten)]
    pub step: ConversationStep,
}

/// A step of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum ConversationStep {
    /// Written before the first model turn.
    Start {
        /// The upstream model asked.
        model: String,
        /// Messages the caller sent.
        messages: u32,
        /// Digest of the caller's messages.
        messages_digest: String,
        /// The iteration bound in force.
        max_iterations: u32,
        /// Governed tools offered to the model.
        tools_offered: u32,
    },
    /// Written after a model turn and the tool calls it asked for were answered.
    Turn {
        /// The turn (1-based).
        iteration: u32,
        /// Digest of the model's response.
        response_digest: String,
        /// Token usage, when the upstream reported it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tokens: Option<TokenUsage>,
        /// The turn's tool calls, in the model's order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<TurnCall>,
    },
    /// Written before the conversation's answer (or refusal) is given.
    End {
        /// Why it ended.
        reason: ConversationEnd,
        /// Model turns made.
        iterations: u32,
        /// Tool calls the model asked for.
        tool_calls: u32,
        /// Tokens the turns reported, summed.
        tokens: u64,
        /// The stable code, for `upstream_error` and `refused`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_code: Option<ErrorCode>,
    },
}

/// Why a conversation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConversationEnd {
    /// The model answered without asking for tools.
    Answered,
    /// The iteration bound was reached with tool calls still pending.
    MaxIterations,
    /// The conversation used its token budget.
    Budget,
    /// The upstream model failed (unreachable, too slow, a malformed response).
    UpstreamError,
    /// A model turn was refused (a quota on model turns).
    Refused,
}

impl ConversationEnd {
    /// Its name in records and responses.
    pub fn as_str(self) -> &'static str {
        match self {
            ConversationEnd::Answered => "answered",
            ConversationEnd::MaxIterations => "max_iterations",
            ConversationEnd::Budget => "budget",
            ConversationEnd::UpstreamError => "upstream_error",
            ConversationEnd::Refused => "refused",
        }
    }
}

/// A model turn's token usage as the upstream reported it.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[schemars(deny_unknown_fields)]
pub struct TokenUsage {
    /// Prompt tokens.
    pub prompt: u64,
    /// Completion tokens.
    pub completion: u64,
    /// Both.
    pub total: u64,
}

/// One tool call of a model turn: the model's id for it, the tool as named, and
/// the call id its evidence is recorded under (a Begin/End or a Denial; none for
/// a call answered in place, such as reading a skill's instructions).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TurnCall {
    /// The model's id for the call (`tool_call_id`).
    pub id: String,
    /// The tool as the model named it (its id when it named one of the caller's tools).
    pub tool: String,
    /// The evidence's call id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_id: Option<CallId>,
    /// The stable code when the call was refused or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
}

/// An evidence event in its envelope (tenant, actor, origin, trace, time).
pub type EvidenceRecord = Envelope<EvidenceEvent>;
