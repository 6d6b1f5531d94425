//! The evidence store seam: where durable evidence lands and how it is queried.
//!
//! Edge crates implement [`EvidenceStore`] on real databases (SQLite, Postgres); the
//! durable sink drains its spool into one. Writes are idempotent by envelope id, so a
//! batch that is re-sent after a crash or an outage lands exactly once.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::{ActorId, CallId, EnvelopeId, Origin, Surface, TenantId, ToolId, UnixMillis};

use crate::{EncodedRecord, EndStatus, EvidenceEvent, EvidenceRecord};

/// The public field marking a [`store_refusal`]; it survives gRPC (the evidence
/// role), unlike notes.
const REFUSED_BY: &str = "refused_by";

/// The error an [`EvidenceStore`] returns when it refuses the data itself (a value
/// the database cannot hold), as opposed to an outage: `SCHEMA.VALIDATION_FAILED`
/// marked `refused_by: store`. Only this marking makes the durable sink quarantine
/// a record; any other error is retried.
pub fn store_refusal(reason: impl Into<String>) -> SoulError {
    SoulError::new(
        ErrorCode::SchemaValidationFailed,
        "the evidence store refuses this record",
    )
    .with_field(REFUSED_BY, "store")
    .with_field("reason", reason.into())
}

/// Whether `e` is a [`store_refusal`].
pub fn is_store_refusal(e: &SoulError) -> bool {
    e.code() == ErrorCode::SchemaValidationFailed && e.field(REFUSED_BY) == Some("store")
}

/// The most calls one page of [`EvidenceStore::list`] returns.
pub const MAX_PAGE: u32 = 1_000;

/// Durable evidence: idempotent batch writes, queries by call and by tenant.
#[async_trait]
pub trait EvidenceStore: Send + Sync + 'static {
    /// Writes `records` atomically (all or none). A record whose envelope id is
    /// already stored is skipped, so re-sending a batch is harmless.
    ///
    /// An error means "try again later" (an outage), except a [`store_refusal`]:
    /// the store refuses the data itself and retrying the same batch can never
    /// succeed (the durable sink then isolates and quarantines the refused record
    /// instead of retrying forever).
    async fn write_batch(&self, records: &[EvidenceRecord]) -> Result<(), SoulError>;

    /// [`write_batch`](Self::write_batch) for records given as their serialized
    /// text, as the durable sink's spool holds them: a store that keeps the text
    /// takes it as it is instead of decoding and re-encoding every record (most of
    /// the drain's work). Text that is not a record is a [`store_refusal`]. The
    /// default decodes the batch and calls `write_batch`.
    async fn write_encoded(&self, records: &[EncodedRecord]) -> Result<(), SoulError> {
        let decoded = records
            .iter()
            .map(EncodedRecord::decode)
            .collect::<Result<Vec<_>, _>>()?;
        self.write_batch(&decoded).await
    }

    /// Every record of one call (Begin, End, Denial), oldest first; empty when unknown.
    /// With `tenant`, only that tenant's records (tenant isolation for remote callers).
    async fn call(
        &self,
        tenant: Option<&TenantId>,
        call_id: &CallId,
    ) -> Result<CallEvidence, SoulError>;

    /// Calls that reached execution, newest first, filtered and paginated.
    async fn list(&self, query: &EvidenceQuery) -> Result<CallPage, SoulError>;

    /// Calls refused before execution (their Denial records), newest first,
    /// filtered (tool, actor, code, time; never status) and paginated like
    /// [`list`](Self::list).
    async fn list_denials(&self, query: &EvidenceQuery) -> Result<DenialPage, SoulError>;

    /// Deletes evidence recorded before `cutoff` (retention); returns how many records
    /// went (stores that drop whole partitions may report an estimate).
    async fn purge_before(&self, cutoff: UnixMillis) -> Result<u64, SoulError>;
}

/// The records of one call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CallEvidence {
    /// Oldest first; within one millisecond an End comes after the Begin.
    pub records: Vec<EvidenceRecord>,
}

impl CallEvidence {
    /// Whether nothing is recorded for the call.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// The Begin records (exactly one for a call that reached execution).
    pub fn begins(&self) -> impl Iterator<Item = &EvidenceRecord> {
        self.records
            .iter()
            .filter(|r| matches!(r.payload, EvidenceEvent::Begin(_)))
    }

