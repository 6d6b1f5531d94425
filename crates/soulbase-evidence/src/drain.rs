//! The drainer: ships committed spool records to the store in batches, exactly once.
//!
//! It reads only what the writer has made durable, checks each record as it reads
//! it (on the blocking pool) and passes it on as the text the spool holds (the
//! store reads only the fields it indexes instead of encoding every record
//! again), writes a batch with one
//! idempotent store write, then advances and persists the checkpoint. A store
//! failure (outage) is retried with backoff from the same position; a batch that
//! landed just before a crash is re-sent after it and skipped by the store (envelope
//! ids are unique), so every record lands exactly once. A record the store refuses
//! for good (including text that is not a record) is isolated by bisecting its
//! batch and quarantined (see
//! [`segment::QUARANTINE_FILE`]). Drained segments are retired (kept as spares for
//! reuse, or deleted) unless a Begin in
//! them still waits for its End (recovery needs it).

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use soulbase_observe::{EncodedRecord, EvidenceStore, is_store_refusal};
use tokio::sync::mpsc;

use crate::quarantine::{self, RequeueReport};
use crate::segment::{self, Pos};
use crate::shared::{Kind, Request, Shared, lock, unavailable};

/// A request to offer the quarantine file's records to the store again
/// ([`crate::DurableSink::retry_quarantine`]), answered once done.
pub(crate) struct RetryRequest {
    /// Where the answer goes.
    pub reply: tokio::sync::oneshot::Sender<Result<RequeueReport, soulbase_errors::SoulError>>,
}

/// Tuning of the drainer.
#[derive(Debug, Clone, Copy)]
pub struct DrainOptions {
    /// Most records read from the spool per round.
    pub batch: usize,
    /// Store writes per round, run concurrently on slices of the batch (a database
    /// ingests faster on several connections); the checkpoint advances once all landed.
    pub parallel: usize,
    /// First retry delay after a store failure (doubles up to `max_backoff`).
    pub min_backoff: Duration,
    /// Longest retry delay (250 ms by default: once the store is back, the spool
    /// drains, its space is reclaimed and calls refused for a full disk are
    /// taken again within a second).
    pub max_backoff: Duration,
    /// Shortest interval between checkpoint writes (a write in place and an
    /// `fdatasync` each, on the disk the spool fsyncs to), except on reaching a new
    /// segment and at shutdown; the last position is written once this much time
    /// has passed, also when idle; after every batch while appends are failing (a
    /// full disk), whose space the checkpoint's retirement of drained segments
    /// frees. The drained position is published after each batch (with each
    /// checkpoint while appends are failing: see `persist`). A
    /// checkpoint lost to a crash only makes batches be re-sent, which the store
    /// skips.
    pub checkpoint_every: Duration,
    /// Shortest interval between the starts of two store writes while the drainer
    /// keeps up (a batch smaller than `batch`). Records are durable in the spool
    /// already; lingering gathers them into fewer, larger writes, so the database
    /// commits (and fsyncs its log) at most 4 times a second (250 ms by default:
    /// at 20 calls/s a commit holds ~5 calls, not 2 as with 100 ms, which cut the
    /// SQLite connections' CPU per call by two thirds) instead of once per
    /// handful of calls, and takes less CPU from the request path; at low rates it
    /// gathers a call's Begin and End, and several calls, into one write. A backlog
    /// is drained back to back, and so is everything while appends fail (a full
    /// disk: the drain's writes free the room refused calls wait for); a reader
    /// waiting for the store to catch up ([`crate::DurableSink::wait_drained`])
    /// cuts the linger short.
    pub linger: Duration,
    /// The linger instead of `linger` while records come slower than `quiet_rate`
    /// a second (1 s by default; never shorter than `linger`). A
    /// store write costs about the same for 10 records as for 40 — a commit, its
    /// `fsync`, a checkpoint, and wake-ups of the drainer and the database's
    /// threads — so a quiet server writes about once a second: at 20 calls/s
    /// ~20 calls a write, not ~5 (`idle_cpu.py`: ~17 % less CPU per call).
    /// Readers waiting for the store cut it short as they do `linger`; a process
    /// reading the database directly sees a quiet server's evidence up to this
    /// much later.
    pub quiet_linger: Duration,
    /// Records a second (over the interval since the start of the previous store
    /// write, or since the first record after a pause) below which the drainer
    /// lingers `quiet_linger`: 100 by
    /// default, 50 calls a second. A busier server's writes already hold enough
    /// records each.
    pub quiet_rate: u32,
    /// Fewest records per concurrent store write: a batch is split over `parallel`
    /// connections only when every slice gets at least this many.
    pub min_slice: usize,
}

