//! Evidence that is never lost (R11, SB-08 invariant 4 / SLO-4).
//!
//! [`DurableSink`] is the [`EvidenceSink`](soulbase_observe::EvidenceSink) the
//! pipeline writes through in production. Every record goes first to a local,
//! append-only **spool** on disk, then a **drainer** ships it to an
//! [`EvidenceStore`](soulbase_observe::EvidenceStore) (SQLite or Postgres, in
//! `soulbase-store`) in batches:
//!
//! - **sync** durability (the default): `record` returns once the record is fsynced
//!   in the spool. Concurrent callers share one `fdatasync` (group commit), so a
//!   Begin is durable before its call executes at the cost of one batched fsync;
//!   under load a round gathers for [`BUSY_LINGER`] before it is written, a lone
//!   caller's never.
//!   `submit` queues a Begin without waiting (for calls that can change nothing):
//!   it is written in order — held for the next round without waking the writer,
//!   at most [`SUBMITTED_WAIT`] into its call, so a quick call is one `fdatasync`
//!   and one wake-up of the writer — and if it is refused its End is refused too.
//! - **async** durability: `record` returns once queued; the writer lets a round
//!   gather for [`ASYNC_LINGER`] (queued records wake nobody meanwhile) and commits
//!   it, so within a few milliseconds. A crash can lose that window — for those who
//!   accept it.
//! - a **store outage** loses nothing: records accumulate in the spool and drain
//!   when the store returns; writes are idempotent by envelope id (exactly once).
//! - a **crash** loses nothing acknowledged: on [`DurableSink::open`] the spool is
//!   recovered (torn tail cut), and every Begin without an End is closed `aborted`.
//! - **full spool** (over its cap, or the disk is full): new Begins are refused with
//!   `EVIDENCE.UNAVAILABLE`, so the pipeline refuses the call before execution; the
//!   End of every accepted Begin has room reserved and is never refused for space.
//!   Nothing on the way back needs new space (the checkpoint file is made when the
//!   spool is opened and rewritten in place), and calls are taken again as soon as
//!   the drain has freed room.
//! - a record the **store refuses** for good (a
//!   [`store_refusal`](soulbase_observe::store_refusal), not an outage) is isolated
//!   from its batch and kept in `quarantine.jsonl` in the spool directory, so it
//!   never blocks the drain; so is an intact spool frame that is not a record
//!   (frames left by an earlier process are decoded whole to find out; this
//!   process's own are records it serialized, and are not decoded again).
//!   Once the cause is fixed, those records are offered to the store again: by
//!   the running sink's drainer ([`DurableSink::retry_quarantine`], `POST
//!   /api/quarantine/retry`), or with the server stopped
//!   ([`quarantine::requeue`], `soulbase evidence quarantine retry`).
//! - the drainer passes records on as the text the spool holds
//!   ([`EvidenceStore::write_encoded`](soulbase_observe::EvidenceStore::write_encoded)):
//!   a store that keeps the text reads only the fields it indexes.
//! - a spool **deleted under a running sink** (its directory, segments or `LOCK`)
//!   loses nothing acknowledged: the writer puts the active segment back from its
//!   open file before acknowledging, and stops using the path for good if another
//!   process has locked it meanwhile.

mod drain;
mod frame;
pub mod quarantine;
mod recovery;
mod segment;
mod shared;
mod sink;
mod writer;

pub use drain::DrainOptions;
pub use recovery::{RecoveryReport, aborted_end};
pub use segment::Pos;
pub use sink::{Durability, DurableSink, SpoolOptions, SpoolStats, default_max_bytes};
pub use writer::{ASYNC_LINGER, BUSY_LINGER, SUBMITTED_WAIT};
