//! The writer thread: appends to the active segment with group commit.
//!
//! Requests queue up while an fsync is in flight; the next round takes all of them,
//! writes them with one `write` and makes them durable with one `fdatasync`. Under
//! load many callers share one fsync; idle, a lone caller pays one fsync. Submitted
//! Begins — Begins of calls that change nothing, whose callers wait for them only
//! with their End — are not sent but held (see [`Shared::held`]): every round
//! takes those held so far and writes its records in the order they were
//! accepted, so a quick call's Begin and End are one round and wake the writer
//! once. With async durability they are
//! sent, and a round of submitted Begins only waits up to [`SUBMITTED_WAIT`] for
//! more.
//!
//! Rounds overwrite zeros written ahead of the data, so their `fdatasync` flushes
//! data only — no file-size change or block allocation for the filesystem to
//! persist, which is what makes an fsync slow and jittery on a busy disk. The zeros
//! are written off the commit path: once the active segment is half full, a helper
//! thread zero-fills and fsyncs the next segment as `next-….seg.tmp` — in a drained
//! segment kept as a spare when there is one (see [`segment::SPARE_PREFIX`]: no
//! blocks allocated, none freed), else in a new file — which the writer renames
//! into place when it rolls over. The segment found at a start is zero-filled
//! before the writer starts ([`zero_fill_active`]), while no call waits on the disk.
//! Only when no prepared file is ready (a slow disk, or a failed preparation) does
//! the writer extend the active segment itself, a chunk at a time; that round's
//! `fdatasync` then also flushes the chunk (measured: 3–8 ms instead of ~0.1 ms on
//! a virtual disk, and tens of ms under load). A segment is sealed as
//! it is, its zeros after the data (readers stop at them): cutting them off would
//! free blocks on the commit path.
//!
//! Before and after each round the writer checks that the active segment and
//! `LOCK` still have names; a deleted spool is restored before the round is
//! acknowledged (see `restore_if_unlinked`).

use foldhash::{HashMap, HashMapExt};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use soulbase_types::EnvelopeId;
use tokio::sync::mpsc;

use crate::segment::{self, Pos};
use crate::shared::{FENCED, Kind, Request, Shared, lock, unavailable};

/// Most requests taken in one round.
const MAX_ROUND: usize = 32_768;

/// What [`run`] is told of the spool's options.
pub struct Tuning {
    /// Size at which a new segment is started.
    pub segment_bytes: u64,
    /// How long a round of submitted Begins only waits for more ([`SUBMITTED_WAIT`]).
    pub submitted_wait: Duration,
    /// With async durability, how long a round nobody waits on gathers more
    /// ([`ASYNC_LINGER`]); `None` with sync durability.
    pub async_linger: Option<Duration>,
    /// How long a round someone waits on gathers more right behind a round that
    /// answered two callers or more ([`BUSY_LINGER`], [`busy`]); zero never.
    pub busy_linger: Duration,
}

/// Longest a submitted Begin waits for a round to take it, by default: a held
/// Begin's answer, awaited while its call runs, then asks the writer for a round
/// (with async durability such a round gathers for [`ASYNC_LINGER`] instead).
/// Nobody waits on such a Begin until the call's End is
/// recorded, so a call that ends sooner has its Begin and End in one round (one
/// `fdatasync` instead of two); a longer call's Begin is durable this much
/// later, while the call runs (its result waits for it).
pub const SUBMITTED_WAIT: Duration = Duration::from_millis(2);
/// With async durability, how long the writer lets a round that nobody waits on
/// gather more before writing it, by default. It sleeps meanwhile with no waker
/// registered on its queue, so the records queued in that time wake nobody: under
/// load a round holds a millisecond of records, and the writer is woken (and
/// `fdatasync`s) about once per millisecond instead of once per record or two —
/// each such wake-up preempts a runtime worker. A record is durable at most about
/// this much later than it would be without it.
pub const ASYNC_LINGER: Duration = Duration::from_millis(1);
/// How long a round that callers wait on gathers more before it is written, by
/// default, when its first request came less than this after the end of a round
/// that answered two callers or more ([`busy`]): calls that come so fast, from
/// more than one caller, bring more requests into the round while it waits. (A
/// lone caller making one call after another gains nothing by it.)
/// As with [`ASYNC_LINGER`] the writer sleeps with no waker on its queue, so the
/// requests queued meanwhile wake nobody. Under load a round then holds several
/// calls, not one or two, and the writer wakes and `fdatasync`s that much less
/// often (MCP saturated, 7 runs alternated with and without: 5–18 % less CPU per
/// call in 6, 14–21 % more calls a second in 5; docs/performance.md). A call that
/// comes alone, as from a lone caller or at a thousand calls a second, never waits.
pub const BUSY_LINGER: Duration = Duration::from_micros(200);

