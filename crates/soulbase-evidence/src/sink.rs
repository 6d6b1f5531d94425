//! The durable evidence sink: spool first, store second.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{Durable, EvidenceEvent, EvidenceRecord, EvidenceSink, EvidenceStore};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::drain::{self, DrainOptions, RetryRequest};
use crate::quarantine::RequeueReport;
use crate::recovery::{self, RecoveryReport};
use crate::segment::{self, Pos};
use crate::shared::{Accounting, Holds, Kind, Request, Shared, lock, unavailable};
use crate::{frame, writer};

/// When a record counts as recorded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Durability {
    /// `record` returns once the record is fsynced in the spool (group commit): a
    /// Begin is durable before the call executes (a submitted one, of a call that
    /// can change nothing, before its result returns), an End before its result returns.
    #[default]
    Sync,
    /// `record` returns once the record is queued for the spool writer, which
    /// writes what is queued a millisecond at a time ([`SpoolOptions::async_linger`]);
    /// a crash may lose the last few milliseconds of evidence.
    Async,
}

/// How to open a spool.
#[derive(Debug, Clone)]
pub struct SpoolOptions {
    /// The spool directory (created if missing; one process at a time).
    pub dir: PathBuf,
    /// Sync or async durability.
    pub durability: Durability,
    /// Cap on spool bytes; a Begin that would cross it is refused (`EVIDENCE.UNAVAILABLE`).
    pub max_bytes: u64,
    /// Size at which the writer starts a new segment.
    pub segment_bytes: u64,
    /// Room held back per open Begin for its End.
    pub end_reserve: u64,
    /// Bytes of disk kept in a reserve file, released when the disk fills up so that
    /// the Ends of accepted calls can still be written. A Begin is admitted only
    /// while the file is there and covers the End of every open call
    /// (`end_reserve` each): at most `disk_reserve / end_reserve` calls are open at
    /// once (512 with the defaults).
    pub disk_reserve: u64,
    /// Requests queued for the writer before callers wait.
    pub queue: usize,
    /// Longest a submitted Begin waits for a round to take it while its call
    /// runs ([`SUBMITTED_WAIT`](crate::SUBMITTED_WAIT) by default).
    pub submitted_wait: Duration,
    /// With async durability, how long a round nobody waits on gathers more
    /// records before it is written ([`ASYNC_LINGER`](crate::ASYNC_LINGER) by
    /// default); unused with sync durability.
    pub async_linger: Duration,
    /// How long a round callers wait on gathers more when its first request came
    /// less than this after the end of a round that answered two callers or more
    /// ([`BUSY_LINGER`](crate::BUSY_LINGER) by default; zero never).
    pub busy_linger: Duration,
    /// Drainer tuning.
    pub drain: DrainOptions,
}

impl SpoolOptions {
    /// Defaults for `dir`: sync, 1 GiB cap, 16 MiB segments.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            durability: Durability::Sync,
            max_bytes: 1 << 30,
            segment_bytes: 16 << 20,
            end_reserve: 2 << 10,
            disk_reserve: 1 << 20,
            queue: 65_536,
            submitted_wait: writer::SUBMITTED_WAIT,
            async_linger: writer::ASYNC_LINGER,
            busy_linger: writer::BUSY_LINGER,
            drain: DrainOptions::default(),
        }
    }

    /// Sets the durability mode.
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }

    /// Sets the cap (segments shrink to at most an eighth of it).
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.max_bytes = bytes;
        self.segment_bytes = self.segment_bytes.min((bytes / 8).max(4 << 10));
        self
    }

    fn validate(&self) -> Result<(), SoulError> {
        let bad = |field: &str, msg: &str| {
            Err(SoulError::new(ErrorCode::ConfigInvalid, msg.to_owned())
                .with_field("field", field.to_owned()))
        };
        if self.max_bytes < 4 * self.end_reserve.max(1) {
            return bad("evidence.spool_max_bytes", "the spool cap is too small");
        }
        if self.disk_reserve < self.end_reserve.max(1) {
            return bad(
                "disk_reserve",
                "the disk reserve must hold the End of at least one call",
            );
        }
        if self.segment_bytes == 0 {
            return bad("segment_bytes", "must be positive");
        }
        if self.queue == 0 || self.drain.batch == 0 || self.drain.parallel == 0 {
            return bad("queue", "queue and batch sizes must be positive");
        }
        Ok(())
    }
}

/// Most a derived cap ([`default_max_bytes`]) allows: the former fixed default.
const DERIVED_CAP_MAX: u64 = 1 << 30;
/// Least a derived cap allows (the configuration's minimum).
const DERIVED_CAP_MIN: u64 = 1 << 20;
/// Largest segment (the default size, which [`SpoolOptions::max_bytes`] only shrinks).
const SEGMENT_MAX: u64 = 16 << 20;

