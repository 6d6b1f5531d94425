//! State shared by the sink (callers), the writer thread and the drainer task.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use foldhash::HashSet;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_types::EnvelopeId;
use tokio::sync::{Notify, oneshot};

use crate::segment::Pos;

/// What the writer needs to know about a record besides its bytes.
#[derive(Debug)]
pub enum Kind {
    /// A Begin: pins its segment until its End is written.
    Begin(EnvelopeId),
    /// An End, closing the Begin with this id.
    End(EnvelopeId),
    /// A denial.
    Other,
    /// No record: acknowledge once everything queued before is durable.
    Flush,
}

/// One append for the writer.
pub struct Request {
    /// The framed record (empty for a flush).
    pub bytes: Vec<u8>,
    /// What it is.
    pub kind: Kind,
    /// Answered once the bytes are durable (sync mode and flushes).
    pub ack: Option<oneshot::Sender<Result<(), SoulError>>>,
    /// A Begin accepted by `submit`: its End may be queued before it is durable, so
    /// if it is refused, its End must be refused too (the writer remembers it).
    pub submitted: bool,
    /// Where a record stands in the order records were accepted
    /// ([`Shared::next_seq`]); a round writes its records in this order, so a held
    /// Begin never goes ahead of a record accepted before it. Zero for a flush.
    pub seq: u64,
}

impl Request {
    /// A flush nobody waits on: has the writer make a round (of what is queued and
    /// held), as a probe or a wake-up.
    pub fn flush() -> Self {
        Request {
            bytes: Vec::new(),
            kind: Kind::Flush,
            ack: None,
            submitted: false,
            seq: 0,
        }
    }
}

/// Space accounting against the spool cap.
#[derive(Default)]
pub struct Accounting {
    /// Bytes in live segments plus bytes accepted but not yet written.
    pub disk: u64,
    /// Room held back for the Ends of open Begins.
    pub reserved: u64,
    /// Begins accepted whose End has not been accepted yet.
    pub open: HashSet<EnvelopeId>,
}

/// Shared state.
pub struct Shared {
    /// The spool directory.
    pub dir: PathBuf,
    /// The cap on spool bytes.
    pub max_bytes: u64,
    /// Room held for each open Begin's End.
    pub end_reserve: u64,
    /// Space accounting.
    pub acct: Mutex<Accounting>,
    /// Everything before this is durable in the spool.
    pub committed: Mutex<Pos>,
    /// Where this process's writer began appending: every frame from here on is a
    /// record this process serialized, so the drain takes it without decoding it
    /// again ([`EncodedRecord::known`](soulbase_observe::EncodedRecord::known));
    /// frames before it (left by an earlier process) are checked whole.
    pub own_from: Pos,
    /// Submitted Begins (sync durability) not yet taken by a round. They are not
    /// sent to the writer, so queueing one wakes nobody. The next round takes them
    /// all and writes each in the order records were accepted ([`Request::seq`]):
    /// the round of the call's End at the latest (the Begin is held before its End
    /// is sent), or the flush its answer asks for once it has waited
    /// [`SUBMITTED_WAIT`](crate::SUBMITTED_WAIT) (see `sink::held_durable`).
    /// Bounded by the open calls the spool admits.
    pub held: Mutex<Vec<Request>>,
    /// The next record's [`Request::seq`]. A held Begin takes its number with the
    /// `held` lock, which the writer holds while it empties the channel and takes
    /// what is held: whatever was accepted before a Begin the round takes is in
    /// the round too.
    pub next_seq: AtomicU64,
    /// Signalled by the writer after each commit.
    pub committed_notify: Notify,
    /// Everything before this is in the store.
    pub drained: Mutex<Pos>,
    /// Signalled by the drainer after each batch.
    pub drained_notify: Notify,
    /// Someone waits for the store to catch up ([`crate::DurableSink::wait_drained`]):
    /// the drainer stops lingering and writes what it has at once.
    pub drain_now: Notify,
    /// Since when the store has been behind the spool (records durable in the
    /// spool and not yet in the store), `None` while it is caught up: the drain
    /// lag ([`Shared::drain_lag`]) is measured from it.
    pub behind_since: Mutex<Option<std::time::Instant>>,
    /// The segment the writer appends to.
    pub active: AtomicU64,
    /// The oldest segment holding a Begin whose End is not yet written (`u64::MAX`: none).
    pub min_pin: AtomicU64,
    /// The last append failed (disk full, IO error): new Begins are refused until a
    /// round succeeds and there is room again (see `writer::room_again`).
    pub broken: AtomicBool,
    /// The spool directory was deleted and another process has taken its path since:
    /// this sink no longer writes, reads, checkpoints or deletes anything there.
    pub fenced: AtomicBool,
    /// Device and inode of the `LOCK` file this sink holds (updated when the writer
    /// locks a recreated directory): the directory is this sink's while its `LOCK`
    /// is that file.
    pub lock_id: Mutex<(u64, u64)>,
    /// Bytes of the disk reserve file, recreated with a deleted directory. It also
    /// bounds the calls open at once: a Begin is admitted only while the reserve
    /// covers the End of every open call (`end_reserve` each), so that when the
    /// disk fills, releasing it always makes room for all of their Ends.
    pub disk_reserve: u64,
    /// The disk reserve file is there at its full size (see [`Shared::make_reserve`]):
    /// Begins are admitted only then.
    pub reserve_held: AtomicBool,
    /// The last store error, cleared by a successful batch.
    pub store_error: Mutex<Option<String>>,
    /// Records written to the store by this process.
    pub records_drained: AtomicU64,
    /// Records the store refused for good, kept in the quarantine file instead.
    pub records_quarantined: AtomicU64,
    /// Rounds the writer made durable (one `write` and one `fdatasync` each).
    pub rounds: AtomicU64,
    /// Data bytes of the segments sealed by this process, by id: a sealed segment
    /// keeps its zeros after the data, and the drainer takes only the data off the
    /// accounting when it retires it.
    pub sealed: Mutex<HashMap<u64, u64>>,
    /// The spares the prep helper may zero-fill as a next segment: those whose
    /// names are durable, so a crash cannot turn a half-zeroed spare back into the
    /// drained segment it was. Listed at start-up after the directory is synced,
    /// and extended by the drainer after each directory sync that follows its
    /// renames; spares left by anyone else are never taken (they are listed at the
    /// next start).
    pub spares: Mutex<Vec<PathBuf>>,
    /// Set when the sink is shutting down.
    pub stopping: AtomicBool,
    /// Wakes the drainer for shutdown.
    pub stop_notify: Notify,
    /// The [`Hold`]s alive, and whether new ones are refused (the writer is closing).
    pub holds: Mutex<Holds>,
    /// Signalled when the last [`Hold`] is dropped.
    pub released: Condvar,
    /// A probe (an empty round asking the writer whether there is room again after
    /// a failed append) is queued: refused Begins send at most one at a time.
    pub probe_queued: AtomicBool,
    /// The drainer freed space (retired drained segments) while appends were
    /// failing: the writer's next round checks for room at once instead of waiting
    /// out the interval between checks, so the refusal clears as soon as the space
    /// exists (see `drain::persist`).
    pub room_freed: AtomicBool,
    /// Test fault: this many appends of records fail as if the disk were full.
    #[cfg(test)]
    pub fail_appends: std::sync::atomic::AtomicU32,
    /// Test fault: the disk reserve cannot be created (the disk is still full).
    #[cfg(test)]
    pub fail_reserve: AtomicBool,
    /// Test hook: the writer holds the round it has started until this is cleared,
    /// so that what is queued meanwhile joins it.
    #[cfg(test)]
    pub hold_rounds: AtomicBool,
}