/// Whether a round whose first request came at `now` is to linger: the last round,
/// if it answered two callers or more (`last_shared_end`), ended less than
/// `linger` before it. Never otherwise, nor with a zero `linger`.
fn busy(last_shared_end: Option<Instant>, now: Instant, linger: Duration) -> bool {
    last_shared_end.is_some_and(|end| now.saturating_duration_since(end) < linger)
}

/// Bytes of zeros a segment is extended by ahead of its data.
const CHUNK: u64 = 4 << 20;

/// Bytes of zeros a segment of `segment_bytes` is extended by when it runs out.
fn chunk_for(segment_bytes: u64) -> u64 {
    CHUNK.min(segment_bytes.max(4 << 10))
}

/// Length a segment of `segment_bytes` is zero-filled to before use: its size and
/// room for the round that crosses it.
fn prepared_len(segment_bytes: u64) -> u64 {
    segment_bytes + chunk_for(segment_bytes) / 4
}

/// Zero-fills the segment found at a start (`len` bytes of data in `file`) to the
/// length of a prepared segment and makes the zeros durable; returns the file's
/// length. Done before the writer starts, while no call of this spool waits on the
/// disk, so the first segment's rounds only overwrite zeros like every later
/// segment's, instead of extending it on the commit path (stalls of tens of ms over
/// a fresh server's first calls). Flushed a MiB at a time, like a prepared segment,
/// so whatever else shares the disk never queues behind one large flush. A segment
/// already that full is left as it is. On failure (a full disk) the zeros are cut
/// off again, and the writer extends the segment as it goes.
pub fn zero_fill_active(file: &File, len: u64, segment_bytes: u64) -> u64 {
    let to = prepared_len(segment_bytes);
    if len >= segment_bytes {
        return len;
    }
    match segment::write_zeros_at(file, len, to, || file.sync_data()) {
        Ok(()) => to,
        Err(e) => {
            tracing::warn!(error = %e, "could not zero-fill the spool segment ahead of use");
            let _ = file.set_len(len);
            len
        }
    }
}

/// Writes a zero-filled file of at least `bytes` at `path` (a spare of the spool moved
/// there, or a new file: never one another writer could be using) and makes it
/// durable, for the writer to rename into place as its next segment. A spare is
/// zero-filled whole, so none of its old records is ever read again. It is
/// flushed a MiB at a time, so the commits sharing the disk never queue behind one
/// large flush, and stops early when `cancel` is set. On any failure the file is
/// removed, so a full disk is not filled further.
fn prepare_next(shared: &Shared, path: &Path, bytes: u64, cancel: &AtomicBool) -> io::Result<File> {
    let write = || {
        // Only a spare whose name is durable (see `Shared::spares`): a crash must
        // never bring a half-zeroed file back as the drained segment it was. None
        // from a directory that is no longer this sink's.
        let spare = shared.owns_dir() && segment::take_spare(&mut lock(&shared.spares), path);
        let file = if spare {
            OpenOptions::new().read(true).write(true).open(path)?
        } else {
            OpenOptions::new()
                .create_new(true)
                .read(true)
                .write(true)
                .open(path)?
        };
        let bytes = bytes.max(file.metadata()?.len());
        segment::write_zeros_at(&file, 0, bytes, || {
            if cancel.load(Ordering::Acquire) {
                return Err(io::Error::other("preparation cancelled"));
            }
            file.sync_data()
        })?;
        file.sync_all()?;
        Ok(file)
    };
    write().inspect_err(|_| {
        let _ = std::fs::remove_file(path);
    })
}

/// Tells the prepared files of this process apart (with the pid, a name is never
/// reused, so a file is only ever written by the helper that created it).
static PREPARATIONS: AtomicU64 = AtomicU64::new(0);

/// A zero-filled next segment being prepared on a helper thread.
struct Job {
    /// Where it is written.
    path: PathBuf,
    /// Stops the helper.
    cancel: Arc<AtomicBool>,
    /// The helper, done once the file is durable.
    handle: JoinHandle<io::Result<File>>,
}