impl Default for DrainOptions {
    fn default() -> Self {
        Self {
            batch: 4_000,
            parallel: 2,
            min_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(250),
            checkpoint_every: Duration::from_secs(1),
            linger: Duration::from_millis(250),
            quiet_linger: Duration::from_secs(1),
            quiet_rate: 100,
            min_slice: 500,
        }
    }
}

/// Reads the next run of committed records after `pos`; the new position follows them.
fn next_batch(shared: &Shared, pos: Pos, max: usize) -> std::io::Result<(Vec<EncodedRecord>, Pos)> {
    if shared.fenced.load(Ordering::Acquire) {
        return Err(std::io::Error::other(crate::shared::FENCED));
    }
    let committed = *lock(&shared.committed);
    let mut pos = pos;
    loop {
        if pos >= committed {
            return Ok((Vec::new(), pos));
        }
        if !shared.owns_dir() {
            // NotFound: the drainer wakes the writer, whose next round restores the
            // directory or fences the sink.
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the spool directory's LOCK is missing or not this sink's",
            ));
        }
        // A sealed segment is read up to its data, when this process sealed it:
        // never into the zeros after it, nor into frames of a round that failed.
        let active = pos.segment == committed.segment;
        let limit = if active {
            Some(committed.offset)
        } else {
            lock(&shared.sealed).get(&pos.segment).copied()
        };
        let own = pos >= shared.own_from;
        let (records, offset, corrupt) =
            match segment::read_range(&shared.dir, pos, limit, max, own) {
                Ok(r) => r,
                // A sealed segment deleted before it was drained: its records are gone.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !active => {
                    tracing::error!(
                        segment = pos.segment,
                        "a spool segment was deleted before it was drained; its records are lost"
                    );
                    (Vec::new(), pos.offset, false)
                }
                // The active segment deleted: the writer puts it back from its open file
                // with its next round; until then this is an error, retried.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(std::io::Error::new(
                        e.kind(),
                        format!("the active spool segment {} is missing", pos.segment),
                    ));
                }
                Err(e) => return Err(e),
            };
        if !records.is_empty() {
            return Ok((
                records,
                Pos {
                    segment: pos.segment,
                    offset,
                },
            ));
        }
        if pos.segment < committed.segment {
            // The end of a sealed segment (or a corrupt or missing one): move on.
            if corrupt {
                tracing::error!(
                    segment = pos.segment,
                    offset,
                    "corrupt spool segment; skipping its tail"
                );
            }
            let ids = segment::list_segments(&shared.dir)?;
            let following = ids
                .into_iter()
                .find(|&id| id > pos.segment)
                .unwrap_or(committed.segment);
            pos = Pos {
                segment: following,
                offset: 0,
            };
            continue;
        }
        let next = Pos {
            segment: pos.segment,
            offset,
        };
        return Ok((Vec::new(), next));
    }
}

/// Retires segments wholly before `drained` that no open Begin pins (kept as
/// spares for reuse, or deleted: see [`segment::retire`]). Returns whether any
/// was retired.
fn delete_drained(shared: &Shared, drained: Pos) -> bool {
    if !shared.owns_dir() {
        return false;
    }
    let pin = shared.min_pin.load(Ordering::Acquire);
    let active = shared.active.load(Ordering::Acquire);
    let Ok(ids) = segment::list_segments(&shared.dir) else {
        return false;
    };
    let mut retired = false;
    let mut kept = Vec::new();
    for id in ids {
        if id >= drained.segment || id >= pin || id >= active {
            break;
        }
        let path = segment::segment_path(&shared.dir, id);
        let sealed = lock(&shared.sealed).get(&id).copied();
        // Segments sealed before this start were cut to their data by recovery.
        let len = sealed.unwrap_or_else(|| std::fs::metadata(&path).map_or(0, |m| m.len()));
        // No spares while appends fail (a full disk): their room is better spent
        // on the Ends of accepted calls.
        let keep = !shared.broken.load(Ordering::Acquire);
        if let Ok(spare) = segment::retire(&shared.dir, id, keep) {
            lock(&shared.sealed).remove(&id);
            let mut a = lock(&shared.acct);
            a.disk = a.disk.saturating_sub(len);
            retired = true;
            kept.extend(spare);
        }
    }
    // New spares are offered for reuse only once their names are durable (see
    // `Shared::spares`); if the sync fails they wait for the next start.
    if retired && segment::sync_dir(&shared.dir).is_ok() {
        lock(&shared.spares).extend(kept);
    }
    retired
}