/// The cap for a spool in `dir` when none is configured: what the volume holding
/// it has free, plus what the spool's files already take (a spool filled by an
/// outage may use its own space), less the disk reserve (`disk_reserve`) and the
/// segments the disk holds beyond the records the cap counts — about four (the
/// zeros ahead of the active one, the next one prepared, two spares), each at most
/// 16 MiB and at most an eighth of the cap — and at most 1 GiB (at least 1 MiB).
/// So on a volume smaller than the cap would be, the cap refuses calls before the
/// disk fills. `dir` need not exist yet (its nearest existing ancestor is measured).
pub fn default_max_bytes(dir: &std::path::Path, disk_reserve: u64) -> std::io::Result<u64> {
    let existing = dir
        .ancestors()
        .find(|p| p.exists())
        .unwrap_or(std::path::Path::new("/"));
    let vfs = rustix::fs::statvfs(existing).map_err(std::io::Error::from)?;
    let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
    let own: u64 = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    let budget = free.saturating_add(own).saturating_sub(disk_reserve);
    // Four segments beyond the cap: 16 MiB each once the cap reaches 128 MiB,
    // else an eighth of it each (cap × 1.5 on the disk).
    let cap = if budget >= 8 * SEGMENT_MAX + 4 * SEGMENT_MAX {
        budget - 4 * SEGMENT_MAX
    } else {
        budget / 3 * 2
    };
    Ok(cap.clamp(DERIVED_CAP_MIN, DERIVED_CAP_MAX))
}

/// A snapshot of the spool's state, for health checks and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpoolStats {
    /// Bytes in the spool (and accepted but not yet written).
    pub disk_bytes: u64,
    /// Bytes held for the Ends of open calls.
    pub reserved_bytes: u64,
    /// Calls whose Begin was accepted and whose End was not yet.
    pub open_calls: usize,
    /// Everything before this is durable in the spool.
    pub committed: Pos,
    /// Everything before this is in the store.
    pub drained: Pos,
    /// Records written to the store by this process.
    pub records_drained: u64,
    /// Records the store refused for good, kept in `quarantine.jsonl` in the spool
    /// directory instead (by this process).
    pub records_quarantined: u64,
    /// Append rounds made durable by this process, each one `write` and one
    /// `fdatasync` of everything queued (group commit): fewer than records under
    /// load, and one per quick call that changes nothing (its Begin is held for
    /// its End's round, see [`SUBMITTED_WAIT`](crate::SUBMITTED_WAIT)).
    pub rounds: u64,
    /// How long the store has been behind the spool: an upper bound on the age of
    /// the oldest record not yet in the store (zero while caught up).
    pub drain_lag: Duration,
    /// The last store failure, `None` once a batch lands again.
    pub store_error: Option<String>,
    /// Whether the last append failed: new calls are refused until a round succeeds
    /// and there is room on the disk again.
    pub broken: bool,
}

struct Inner {
    shared: Arc<Shared>,
    tx: mpsc::Sender<Request>,
    /// Requests to the drainer to offer the quarantine file again.
    retries: mpsc::Sender<RetryRequest>,
    durability: Durability,
    /// How long a held Begin's answer waits before it asks for a round itself.
    submitted_wait: Duration,
    drainer: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Stops the drainer on drop, even after a `shutdown` that was cancelled while
    /// it waited for the drainer.
    drainer_abort: tokio::task::AbortHandle,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// An [`EvidenceSink`] that never loses what it accepted: records go to an
/// append-only spool on disk (group commit), and a drainer ships them to an
/// [`EvidenceStore`] in batches, exactly once, surviving store outages and crashes.
///
/// Cheap to clone. Needs a tokio runtime (the drainer is a task; the writer is a
/// thread of its own).
#[derive(Clone)]
pub struct DurableSink {
    inner: Arc<Inner>,
}

impl DurableSink {
    /// Opens (recovering) the spool and starts the writer and the drainer.
    ///
    /// `EVIDENCE.UNAVAILABLE` when the directory cannot be used or another process
    /// holds it; `CONFIG.INVALID` for bad options.
    pub async fn open(
        options: SpoolOptions,
        store: Arc<dyn EvidenceStore>,
    ) -> Result<(DurableSink, RecoveryReport), SoulError> {
        options.validate()?;
        let opts = options.clone();
        let opened = tokio::task::spawn_blocking(move || prepare(&opts))
            .await
            .map_err(SoulError::internal)??;
        let (lock_file, report, active_file, reserve_made) = opened;
        let lock_id = lock_file
            .metadata()
            .map(|m| segment::identity(&m))
            .map_err(|e| {
                unavailable("the evidence spool cannot be opened").with_note(e.to_string())
            })?;
        let shared = Arc::new(Shared {
            dir: options.dir.clone(),
            max_bytes: options.max_bytes,
            end_reserve: options.end_reserve,
            acct: Mutex::new(Accounting {
                disk: report.disk_bytes,
                ..Accounting::default()
            }),
            committed: Mutex::new(Pos {
                segment: report.active_segment,
                offset: active_file.1,
            }),
            own_from: Pos {
                segment: report.active_segment,
                offset: active_file.1,
            },
            held: Mutex::new(Vec::new()),
            next_seq: AtomicU64::new(1),
            committed_notify: Notify::new(),
            drained: Mutex::new(report.resume_at),
            drained_notify: Notify::new(),
            drain_now: Notify::new(),
            behind_since: Mutex::new(None),
            active: AtomicU64::new(report.active_segment),
            min_pin: AtomicU64::new(u64::MAX),
            // Without its disk reserve (a disk already full at open) the spool
            // takes no Begin: it is in the failed-append state, whose probes make
            // the reserve as soon as there is room (see `writer::room_again`).
            broken: AtomicBool::new(!reserve_made),
            fenced: AtomicBool::new(false),
            lock_id: Mutex::new(lock_id),
            disk_reserve: options.disk_reserve,
            reserve_held: AtomicBool::new(reserve_made),
            store_error: Mutex::new(None),
            records_drained: AtomicU64::new(0),
            records_quarantined: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            sealed: Mutex::new(HashMap::new()),
            // Durable: the directory was synced after recovery (`prepare`).
            spares: Mutex::new(segment::spares(&options.dir).unwrap_or_default()),
            stopping: AtomicBool::new(false),
            stop_notify: Notify::new(),
            holds: Mutex::new(Holds::default()),
            released: Condvar::new(),
            probe_queued: AtomicBool::new(false),
            room_freed: AtomicBool::new(false),
            #[cfg(test)]
            fail_appends: std::sync::atomic::AtomicU32::new(0),
            #[cfg(test)]
            fail_reserve: AtomicBool::new(false),
            #[cfg(test)]
            hold_rounds: AtomicBool::new(false),
        });
        let (tx, rx) = mpsc::channel(options.queue);
        let active = writer::Active {
            file: active_file.0,
            id: report.active_segment,
            len: active_file.1,
            allocated: active_file.2,
            chunk: 0,
        };
        let w_shared = shared.clone();
        let tuning = writer::Tuning {
            segment_bytes: options.segment_bytes,
            submitted_wait: options.submitted_wait,
            async_linger: (options.durability == Durability::Async).then_some(options.async_linger),
            busy_linger: options.busy_linger,
        };
        let writer = std::thread::Builder::new()
            .name("evidence-spool".into())
            .spawn(move || writer::run(w_shared, rx, active, tuning, lock_file))
            .map_err(|e| unavailable("cannot start the spool writer").with_note(e.to_string()))?;
        let (retries, retry_rx) = mpsc::channel(16);
        let drainer = tokio::spawn(drain::run(
            shared.clone(),
            store,
            options.drain,
            tx.downgrade(),
            retry_rx,
        ));
        Ok((
            DurableSink {
                inner: Arc::new(Inner {
                    shared,
                    tx,
                    retries,
                    durability: options.durability,
                    submitted_wait: options.submitted_wait,
                    drainer_abort: drainer.abort_handle(),
                    drainer: Mutex::new(Some(drainer)),
                    writer: Mutex::new(Some(writer)),
                }),
            },
            report,
        ))
    }