/// The next segment, zero-filled ahead of use.
struct Prepared {
    /// The preparation under way or finished, if any.
    job: Option<Job>,
}

impl Prepared {
    /// Starts preparing a next segment of `bytes`, unless one is under way.
    fn start(&mut self, shared: &Arc<Shared>, bytes: u64) {
        if self.job.is_some() {
            return;
        }
        let path = shared.dir.join(format!(
            "{}{}-{}{}",
            segment::NEXT_PREFIX,
            std::process::id(),
            PREPARATIONS.fetch_add(1, Ordering::Relaxed),
            segment::NEXT_SUFFIX
        ));
        let cancel = Arc::new(AtomicBool::new(false));
        let (s, p, c) = (shared.clone(), path.clone(), cancel.clone());
        match std::thread::Builder::new()
            .name("evidence-spool-prep".into())
            .spawn(move || prepare_next(&s, &p, bytes, &c))
        {
            Ok(handle) => {
                self.job = Some(Job {
                    path,
                    cancel,
                    handle,
                })
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not start preparing the next spool segment")
            }
        }
    }

    /// Stops a preparation under way and removes its file (the disk is full, and
    /// its bytes are better spent on the Ends of accepted calls; or the writer is
    /// stopping). Waits at most for the MiB being written.
    fn abandon(&mut self) {
        if let Some(job) = self.job.take() {
            job.cancel.store(true, Ordering::Release);
            let _ = job.handle.join();
            let _ = std::fs::remove_file(&job.path);
        }
    }

    /// The prepared file, renamed to segment `id`, if it is ready; never waits.
    fn take(&mut self, shared: &Shared, id: u64) -> Option<Active> {
        if !self.job.as_ref().is_some_and(|j| j.handle.is_finished()) {
            return None;
        }
        let job = self.job.take()?;
        let file = match job.handle.join() {
            Ok(Ok(file)) => file,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not prepare the next spool segment");
                return None;
            }
            Err(_) => return None,
        };
        let allocated = file.metadata().ok()?.len();
        if let Err(e) = std::fs::rename(&job.path, segment::segment_path(&shared.dir, id)) {
            tracing::warn!(error = %e, "could not use the prepared spool segment");
            // Its name is this process's alone: nobody else would remove it.
            let _ = std::fs::remove_file(&job.path);
            return None;
        }
        // Not used unless its name is durable; the file left under the segment's
        // name is reused (`open_segment`) or replaced by the next try.
        if let Err(e) = segment::sync_dir(&shared.dir) {
            tracing::warn!(error = %e, "could not use the prepared spool segment");
            return None;
        }
        Some(Active {
            file,
            id,
            len: 0,
            allocated,
            chunk: 0,
        })
    }
}

/// Opens (creating) segment `id` for writing.
pub fn open_segment(shared: &Shared, id: u64) -> io::Result<File> {
    let f = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(segment::segment_path(&shared.dir, id))?;
    segment::sync_dir(&shared.dir)?;
    Ok(f)
}

/// The active segment being appended to.
pub struct Active {
    /// Its file, opened for writing.
    pub file: File,
    /// Its id.
    pub id: u64,
    /// Length of its data.
    pub len: u64,
    /// Length of the file (data plus zeros ahead of it).
    pub allocated: u64,
    /// Bytes of zeros to extend by.
    pub chunk: u64,
}

impl Active {
    /// Writes `bytes` after the data and makes them durable (one `fdatasync`).
    fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let end = self.len + bytes.len() as u64;
        if end > self.allocated {
            let target = end + self.chunk;
            match segment::write_zeros_at(&self.file, end.max(self.allocated), target, || Ok(())) {
                Ok(()) => self.allocated = target,
                // No room for the zeros ahead (a full disk): they only save later
                // rounds a file extension, so the bytes are written without them —
                // the room released for the Ends of accepted calls is smaller
                // than a chunk.
                Err(_) => {
                    self.file.set_len(self.allocated.max(self.len))?;
                    self.allocated = end;
                }
            }
        }
        self.file.write_all_at(bytes, self.len)?;
        self.file.sync_data()
    }

    /// Cuts the file back to its data (sealing, or after a failed write).
    fn trim(&mut self) -> io::Result<()> {
        self.file.set_len(self.len)?;
        self.allocated = self.len;
        Ok(())
    }
}