/// Why a job is skipped: the sink was dropped and its writer is releasing `LOCK`
/// (see [`crate::shared::Hold`]).
const CLOSING: &str = "the evidence sink is closing";

/// A read of the spool in progress: the records and the position after them.
type Read = tokio::task::JoinHandle<std::io::Result<(Vec<EncodedRecord>, Pos)>>;

/// Most bytes waiting in the active segment that the drainer reads in place rather
/// than on the blocking pool: a read of that much from the page cache takes
/// microseconds, while a hand-off to the blocking pool and back costs two thread
/// wakeups, which at low rates were most of a call's drain cost.
const READ_IN_PLACE: u64 = 256 << 10;

/// Reads the next batch after `pos` (see [`spawn_read`]): in place when little is
/// waiting in the active segment ([`READ_IN_PLACE`]), else on the blocking pool.
async fn read(
    shared: &Arc<Shared>,
    pos: Pos,
    max: usize,
) -> Result<std::io::Result<(Vec<EncodedRecord>, Pos)>, tokio::task::JoinError> {
    let committed = *lock(&shared.committed);
    if committed.segment == pos.segment
        && committed.offset.saturating_sub(pos.offset) <= READ_IN_PLACE
    {
        return Ok(match shared.try_hold() {
            Some(held) => next_batch(&held, pos, max),
            None => Err(std::io::Error::other(CLOSING)),
        });
    }
    spawn_read(shared, pos, max).await
}

/// Reads the next batch after `pos` on the blocking pool (records as their text:
/// the store reads only the fields it indexes).
fn spawn_read(shared: &Arc<Shared>, pos: Pos, max: usize) -> Read {
    let held = shared.try_hold();
    tokio::task::spawn_blocking(move || match held {
        Some(shared) => next_batch(&shared, pos, max),
        None => Err(std::io::Error::other(CLOSING)),
    })
}

