//! Soulbase's evidence model and the seam evidence flows through.
//!
//! Every call that reaches execution produces exactly one [`EvidenceBegin`] before it
//! runs and exactly one [`EvidenceEnd`] after — on success, failure, timeout,
//! cancellation and panic alike (SB-08 invariant 4). Calls refused in preflight
//! produce only a [`Denial`]. Records carry digests and redacted summaries, never raw
//! arguments or outputs.
//!
//! [`EvidenceSink`] is the seam: the tools pipeline writes through it; durable stores
//! (SQLite, Postgres, with a spool) implement it in edge crates. This crate ships the
//! in-memory sinks used when linking without storage, in tests and in benchmarks.
//!
//! [`EvidenceStore`] is the durable side: idempotent batch writes keyed by envelope
//! id (typed, or as the records' JSON text, [`EncodedRecord`]), queries by call and by tenant/time/tool/status with keyset pagination.
//! [`replay`] rebuilds a call's key behaviour and result summary from its records;
//! [`replay_conversation`] an agent-loop conversation's turns and the calls they made.
//! [`MemoryStore`] is the in-process store. The spool, the batching writer and the
//! SQLite/Postgres stores are edge crates (`soulbase-evidence`, `soulbase-store`).
//!
//! [`AuditLog`] (module `audit`) keeps the audit of changes — registry, skill
//! states, the skill set, configuration reloads — as [`AuditRecord`]s: who, what,
//! when, and hashes of the thing before and after. [`MemoryAuditLog`] is the
//! in-process log; the SQL one is in `soulbase-store`.
//!
//! This crate does no IO. With the `fixtures` feature (tests and benchmarks only) it
//! also offers sample records (module `fixtures`).

mod audit;
mod conversation_replay;
mod digest;
mod encoded;
#[cfg(feature = "fixtures")]
pub mod fixtures;
mod json;
mod memory_store;
mod model;
mod quick_head;
mod replay;
mod sink;
mod store;
#[cfg(test)]
mod tests;

pub use audit::{
    AuditFilter, AuditKind, AuditLog, AuditRecord, MAX_AUDIT_PAGE, MAX_DETAIL_CHARS,
    MemoryAuditLog, state_hash, system_subject,
};
pub use conversation_replay::{
    CallReplay, ConversationReplay, EndReplay, TurnReplay, conversation_calls, is_conversation,
    replay_conversation,
};
pub use digest::{canonical_json, digest_bytes, digest_json};
pub use encoded::{EncodedRecord, RecordHead, write_record};
pub use memory_store::MemoryStore;
pub use model::{
    BudgetUsage, ClientRequestKind, ClientRequestRecord, ConsentUsed, ConversationEnd,
    ConversationEvent, ConversationRef, ConversationStep, Denial, EndStatus, EvidenceBegin,
    EvidenceEnd, EvidenceEvent, EvidenceRecord, SideEffectRecord, TokenUsage, TurnCall,
};
pub use replay::{Execution, Replay, ReplayOutcome, replay};
pub use sink::{ChannelSink, Durable, EvidenceSink, MemorySink};
pub use store::{
    CallEvidence, CallPage, CallSummary, DenialPage, DenialSummary, EvidenceQuery, EvidenceStore,
    MAX_PAGE, PageCursor, is_store_refusal, store_error, store_refusal, summarize,
    summarize_denial,
};