/// Runs until every sender is gone; every batch is durable before it is acknowledged.
///
/// `dir_lock` is the spool directory's lock: held here, it is released only once
/// the last queued request is written, any preparation has finished and so has
/// every drainer job already started (see [`crate::shared::Hold`]), so a spool
/// reopened meanwhile (same process, after the sink is dropped) never has two
/// writers, nor a job of the old sink's drainer deleting files under its recovery.
pub fn run(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<Request>,
    mut active: Active,
    tuning: Tuning,
    mut dir_lock: File,
) {
    let segment_bytes = tuning.segment_bytes;
    active.chunk = chunk_for(segment_bytes);
    let prepared_bytes = prepared_len(segment_bytes);
    let mut prepared = Prepared { job: None };
    let mut pins: HashMap<EnvelopeId, u64> = HashMap::new();
    // Refused submitted Begins, and when (see `REFUSED_KEPT`).
    let mut refused: HashMap<EnvelopeId, Instant> = HashMap::new();
    let mut batch: Vec<Request> = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut room_checked: Option<Instant> = None;
    // Ends that could not be written (the disk full even without the reserve):
    // their callers were told, and they are retried, first in every round and on
    // their own every `retry_every`, until they land (or, once the sink is
    // dropped, for `PENDING_KEPT_AFTER_CLOSE`).
    let mut pending: Vec<Request> = Vec::new();
    let mut retry_every = PENDING_RETRY_MIN;
    let mut closed_at: Option<Instant> = None;
    // When the last round ended, if it answered two callers or more (see `busy`).
    let mut last_shared_end: Option<Instant> = None;
    loop {
        let first = if pending.is_empty() {
            match rx.blocking_recv() {
                Some(r) => Some(r),
                // Every sender is gone: a last round for what is held.
                None if !lock(&shared.held).is_empty() => None,
                None => break,
            }
        } else if let Some(at) = closed_at {
            if at.elapsed() >= PENDING_KEPT_AFTER_CLOSE {
                tracing::error!(
                    ends = pending.len(),
                    "the sink closed with Ends that could not be written; recovery will close their calls as aborted"
                );
                break;
            }
            std::thread::sleep(retry_every);
            None
        } else {
            match recv_within(&mut rx, retry_every) {
                Ok(r) => r,
                Err(()) => {
                    closed_at = Some(Instant::now());
                    None
                }
            }
        };
        // Queued before anything else in this round.
        batch.append(&mut pending);
        if let Some(first) = first {
            batch.push(first);
        }
        if batch.is_empty() && lock(&shared.held).is_empty() {
            continue;
        }
        #[cfg(test)]
        while shared.hold_rounds.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        let lingers = closed_at.is_none()
            && busy(last_shared_end, Instant::now(), tuning.busy_linger)
            && batch.iter().any(|r| r.ack.is_some());
        take_queued(&mut rx, &mut batch);
        if lingers {
            // Callers wait on this round, but requests come faster than this: let
            // it gather, woken by nobody (as below).
            std::thread::sleep(tuning.busy_linger);
            take_queued(&mut rx, &mut batch);
        } else if let Some(linger) = tuning.async_linger
            && closed_at.is_none()
            && !batch.is_empty()
            && batch.iter().all(|r| r.ack.is_none())
        {
            // Nobody waits on this round: let it gather. No waker is registered on
            // the queue while the thread sleeps, so what is queued meanwhile wakes
            // nobody (a request that waits is taken with the rest).
            std::thread::sleep(linger);
            take_queued(&mut rx, &mut batch);
        } else if closed_at.is_none() && batch.iter().all(|r| r.submitted) {
            let until = Instant::now() + tuning.submitted_wait;
            while batch.len() < MAX_ROUND
                && let Ok(Some(r)) = recv_until(&mut rx, until)
            {
                let from = batch.len();
                batch.push(r);
                take_queued(&mut rx, &mut batch);
                if batch[from..].iter().any(|r| !r.submitted) {
                    break;
                }
            }
        }
        take_held(&shared, &mut rx, &mut batch);
        // A probe queued before this point is in this round (or behind it).
        shared.probe_queued.store(false, Ordering::Release);
        if !refused.is_empty() {
            refuse_orphan_ends(&shared, &refused, &mut batch);
        }
        buf.clear();
        for r in &batch {
            buf.extend_from_slice(&r.bytes);
        }
        let callers = batch
            .iter()
            .filter(|r| r.ack.is_some() && !r.submitted)
            .count();
        let appended = append_round(&shared, &mut active, &mut dir_lock, &buf);
        last_shared_end = (callers >= 2).then(Instant::now);
        match appended {
            Ok(()) => {
                active.len += buf.len() as u64;
                // Before the acknowledgements: a flush returns with the check done.
                // Space the drainer freed is checked at once (no stale refusals).
                if shared.broken.load(Ordering::Acquire)
                    && (shared.room_freed.swap(false, Ordering::AcqRel)
                        | room_check_due(&mut room_checked))
                    && room_again(&shared, segment_bytes)
                {
                    shared.broken.store(false, Ordering::Release);
                    tracing::warn!("the evidence spool can be written again; accepting calls");
                }
                commit(&shared, &mut pins, &mut batch, &active);
            }
            Err(e) => {
                prepared.abandon();
                recover_from_failed_append(
                    &shared,
                    &mut pins,
                    &mut refused,
                    &mut batch,
                    &mut pending,
                    &mut active,
                    &mut dir_lock,
                    e,
                )
            }
        }
        retry_every = if pending.is_empty() {
            PENDING_RETRY_MIN
        } else {
            (retry_every * 2).min(PENDING_RETRY_MAX)
        };
        if active.len >= segment_bytes / 2 && !shared.broken.load(Ordering::Acquire) {
            prepared.start(&shared, prepared_bytes);
        }
        // Never while broken: the last round failed, and a segment whose file was
        // deleted and could not be restored must not be sealed and left behind.
        // Checked again here: a segment deleted since the round's check must be put
        // back before its only open file is let go.
        if active.len >= segment_bytes && !shared.broken.load(Ordering::Acquire) && {
            let len = active.len;
            restore_if_unlinked(&shared, &mut active, &mut dir_lock, len)
                .inspect_err(|e| tracing::error!(error = %e, "not sealing the spool segment"))
                .is_ok()
        } {
            // Sealed as it is (see the module doc); the drainer accounts for its
            // data, not its zeros, when it retires it.
            lock(&shared.sealed).insert(active.id, active.len);
            let next = match prepared.take(&shared, active.id + 1) {
                Some(next) => Ok(next),
                None => open_segment(&shared, active.id + 1).map(|file| Active {
                    file,
                    id: active.id + 1,
                    len: 0,
                    allocated: 0,
                    chunk: 0,
                }),
            };
            match next {
                Ok(next) => {
                    active = Active {
                        chunk: active.chunk,
                        ..next
                    };
                    // A reserve given up on a full disk and not made again since.
                    keep_reserve(&shared);
                    shared.active.store(active.id, Ordering::Release);
                    shared.set_committed(Pos {
                        segment: active.id,
                        offset: 0,
                    });
                    shared.committed_notify.notify_one();
                }
                Err(e) => tracing::error!(error = %e, "could not open a new spool segment"),
            }
        }
    }
    // Every sender is gone: stop a preparation and remove its file (the next start
    // would), and wait for the drainer's jobs, so nothing writes in the directory
    // once the lock is released.
    prepared.abandon();
    shared.close_and_wait();
    drop(dir_lock);
}