    /// The End records (exactly one for a call that reached execution).
    pub fn ends(&self) -> impl Iterator<Item = &EvidenceRecord> {
        self.records
            .iter()
            .filter(|r| matches!(r.payload, EvidenceEvent::End(_)))
    }

    /// The Denial records (a call refused before execution).
    pub fn denials(&self) -> impl Iterator<Item = &EvidenceRecord> {
        self.records
            .iter()
            .filter(|r| matches!(r.payload, EvidenceEvent::Denied(_)))
    }
}

/// Which calls [`EvidenceStore::list`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvidenceQuery {
    /// The tenant (required: evidence is always read per tenant).
    pub tenant: TenantId,
    /// Calls that began at or after this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<UnixMillis>,
    /// Calls that began strictly before this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<UnixMillis>,
    /// Only this tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolId>,
    /// Only calls that ended so (`None`: any, including still open).
    /// [`EvidenceStore::list_denials`] refuses it: a denial never ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EndStatus>,
    /// Only calls made by this actor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actor: Option<ActorId>,
    /// Only calls that ended (or were refused) with this error code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<ErrorCode>,
    /// Page size, 1..=[`MAX_PAGE`].
    pub limit: u32,
    /// Continue after this cursor (from [`CallPage::next`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<PageCursor>,
}

impl EvidenceQuery {
    /// The newest `limit` calls of `tenant`.
    pub fn tenant(tenant: TenantId, limit: u32) -> Self {
        Self {
            tenant,
            from: None,
            to: None,
            tool: None,
            status: None,
            actor: None,
            code: None,
            limit,
            after: None,
        }
    }

    /// [`validate`](Self::validate), for a listing of denials: a status filter
    /// is refused (a denied call never ran, so it has none).
    pub fn validate_denials(&self) -> Result<(), SoulError> {
        self.validate()?;
        if self.status.is_some() {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "a denial has no end status: leave status out when listing denials",
            )
            .with_field("field", "status"));
        }
        Ok(())
    }

    /// The code filter as its stable text (what the stores compare).
    pub fn code_text(&self) -> Option<&'static str> {
        self.code.map(ErrorCode::as_str)
    }

    /// Checks the limit and the range; errors name the field.
    pub fn validate(&self) -> Result<(), SoulError> {
        if self.limit == 0 || self.limit > MAX_PAGE {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                format!("limit must be between 1 and {MAX_PAGE}"),
            )
            .with_field("field", "limit"));
        }
        if let (Some(from), Some(to)) = (self.from, self.to)
            && from.0 > to.0
        {
            return Err(SoulError::new(
                ErrorCode::SchemaValidationFailed,
                "from must not be after to",
            )
            .with_field("field", "from"));
        }
        Ok(())
    }
}

/// Where a page ended: the Begin time and envelope id of its last call.
/// Its text form (`<millis>.<envelope id>`) is what clients pass back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "String", into = "String")]
#[schemars(with = "String")]
pub struct PageCursor {
    /// Begin time of the last call returned.
    pub at: UnixMillis,
    /// Begin envelope id of the last call returned (tie-breaker).
    pub id: EnvelopeId,
}

impl PageCursor {
    /// Parses the text form; a malformed cursor names the field `after`.
    pub fn parse(s: &str) -> Result<Self, SoulError> {
        let bad = || {
            SoulError::new(ErrorCode::SchemaValidationFailed, "malformed page cursor")
                .with_field("field", "after")
        };
        let (at, id) = s.split_once('.').ok_or_else(bad)?;
        let at = at.parse::<i64>().map_err(|_| bad())?;
        let id = EnvelopeId::new(id).map_err(|_| bad())?;
        Ok(Self {
            at: UnixMillis(at),
            id,
        })
    }
}

impl std::fmt::Display for PageCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.at.0, self.id)
    }
}

impl TryFrom<String> for PageCursor {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        PageCursor::parse(&s).map_err(|e| e.message().to_owned())
    }
}

impl From<PageCursor> for String {
    fn from(c: PageCursor) -> String {
        c.to_string()
    }
}