/// Runs until the sink stops and everything committed is drained (or it is told to
/// stop while the store is down).
///
/// Pipelined when behind: while a full batch is being written to the store, the
/// next one is read (and decoded) from the spool, and a checkpoint is made
/// durable. Keeping up, it lingers so writes start at most every `linger` (every
/// `quiet_linger` while records come slowly). Checkpoints are
/// persisted in order, each after its batch landed, at most every
/// `checkpoint_every` (sooner on reaching a new segment, and at shutdown); the
/// drained position is published after each batch (with the checkpoint while
/// appends are failing).
///
/// `wake` reaches the writer without keeping it alive: a missing active segment is
/// restored by the writer's next round, so the drainer asks for one (an empty
/// flush) rather than waiting for the next record.
///
/// `retries` are requests to offer the quarantine file again: served between two
/// batches (the drainer is the file's only writer, so nothing appends to it
/// meanwhile), at once when idle or lingering; refused at once while the store
/// (or the spool) is failing.
pub async fn run(
    shared: Arc<Shared>,
    store: Arc<dyn EvidenceStore>,
    opts: DrainOptions,
    wake: mpsc::WeakSender<Request>,
    mut retries: mpsc::Receiver<RetryRequest>,
) {
    let mut pos = *lock(&shared.drained);
    let mut backoff = opts.min_backoff;
    // Segments drained before a restart need no new record to be cleaned up.
    if let Some(s) = shared.try_hold() {
        let _ = tokio::task::spawn_blocking(move || delete_drained(&s, pos)).await;
    }
    let mut prefetched: Option<Read> = None;
    let mut checkpoint: Option<tokio::task::JoinHandle<()>> = None;
    // The last position handed to a checkpoint write, and when.
    let mut persisted = pos;
    let mut persisted_at = tokio::time::Instant::now();
    // When the last store write started, or the first record after a pause came
    // (none yet since the drainer started).
    let mut previous_write: Option<tokio::time::Instant> = None;
    loop {
        // Between two batches: nothing is being quarantined.
        while let Ok(request) = retries.try_recv() {
            serve_retry(&shared, store.as_ref(), request).await;
        }
        let notified = shared.committed_notify.notified();
        // A prefetched batch is used only if it holds records: an empty one may
        // predate a commit whose notification came before `notified` was armed.
        let early = match prefetched.take() {
            Some(h) => match h.await {
                Ok(Ok((records, next))) if !records.is_empty() => Some((records, next)),
                _ => None,
            },
            None => None,
        };
        let read = match early {
            Some(r) => Ok(Ok(r)),
            None => read(&shared, pos, opts.batch).await,
        };
        let (records, next) = match read {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "reading the evidence spool failed");
                if e.kind() == std::io::ErrorKind::NotFound
                    && let Some(writer) = wake.upgrade()
                {
                    let _ = writer.try_send(Request::flush());
                }
                *lock(&shared.store_error) = Some(format!("reading the spool: {e}"));
                if wait_or_stop(&shared, backoff, &mut retries).await {
                    finish(checkpoint).await;
                    return;
                }
                backoff = (backoff * 2).min(opts.max_backoff);
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "the spool reader panicked");
                finish(checkpoint).await;
                return;
            }
        };
        if records.is_empty() {
            pos = next;
            // Registered before `stopping` is read, so a shutdown in between is not
            // missed (`notify_waiters` only wakes registered waiters).
            let stop = shared.stop_notify.notified();
            tokio::pin!(stop);
            stop.as_mut().enable();
            let stopping = shared.stopping.load(Ordering::Acquire);
            let pending = persisted != pos;
            if pending
                && (stopping
                    || pos.segment != persisted.segment
                    || persisted_at.elapsed() >= opts.checkpoint_every)
            {
                finish(checkpoint.take()).await;
                persist(&shared, pos, &wake).await;
                (persisted, persisted_at) = (pos, tokio::time::Instant::now());
                continue;
            }
            if stopping {
                finish(checkpoint).await;
                return;
            }
            let due = persisted_at + opts.checkpoint_every;
            tokio::select! {
                () = notified => {
                    // The first record after a pause: the rest of its call (its
                    // End), and other calls, are gathered into the same write.
                    let now = tokio::time::Instant::now();
                    // The rate of the write that follows is measured from here,
                    // not across the pause.
                    previous_write = Some(now);
                    let until = now + opts.linger;
                    linger(&shared, store.as_ref(), until, &mut retries).await;
                }
                () = &mut stop => {}
                () = tokio::time::sleep_until(due), if pending => {}
                Some(request) = retries.recv() => {
                    serve_retry(&shared, store.as_ref(), request).await;
                }
            }
            continue;
        }
        // A full batch means a backlog, and so does one that ends in a sealed
        // segment (records from later segments are committed too: after a restart,
        // one small segment for each process before): read the next one while this
        // one is written, and write it without lingering.
        let backlog = records.len() >= opts.batch || next.segment < lock(&shared.committed).segment;
        if backlog {
            prefetched = Some(spawn_read(&shared, next, opts.batch));
        }
        let write_started = tokio::time::Instant::now();
        let since_previous = previous_write.map(|at| write_started - at);
        previous_write = Some(write_started);
        // Write the batch, retrying from the same position until the store takes it.
        let slice = records
            .len()
            .div_ceil(opts.parallel.max(1))
            .max(opts.min_slice)
            .max(1);
        // Records of this batch (by index) already quarantined, kept across
        // retries so an outage during isolation never quarantines (or counts) one
        // twice.
        let mut kept: HashSet<usize> = HashSet::new();
        loop {
            let writes = records.chunks(slice).map(|c| store.write_encoded(c));
            let mut outcome: Result<(), soulbase_errors::SoulError> =
                futures_util::future::join_all(writes)
                    .await
                    .into_iter()
                    .collect();
            if matches!(&outcome, Err(e) if is_store_refusal(e)) {
                // Retrying would never succeed: write what the store takes and
                // keep what it refuses in the quarantine file.
                outcome = isolate(&shared, store.as_ref(), &records, &mut kept).await;
            }
            let quarantined = kept.len();
            match outcome {
                Ok(()) => {
                    backoff = opts.min_backoff;
                    *lock(&shared.store_error) = None;
                    shared
                        .records_drained
                        .fetch_add((records.len() - quarantined) as u64, Ordering::Relaxed);
                    break;
                }
                Err(e) => {
                    let cause = e.audit().causes.join("; ");
                    tracing::warn!(error = %e, cause, "evidence store write failed; retrying");
                    *lock(&shared.store_error) = Some(format!("{}: {cause}", e.message()));
                    if wait_or_stop(&shared, backoff, &mut retries).await {
                        finish(checkpoint).await;
                        return;
                    }
                    backoff = (backoff * 2).min(opts.max_backoff);
                }
            }
        }
        pos = next;
        // Published now, not with the next checkpoint: readers waiting for the
        // store (listings) go on at once. Not while appends fail: then the
        // checkpoint publishes it, after the segments it frees are retired and the
        // writer has seen the room (see `persist`).
        let broken = shared.broken.load(Ordering::Acquire);
        if !broken {
            shared.set_drained(pos);
            shared.drained_notify.notify_waiters();
        }
        if broken
            || pos.segment != persisted.segment
            || persisted_at.elapsed() >= opts.checkpoint_every
        {
            // The previous checkpoint first (in order), then this one in the background.
            finish(checkpoint.take()).await;
            let s = shared.clone();
            let w = wake.clone();
            checkpoint = Some(tokio::spawn(async move { persist(&s, pos, &w).await }));
            (persisted, persisted_at) = (pos, tokio::time::Instant::now());
        }
        if !backlog {
            let lingers = linger_after(records.len(), since_previous, &opts);
            linger(
                &shared,
                store.as_ref(),
                write_started + lingers,
                &mut retries,
            )
            .await;
        }
    }
}