/// First wait between two tries of Ends that could not be written; doubled after
/// each failed try up to [`PENDING_RETRY_MAX`].
const PENDING_RETRY_MIN: Duration = Duration::from_millis(10);
/// Longest wait between two tries of Ends that could not be written.
const PENDING_RETRY_MAX: Duration = Duration::from_millis(500);
/// How long Ends that could not be written are still tried once the sink is
/// dropped (its `LOCK` is held meanwhile); after that, recovery at the next start
/// closes their calls as aborted — calls whose callers were told their End was
/// pending, never that they succeeded.
const PENDING_KEPT_AFTER_CLOSE: Duration = Duration::from_secs(5);

/// Adds the held Begins (see [`Shared::held`]) and everything still queued to
/// `batch`, and puts the round in the order its records were accepted
/// ([`Request::seq`]). The channel is emptied under the `held` lock, after the
/// round's other requests were received: a Begin is held before its End is
/// sent, so every End in the round finds its Begin in it (or in an earlier
/// round), and a record sent before a Begin was held is in the channel by then,
/// so a Begin the round takes never goes ahead of it. (The queue's capacity
/// bounds how much this takes beyond [`MAX_ROUND`].)
fn take_held(shared: &Shared, rx: &mut mpsc::Receiver<Request>, batch: &mut Vec<Request>) {
    let mut held = lock(&shared.held);
    while let Ok(r) = rx.try_recv() {
        batch.push(r);
    }
    if !held.is_empty() {
        batch.append(&mut held);
    }
    drop(held);
    batch.sort_by_key(|r| r.seq);
}