/// One call in a listing: its Begin joined with its End (if any).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct CallSummary {
    /// The call.
    pub call_id: CallId,
    /// The Begin envelope (the call's evidence reference).
    pub begin_id: EnvelopeId,
    /// The tenant.
    pub tenant: TenantId,
    /// The actor.
    pub actor: ActorId,
    /// Where the call came from.
    pub origin: Origin,
    /// The surface it came through, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surface: Option<Surface>,
    /// The tool.
    pub tool_id: ToolId,
    /// The version executed.
    pub tool_version: String,
    /// When it began.
    pub began_at: UnixMillis,
    /// When it ended (`None`: still open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<UnixMillis>,
    /// How it ended (`None`: still open).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EndStatus>,
    /// The error code when it did not end ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<ErrorCode>,
    /// Execution time in microseconds (when ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_us: Option<u64>,
}

/// One page of calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct CallPage {
    /// Newest first.
    pub calls: Vec<CallSummary>,
    /// Pass as `after` for the next page; `None` on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<PageCursor>,
}

/// One call refused before execution: its Denial record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct DenialSummary {
    /// The call.
    pub call_id: CallId,
    /// The Denial envelope (the page cursor's tie-breaker).
    pub denial_id: EnvelopeId,
    /// The tenant.
    pub tenant: TenantId,
    /// The actor.
    pub actor: ActorId,
    /// Where the call came from.
    pub origin: Origin,
    /// The tool as requested (it may not exist, or not be a tool id at all).
    pub tool: String,
    /// When it was refused.
    pub at: UnixMillis,
    /// Why.
    pub code: ErrorCode,
}

/// One page of denials.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct DenialPage {
    /// Newest first.
    pub denials: Vec<DenialSummary>,
    /// Pass as `after` for the next page; `None` on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<PageCursor>,
}

/// The summary of a Denial record; `None` when `record` is not one.
pub fn summarize_denial(record: &EvidenceRecord) -> Option<DenialSummary> {
    let EvidenceEvent::Denied(d) = &record.payload else {
        return None;
    };
    Some(DenialSummary {
        call_id: d.call_id.clone(),
        denial_id: record.id.clone(),
        tenant: record.tenant.clone(),
        actor: record.actor.clone(),
        origin: record.origin,
        tool: d.tool.clone(),
        at: record.at,
        code: d.code,
    })
}

impl DenialPage {
    /// A page of `denials` (at most `limit` are kept; one more means there is a
    /// next page).
    pub fn of(mut denials: Vec<DenialSummary>, limit: u32) -> Self {
        let more = denials.len() > limit as usize;
        denials.truncate(limit as usize);
        let next = if more {
            denials.last().map(|d| PageCursor {
                at: d.at,
                id: d.denial_id.clone(),
            })
        } else {
            None
        };
        DenialPage { denials, next }
    }
}

/// Builds a summary from a Begin record and its End record, if any.
/// `None` when `begin` is not a Begin.
pub fn summarize(begin: &EvidenceRecord, end: Option<&EvidenceRecord>) -> Option<CallSummary> {
    let EvidenceEvent::Begin(b) = &begin.payload else {
        return None;
    };
    let end_event = end.and_then(|e| match &e.payload {
        EvidenceEvent::End(x) => Some((e.at, x)),
        _ => None,
    });
    Some(CallSummary {
        call_id: b.call_id.clone(),
        begin_id: begin.id.clone(),
        tenant: begin.tenant.clone(),
        actor: begin.actor.clone(),
        origin: begin.origin,
        surface: b.surface,
        tool_id: b.tool_id.clone(),
        tool_version: b.tool_version.clone(),
        began_at: begin.at,
        ended_at: end_event.map(|(at, _)| at),
        status: end_event.map(|(_, e)| e.status),
        error_code: end_event.and_then(|(_, e)| e.error_code),
        duration_us: end_event.map(|(_, e)| e.duration_us),
    })
}

/// A storage failure as the stable code: the store is unavailable (retry later).
pub fn store_error(what: &str, cause: impl std::fmt::Display) -> SoulError {
    SoulError::new(ErrorCode::EvidenceUnavailable, "the evidence store failed")
        .with_note(format!("{what}: {cause}"))
}
