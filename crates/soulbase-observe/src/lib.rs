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
//! This crate does no IO.

mod digest;
mod model;
mod sink;

pub use digest::{digest_bytes, digest_json};
pub use model::{
    BudgetUsage, Denial, EndStatus, EvidenceBegin, EvidenceEnd, EvidenceEvent, EvidenceRecord,
    SideEffectRecord,
};
pub use sink::{ChannelSink, EvidenceSink, MemorySink};