    /// Returns once everything recorded before the call is durable in the spool.
    pub async fn flush(&self) -> Result<(), SoulError> {
        let (ack, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Request {
                bytes: Vec::new(),
                kind: Kind::Flush,
                ack: Some(ack),
                submitted: false,
                seq: 0,
            })
            .await
            .map_err(|_| unavailable("the spool writer has stopped"))?;
        rx.await
            .map_err(|_| unavailable("the spool writer has stopped"))?
    }

    /// Flushes, then waits until everything recorded so far is in the store.
    /// `EVIDENCE.UNAVAILABLE` (with the last store error) if that takes longer than `limit`.
    pub async fn wait_drained(&self, limit: Duration) -> Result<(), SoulError> {
        self.flush().await?;
        let target = *lock(&self.inner.shared.committed);
        let shared = &self.inner.shared;
        let reached = tokio::time::timeout(limit, async {
            loop {
                let notified = shared.drained_notify.notified();
                if *lock(&shared.drained) >= target {
                    return;
                }
                // A lingering drainer writes what it has now.
                shared.drain_now.notify_one();
                notified.await;
            }
        })
        .await;
        reached.map_err(|_| {
            let cause = lock(&shared.store_error).clone().unwrap_or_default();
            unavailable("the evidence store has not caught up with the spool").with_note(cause)
        })
    }

    /// Offers the records of this spool's quarantine file (`quarantine.jsonl`) to
    /// the store again, while the sink runs: what the store takes leaves the
    /// file, what it still refuses stays with the reason it gives now, and lines
    /// that cannot be read stay as they are (see [`crate::quarantine`]).
    ///
    /// The drainer does it, with the store it drains into, between two batches:
    /// it is the file's only writer, so nothing is quarantined meanwhile, and the
    /// drain goes on afterwards. The file is rewritten atomically after the store
    /// took what leaves it; a crash at any point loses no record (one may be
    /// offered again, which the store skips). `EVIDENCE.UNAVAILABLE` while the
    /// drain is failing (the store is down: nothing could be stored now), when a
    /// store outage interrupts it (the file stays as it was), once the sink is
    /// shutting down, and when the spool directory is no longer this sink's.
    pub async fn retry_quarantine(&self) -> Result<RequeueReport, SoulError> {
        let (reply, answer) = oneshot::channel();
        self.inner
            .retries
            .send(RetryRequest { reply })
            .await
            .map_err(|_| unavailable("the evidence drainer has stopped"))?;
        answer
            .await
            .map_err(|_| unavailable("the evidence drainer has stopped"))?
    }