/// How long the drainer lingers after a store write of `records` records that
/// started `since_previous` after the one before it, or after the first record
/// following a pause (`None`: the first write since the drainer started):
/// [`DrainOptions::quiet_linger`] while records come slower than
/// [`DrainOptions::quiet_rate`] a second, else [`DrainOptions::linger`]. The first
/// record after a pause waits `linger`, so a burst after an idle spell reaches the
/// store as soon as before, and the write after it is timed by the burst's rate.
fn linger_after(records: usize, since_previous: Option<Duration>, opts: &DrainOptions) -> Duration {
    let quiet = since_previous
        .is_some_and(|d| (records as f64) < f64::from(opts.quiet_rate) * d.as_secs_f64());
    if quiet {
        opts.quiet_linger.max(opts.linger)
    } else {
        opts.linger
    }
}

/// Waits until `until` ([`DrainOptions::linger`]), or less: not at all once the
/// sink is stopping or while appends fail (a full disk: the drain's writes free
/// the room refused calls wait for), and no longer once a reader waits for the
/// store ([`Shared::drain_now`]). Requests to offer the quarantine again are
/// served meanwhile.
async fn linger(
    shared: &Arc<Shared>,
    store: &dyn EvidenceStore,
    until: tokio::time::Instant,
    retries: &mut mpsc::Receiver<RetryRequest>,
) {
    // Registered before `stopping` is read (`notify_waiters` only wakes
    // registered waiters).
    let stop = shared.stop_notify.notified();
    tokio::pin!(stop);
    stop.as_mut().enable();
    if shared.stopping.load(Ordering::Acquire) || shared.broken.load(Ordering::Acquire) {
        return;
    }
    tokio::select! {
        () = tokio::time::sleep_until(until) => {}
        () = &mut stop => {}
        () = shared.drain_now.notified() => {}
        Some(request) = retries.recv() => {
            serve_retry(shared, store, request).await;
        }
    }
}

/// Writes `records` to `store` in ever smaller slices until each refused record
/// stands alone; returns those (index in `records`, the store's refusal), in
/// order. An outage is an error, and so is `stop` refusing to go on before a
/// write; what was written is taken again idempotently when the batch is retried.
/// Serves the drain ([`isolate`]) and [`crate::quarantine::requeue`].
pub(crate) async fn write_isolating(
    store: &dyn EvidenceStore,
    records: &[EncodedRecord],
    stop: impl Fn() -> Result<(), soulbase_errors::SoulError>,
) -> Result<Vec<(usize, soulbase_errors::SoulError)>, soulbase_errors::SoulError> {
    let mut refused = Vec::new();
    let mut pending: Vec<std::ops::Range<usize>> = Vec::new();
    pending.push(0..records.len());
    while let Some(range) = pending.pop() {
        stop()?;
        match store.write_encoded(&records[range.clone()]).await {
            Ok(()) => {}
            Err(e) if is_store_refusal(&e) && range.len() > 1 => {
                let mid = range.start + range.len() / 2;
                // Back half first on the stack: the front half is written first.
                pending.push(mid..range.end);
                pending.push(range.start..mid);
            }
            Err(e) if is_store_refusal(&e) => refused.push((range.start, e)),
            Err(e) => return Err(e),
        }
    }
    Ok(refused)
}