/// The count behind [`Shared::holds`].
#[derive(Debug, Default)]
pub struct Holds {
    /// Holds alive.
    pub count: usize,
    /// Set by the writer once no sender is left: no hold is given out after that.
    pub closing: bool,
}

/// Keeps the writer from releasing `LOCK` while alive. Each of the drainer's jobs
/// that touches the directory (reads, checkpoints, retirements, quarantine) runs
/// under one: a job already running on the blocking pool when the sink is dropped
/// finishes anyway (aborting the drainer does not stop it), and must not touch the
/// directory once another sink, in this process or another, has locked it.
/// Derefs to the shared state.
pub struct Hold(Arc<Shared>);

impl Shared {
    /// A [`Hold`] for a job about to touch the directory; `None` once the writer is
    /// closing (the sink is gone: the job is skipped, the next start redoes it).
    pub fn try_hold(self: &Arc<Self>) -> Option<Hold> {
        let mut holds = lock(&self.holds);
        if holds.closing {
            return None;
        }
        holds.count += 1;
        Some(Hold(self.clone()))
    }

    /// Refuses new holds and blocks until every [`Hold`] is dropped. Only the
    /// writer calls it, once no sender is left, before it releases `LOCK`; the jobs
    /// it waits for are short file operations, never the store.
    pub fn close_and_wait(&self) {
        let mut holds = lock(&self.holds);
        holds.closing = true;
        while holds.count > 0 {
            holds = self.released.wait(holds).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl std::ops::Deref for Hold {
    type Target = Arc<Shared>;
    fn deref(&self) -> &Arc<Shared> {
        &self.0
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut holds = lock(&self.0.holds);
        holds.count = holds.count.saturating_sub(1);
        if holds.count == 0 {
            self.0.released.notify_all();
        }
    }
}

/// Locks a mutex, recovering from poisoning (the data is plain counters).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why a fenced sink refuses: its deleted directory has another owner now.
pub const FENCED: &str = "the spool directory was deleted and is now used by another process";

/// The stable refusal.
pub fn unavailable(message: &'static str) -> SoulError {
    SoulError::new(ErrorCode::EvidenceUnavailable, message)
}

impl Shared {
    /// Moves the committed position (the writer, after a round is durable); the
    /// store is behind from now on unless it already was.
    pub fn set_committed(&self, pos: Pos) {
        *lock(&self.committed) = pos;
        if *lock(&self.drained) < pos {
            lock(&self.behind_since).get_or_insert_with(std::time::Instant::now);
        }
    }

    /// Moves the drained position forward (the drainer, after a batch is in the
    /// store; never back: a checkpoint written in the background may finish after
    /// a later batch was published); once it reaches the committed one the store is
    /// caught up.
    pub fn set_drained(&self, pos: Pos) {
        let mut drained = lock(&self.drained);
        if pos > *drained {
            *drained = pos;
        }
        let pos = *drained;
        drop(drained);
        if pos >= *lock(&self.committed) {
            *lock(&self.behind_since) = None;
        }
    }

    /// How long the store has been behind the spool: an upper bound on the age
    /// of the oldest record not yet in the store (zero while caught up).
    pub fn drain_lag(&self) -> std::time::Duration {
        lock(&self.behind_since).map_or(std::time::Duration::ZERO, |t| t.elapsed())
    }

    /// Whether the spool directory is still this sink's: not fenced, and its `LOCK`
    /// is the file this sink holds. The drainer reads, checkpoints and deletes only
    /// then (a deleted `LOCK` may have let another process in).
    pub fn owns_dir(&self) -> bool {
        !self.fenced.load(Ordering::Acquire)
            && std::fs::metadata(self.dir.join("LOCK"))
                .is_ok_and(|m| crate::segment::identity(&m) == *lock(&self.lock_id))
    }

    /// Admits a record of `len` bytes against the cap. Begins need room for
    /// themselves plus their End's reserve; Ends are always admitted (their room was
    /// reserved); denials need room for themselves.
    pub fn admit(&self, kind: &Kind, len: u64) -> Result<(), SoulError> {
        let mut a = lock(&self.acct);
        match kind {
            Kind::Begin(id) => {
                if self.broken.load(Ordering::Acquire) {
                    return Err(unavailable(
                        "the evidence spool cannot be written (disk full or IO error); call refused",
                    ));
                }
                if !self.reserve_held.load(Ordering::Acquire) {
                    return Err(unavailable(
                        "the evidence spool has no disk reserve for the End of this call; call refused",
                    ));
                }
                if a.reserved + self.end_reserve > self.disk_reserve {
                    return Err(unavailable(
                        "more calls are running than the spool's disk reserve covers the Ends of; call refused",
                    )
                    .with_field("open_calls", a.open.len().to_string()));
                }
                if a.disk + a.reserved + len + self.end_reserve > self.max_bytes {
                    return Err(unavailable("the evidence spool is full; call refused")
                        .with_field("spool_max_bytes", self.max_bytes.to_string()));
                }
                a.disk += len;
                a.reserved += self.end_reserve;
                a.open.insert(id.clone());
            }
            Kind::End(begin) => {
                a.disk += len;
                if a.open.remove(begin) {
                    a.reserved = a.reserved.saturating_sub(self.end_reserve);
                }
            }
            Kind::Other => {
                // Not while appends fail: what room there is (the released disk
                // reserve) is for the Ends of accepted calls.
                if self.broken.load(Ordering::Acquire) {
                    return Err(unavailable(
                        "the evidence spool cannot be written (disk full or IO error)",
                    ));
                }
                if a.disk + a.reserved + len > self.max_bytes {
                    return Err(unavailable("the evidence spool is full"));
                }
                a.disk += len;
            }
            Kind::Flush => {}
        }
        Ok(())
    }

    /// Creates (or re-creates) the disk reserve file (see `segment::ensure_reserve`)
    /// and records whether it is there: Begins are admitted only while it is.
    pub fn make_reserve(&self) -> std::io::Result<()> {
        let made = crate::segment::ensure_reserve(&self.dir, self.disk_reserve);
        self.reserve_held.store(made.is_ok(), Ordering::Release);
        made
    }

    /// Frees the disk reserve (the disk is full: its room goes to the Ends of
    /// accepted calls); no Begin is admitted until it is made again. Returns
    /// whether there was one.
    pub fn release_reserve(&self) -> bool {
        self.reserve_held.store(false, Ordering::Release);
        crate::segment::release_reserve(&self.dir)
    }

    /// Undoes [`Shared::admit`] for a record that was never written.
    pub fn unadmit(&self, kind: &Kind, len: u64) {
        let mut a = lock(&self.acct);
        a.disk = a.disk.saturating_sub(len);
        if let Kind::Begin(id) = kind
            && a.open.remove(id)
        {
            a.reserved = a.reserved.saturating_sub(self.end_reserve);
        }
    }
}