    /// The spool's state.
    pub fn stats(&self) -> SpoolStats {
        let s = &self.inner.shared;
        let a = lock(&s.acct);
        SpoolStats {
            disk_bytes: a.disk,
            reserved_bytes: a.reserved,
            open_calls: a.open.len(),
            committed: *lock(&s.committed),
            drained: *lock(&s.drained),
            records_drained: s.records_drained.load(Ordering::Relaxed),
            records_quarantined: s.records_quarantined.load(Ordering::Relaxed),
            rounds: s.rounds.load(Ordering::Relaxed),
            drain_lag: s.drain_lag(),
            store_error: lock(&s.store_error).clone(),
            broken: s.broken.load(Ordering::Acquire),
        }
    }

    /// Stops the drainer after it drains what it can within `limit`; the spool keeps
    /// the rest for the next start. Records already accepted are durable either way.
    pub async fn shutdown(&self, limit: Duration) {
        let drained = self.wait_drained(limit).await;
        if let Err(e) = drained {
            tracing::warn!(error = %e, "shutting down with evidence left in the spool");
        }
        let s = &self.inner.shared;
        s.stopping.store(true, Ordering::Release);
        s.stop_notify.notify_waiters();
        let handle = lock(&self.inner.drainer).take();
        if let Some(h) = handle {
            let _ = h.await;
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.stop_notify.notify_waiters();
        self.drainer_abort.abort();
        // The writer thread ends once the channel closes (after `tx` is dropped with
        // this struct); it acknowledges nothing it has not made durable, and holds
        // the directory lock until it has written everything queued and the
        // drainer's jobs already started have ended (a retirement running on the
        // blocking pool would otherwise race the next sink's recovery).
        let _ = lock(&self.writer).take();
    }
}

/// The lock, the recovery report, the active segment (its file, the length of its
/// data and the file's length, zeros written ahead), and whether the disk reserve
/// is there.
type Prepared = (File, RecoveryReport, (File, u64, u64), bool);

/// Locks the directory, recovers it, creates the checkpoint file (see
/// [`segment::ensure_checkpoint`]), recreates the reserve and opens the active
/// segment, zero-filled ahead of its data.
fn prepare(options: &SpoolOptions) -> Result<Prepared, SoulError> {
    let dir = &options.dir;
    let io = |what: &str, e: std::io::Error| {
        unavailable("the evidence spool cannot be opened")
            .with_field("dir", dir.display().to_string())
            .with_note(format!("{what}: {e}"))
    };
    std::fs::create_dir_all(dir).map_err(|e| io("creating the directory", e))?;
    let lock_file = segment::lock_dir(dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock => {
            unavailable("the evidence spool is in use (another process, or a sink still closing)")
                .with_field("dir", dir.display().to_string())
        }
        _ => io("opening LOCK", e),
    })?;
    let report = recovery::recover(dir)?;
    // Made now, while nothing is queued: from here on every checkpoint is written
    // in place and needs no new space, so a drain after a full disk can always
    // checkpoint. On a disk already full, the drain retires drained segments
    // anyway and makes the file with the first checkpoint after that.
    if let Err(e) = segment::ensure_checkpoint(dir, report.resume_at) {
        tracing::warn!(error = %e, "could not create the spool's checkpoint file yet");
    }
    let reserve_made = segment::ensure_reserve(dir, options.disk_reserve)
        .inspect_err(|e| {
            tracing::warn!(error = %e, "could not create the spool's disk reserve; calls are refused until it can be")
        })
        .is_ok();
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(segment::segment_path(dir, report.active_segment))
        .map_err(|e| io("opening the active segment", e))?;
    let len = file.metadata().map_err(|e| io("stat", e))?.len();
    segment::sync_dir(dir).map_err(|e| io("syncing the directory", e))?;
    let allocated = writer::zero_fill_active(&file, len, options.segment_bytes);
    Ok((lock_file, report, (file, len, allocated), reserve_made))
}

#[async_trait]
impl EvidenceSink for DurableSink {
    async fn record(&self, record: EvidenceRecord) -> Result<(), SoulError> {
        match self.enqueue(record, false).await? {
            Some(rx) => durable(rx).await,
            None => Ok(()),
        }
    }