/// Writes what the store takes of `records` ([`write_isolating`]) and quarantines
/// each record it refuses, adding their indices to `kept` (a record already there
/// is not written to the file again). An outage meanwhile, or shutdown, returns an
/// error: the caller retries the whole batch later, which the store takes
/// idempotently.
async fn isolate(
    shared: &Arc<Shared>,
    store: &dyn EvidenceStore,
    records: &[EncodedRecord],
    kept: &mut HashSet<usize>,
) -> Result<(), soulbase_errors::SoulError> {
    let stopping = || {
        if shared.stopping.load(Ordering::Acquire) {
            Err(crate::shared::unavailable(
                "stopping while isolating a refused evidence record",
            ))
        } else {
            Ok(())
        }
    };
    for (at, e) in write_isolating(store, records, stopping).await? {
        if kept.contains(&at) {
            continue;
        }
        if !shared.owns_dir() {
            // Quarantined later, in the directory once it is this sink's again.
            return Err(crate::shared::unavailable(
                "the spool directory is missing or not this sink's",
            )
            .with_note(e.to_string()));
        }
        let cause = e.field("reason").unwrap_or(e.message()).to_owned();
        let Some(s) = shared.try_hold() else {
            return Err(crate::shared::unavailable(CLOSING).with_note(e.to_string()));
        };
        let (record, why) = (records[at].clone(), cause.clone());
        let written =
            tokio::task::spawn_blocking(move || segment::quarantine(&s.dir, &record, &why))
                .await
                .map_err(soulbase_errors::SoulError::internal)?;
        if let Err(io) = written {
            return Err(crate::shared::unavailable(
                "a refused evidence record could not be quarantined",
            )
            .with_note(io.to_string()));
        }
        kept.insert(at);
        shared.records_quarantined.fetch_add(1, Ordering::Relaxed);
        let envelope = records[at].head().map(|h| h.id.into_owned()).ok();
        tracing::error!(
            envelope = envelope.as_deref().unwrap_or("(unreadable)"),
            cause,
            "the evidence store refused a record; kept in the spool's quarantine.jsonl"
        );
    }
    Ok(())
}

/// Waits for a checkpoint being persisted, if any.
async fn finish(checkpoint: Option<tokio::task::JoinHandle<()>>) {
    if let Some(h) = checkpoint
        && let Err(e) = h.await
    {
        tracing::error!(error = %e, "checkpoint task failed");
    }
}

/// Persists the checkpoint, deletes what is no longer needed and publishes the
/// drained position.
///
/// Drained segments are retired whether or not the checkpoint could be written:
/// their records are in the store, and a checkpoint that lags behind only makes a
/// restart send again what the store skips. So a drain after a full disk frees
/// space even if the checkpoint cannot be written (it is written in place and
/// needs none, but the spool may have been opened on a full disk before the file
/// existed). When that frees space while appends are failing, the writer checks
/// for room before the position is published, so calls are taken again as soon
/// as the space exists: the first call after reclamation is not refused.
async fn persist(shared: &Arc<Shared>, pos: Pos, wake: &mpsc::WeakSender<Request>) {
    // Not this sink's directory (deleted, or another process's now): no file is
    // written there, but what is in the store is still published as drained.
    // Closing: the sink is gone, and the next start drains from the last checkpoint.
    let held = shared.try_hold().filter(|_| shared.owns_dir());
    if let Some(s) = held {
        let written = tokio::task::spawn_blocking(move || {
            let r = segment::write_checkpoint(&s.dir, pos);
            (r, delete_drained(&s, pos))
        })
        .await;
        match written {
            Ok((r, retired)) => {
                if let Err(e) = r {
                    tracing::error!(error = %e, "could not persist the spool checkpoint");
                }
                if retired && shared.broken.load(Ordering::Acquire) {
                    room_freed(shared, wake).await;
                }
            }
            Err(e) => tracing::error!(error = %e, "checkpoint task failed"),
        }
    }
    shared.set_drained(pos);
    shared.drained_notify.notify_waiters();
}