/// Moves what is queued into `batch`, up to [`MAX_ROUND`] requests in all.
fn take_queued(rx: &mut mpsc::Receiver<Request>, batch: &mut Vec<Request>) {
    while batch.len() < MAX_ROUND {
        match rx.try_recv() {
            Ok(r) => batch.push(r),
            Err(_) => break,
        }
    }
}

/// The next request, if one comes within `within`; `Err` once every sender is gone.
fn recv_within(rx: &mut mpsc::Receiver<Request>, within: Duration) -> Result<Option<Request>, ()> {
    recv_until(rx, Instant::now() + within)
}

/// Unparks the writer thread when the channel has something for it.
struct Unpark(std::thread::Thread);

impl std::task::Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The next request, if one comes before `until` (the thread parks meanwhile and
/// is woken by the sender); `Err` once every sender is gone.
fn recv_until(rx: &mut mpsc::Receiver<Request>, until: Instant) -> Result<Option<Request>, ()> {
    let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = std::task::Context::from_waker(&waker);
    loop {
        match rx.poll_recv(&mut cx) {
            std::task::Poll::Ready(Some(r)) => return Ok(Some(r)),
            std::task::Poll::Ready(None) => return Err(()),
            std::task::Poll::Pending => {}
        }
        let now = Instant::now();
        if now >= until {
            return Ok(None);
        }
        // Returns on an unpark, at `until`, or spuriously: the channel is polled again.
        std::thread::park_timeout(until - now);
    }
}

/// Appends a round's bytes and makes them durable under the segment's name (see
/// [`restore_if_unlinked`]): every acknowledging path goes through here.
fn append_round(
    shared: &Shared,
    active: &mut Active,
    dir_lock: &mut File,
    bytes: &[u8],
) -> io::Result<()> {
    if shared.fenced.load(Ordering::Acquire) {
        return Err(io::Error::other(FENCED));
    }
    // Before writing (the directory may have another owner now, who must never
    // see this round) and after (a deletion during the write).
    restore_if_unlinked(shared, active, dir_lock, active.len)?;
    let data_len = active.len + bytes.len() as u64;
    #[cfg(test)]
    if !bytes.is_empty()
        && shared
            .fail_appends
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    {
        return Err(io::Error::new(
            io::ErrorKind::StorageFull,
            "test fault: disk full",
        ));
    }
    active.append(bytes)?;
    restore_if_unlinked(shared, active, dir_lock, data_len)
}

/// Bytes that must be writable before calls are accepted again after a failed append.
const ROOM_PROBE: u64 = 64 << 10;
/// Least time between two checks for room: refused calls keep queueing probes.
const ROOM_CHECK_EVERY: Duration = Duration::from_millis(100);

/// Whether a check for room is due (none in the last [`ROOM_CHECK_EVERY`]); if so,
/// counts it as made now.
fn room_check_due(last: &mut Option<Instant>) -> bool {
    let now = Instant::now();
    if last.is_some_and(|at| now.duration_since(at) < ROOM_CHECK_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

/// After a failed append, whether calls may be accepted again: a round has just
/// succeeded (a round of Ends or an empty probe proves nothing about room), the
/// disk reserve is there (made again if it was given up for the Ends of accepted
/// calls) and, besides it, [`ROOM_PROBE`] bytes and a whole prepared segment
/// (`segment_bytes` and the zeros ahead of it) can be written: the spool can
/// then go on to its next segment, so calls taken again are not refused again at
/// once while a drain is still freeing space.
fn room_again(shared: &Shared, segment_bytes: u64) -> bool {
    #[cfg(test)]
    if shared.fail_reserve.load(Ordering::Acquire) {
        return false;
    }
    if !shared.owns_dir() {
        return false;
    }
    // Begins are taken only with the reserve there for their Ends.
    if let Err(e) = shared.make_reserve() {
        tracing::warn!(error = %e, "the spool's disk reserve cannot be made again yet");
        return false;
    }
    segment::room_for(&shared.dir, ROOM_PROBE + prepared_len(segment_bytes)).is_ok()
}

/// Makes the disk reserve if it is missing; when it cannot be made, the spool
/// goes to the failed-append state (Begins refused, each refusal probing for room)
/// until [`room_again`] can make it.
fn keep_reserve(shared: &Shared) {
    if let Err(e) = shared.make_reserve() {
        tracing::warn!(error = %e, "the spool's disk reserve cannot be made; refusing calls until it can");
        shared.broken.store(true, Ordering::Release);
    }
}

/// Whether `file` has lost its last name.
fn unlinked(file: &File) -> io::Result<bool> {
    Ok(file.metadata()?.nlink() == 0)
}

/// Puts the spool back if its active segment or `LOCK` was deleted while in use
/// (the directory removed under a running server, by hand or by a temp-file
/// cleaner). The active segment's records, `data_len` bytes, are still in the open
/// file: they are copied to a new file under the segment's name (recreating the
/// directory, with its reserve, and taking its lock again) before the round is
/// acknowledged, so the drainer reads them and nothing accepted is lost. Sealed
/// segments deleted before they were drained cannot be recovered; the drainer
/// reports them.
///
/// An error fails the round like a failed write. If another process has locked
/// the path meanwhile, the sink is fenced: it never writes, reads or deletes there
/// again.
fn restore_if_unlinked(
    shared: &Shared,
    active: &mut Active,
    dir_lock: &mut File,
    data_len: u64,
) -> io::Result<()> {
    let segment_gone = unlinked(&active.file)?;
    if !segment_gone && !unlinked(dir_lock)? {
        return Ok(());
    }
    let dir = &shared.dir;
    tracing::error!(
        segment = active.id,
        dir = %dir.display(),
        "spool files were deleted while in use; restoring them"
    );
    let recreated = !dir.exists();
    if recreated {
        std::fs::create_dir_all(dir)?;
        if let Some(parent) = dir.parent() {
            segment::sync_dir(parent)?;
        }
    }
    // `lock_id` is `dir_lock`'s identity: if `LOCK` is still that file, the lock
    // held is still the directory's (a second lock on it would block on this one).
    if !shared.owns_dir() {
        match segment::lock_dir(dir) {
            // Held from here on, also if the copy below fails.
            Ok(relocked) => {
                *dir_lock = relocked;
                *lock(&shared.lock_id) = segment::identity(&dir_lock.metadata()?);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                shared.fenced.store(true, Ordering::Release);
                tracing::error!(
                    dir = %dir.display(),
                    "the deleted spool directory is now used by another process; this sink stops using it"
                );
                return Err(io::Error::other(FENCED));
            }
            Err(e) => return Err(e),
        }
    }
    if segment_gone {
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(segment::segment_path(dir, active.id))?;
        let mut chunk = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < data_len {
            let n = (data_len - at).min(chunk.len() as u64) as usize;
            active.file.read_exact_at(&mut chunk[..n], at)?;
            file.write_all_at(&chunk[..n], at)?;
            at += n as u64;
        }
        file.sync_all()?;
        active.file = file;
        active.allocated = data_len;
    }
    if recreated {
        keep_reserve(shared);
    }
    segment::sync_dir(dir)
}

/// Records a successful round: pins, the committed position, acknowledgements.
fn commit(
    shared: &Shared,
    pins: &mut HashMap<EnvelopeId, u64>,
    batch: &mut Vec<Request>,
    active: &Active,
) {
    for r in batch.iter() {
        match &r.kind {
            Kind::Begin(id) => {
                pins.insert(id.clone(), active.id);
            }
            Kind::End(begin) => {
                pins.remove(begin);
            }
            Kind::Other | Kind::Flush => {}
        }
    }
    shared.min_pin.store(
        pins.values().copied().min().unwrap_or(u64::MAX),
        Ordering::Release,
    );
    shared.set_committed(Pos {
        segment: active.id,
        offset: active.len,
    });
    shared.rounds.fetch_add(1, Ordering::Relaxed);
    shared.committed_notify.notify_one();
    for r in batch.drain(..) {
        if let Some(ack) = r.ack {
            let _ = ack.send(Ok(()));
        }
    }
}

/// How long a refused submitted Begin is remembered: longer than any call runs
/// (tools time out within 10 minutes), so its End (or a second one, from a call
/// cancelled while its End was being written) is refused whenever it comes.
const REFUSED_KEPT: Duration = Duration::from_secs(3600);

/// Refuses, and takes out of `batch`, the Ends whose submitted Begin was refused
/// (see [`Request::submitted`]): an End must never be durable without its Begin.
fn refuse_orphan_ends(
    shared: &Shared,
    refused: &HashMap<EnvelopeId, Instant>,
    batch: &mut Vec<Request>,
) {
    batch.retain_mut(|r| {
        let Kind::End(begin) = &r.kind else {
            return true;
        };
        if !refused.contains_key(begin) {
            return true;
        }
        shared.unadmit(&Kind::Other, r.bytes.len() as u64);
        if let Some(ack) = r.ack.take() {
            let _ = ack.send(Err(unavailable(
                "the Begin of this call could not be written, so its End is not either",
            )));
        }
        false
    });
}

/// An append failed (typically the disk is full). Ends must still land: free the
/// reserve and try them alone. Everything else in the round is refused and its
/// accounting undone. Ends that still cannot be written are answered as pending
/// (`EVIDENCE.UNAVAILABLE`, field `end: pending`: the caller must not report
/// success) and kept in `pending`, to be tried again until they land.
#[allow(clippy::too_many_arguments)]
fn recover_from_failed_append(
    shared: &Shared,
    pins: &mut HashMap<EnvelopeId, u64>,
    refused: &mut HashMap<EnvelopeId, Instant>,
    batch: &mut Vec<Request>,
    pending: &mut Vec<Request>,
    active: &mut Active,
    dir_lock: &mut File,
    error: io::Error,
) {
    tracing::error!(error = %error, segment = active.id, "evidence spool append failed");
    shared.broken.store(true, Ordering::Release);
    let _ = active.trim();
    let (mut ends, others): (Vec<Request>, Vec<Request>) = batch
        .drain(..)
        .partition(|r| matches!(r.kind, Kind::End(_) | Kind::Flush));
    // A probe (an empty round nobody waits for) needs no second try.
    ends.retain(|r| !r.bytes.is_empty() || r.ack.is_some());
    let now = Instant::now();
    refused.retain(|_, at| now.duration_since(*at) < REFUSED_KEPT);
    for r in others {
        if r.submitted
            && let Kind::Begin(id) = &r.kind
        {
            refused.insert(id.clone(), now);
        }
        shared.unadmit(&r.kind, r.bytes.len() as u64);
        if let Some(ack) = r.ack {
            let _ = ack.send(Err(unavailable(
                "the evidence spool cannot be written (disk full or IO error)",
            )
            .with_note(error.to_string())));
        }
    }
    // After the refusals above: an End queued in the same round as its Begin.
    refuse_orphan_ends(shared, refused, &mut ends);
    if ends.is_empty() {
        return;
    }
    let bytes: Vec<u8> = ends.iter().flat_map(|r| r.bytes.iter().copied()).collect();
    let mut result = append_round(shared, active, dir_lock, &bytes);
    if result.is_err()
        && !shared.fenced.load(Ordering::Acquire)
        && (shared.release_reserve() | segment::remove_spares(&shared.dir))
    {
        tracing::warn!("released the spool reserve and spares to write the Ends of accepted calls");
        let _ = active.trim();
        result = append_round(shared, active, dir_lock, &bytes);
    }
    match result {
        Ok(()) => {
            active.len += bytes.len() as u64;
            commit(shared, pins, &mut ends, active);
        }
        Err(e) => {
            let _ = active.trim();
            let count = ends
                .iter()
                .filter(|r| matches!(r.kind, Kind::End(_)))
                .count();
            if count > 0 {
                tracing::error!(error = %e, ends = count, "could not write the End of an accepted call yet; it is kept and tried again");
            }
            for mut r in ends {
                let is_end = matches!(r.kind, Kind::End(_));
                if let Some(ack) = r.ack.take() {
                    let answer = if is_end {
                        unavailable(
                            "the End of this call could not be made durable yet (disk full or IO error); it is kept in memory and written as soon as there is room",
                        )
                        .with_field("end", "pending")
                    } else {
                        unavailable("the evidence spool cannot be written")
                    };
                    let _ = ack.send(Err(answer.with_note(e.to_string())));
                }
                // Still admitted: its bytes are written once there is room.
                if is_end {
                    pending.push(r);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round lingers only when the last round that answered two callers or more
    /// ended less than the linger before its first request; never after no such
    /// round, nor with a zero linger.
    #[test]
    fn a_round_lingers_only_right_behind_another() {
        let end = Instant::now();
        let linger = Duration::from_micros(200);
        assert!(!busy(None, end, linger), "no such round before");
        assert!(busy(Some(end), end + Duration::from_micros(50), linger));
        assert!(!busy(Some(end), end + Duration::from_micros(200), linger));
        assert!(!busy(Some(end), end + Duration::from_millis(1), linger));
        assert!(!busy(Some(end), end, Duration::ZERO), "a zero linger never");
    }
}