    /// Queues the Begin and returns: the writer writes it in order with what follows,
    /// and refuses its End if the Begin itself is refused. With sync durability the
    /// Begin is held for the next round without waking the writer (see
    /// [`Shared::held`]); its answer, while awaited, asks for a round of its own
    /// once it has waited `submitted_wait`.
    async fn submit(&self, begin: EvidenceRecord) -> Result<Durable, SoulError> {
        let submitted = matches!(begin.payload, EvidenceEvent::Begin(_));
        Ok(match self.enqueue(begin, submitted).await? {
            Some(rx) if submitted => Box::pin(held_durable(
                rx,
                self.inner.tx.downgrade(),
                self.inner.submitted_wait,
            )),
            Some(rx) => Box::pin(durable(rx)),
            None => Box::pin(std::future::ready(Ok(()))),
        })
    }
}

/// The answer to a held Begin: it comes with the next round, which is the call's
/// End's at the latest. A longer call's answer is awaited while it runs: once it
/// has waited `wait` it asks the writer for a round (a flush nobody waits on), so
/// the Begin of a call still running is durable that much later, as the writer
/// would have held it. Nothing is asked for a call that ends sooner. The wait
/// starts at the first poll: registering its timer wakes the runtime's timer
/// driver when no earlier timer is due (an idle server), so a caller that has no
/// reason to listen before its End is queued (a tool that finished at once)
/// polls it only after.
async fn held_durable(
    mut rx: oneshot::Receiver<Result<(), SoulError>>,
    writer: mpsc::WeakSender<Request>,
    wait: Duration,
) -> Result<(), SoulError> {
    tokio::select! {
        biased;
        answer = &mut rx => return answer.map_err(|_| unavailable("the spool writer has stopped"))?,
        () = tokio::time::sleep(wait) => {}
    }
    // With the sink gone, the writer takes what is held in its last round.
    if let Some(tx) = writer.upgrade() {
        let flush = Request::flush();
        // A full queue means a round is coming anyway.
        if let Err(mpsc::error::TrySendError::Closed(_)) = tx.try_send(flush) {
            return Err(unavailable("the spool writer has stopped"));
        }
    }
    durable(rx).await
}

/// The writer's answer to a queued record.
async fn durable(rx: oneshot::Receiver<Result<(), SoulError>>) -> Result<(), SoulError> {
    rx.await
        .map_err(|_| unavailable("the spool writer has stopped"))?
}

impl DurableSink {
    /// Admits a record against the cap and queues it for the writer; returns the
    /// receiver of the writer's answer in `sync` mode.
    async fn enqueue(
        &self,
        record: EvidenceRecord,
        submitted: bool,
    ) -> Result<Option<oneshot::Receiver<Result<(), SoulError>>>, SoulError> {
        let mut bytes = Vec::with_capacity(1024);
        frame::encode_with(&mut bytes, |out| {
            soulbase_observe::write_record(&record, out)
        })?;
        let kind = match &record.payload {
            EvidenceEvent::Begin(_) => Kind::Begin(record.id.clone()),
            EvidenceEvent::End(e) => Kind::End(e.begin_id.clone()),
            EvidenceEvent::Denied(_) | EvidenceEvent::Conversation(_) => Kind::Other,
        };
        let len = bytes.len() as u64;
        let shared = &self.inner.shared;
        if let Err(refused) = shared.admit(&kind, len) {
            // A probe: the writer's next round checks whether there is room again,
            // so calls come back without waiting for other traffic. One at a time;
            // none for a sink fenced off its directory (it never writes again).
            if shared.broken.load(Ordering::Acquire)
                && !shared.fenced.load(Ordering::Acquire)
                && !shared.probe_queued.swap(true, Ordering::AcqRel)
            {
                let probe = Request::flush();
                if self.inner.tx.try_send(probe).is_err() {
                    shared.probe_queued.store(false, Ordering::Release);
                }
            }
            return Err(refused);
        }
        let (ack, rx) = match self.inner.durability {
            Durability::Sync => {
                let (tx, rx) = oneshot::channel();
                (Some(tx), Some(rx))
            }
            Durability::Async => (None, None),
        };
        let unadmit = match &kind {
            Kind::Begin(id) => Kind::Begin(id.clone()),
            _ => Kind::Other,
        };
        let mut request = Request {
            bytes,
            kind,
            ack,
            submitted,
            seq: 0,
        };
        if submitted && request.ack.is_some() {
            if self.inner.tx.is_closed() {
                shared.unadmit(&unadmit, len);
                return Err(unavailable("the spool writer has stopped"));
            }
            let mut held = lock(&shared.held);
            request.seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
            held.push(request);
            return Ok(rx);
        }
        request.seq = shared.next_seq.fetch_add(1, Ordering::Relaxed);
        // A caller dropped while the queue is full has its admission undone.
        let mut admitted = Admitted {
            shared,
            kind: unadmit,
            len,
            queued: false,
        };
        if self.inner.tx.send(request).await.is_err() {
            return Err(unavailable("the spool writer has stopped"));
        }
        admitted.queued = true;
        Ok(rx)
    }
}

/// A record admitted against the cap ([`Shared::admit`]) on its way to the
/// writer's queue: the admission is undone unless it got there (its caller was
/// dropped while the queue was full, or the writer has stopped). Left undone,
/// the bytes and the open Begin would count against the cap and the disk
/// reserve for as long as the sink lives.
struct Admitted<'a> {
    shared: &'a Shared,
    /// What was admitted (a Begin's id, or `Other`).
    kind: Kind,
    len: u64,
    /// In the queue: the writer accounts for it from here on.
    queued: bool,
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        if !self.queued {
            self.shared.unadmit(&self.kind, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use soulbase_observe::MemoryStore;
    use soulbase_observe::fixtures::{sample_begin, sample_end};

    /// A Begin and its End.
    fn call() -> (EvidenceRecord, EvidenceRecord) {
        let begin = sample_begin();
        let end = sample_end(&begin);
        (begin, end)
    }

    /// A held Begin never goes ahead of a record accepted before it: a round
    /// that takes the Begin takes that record too, and writes them in the order
    /// they were accepted, though the Begin was held and the record sent.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_begin_is_written_after_what_was_accepted_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let (sink, _) =
            DurableSink::open(SpoolOptions::new(dir.path()), Arc::new(MemoryStore::new()))
                .await
                .unwrap();
        let shared = sink.inner.shared.clone();
        // The writer takes its first request and holds the round until all three
        // are queued or held.
        shared.hold_rounds.store(true, Ordering::Release);
        let (first, _) = call();
        let (before, _) = call();
        let (held, _) = call();
        let first_rx = sink.enqueue(first.clone(), false).await.unwrap().unwrap();
        let before_rx = sink.enqueue(before.clone(), false).await.unwrap().unwrap();
        let held_durable = sink.submit(held.clone()).await.unwrap();
        shared.hold_rounds.store(false, Ordering::Release);
        durable(first_rx).await.unwrap();
        durable(before_rx).await.unwrap();
        held_durable.await.unwrap();
        assert_eq!(sink.stats().rounds, 1, "one round took all three");
        let spooled = std::fs::read(segment::segment_path(
            dir.path(),
            shared.active.load(Ordering::Acquire),
        ))
        .unwrap();
        let at = |r: &EvidenceRecord| {
            let id = r.id.to_string();
            spooled
                .windows(id.len())
                .position(|w| w == id.as_bytes())
                .unwrap()
        };
        assert!(at(&first) < at(&before), "in the order accepted");
        assert!(
            at(&before) < at(&held),
            "the held Begin after the record sent before it"
        );
    }

    /// With async durability a round nobody waits on gathers for `async_linger`
    /// before it is written, and what is queued meanwhile wakes nobody: the records
    /// recorded within the linger share one round.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn async_records_queued_within_the_linger_share_one_round() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = SpoolOptions::new(dir.path()).durability(Durability::Async);
        // Far longer than queuing the records takes, even in a debug build on a
        // busy machine.
        let linger = Duration::from_millis(300);
        options.async_linger = linger;
        let (sink, _) = DurableSink::open(options, Arc::new(MemoryStore::new()))
            .await
            .unwrap();
        let started = std::time::Instant::now();
        for _ in 0..20 {
            let (begin, end) = call();
            sink.record(begin).await.unwrap();
            sink.record(end).await.unwrap();
        }
        assert_eq!(
            sink.stats().rounds,
            0,
            "nothing written while the round gathers"
        );
        // Not a flush: a request someone waits on is written without lingering,
        // and a writer thread slow to wake could take it with the first record.
        for _ in 0..3000 {
            if sink.stats().rounds > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(
            started.elapsed() >= linger,
            "the round waited out the linger"
        );
        assert_eq!(sink.stats().rounds, 1, "one round took the 40 records");
        sink.wait_drained(Duration::from_secs(30)).await.unwrap();
        assert_eq!(
            sink.stats().records_drained,
            40,
            "every record reached the store"
        );
    }

    /// A round callers wait on lingers for more only right behind a round that
    /// answered two callers or more, within `busy_linger` of its end: a lone
    /// caller's records, one after another, are written at once; a record right
    /// behind a shared round waits out the linger, and what is queued meanwhile
    /// joins its round.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sync_round_lingers_only_right_behind_a_shared_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = SpoolOptions::new(dir.path());
        // Far longer than writing a record takes, even in a debug build on a busy
        // machine.
        let linger = Duration::from_secs(1);
        options.busy_linger = linger;
        let (sink, _) = DurableSink::open(options, Arc::new(MemoryStore::new()))
            .await
            .unwrap();
        let shared = sink.inner.shared.clone();
        let started = std::time::Instant::now();
        for _ in 0..3 {
            sink.record(call().0).await.unwrap();
        }
        assert!(
            started.elapsed() < linger,
            "a lone caller's rounds never linger"
        );
        assert_eq!(sink.stats().rounds, 3);
        // A round that answers two callers.
        shared.hold_rounds.store(true, Ordering::Release);
        let a = sink.enqueue(call().0, false).await.unwrap().unwrap();
        let b = sink.enqueue(call().0, false).await.unwrap().unwrap();
        shared.hold_rounds.store(false, Ordering::Release);
        durable(a).await.unwrap();
        durable(b).await.unwrap();
        assert_eq!(sink.stats().rounds, 4);
        let started = std::time::Instant::now();
        let behind = tokio::spawn({
            let sink = sink.clone();
            async move { sink.record(call().0).await }
        });
        // Queued while the round of `behind` lingers (or with it).
        sink.record(call().0).await.unwrap();
        behind.await.unwrap().unwrap();
        assert!(started.elapsed() >= linger, "the round behind lingered");
        assert_eq!(
            sink.stats().rounds,
            5,
            "the record queued meanwhile joined it"
        );
    }