/// Space was freed while appends were failing: has the writer check for room at
/// once (see [`Shared::room_freed`]) and waits for that round, which clears the
/// refusal if there is room. Nothing is waited for once the sink is closing.
async fn room_freed(shared: &Shared, wake: &mpsc::WeakSender<Request>) {
    shared.room_freed.store(true, Ordering::Release);
    let Some(writer) = wake.upgrade() else {
        return;
    };
    let (ack, done) = tokio::sync::oneshot::channel();
    let probe = Request {
        bytes: Vec::new(),
        kind: Kind::Flush,
        ack: Some(ack),
        submitted: false,
        seq: 0,
    };
    let sent = writer.send(probe).await;
    // Not kept while waiting: the writer must see the channel close once the sink
    // is dropped.
    drop(writer);
    if sent.is_ok() {
        let _ = done.await;
    }
}

/// Sleeps `d` unless the sink is stopping; true when it is. Meanwhile a request
/// to offer the quarantine again is refused at once: the drain is failing (the
/// store is down, or the spool cannot be read), so it could not succeed now.
async fn wait_or_stop(
    shared: &Shared,
    d: Duration,
    retries: &mut mpsc::Receiver<RetryRequest>,
) -> bool {
    let stop = shared.stop_notify.notified();
    tokio::pin!(stop);
    stop.as_mut().enable();
    if shared.stopping.load(Ordering::Acquire) {
        return true;
    }
    let sleep = tokio::time::sleep(d);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            () = &mut sleep => return shared.stopping.load(Ordering::Acquire),
            () = &mut stop => return true,
            Some(request) = retries.recv() => {
                let cause = lock(&shared.store_error).clone().unwrap_or_default();
                let refused = unavailable(
                    "the evidence drain is failing (the store is unavailable or the spool \
                     cannot be read); offer the quarantine again once it recovers",
                )
                .with_note(cause);
                let _ = request.reply.send(Err(refused));
            }
        }
    }
}

/// Offers the quarantine file again for `request` (unless its asker is gone) and
/// answers it.
async fn serve_retry(shared: &Arc<Shared>, store: &dyn EvidenceStore, request: RetryRequest) {
    if request.reply.is_closed() {
        return;
    }
    let answer = retry_quarantine(shared, store).await;
    match &answer {
        Ok(r) => tracing::info!(
            stored = r.stored,
            refused = r.refused.len(),
            unreadable = r.unreadable.len(),
            "the evidence quarantine was offered to the store again"
        ),
        Err(e) => tracing::warn!(error = %e, "offering the evidence quarantine again failed"),
    }
    let _ = request.reply.send(answer);
}

/// [`quarantine::offer`] on this sink's spool, each file operation under a
/// [`crate::shared::Hold`] and only while the directory is still this sink's.
async fn retry_quarantine(
    shared: &Arc<Shared>,
    store: &dyn EvidenceStore,
) -> Result<RequeueReport, soulbase_errors::SoulError> {
    let access = || match shared.try_hold() {
        Some(held) if shared.owns_dir() => Ok(held),
        Some(_) => Err(unavailable(
            "the spool directory is missing or not this sink's",
        )),
        None => Err(unavailable(CLOSING)),
    };
    let stop = || {
        if shared.stopping.load(Ordering::Acquire) {
            Err(unavailable(
                "stopping while offering the quarantine to the store again",
            ))
        } else {
            Ok(())
        }
    };
    quarantine::offer(&shared.dir, store, access, stop).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A quiet drainer (fewer than `quiet_rate` records a second since its last
    /// write) lingers `quiet_linger`; a busier one, and one after its first
    /// write, `linger`; `quiet_linger` never shortens the linger.
    #[test]
    fn a_quiet_drainer_lingers_longer() {
        let opts = DrainOptions::default();
        let (quiet, busy) = (Duration::from_secs(1), Duration::from_millis(250));
        assert_eq!(linger_after(3, None, &opts), busy, "the first write");
        let quarter = Some(Duration::from_millis(250));
        assert_eq!(linger_after(10, quarter, &opts), quiet, "20 calls a second");
        assert_eq!(
            linger_after(500, quarter, &opts),
            busy,
            "1,000 calls a second"
        );
        assert_eq!(linger_after(99, Some(Duration::from_secs(1)), &opts), quiet);
        assert_eq!(linger_after(100, Some(Duration::from_secs(1)), &opts), busy);
        let short = DrainOptions {
            quiet_linger: Duration::ZERO,
            ..DrainOptions::default()
        };
        assert_eq!(linger_after(10, quarter, &short), busy);
    }
}