    /// A caller dropped while the writer's queue is full leaves nothing behind:
    /// its admission against the cap and the disk reserve is undone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_caller_dropped_while_the_queue_is_full_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let mut options = SpoolOptions::new(dir.path());
        options.queue = 1;
        let (sink, _) = DurableSink::open(options, Arc::new(MemoryStore::new()))
            .await
            .unwrap();
        let shared = sink.inner.shared.clone();
        let accounted = || {
            let a = lock(&shared.acct);
            (a.disk, a.reserved, a.open.len())
        };
        // The writer takes one record and holds its round; one more fills the queue.
        shared.hold_rounds.store(true, Ordering::Release);
        let taken = sink.enqueue(call().0, false).await.unwrap().unwrap();
        let tx = sink.inner.tx.clone();
        tokio::time::timeout(Duration::from_secs(20), async {
            while tx.capacity() != tx.max_capacity() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
        .expect("the writer took the first record");
        let queued = sink.enqueue(call().0, false).await.unwrap().unwrap();
        let before = accounted();
        let stuck = tokio::time::timeout(Duration::from_millis(50), sink.record(call().0)).await;
        assert!(stuck.is_err(), "the record waited for room in the queue");
        assert_eq!(accounted(), before, "its admission was undone");
        shared.hold_rounds.store(false, Ordering::Release);
        durable(taken).await.unwrap();
        durable(queued).await.unwrap();
        let (begin, end) = call();
        sink.record(begin).await.unwrap();
        sink.record(end).await.unwrap();
        assert_eq!(
            sink.stats().reserved_bytes,
            2 * SpoolOptions::new(dir.path()).end_reserve,
            "only the two Begins still open are reserved for"
        );
    }

    /// A full disk: the End of an accepted call is still written (the reserve is
    /// given up for it), new calls are refused while the disk stays full, and they
    /// are accepted again, with the reserve made again, once there is room, without
    /// any other traffic. Nothing accepted is lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sink_refusing_calls_for_a_full_disk_takes_them_again_once_there_is_room() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let (sink, _) = DurableSink::open(SpoolOptions::new(dir.path()), store.clone())
            .await
            .unwrap();
        let shared = sink.inner.shared.clone();
        let reserve = dir.path().join("reserve");
        assert!(reserve.exists());
        let (b1, e1) = call();
        sink.record(b1.clone()).await.unwrap();

        // The disk fills up as the End is written: its round fails, and so does the
        // End tried alone; the reserve is given up and the End lands in its room.
        shared.fail_appends.store(2, Ordering::Release);
        shared.fail_reserve.store(true, Ordering::Release);
        sink.record(e1.clone()).await.unwrap();
        assert!(!reserve.exists(), "the reserve was given up for the End");
        assert!(sink.stats().broken);

        // Still full: Begins are refused, and the probe each one sends changes nothing.
        for _ in 0..2 {
            let refused = sink.record(call().0).await.unwrap_err();
            assert_eq!(refused.code(), ErrorCode::EvidenceUnavailable);
            sink.flush().await.unwrap();
            assert!(sink.stats().broken);
            assert!(!reserve.exists());
        }

        // Room again: refused Begins' probes bring the sink back (one check per
        // 100 ms at most, so it may take another refused Begin or two).
        shared.fail_reserve.store(false, Ordering::Release);
        let back = tokio::time::timeout(Duration::from_secs(20), async {
            while let Err(refused) = sink.record(call().0).await {
                assert_eq!(refused.code(), ErrorCode::EvidenceUnavailable);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(back.is_ok(), "a probe found room and cleared the failure");
        assert!(!sink.stats().broken);
        assert_eq!(
            std::fs::metadata(&reserve).unwrap().len(),
            SpoolOptions::new(dir.path()).disk_reserve
        );
        let (b2, e2) = call();
        sink.record(b2.clone()).await.unwrap();
        sink.record(e2.clone()).await.unwrap();

        sink.wait_drained(Duration::from_secs(20)).await.unwrap();
        let ids: Vec<_> = store.records().into_iter().map(|r| r.id).collect();
        for r in [&b1, &e1, &b2, &e2] {
            assert!(ids.contains(&r.id), "{:?} is in the store", r.payload);
        }
        // And the Begin that was taken when the sink came back (its call left open).
        assert_eq!(ids.len(), 5, "nothing refused reached the store");
    }

    /// An End that cannot be written even with the reserve given up is answered
    /// as pending (`EVIDENCE.UNAVAILABLE`, `end: pending`), never as recorded; it is
    /// kept in memory and lands on its own, with no other traffic, once appends
    /// work again. Meanwhile Begins and denials are refused (the room is for Ends).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_end_that_cannot_be_written_is_answered_pending_and_lands_later() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let (sink, _) = DurableSink::open(SpoolOptions::new(dir.path()), store.clone())
            .await
            .unwrap();
        let shared = sink.inner.shared.clone();
        let (b1, e1) = call();
        sink.record(b1.clone()).await.unwrap();
        // The round, the End alone, and the End after the reserve is given up.
        shared.fail_appends.store(3, Ordering::Release);
        shared.fail_reserve.store(true, Ordering::Release);
        let pending = sink.record(e1.clone()).await.unwrap_err();
        assert_eq!(pending.code(), ErrorCode::EvidenceUnavailable);
        assert_eq!(pending.field("end"), Some("pending"), "{pending:?}");
        assert!(sink.stats().broken);
        assert!(!shared.reserve_held.load(Ordering::Acquire));
        let refused = sink.record(call().0).await.unwrap_err();
        assert_eq!(refused.code(), ErrorCode::EvidenceUnavailable);
        let mut denial = call().0;
        denial.payload = EvidenceEvent::Denied(soulbase_observe::Denial {
            call_id: soulbase_types::CallId::generate(),
            tool: "demo.x.y".into(),
            code: ErrorCode::QuotaRateLimited,
        });
        let refused = sink.record(denial).await.unwrap_err();
        assert_eq!(refused.code(), ErrorCode::EvidenceUnavailable);

        // Appends work again: the End lands on its own (the writer tries it again).
        let landed = tokio::time::timeout(Duration::from_secs(20), async {
            while !store.records().iter().any(|r| r.id == e1.id) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(landed.is_ok(), "the pending End reached the store");
        assert!(store.records().iter().any(|r| r.id == b1.id));
        // And calls are taken again once the reserve can be made.
        shared.fail_reserve.store(false, Ordering::Release);
        let back = tokio::time::timeout(Duration::from_secs(20), async {
            while sink.record(call().0).await.is_err() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(back.is_ok());
        assert!(shared.reserve_held.load(Ordering::Acquire));
    }

    /// A Begin is admitted only while the disk reserve covers the End of every
    /// open call: past `disk_reserve / end_reserve` open calls, Begins are refused
    /// until an End comes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn begins_are_refused_past_the_calls_the_disk_reserve_covers() {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SpoolOptions::new(dir.path());
        opts.disk_reserve = 2 * opts.end_reserve;
        let (sink, _) = DurableSink::open(opts, Arc::new(MemoryStore::new()))
            .await
            .unwrap();
        let (b1, e1) = call();
        sink.record(b1).await.unwrap();
        sink.record(call().0).await.unwrap();
        let refused = sink.record(call().0).await.unwrap_err();
        assert_eq!(refused.code(), ErrorCode::EvidenceUnavailable);
        assert_eq!(refused.field("open_calls"), Some("2"));
        sink.record(e1).await.unwrap();
        sink.record(call().0).await.unwrap();
        assert_eq!(sink.stats().open_calls, 2);
    }

    /// A Begin accepted by `submit` is written in order with what follows it: if
    /// its round fails, its End is refused too — queued in the same round, or
    /// after the failure is known, and a second End as well (a call cancelled while
    /// its End was written sends one) — so no End is ever stored without its
    /// Begin; once the spool takes calls again, a submitted Begin and its End land.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_end_of_a_submitted_begin_that_was_refused_is_refused_too() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MemoryStore::new());
        let (sink, _) = DurableSink::open(SpoolOptions::new(dir.path()), store.clone())
            .await
            .unwrap();
        let shared = sink.inner.shared.clone();

        let mut refused = Vec::new();
        for same_round in [true, false] {
            shared.fail_appends.store(1, Ordering::Release);
            let (b, e) = call();
            let (begin, end) = if same_round {
                // The writer takes the Begin and holds its round until the End is
                // queued behind it.
                shared.hold_rounds.store(true, Ordering::Release);
                let begin = sink.submit(b.clone()).await.unwrap();
                let end = sink.enqueue(e.clone(), false).await.unwrap().unwrap();
                shared.hold_rounds.store(false, Ordering::Release);
                (begin.await, durable(end).await)
            } else {
                let begin = sink.submit(b.clone()).await.unwrap().await;
                (begin, sink.record(e.clone()).await)
            };
            assert_eq!(begin.unwrap_err().code(), ErrorCode::EvidenceUnavailable);
            assert_eq!(end.unwrap_err().code(), ErrorCode::EvidenceUnavailable);
            let again = sink.record(e.clone()).await.unwrap_err();
            assert_eq!(again.code(), ErrorCode::EvidenceUnavailable);
            refused.extend([b.id, e.id]);
            // Calls are refused until a round succeeds with room on the disk.
            let back = tokio::time::timeout(Duration::from_secs(20), async {
                while sink.record(call().0).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await;
            assert!(back.is_ok(), "the spool takes calls again");
        }

        let (b, e) = call();
        let durable = sink.submit(b.clone()).await.unwrap();
        sink.record(e.clone()).await.unwrap();
        durable.await.unwrap();

        sink.wait_drained(Duration::from_secs(20)).await.unwrap();
        let ids: Vec<_> = store.records().into_iter().map(|r| r.id).collect();
        assert!(ids.contains(&b.id) && ids.contains(&e.id));
        for id in &refused {
            assert!(
                !ids.contains(id),
                "a refused call left nothing in the store"
            );
        }
        assert_eq!(
            sink.stats().reserved_bytes,
            2 * SpoolOptions::new(dir.path()).end_reserve,
            "only the two Begins taken on the way back are still open"
        );
    }

    /// A job of the drainer still running on the blocking pool when the sink is
    /// dropped (a retirement, a checkpoint) keeps `LOCK` held until it ends, so a
    /// sink reopened on the directory never recovers it while the job writes there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_writer_keeps_the_lock_until_the_drainers_jobs_end() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SpoolOptions::new(dir.path());
        let (sink, _) = DurableSink::open(opts, Arc::new(MemoryStore::new()))
            .await
            .unwrap();
        sink.flush().await.unwrap();
        let shared = sink.inner.shared.clone();
        let job = shared.try_hold().unwrap();
        drop(sink);
        // Time for the writer to see the channel close and, without the hold, to
        // release the lock (it does within microseconds).
        let until = std::time::Instant::now() + Duration::from_millis(200);
        while std::time::Instant::now() < until {
            let err = segment::lock_dir(dir.path()).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::WouldBlock);
            tokio::task::yield_now().await;
        }
        drop(job);
        let relocked = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match segment::lock_dir(dir.path()) {
                    Ok(file) => return file,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        tokio::task::yield_now().await
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        })
        .await;
        assert!(
            relocked.is_ok(),
            "the writer released LOCK once the job ended"
        );
        assert!(
            shared.try_hold().is_none(),
            "no job starts once the writer is closing"
        );
    }
}
