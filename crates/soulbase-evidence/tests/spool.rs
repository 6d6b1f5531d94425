#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The durable sink against an in-process store: durability, recovery, caps, outages.

use std::os::unix::fs::MetadataExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_evidence::{Durability, DurableSink, SpoolOptions, quarantine};
use soulbase_observe::fixtures::{sample_begin as begin, sample_end as end};
use soulbase_observe::{
    CallEvidence, CallPage, EndStatus, EvidenceEvent, EvidenceQuery, EvidenceRecord, EvidenceSink,
    EvidenceStore, MemoryStore, store_refusal,
};
use soulbase_testkit::volume::{SmallVolume, as_root};
use soulbase_types::{CallId, EnvelopeId, TenantId, UnixMillis};

/// A store in front of a [`MemoryStore`] that can be switched down, and that can
/// lose its acknowledgement after writing (the batch landed, the reply did not).
#[derive(Default)]
struct Flaky {
    inner: MemoryStore,
    down: AtomicBool,
    lose_acks: AtomicUsize,
    writes: AtomicUsize,
    /// Calls of `write_batch`, also while down.
    attempts: AtomicUsize,
    /// Records refused for good (`SCHEMA.VALIDATION_FAILED`), by envelope id.
    refused: std::sync::Mutex<Vec<EnvelopeId>>,
}

#[async_trait]
impl EvidenceStore for Flaky {
    async fn write_batch(&self, records: &[EvidenceRecord]) -> Result<(), SoulError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.down.load(Ordering::SeqCst) {
            return Err(SoulError::of(ErrorCode::EvidenceUnavailable).with_note("down"));
        }
        let refused = self.refused.lock().unwrap().clone();
        if records.iter().any(|r| refused.contains(&r.id)) {
            return Err(store_refusal("refused by the test"));
        }
        self.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.write_batch(records).await?;
        if self
            .lose_acks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(SoulError::of(ErrorCode::EvidenceUnavailable).with_note("ack lost"));
        }
        Ok(())
    }
    async fn call(&self, t: Option<&TenantId>, c: &CallId) -> Result<CallEvidence, SoulError> {
        self.inner.call(t, c).await
    }
    async fn list(&self, q: &EvidenceQuery) -> Result<CallPage, SoulError> {
        self.inner.list(q).await
    }
    async fn list_denials(
        &self,
        q: &EvidenceQuery,
    ) -> Result<soulbase_observe::DenialPage, SoulError> {
        self.inner.list_denials(q).await
    }
    async fn purge_before(&self, c: UnixMillis) -> Result<u64, SoulError> {
        self.inner.purge_before(c).await
    }
}

fn count(store: &MemoryStore) -> (usize, usize, usize) {
    let rs = store.records();
    let b = rs
        .iter()
        .filter(|r| matches!(r.payload, EvidenceEvent::Begin(_)))
        .count();
    let e = rs
        .iter()
        .filter(|r| matches!(r.payload, EvidenceEvent::End(_)))
        .count();
    let aborted = rs
        .iter()
        .filter(|r| matches!(&r.payload, EvidenceEvent::End(e) if e.status == EndStatus::Aborted))
        .count();
    (b, e, aborted)
}

const LIMIT: Duration = Duration::from_secs(20);

/// Opens a sink with the default options in `dir`, draining into `store`.
async fn open_in(dir: &std::path::Path, store: Arc<dyn EvidenceStore>) -> DurableSink {
    DurableSink::open(SpoolOptions::new(dir), store)
        .await
        .unwrap()
        .0
}

/// Opens a sink with `opts` in front of a store that is down (records stay in
/// the spool until the test brings it up).
async fn open_with_store_down(opts: SpoolOptions) -> (DurableSink, Arc<Flaky>) {
    let store = Arc::new(Flaky::default());
    store.down.store(true, Ordering::SeqCst);
    let (sink, _) = DurableSink::open(opts, store.clone()).await.unwrap();
    (sink, store)
}

/// `attempt`'s first outcome other than "the spool is in use": what a caller
/// gets once the previous sink's writer has released the spool (it holds the
/// directory until everything queued is written); fails after [`LIMIT`].
async fn when_released<T>(
    mut attempt: impl AsyncFnMut() -> Result<T, SoulError>,
) -> Result<T, SoulError> {
    let retry = async {
        loop {
            match attempt().await {
                Err(e) if e.message().contains("in use") => tokio::task::yield_now().await,
                done => return done,
            }
        }
    };
    tokio::time::timeout(LIMIT, retry)
        .await
        .expect("the old writer released the spool")
}

/// Opens the spool again once the previous sink has released it.
async fn reopen(
    opts: SpoolOptions,
    store: Arc<dyn EvidenceStore>,
) -> (DurableSink, soulbase_evidence::RecoveryReport) {
    when_released(async || DurableSink::open(opts.clone(), store.clone()).await)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_records_drain_to_the_store_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let (sink, report) = DurableSink::open(SpoolOptions::new(dir.path()), store.clone())
        .await
        .unwrap();
    assert_eq!(report.segments, 0);
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let sink = sink.clone();
        tasks.push(tokio::spawn(async move {
            let b = begin();
            sink.record(b.clone()).await.unwrap();
            sink.record(end(&b)).await.unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (200, 200, 0));
    let stats = sink.stats();
    assert_eq!(stats.open_calls, 0);
    assert_eq!(stats.reserved_bytes, 0);
    assert_eq!(stats.records_drained, 400);
}

/// A call that changes nothing has its Begin submitted (nobody waits on it until
/// the End is recorded): the writer holds it for the End, and both are one round —
/// one `fdatasync`, not two. A submitted Begin with no End coming is made durable
/// on its own once the wait is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_submitted_begin_waits_for_its_end_and_both_are_one_round() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut opts = SpoolOptions::new(dir.path());
    // Far longer than any scheduling delay: the Begin is written only with its End.
    opts.submitted_wait = Duration::from_secs(600);
    let (sink, _) = DurableSink::open(opts, store.clone()).await.unwrap();
    let before = sink.stats().rounds;
    for _ in 0..5 {
        let b = begin();
        let durable = sink.submit(b.clone()).await.unwrap();
        sink.record(end(&b)).await.unwrap();
        durable.await.unwrap();
    }
    assert_eq!(sink.stats().rounds - before, 5, "one round per call");
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (5, 5, 0));

    // The default wait: a lone submitted Begin becomes durable by itself.
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let sink = open_in(dir.path(), store.clone()).await;
    let b = begin();
    let durable = sink.submit(b.clone()).await.unwrap();
    tokio::time::timeout(LIMIT, durable).await.unwrap().unwrap();
    assert_eq!(sink.stats().rounds, 1);
    assert_eq!(sink.stats().open_calls, 1);
    sink.record(end(&b)).await.unwrap();
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (1, 1, 0));
}

/// A submitted Begin is held for the next round, not sent to the writer: nothing
/// is written for it alone while nobody awaits its answer, whatever the wait, and
/// the round of anything recorded next takes it, ahead of that record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_begin_goes_with_the_next_round_ahead_of_it() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut opts = SpoolOptions::new(dir.path());
    opts.submitted_wait = Duration::ZERO;
    let (sink, _) = DurableSink::open(opts, store.clone()).await.unwrap();
    let b = begin();
    let durable = sink.submit(b.clone()).await.unwrap();
    // The writer is not woken for it: without a wait, it would have written the
    // Begin at once (one `fdatasync`, well within the time given here).
    let written = tokio::time::timeout(Duration::from_millis(200), async {
        while sink.stats().rounds == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(written.is_err(), "nothing is written for a held Begin");
    let other = begin();
    sink.record(other.clone()).await.unwrap();
    assert_eq!(sink.stats().rounds, 1);
    durable.await.unwrap();
    sink.record(end(&b)).await.unwrap();
    sink.record(end(&other)).await.unwrap();
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (2, 2, 0));
    // In the spool, the held Begin is ahead of the record that took it.
    let spooled = spool_bytes(dir.path());
    let at = |id: &EnvelopeId| {
        let id = id.to_string();
        spooled
            .windows(id.len())
            .position(|w| w == id.as_bytes())
            .unwrap()
    };
    assert!(at(&b.id) < at(&other.id), "held first");
}

/// Every segment of the spool in `dir`, in order, as one run of bytes.
fn spool_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut segments: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy();
            name.starts_with("seg-") && name.ends_with(".log")
        })
        .collect();
    segments.sort();
    segments
        .iter()
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect()
}

/// A held Begin whose answer nobody awaits (its call was dropped) is still
/// written when the sink goes away: the writer's last round takes it, and the
/// next start closes the call as aborted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_begin_is_written_when_the_sink_goes_away() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = SpoolOptions::new(dir.path());
    opts.submitted_wait = Duration::from_secs(600);
    let (sink, _down) = open_with_store_down(opts.clone()).await;
    let b = begin();
    drop(sink.submit(b.clone()).await.unwrap());
    drop(sink);

    let store = Arc::new(MemoryStore::new());
    let (sink, report) = reopen(opts, store.clone()).await;
    let EvidenceEvent::Begin(begun) = &b.payload else {
        unreachable!()
    };
    assert_eq!(report.aborted, vec![begun.call_id.clone()]);
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_store_refuses_is_quarantined_and_the_drain_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Flaky::default());
    let sink = open_in(dir.path(), store.clone()).await;
    let mut refused_id = None;
    for i in 0..50 {
        let b = begin();
        if i == 17 {
            store.refused.lock().unwrap().push(b.id.clone());
            refused_id = Some(b.id.clone());
        }
        sink.record(b.clone()).await.unwrap();
        sink.record(end(&b)).await.unwrap();
    }
    // Without isolation the batch holding it would be retried forever.
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store.inner), (49, 50, 0));
    let stats = sink.stats();
    assert_eq!(stats.records_quarantined, 1);
    assert_eq!(stats.records_drained, 99);
    assert_eq!(stats.store_error, None);
    // Kept, not lost: the whole record, with the store's reason.
    let text = std::fs::read_to_string(dir.path().join("quarantine.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1);
    let kept: EvidenceRecord = serde_json::from_value(lines[0]["record"].clone()).unwrap();
    assert_eq!(Some(kept.id), refused_id);
    assert_eq!(lines[0]["refused"], "refused by the test");
    // Later records still drain.
    record_calls(&sink, 1).await;
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store.inner), (50, 51, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_closes_orphaned_begins_as_aborted_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, _down) = open_with_store_down(SpoolOptions::new(dir.path())).await;
    let finished = begin();
    sink.record(finished.clone()).await.unwrap();
    sink.record(end(&finished)).await.unwrap();
    let orphan = begin();
    sink.record(orphan.clone()).await.unwrap();
    // "Crash": the process goes away with the store down and one call in flight.
    drop(sink);

    let store = Arc::new(MemoryStore::new());
    let (sink, report) = reopen(SpoolOptions::new(dir.path()), store.clone()).await;
    let EvidenceEvent::Begin(b) = &orphan.payload else {
        unreachable!()
    };
    assert_eq!(report.aborted, vec![b.call_id.clone()]);
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (2, 2, 1));
    let ev = store.call(None, &b.call_id).await.unwrap();
    assert_eq!(ev.ends().count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn segments_zero_filled_ahead_hold_every_record_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    // A next segment left half-prepared by an earlier run, and not zeros: it must
    // never be read nor become a segment as it is.
    let stale = dir.path().join("next-1-0.seg.tmp");
    std::fs::write(&stale, vec![0xAB; 64 << 10]).unwrap();
    let mut opts = SpoolOptions::new(dir.path());
    opts.segment_bytes = 8 << 10;
    let (sink, _down) = open_with_store_down(opts.clone()).await;
    assert!(!stale.exists(), "start-up removes a stale next segment");
    // Many rollovers, most onto segments prepared by the helper thread; the store
    // is down, so every segment stays for recovery to read back.
    record_calls(&sink, 300).await;
    let segments = segment_files(dir.path());
    assert!(segments > 10, "{segments} segments");
    drop(sink);

    let store = Arc::new(MemoryStore::new());
    let (sink, report) = reopen(opts.clone(), store.clone()).await;
    // Every record read back intact (checksummed), nothing torn, nothing open.
    assert_eq!(report.records, 600);
    assert_eq!(report.truncated_bytes, 0);
    assert!(report.aborted.is_empty());
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (300, 300, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_segment_found_at_a_start_is_zero_filled_before_the_first_call() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SpoolOptions::new(dir.path());
    let len = |p: &std::path::Path| std::fs::metadata(p).unwrap().len();
    let (sink, _down) = open_with_store_down(opts.clone()).await;
    let active = newest_segment(dir.path());
    let filled = len(&active);
    assert!(filled >= opts.segment_bytes, "{filled} bytes at open");
    // The rounds overwrite those zeros: the file never grows on the commit path.
    record_calls(&sink, 50).await;
    assert_eq!(len(&active), filled);
    drop(sink);

    // Reopened: the zeros after the data are not a torn tail, every record is read
    // back, and the segment the writer goes on with is zero-filled again.
    let store = Arc::new(MemoryStore::new());
    let (sink, report) = reopen(opts.clone(), store.clone()).await;
    assert_eq!(report.records, 100);
    assert_eq!(report.truncated_bytes, 0);
    assert!(report.aborted.is_empty());
    assert!(len(&newest_segment(dir.path())) >= opts.segment_bytes);
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (50, 50, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_reopened_right_after_its_sink_is_dropped_sees_every_accepted_record() {
    let dir = tempfile::tempdir().unwrap();
    let opts = SpoolOptions::new(dir.path()).durability(Durability::Async);
    let (sink, down) = open_with_store_down(opts.clone()).await;
    // Some may still be queued when the sink goes away: the old writer writes them
    // and only then releases the directory, so the reopened spool sees them all.
    record_calls(&sink, 2_000).await;
    drop(sink);
    let (_sink, report) = reopen(opts.clone(), down.clone()).await;
    assert_eq!(report.records, 4_000);
    assert!(report.aborted.is_empty());
    assert_eq!(report.truncated_bytes, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_tail_is_cut_and_intact_records_survive() {
    let dir = tempfile::tempdir().unwrap();
    // A half-written frame after the newest segment's data, where a crash during
    // a round leaves it: the zeros after it are not counted as torn.
    let last = &spool_one_call(dir.path()).await;
    write_after_data(last, &[200, 0, 0, 0, 1, 2, 3, 4, b'{', b'"']);

    let store = Arc::new(MemoryStore::new());
    let (sink, report) = reopen(SpoolOptions::new(dir.path()), store.clone()).await;
    assert_eq!(report.truncated_bytes, 10, "{report:?}");
    assert!(report.aborted.is_empty());
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (1, 1, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_lag_grows_while_the_store_is_behind_and_is_zero_once_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, store) = open_with_store_down(SpoolOptions::new(dir.path())).await;
    assert_eq!(sink.stats().drain_lag, Duration::ZERO);
    record_calls(&sink, 2).await;
    let first = sink.stats().drain_lag;
    assert!(first > Duration::ZERO, "behind while the store is down");
    tokio::task::yield_now().await;
    assert!(
        sink.stats().drain_lag >= first,
        "the lag only grows while behind"
    );
    store.down.store(false, Ordering::SeqCst);
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(sink.stats().drain_lag, Duration::ZERO);
    assert_eq!(sink.stats().records_drained, 4);
}

/// After restarts, a backlog lies in one small segment for each process before:
/// the drainer writes it back to back, segment after segment, not one segment
/// per linger (here a minute, quiet or not; no reader waits for the store to cut
/// it short).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_over_many_segments_is_drained_without_lingering() {
    let dir = tempfile::tempdir().unwrap();
    let down = Arc::new(Flaky::default());
    down.down.store(true, Ordering::SeqCst);
    for _ in 0..5 {
        let (sink, _) = reopen(SpoolOptions::new(dir.path()), down.clone()).await;
        record_calls(&sink, 1).await;
        drop(sink);
    }
    let store = Arc::new(MemoryStore::new());
    let mut opts = SpoolOptions::new(dir.path());
    opts.drain.linger = Duration::from_secs(60);
    opts.drain.quiet_linger = Duration::from_secs(60);
    let (_sink, _) = reopen(opts, store.clone()).await;
    until("the five segments' calls are stored", || {
        count(&store) == (5, 5, 0)
    })
    .await;
}

/// Records `n` calls (a Begin and its End each), one after another.
async fn record_calls(sink: &DurableSink, n: usize) {
    for _ in 0..n {
        let b = begin();
        sink.record(b.clone()).await.unwrap();
        sink.record(end(&b)).await.unwrap();
    }
}

/// Spools one call (Begin and End) in `dir` with the store down, lets the sink go,
/// and returns the segment holding it.
async fn spool_one_call(dir: &std::path::Path) -> std::path::PathBuf {
    let (sink, _down) = open_with_store_down(SpoolOptions::new(dir)).await;
    record_calls(&sink, 1).await;
    drop(sink);
    newest_segment(dir)
}

/// The path of the newest spool segment in `dir`.
fn newest_segment(dir: &std::path::Path) -> std::path::PathBuf {
    let mut segs: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segs.sort();
    segs.pop().unwrap()
}

/// Appends a frame holding `payload` after the data of the spool segment at `path`
/// (before its zero-filled tail), as the writer would.
fn append_frame(path: &std::path::Path, payload: &[u8]) {
    const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&CRC.checksum(payload).to_le_bytes());
    frame.extend_from_slice(payload);
    write_after_data(path, &frame);
}

/// Writes `new` over the zeros after the data of the spool segment at `path`.
fn write_after_data(path: &std::path::Path, new: &[u8]) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut at = 0;
    loop {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        if len == 0 {
            break;
        }
        at += 8 + len;
    }
    assert!(bytes[at..at + new.len()].iter().all(|b| *b == 0));
    bytes.splice(at..at + new.len(), new.iter().copied());
    std::fs::write(path, bytes).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_intact_spool_frame_that_is_not_a_record_is_quarantined_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let last = &spool_one_call(dir.path()).await;
    // Checksums intact, contents not records: JSON of another shape, and not JSON.
    append_frame(last, br#"{"not":"a record"}"#);
    append_frame(last, b"garbage");

    let store = Arc::new(MemoryStore::new());
    let (sink, report) = reopen(SpoolOptions::new(dir.path()), store.clone()).await;
    assert_eq!(report.truncated_bytes, 0, "{report:?}");
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (1, 1, 0));
    let stats = sink.stats();
    assert_eq!((stats.records_drained, stats.records_quarantined), (2, 2));
    let text = std::fs::read_to_string(dir.path().join("quarantine.jsonl")).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert_eq!(lines[0]["record"], serde_json::json!({"not": "a record"}));
    assert_eq!(lines[1]["record"], "garbage");
    assert!(
        lines[1]["refused"]
            .as_str()
            .unwrap()
            .contains("not an evidence record"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_refuses_begins_but_never_the_end_of_an_accepted_one() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, store) =
        open_with_store_down(SpoolOptions::new(dir.path()).max_bytes(64 << 10)).await;
    let mut open = Vec::new();
    let refused = loop {
        let b = begin();
        match sink.record(b.clone()).await {
            Ok(()) => open.push(b),
            Err(e) => break e,
        }
        assert!(open.len() < 10_000, "the cap never bit");
    };
    assert_eq!(refused.code(), ErrorCode::EvidenceUnavailable);
    assert!(open.len() > 5);
    // Every accepted Begin still gets its End in, although the spool is "full".
    for b in &open {
        sink.record(end(b)).await.unwrap();
    }
    until("the drainer reports the store down", || {
        sink.stats().store_error.is_some()
    })
    .await;
    assert_eq!(sink.stats().open_calls, 0);
    // The store comes back: everything accepted lands, nothing else.
    store.down.store(false, Ordering::SeqCst);
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store.inner), (open.len(), open.len(), 0));
    // Room again once drained.
    sink.record(begin()).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_resent_after_a_lost_ack_lands_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Flaky::default());
    store.lose_acks.store(2, Ordering::SeqCst);
    let sink = open_in(dir.path(), store.clone()).await;
    record_calls(&sink, 50).await;
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store.inner), (50, 50, 0));
    assert!(store.writes.load(Ordering::SeqCst) >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_mode_and_segment_rotation_delete_drained_segments() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut opts = SpoolOptions::new(dir.path()).durability(Durability::Async);
    opts.segment_bytes = 8 << 10;
    let (sink, _) = DurableSink::open(opts, store.clone()).await.unwrap();
    record_calls(&sink, 500).await;
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store), (500, 500, 0));
    // One more round so the drainer deletes what it finished with (with the
    // checkpoint that follows the drain into a new segment).
    record_calls(&sink, 1).await;
    sink.wait_drained(LIMIT).await.unwrap();
    until("drained segments are deleted", || {
        segment_files(dir.path()) <= 2 && sink.stats().disk_bytes < 32 << 10
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_segments_are_reused_and_their_old_records_never_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = SpoolOptions::new(dir.path());
    opts.segment_bytes = 8 << 10;
    // A checkpoint after every batch: the restart below must resume exactly where
    // the drain stopped (a lagging checkpoint re-sends drained records, which a
    // real store skips but this fresh one would count).
    opts.drain.checkpoint_every = Duration::ZERO;
    let store = Arc::new(Flaky::default());
    let (sink, _) = DurableSink::open(opts.clone(), store.clone())
        .await
        .unwrap();
    record_calls(&sink, 300).await;
    sink.wait_drained(LIMIT).await.unwrap();
    // One more round so the drainer retires what it finished with.
    record_calls(&sink, 1).await;
    sink.wait_drained(LIMIT).await.unwrap();
    let spares = spare_inodes(dir.path());
    assert!((1..=2).contains(&spares.len()), "{} spares", spares.len());
    assert!(sink.stats().disk_bytes < 32 << 10, "{:?}", sink.stats());

    // The store goes down, and records go on until the writer has rolled over onto
    // a spare and written a little into it: what follows in that file was old
    // records unless it was zero-filled.
    store.down.store(true, Ordering::SeqCst);
    let mut fresh = std::collections::HashSet::new();
    let mut on_spare = 0;
    for _ in 0..300 {
        let b = begin();
        let e = end(&b);
        fresh.insert(b.id.clone());
        fresh.insert(e.id.clone());
        sink.record(b).await.unwrap();
        sink.record(e).await.unwrap();
        let active = std::fs::metadata(newest_segment(dir.path())).unwrap().ino();
        if spares.contains(&active) {
            on_spare += 1;
            if on_spare == 2 {
                break;
            }
        }
    }
    assert_eq!(on_spare, 2, "the writer never rolled over onto a spare");
    drop(sink);

    // After a restart exactly the undrained records drain: nothing of the reused
    // segment's old records is read again, and nothing is torn.
    let store = Arc::new(MemoryStore::new());
    let (sink, report) = reopen(opts, store.clone()).await;
    assert_eq!(report.truncated_bytes, 0);
    sink.wait_drained(LIMIT).await.unwrap();
    let pairs = fresh.len() / 2;
    assert_eq!(count(&store), (pairs, pairs, 0));
    assert!(store.records().iter().all(|r| fresh.contains(&r.id)));
}

/// The inode numbers of the spares in `dir`.
fn spare_inodes(dir: &std::path::Path) -> std::collections::HashSet<u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().starts_with("spare-"))
        .map(|e| e.metadata().unwrap().ino())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_process_per_spool() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let _sink = open_in(dir.path(), store.clone()).await;
    let err = DurableSink::open(SpoolOptions::new(dir.path()), store)
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), ErrorCode::EvidenceUnavailable);
    assert!(err.message().contains("in use"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_options_name_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = SpoolOptions::new(dir.path());
    opts.max_bytes = 10;
    let err = DurableSink::open(opts, Arc::new(MemoryStore::new()))
        .await
        .err()
        .unwrap();
    assert_eq!(err.code(), ErrorCode::ConfigInvalid);
    assert_eq!(err.field("field"), Some("evidence.spool_max_bytes"));
}

/// The ids of the segment files in `dir` (`seg-<id>.log`), ascending.
fn segment_ids(dir: &std::path::Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_prefix("seg-")?
                .strip_suffix(".log")?
                .parse()
                .ok()
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// The segment files in `dir` (`seg-*.log`).
fn segment_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().starts_with("seg-"))
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_directory_deleted_while_in_use_is_restored_without_losing_a_record() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let (sink, store) = open_with_store_down(SpoolOptions::new(&spool)).await;
    let mut begins = Vec::new();
    for _ in 0..50 {
        let b = begin();
        sink.record(b.clone()).await.unwrap();
        begins.push(b);
    }
    // Deleted under the running sink while the store is down: the 50 Begins exist
    // only in the writer's open file.
    std::fs::remove_dir_all(&spool).unwrap();
    for b in &begins[..25] {
        sink.record(end(b)).await.unwrap();
    }
    // Acknowledged means back on disk under its name, and the directory locked again.
    assert_eq!(segment_files(&spool), 1);
    let err = DurableSink::open(SpoolOptions::new(&spool), store.clone())
        .await
        .err()
        .unwrap();
    assert!(err.message().contains("in use"), "{err:?}");

    // Deleted again while idle: nothing is written until the next round, which a
    // flush (here: the one `wait_drained` makes) is.
    std::fs::remove_dir_all(&spool).unwrap();
    store.down.store(false, Ordering::SeqCst);
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store.inner), (50, 25, 0));
    for b in &begins[25..] {
        sink.record(end(b)).await.unwrap();
    }
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store.inner), (50, 50, 0));
    let stats = sink.stats();
    assert_eq!(stats.records_drained, 100);
    assert_eq!(stats.store_error, None);
    assert!(!stats.broken);
    // The restored spool recovers like any other: no orphan, nothing re-sent twice.
    drop(sink);
    let (sink, report) = reopen(SpoolOptions::new(&spool), store.clone()).await;
    sink.wait_drained(LIMIT).await.unwrap();
    assert!(report.aborted.is_empty(), "{report:?}");
    assert_eq!(count(&store.inner), (50, 50, 0));
}

/// Polls `done` until it holds, failing after [`LIMIT`].
async fn until(what: &str, done: impl Fn() -> bool) {
    until_within(LIMIT, what, done).await;
}

/// Polls `done` until it holds, failing after `limit`.
async fn until_within(limit: Duration, what: &str, done: impl Fn() -> bool) {
    let waited = tokio::time::timeout(limit, async {
        while !done() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "timed out waiting until {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_segments_with_the_lock_left_in_place_are_restored() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, store) = open_with_store_down(SpoolOptions::new(dir.path())).await;
    let b = begin();
    sink.record(b.clone()).await.unwrap();
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let e = e.unwrap();
        if e.file_name().to_string_lossy().starts_with("seg-") {
            std::fs::remove_file(e.path()).unwrap();
        }
    }
    // The lock this sink holds is still the directory's: the restore keeps it.
    sink.record(end(&b)).await.unwrap();
    assert_eq!(segment_files(dir.path()), 1);
    store.down.store(false, Ordering::SeqCst);
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store.inner), (1, 1, 0));
    assert!(!sink.stats().broken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_sink_restores_its_deleted_segment_when_the_drainer_misses_it() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let (sink, store) = open_with_store_down(SpoolOptions::new(&spool)).await;
    for _ in 0..10 {
        sink.record(begin()).await.unwrap();
    }
    // The drainer holds (some of) those 10 and retries; the next 10 are in the
    // spool only.
    until("the drainer tried the store", || {
        store.attempts.load(Ordering::SeqCst) > 0
    })
    .await;
    for _ in 0..10 {
        sink.record(begin()).await.unwrap();
    }
    std::fs::remove_dir_all(&spool).unwrap();
    // No record and no flush from here: the drainer finds the segment missing and
    // wakes the writer, which puts it back.
    store.down.store(false, Ordering::SeqCst);
    until("all 20 Begins are in the store", || {
        count(&store.inner).0 == 20
    })
    .await;
    assert_eq!(segment_files(&spool), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_whose_deleted_directory_another_process_took_stops_using_it() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let first_store = Arc::new(MemoryStore::new());
    let (first, _) = DurableSink::open(SpoolOptions::new(&spool), first_store.clone())
        .await
        .unwrap();
    std::fs::remove_dir_all(&spool).unwrap();
    let second_store = Arc::new(MemoryStore::new());
    let (second, _) = DurableSink::open(SpoolOptions::new(&spool), second_store.clone())
        .await
        .unwrap();
    // The first sink finds the path locked by the second: it refuses, for good.
    for _ in 0..2 {
        let err = first.record(begin()).await.err().unwrap();
        assert_eq!(err.code(), ErrorCode::EvidenceUnavailable);
        assert!(first.stats().broken);
    }
    // The second spool holds exactly its own records: one open Begin, closed as
    // aborted when it is reopened.
    second.record(begin()).await.unwrap();
    drop(second);
    let (second, report) = reopen(SpoolOptions::new(&spool), second_store.clone()).await;
    second.wait_drained(LIMIT).await.unwrap();
    assert_eq!(report.aborted.len(), 1, "{report:?}");
    assert_eq!(count(&second_store), (1, 1, 1));
    assert_eq!(count(&first_store), (0, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_whose_deleted_lock_another_process_took_refuses_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let first_store = Arc::new(MemoryStore::new());
    let first = open_in(dir.path(), first_store.clone()).await;
    let b = begin();
    first.record(b.clone()).await.unwrap();
    first.record(end(&b)).await.unwrap();
    first.wait_drained(LIMIT).await.unwrap();
    // Only LOCK deleted: a second sink can open the directory while the first runs.
    std::fs::remove_file(dir.path().join("LOCK")).unwrap();
    let second_store = Arc::new(MemoryStore::new());
    let second = open_in(dir.path(), second_store.clone()).await;
    let err = first.record(begin()).await.err().unwrap();
    assert_eq!(err.code(), ErrorCode::EvidenceUnavailable);
    // The refused Begin is nowhere in the directory: reopened, the second spool
    // finds no call left open.
    drop(second);
    let (second, report) = reopen(SpoolOptions::new(dir.path()), second_store.clone()).await;
    second.wait_drained(LIMIT).await.unwrap();
    assert!(report.aborted.is_empty(), "{report:?}");
    assert_eq!(count(&first_store), (1, 1, 0));
}

/// [`quarantine::requeue`] once the sink that used `dir` has released the spool.
async fn requeue_when_released(
    dir: &std::path::Path,
    store: &dyn EvidenceStore,
) -> Result<quarantine::RequeueReport, SoulError> {
    when_released(async || quarantine::requeue(dir, store).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quarantined_records_are_offered_again_once_the_store_takes_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Flaky::default());
    let sink = open_in(dir.path(), store.clone()).await;
    let (mut refused_begin, mut refused_end) = (None, None);
    for i in 0..20 {
        let b = begin();
        let e = end(&b);
        if i == 3 {
            store.refused.lock().unwrap().push(b.id.clone());
            refused_begin = Some(b.id.clone());
        }
        if i == 11 {
            store.refused.lock().unwrap().push(e.id.clone());
            refused_end = Some(e.id.clone());
        }
        sink.record(b).await.unwrap();
        sink.record(e).await.unwrap();
    }
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(count(&store.inner), (19, 19, 0));
    let path = dir.path().join(quarantine::QUARANTINE_FILE);
    let before = std::fs::read_to_string(&path).unwrap();

    // Listing works beside the running sink; offering again does not.
    let entries = quarantine::read(dir.path()).unwrap();
    let ids: Vec<String> = entries
        .iter()
        .map(|e| e.head.as_ref().unwrap().id.clone())
        .collect();
    let (refused_begin, refused_end) = (refused_begin.unwrap(), refused_end.unwrap());
    assert_eq!(
        ids,
        [refused_begin.to_string(), refused_end.to_string()],
        "{entries:?}"
    );
    assert_eq!(entries[0].head.as_ref().unwrap().kind, "begin");
    assert_eq!(entries[1].head.as_ref().unwrap().kind, "end");
    assert_eq!(entries[0].refused, "refused by the test");
    assert_eq!(entries[0].unreadable, None);
    let busy = quarantine::requeue(dir.path(), store.as_ref())
        .await
        .unwrap_err();
    assert_eq!(busy.code(), ErrorCode::EvidenceUnavailable);
    assert!(busy.message().contains("in use"), "{busy:?}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
    drop(sink);

    // The store now takes the End but still refuses the Begin: only the End leaves.
    store
        .refused
        .lock()
        .unwrap()
        .retain(|id| *id == refused_begin);
    let report = requeue_when_released(dir.path(), store.as_ref())
        .await
        .unwrap();
    assert_eq!(report.stored, 1);
    assert_eq!(report.refused.len(), 1, "{report:?}");
    assert_eq!(report.refused[0].0.line, 1);
    assert_eq!(report.refused[0].1, "refused by the test");
    assert!(report.unreadable.is_empty());
    assert_eq!(count(&store.inner), (19, 20, 0));
    let first_line = before.lines().next().unwrap();
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{first_line}\n")
    );

    // And then the Begin: the file goes.
    store.refused.lock().unwrap().clear();
    let report = quarantine::requeue(dir.path(), store.as_ref())
        .await
        .unwrap();
    assert_eq!((report.stored, report.remaining()), (1, 0));
    assert_eq!(count(&store.inner), (20, 20, 0));
    assert!(!path.exists());
    assert!(quarantine::read(dir.path()).unwrap().is_empty());
    // Nothing left to offer: nothing happens.
    let report = quarantine::requeue(dir.path(), store.as_ref())
        .await
        .unwrap();
    assert_eq!(report, quarantine::RequeueReport::default());
    assert!(!path.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_quarantine_lines_stay_and_an_outage_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let last = &spool_one_call(dir.path()).await;
    append_frame(last, br#"{"not":"a record"}"#);
    append_frame(last, b"garbage");
    let store = Arc::new(Flaky::default());
    let (sink, _) = reopen(SpoolOptions::new(dir.path()), store.clone()).await;
    sink.wait_drained(LIMIT).await.unwrap();
    assert_eq!(sink.stats().records_quarantined, 2);
    drop(sink);
    // A record quarantined by an older version, a line that is not UTF-8 (kept
    // byte for byte), then a line torn by a crash.
    let path = dir.path().join(quarantine::QUARANTINE_FILE);
    let kept = begin();
    let line = serde_json::json!({"refused": "an older reason", "record": kept});
    let mut text = std::fs::read(&path).unwrap();
    text.extend_from_slice(format!("{line}\n").as_bytes());
    text.extend_from_slice(b"\xff\xfe not UTF-8\n{\"refused\":\"x\",\"rec");
    std::fs::write(&path, &text).unwrap();

    let entries = quarantine::read(dir.path()).unwrap();
    let lines: Vec<usize> = entries.iter().map(|e| e.line).collect();
    assert_eq!(lines, [1, 2, 3, 4, 5]);
    let unreadable: Vec<bool> = entries.iter().map(|e| e.unreadable.is_some()).collect();
    assert_eq!(unreadable, [true, true, false, true, true], "{entries:?}");
    assert!(
        entries[4]
            .unreadable
            .as_deref()
            .unwrap()
            .starts_with("incomplete"),
        "{entries:?}"
    );
    assert_eq!(entries[2].head.as_ref().unwrap().id, kept.id.to_string());

    // An outage: an error, and the file as it was.
    store.down.store(true, Ordering::SeqCst);
    let down = requeue_when_released(dir.path(), store.as_ref())
        .await
        .unwrap_err();
    assert_eq!(down.code(), ErrorCode::EvidenceUnavailable);
    assert_eq!(std::fs::read(&path).unwrap(), text);

    store.down.store(false, Ordering::SeqCst);
    let report = quarantine::requeue(dir.path(), store.as_ref())
        .await
        .unwrap();
    assert_eq!(report.stored, 1);
    assert!(report.refused.is_empty());
    let left: Vec<usize> = report.unreadable.iter().map(|e| e.line).collect();
    assert_eq!(left, [1, 2, 4, 5]);
    assert!(store.inner.records().iter().any(|r| r.id == kept.id));
    // The unreadable lines stay as they were, in order (the torn one now ended).
    let expected: Vec<u8> = text
        .split(|b| *b == b'\n')
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .flat_map(|(_, l)| l.iter().copied().chain([b'\n']))
        .collect();
    assert_eq!(std::fs::read(&path).unwrap(), expected);
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("quarantine"))
        .collect();
    assert_eq!(names, [quarantine::QUARANTINE_FILE]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_longer_than_a_batch_keeps_exactly_the_refused_lines() {
    let dir = tempfile::tempdir().unwrap();
    let store = Flaky::default();
    let records: Vec<EvidenceRecord> = (0..300).map(|_| begin()).collect();
    let lines: Vec<String> = records
        .iter()
        .map(|r| serde_json::json!({"refused": "r", "record": r}).to_string())
        .collect();
    let path = dir.path().join(quarantine::QUARANTINE_FILE);
    std::fs::write(&path, format!("{}\n", lines.join("\n"))).unwrap();
    // One refused in the first batch of offers, one in the second.
    store
        .refused
        .lock()
        .unwrap()
        .extend([records[3].id.clone(), records[280].id.clone()]);

    let report = quarantine::requeue(dir.path(), &store).await.unwrap();
    assert_eq!(report.stored, 298);
    let refused: Vec<usize> = report.refused.iter().map(|(e, _)| e.line).collect();
    assert_eq!(refused, [4, 281]);
    assert_eq!(count(&store.inner), (298, 0, 0));
    // They stay, with the reason the store gives now.
    let now = |r: &EvidenceRecord| {
        serde_json::json!({"refused": "refused by the test", "record": r}).to_string()
    };
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{}\n{}\n", now(&records[3]), now(&records[280]))
    );
    assert!(lines[3].contains(r#""refused":"r""#));

    // A spool directory that is not there is an error naming it, not an empty list.
    let missing = dir.path().join("nope");
    let e = quarantine::read(&missing).unwrap_err();
    assert_eq!(e.code(), ErrorCode::ConfigInvalid);
    assert!(e.message().contains("nope"), "{e:?}");
    let e = quarantine::requeue(&missing, &store).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::ConfigInvalid);
}

/// The running sink offers its own quarantine again, through its drainer, while
/// calls keep being recorded and drained — one of them refused and quarantined
/// meanwhile: what the store takes leaves the file, what it still refuses stays
/// (line for line when its reason is the same), unreadable lines stay, and
/// nothing the drain quarantines in the meantime is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_sink_offers_its_quarantine_again_beside_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Flaky::default());
    let sink = open_in(dir.path(), store.clone()).await;
    let (mut refused_begin, mut refused_end) = (None, None);
    for i in 0..20 {
        let b = begin();
        let e = end(&b);
        if i == 3 {
            store.refused.lock().unwrap().push(b.id.clone());
            refused_begin = Some(b.id.clone());
        }
        if i == 11 {
            store.refused.lock().unwrap().push(e.id.clone());
            refused_end = Some(e.id.clone());
        }
        sink.record(b).await.unwrap();
        sink.record(e).await.unwrap();
    }
    sink.wait_drained(LIMIT).await.unwrap();
    let (refused_begin, refused_end) = (refused_begin.unwrap(), refused_end.unwrap());
    assert_eq!(count(&store.inner), (19, 19, 0));
    // A line this version cannot read (nothing is being quarantined now).
    let path = dir.path().join(quarantine::QUARANTINE_FILE);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"not a quarantine entry\n").unwrap();
    }
    let first_line = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_owned();

    // The store takes the End now, not the Begin; meanwhile calls go on, and one
    // of them is refused and quarantined by the drain.
    store
        .refused
        .lock()
        .unwrap()
        .retain(|id| *id == refused_begin);
    let late = begin();
    store.refused.lock().unwrap().push(late.id.clone());
    let busy = {
        let sink = sink.clone();
        let late = late.clone();
        tokio::spawn(async move {
            for i in 0..100 {
                if i == 50 {
                    sink.record(late.clone()).await.unwrap();
                    sink.record(end(&late)).await.unwrap();
                }
                record_calls(&sink, 1).await;
            }
        })
    };
    let report = sink.retry_quarantine().await.unwrap();
    busy.await.unwrap();
    assert_eq!(report.stored, 1, "{report:?}");
    assert!(report.rewritten);
    // The Begin refused again (and the late record, if the drain had quarantined
    // it before the retry ran).
    let refused: Vec<(usize, String)> = report
        .refused
        .iter()
        .map(|(e, _)| (e.line, e.head.as_ref().unwrap().id.clone()))
        .collect();
    assert_eq!(refused[0], (1, refused_begin.to_string()), "{report:?}");
    assert!(
        refused[1..]
            .iter()
            .all(|(_, id)| *id == late.id.to_string()),
        "{report:?}"
    );
    assert_eq!(report.refused[0].1, "refused by the test");
    let unreadable: Vec<usize> = report.unreadable.iter().map(|e| e.line).collect();
    assert_eq!(unreadable, [3], "{report:?}");
    sink.wait_drained(LIMIT).await.unwrap();
    assert!(store.inner.records().iter().any(|r| r.id == refused_end));
    assert_eq!(count(&store.inner), (119, 121, 0));

    // The file: the Begin still refused, the unreadable line, and the late
    // record (before or after them, as the drain and the retry went).
    let ids = |entries: &[quarantine::QuarantineEntry]| -> Vec<String> {
        entries
            .iter()
            .filter_map(|e| e.head.as_ref().map(|h| h.id.clone()))
            .collect()
    };
    let entries = quarantine::read(dir.path()).unwrap();
    assert_eq!(entries.len(), 3, "{entries:?}");
    let mut kept = ids(&entries);
    kept.sort();
    let mut expected = vec![refused_begin.to_string(), late.id.to_string()];
    expected.sort();
    assert_eq!(kept, expected);
    assert_eq!(entries.iter().filter(|e| e.unreadable.is_some()).count(), 1);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().any(|l| l == first_line), "{text}");

    // Everything taken now: only the unreadable line stays.
    store.refused.lock().unwrap().clear();
    let report = sink.retry_quarantine().await.unwrap();
    assert_eq!((report.stored, report.remaining()), (2, 1), "{report:?}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "not a quarantine entry\n"
    );
    assert_eq!(count(&store.inner), (121, 121, 0));
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("quarantine"))
        .collect();
    assert_eq!(names, [quarantine::QUARANTINE_FILE]);
    // With nothing to offer, nothing changes.
    std::fs::remove_file(&path).unwrap();
    let report = sink.retry_quarantine().await.unwrap();
    assert_eq!(report, quarantine::RequeueReport::default());
    assert!(!path.exists());
}

/// While the store is down the running sink's retry is refused with
/// `EVIDENCE.UNAVAILABLE` and the file stays as it was; it works once the store
/// is back; and after shutdown it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_sink_refuses_a_retry_while_the_store_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Flaky::default());
    let sink = open_in(dir.path(), store.clone()).await;
    let b = begin();
    store.refused.lock().unwrap().push(b.id.clone());
    sink.record(b.clone()).await.unwrap();
    sink.record(end(&b)).await.unwrap();
    sink.wait_drained(LIMIT).await.unwrap();
    let path = dir.path().join(quarantine::QUARANTINE_FILE);
    let before = std::fs::read(&path).unwrap();
    store.refused.lock().unwrap().clear();

    // Down while idle: the offer itself meets the outage.
    store.down.store(true, Ordering::SeqCst);
    let down = sink.retry_quarantine().await.unwrap_err();
    assert_eq!(down.code(), ErrorCode::EvidenceUnavailable, "{down:?}");
    assert_eq!(std::fs::read(&path).unwrap(), before);
    // Down while draining: the drainer is retrying a batch and answers at once.
    record_calls(&sink, 1).await;
    let answered = tokio::time::timeout(Duration::from_secs(5), sink.retry_quarantine())
        .await
        .expect("answered while the drain retries");
    assert_eq!(answered.unwrap_err().code(), ErrorCode::EvidenceUnavailable);
    assert_eq!(std::fs::read(&path).unwrap(), before);

    store.down.store(false, Ordering::SeqCst);
    sink.wait_drained(LIMIT).await.unwrap();
    let report = sink.retry_quarantine().await.unwrap();
    assert_eq!((report.stored, report.remaining()), (1, 0));
    assert!(!path.exists());
    assert!(store.inner.records().iter().any(|r| r.id == b.id));

    sink.shutdown(LIMIT).await;
    let stopped = sink.retry_quarantine().await.unwrap_err();
    assert_eq!(stopped.code(), ErrorCode::EvidenceUnavailable);
}

/// The checkpoint file of the spool in `dir`: its inode and its text.
fn checkpoint_file(dir: &std::path::Path) -> (u64, String) {
    let path = dir.join("checkpoint");
    let inode = std::fs::metadata(&path)
        .expect("the checkpoint file exists")
        .ino();
    (inode, std::fs::read_to_string(&path).unwrap())
}

/// The checkpoint file exists as soon as the spool is opened (before anything was
/// drained), so no checkpoint ever needs a new file; every checkpoint after that
/// rewrites the same file in place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_file_is_made_at_open_and_rewritten_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(MemoryStore::new());
    let mut opts = SpoolOptions::new(dir.path());
    opts.segment_bytes = 8 << 10;
    let (sink, _) = DurableSink::open(opts.clone(), store.clone())
        .await
        .unwrap();
    let (inode, at_open) = checkpoint_file(dir.path());
    assert_eq!(at_open.len(), 51, "made at its full length: {at_open:?}");
    record_calls(&sink, 200).await;
    sink.wait_drained(LIMIT).await.unwrap();
    // The drained position reaches the file with the next checkpoint (≤ 1 s).
    let drained = sink.stats().drained;
    assert!(drained.segment > 1, "{drained:?}");
    let line = format!("{:020} {:020} ", drained.segment, drained.offset);
    until("the drained position is checkpointed", || {
        checkpoint_file(dir.path()).1.starts_with(&line)
    })
    .await;
    let (same, moved) = checkpoint_file(dir.path());
    assert_eq!(same, inode, "rewritten in place, not replaced");
    assert_eq!(moved.len(), 51, "{moved:?}");
    assert!(!dir.path().join("checkpoint.tmp").exists());
    drop(sink);
    // Reopened, the same file is read and kept: no new file either.
    let (sink, report) = reopen(opts, store.clone()).await;
    assert_eq!(report.resume_at, drained, "{report:?}");
    assert_eq!(checkpoint_file(dir.path()).0, inode);
    drop(sink);
}

/// A spool on a volume that fills up (no checkpoint file before the spool was
/// opened, then not one byte free) while the store is down: calls are refused;
/// once the store is back, the drained segments are reclaimed within 5 s although
/// nothing new can be created on the volume, and the very first call after that
/// is accepted (no stale refusal). Nothing accepted is lost.
#[test]
fn a_full_volume_is_reclaimed_once_the_store_is_back_and_the_next_call_is_taken() {
    as_root(
        "a_full_volume_is_reclaimed_once_the_store_is_back_and_the_next_call_is_taken",
        || on_runtime(full_volume_reclaimed(true)),
    );
}

/// The same with the checkpoint file gone (as for a spool opened on a disk
/// already full, where it cannot be made): the drained segments are reclaimed all
/// the same, and the file is made again once there is room.
#[test]
fn a_full_volume_is_reclaimed_even_without_a_checkpoint_file() {
    as_root(
        "a_full_volume_is_reclaimed_even_without_a_checkpoint_file",
        || on_runtime(full_volume_reclaimed(false)),
    );
}

/// Runs `f` to completion on a runtime like `#[tokio::test]`'s multi-thread one.
fn on_runtime(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f);
}

/// See [`a_full_volume_is_reclaimed_once_the_store_is_back_and_the_next_call_is_taken`];
/// `keep_checkpoint`: false removes the checkpoint file right after open.
async fn full_volume_reclaimed(keep_checkpoint: bool) {
    let volume = SmallVolume::mount("4m");
    let spool = volume.path().join("spool");
    let mut opts = SpoolOptions::new(&spool);
    opts.segment_bytes = 256 << 10;
    opts.drain.max_backoff = Duration::from_millis(250);
    let (sink, store) = open_with_store_down(opts).await;
    assert!(spool.join("checkpoint").exists(), "made at open");
    if !keep_checkpoint {
        std::fs::remove_file(spool.join("checkpoint")).unwrap();
    }

    // Calls until the volume is full and a Begin is refused.
    let mut accepted = 0usize;
    loop {
        let b = begin();
        if let Err(e) = sink.record(b.clone()).await {
            assert_eq!(e.code(), ErrorCode::EvidenceUnavailable, "{e}");
            break;
        }
        sink.record(end(&b)).await.unwrap();
        accepted += 1;
        assert!(accepted < 100_000, "the volume never filled");
    }
    // Every segment before the active one is drained once the store is back, and
    // holds no open call: all of them are reclaimed then.
    let active = *segment_ids(&spool).last().unwrap();
    assert!(segment_ids(&spool).len() > 2, "drained segments to reclaim");
    // Then not one byte left. Begins may still go into zeros written ahead in the
    // active segment (their Ends come once there is room again), and a next
    // segment the writer was zero-filling is given up, its space freed, when a
    // round fails: the volume is filled again until the spool refuses calls with
    // it full to the last byte.
    let mut open = Vec::new();
    let mut full = false;
    for _ in 0..20 {
        volume.fill();
        loop {
            let b = begin();
            match sink.record(b.clone()).await {
                Ok(()) => open.push(b),
                Err(e) => {
                    assert_eq!(e.code(), ErrorCode::EvidenceUnavailable, "{e}");
                    break;
                }
            }
            assert!(open.len() < 100_000, "the volume never filled");
        }
        volume.fill();
        if sink.stats().broken {
            full = true;
            break;
        }
    }
    assert!(full, "the spool refuses calls on the full volume");

    // The store is back: everything drains, the drained segments are freed, and
    // the refusal is lifted with them.
    store.down.store(false, Ordering::SeqCst);
    until_within(
        Duration::from_secs(5),
        "the spool is drained and reclaimed",
        || {
            let s = sink.stats();
            s.drained >= s.committed && segment_ids(&spool).iter().all(|&id| id >= active)
        },
    )
    .await;
    let first = begin();
    sink.record(first.clone())
        .await
        .expect("the first call after reclamation is taken");
    sink.record(end(&first)).await.unwrap();
    assert!(!sink.stats().broken);
    for b in &open {
        sink.record(end(b)).await.unwrap();
    }
    record_calls(&sink, 20).await;
    sink.wait_drained(LIMIT).await.unwrap();
    let n = accepted + open.len() + 21;
    assert_eq!(count(&store.inner), (n, n, 0));
    until("the checkpoint file is there again", || {
        spool.join("checkpoint").exists()
    })
    .await;
    drop(sink);
    drop(volume);
}

/// With no cap configured, the cap derives from the spool volume's free space
/// (plus what the spool already holds), less the disk reserve and the segments
/// held beyond the records: on a small volume the cap, not a full disk, refuses
/// calls first; the space others take on the volume lowers it.
#[test]
fn the_default_cap_derives_from_the_volumes_free_space() {
    as_root(
        "the_default_cap_derives_from_the_volumes_free_space",
        || {
            on_runtime(async {
                let volume = SmallVolume::mount("16m");
                let spool = volume.path().join("spool");
                let reserve = SpoolOptions::new(&spool).disk_reserve;
                let empty = soulbase_evidence::default_max_bytes(&spool, reserve).unwrap();
                // 16 MiB less the reserve, a third of it for the segments beyond.
                let expected = ((16u64 << 20) - reserve) / 3 * 2;
                assert!(
                    empty <= expected && empty + (64 << 10) >= expected,
                    "{empty} for about {expected}"
                );
                // Others' files lower it.
                std::fs::write(volume.path().join("other"), vec![1u8; 4 << 20]).unwrap();
                let less = soulbase_evidence::default_max_bytes(&spool, reserve).unwrap();
                assert!(less + (2 << 20) < empty, "{less} < {empty}");

                // A spool with that cap fills up with calls refused by the cap, before
                // the disk is full: its own files count towards the cap next time.
                let opts = SpoolOptions::new(&spool).max_bytes(less);
                let (sink, store) = open_with_store_down(opts).await;
                let mut accepted = 0usize;
                loop {
                    let b = begin();
                    match sink.record(b.clone()).await {
                        Ok(()) => sink.record(end(&b)).await.unwrap(),
                        Err(e) => {
                            assert_eq!(
                                e.field("spool_max_bytes"),
                                Some(less.to_string().as_str()),
                                "{e}"
                            );
                            break;
                        }
                    }
                    accepted += 1;
                    assert!(accepted < 100_000);
                }
                assert!(!sink.stats().broken, "the disk never filled");
                let again = soulbase_evidence::default_max_bytes(&spool, reserve).unwrap();
                assert!(
                    again + (1 << 20) >= less,
                    "the spool's own files count: {again} vs {less}"
                );
                store.down.store(false, Ordering::SeqCst);
                sink.wait_drained(LIMIT).await.unwrap();
                assert_eq!(count(&store.inner).0, accepted);
                drop(sink);
            })
        },
    );
}

/// At low rates the drainer lingers, so a call's Begin and End (and other calls)
/// reach the store in one write; a reader waiting for the store cuts the linger
/// short, and the drained position is published with each write, not with the
/// next checkpoint. The linger and the checkpoint interval here are a minute, the
/// waits' bound ten seconds: a reader held by either would fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lingering_drainer_gathers_a_call_and_writes_at_once_for_a_waiting_reader() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(Flaky::default());
    let mut opts = SpoolOptions::new(dir.path());
    opts.drain.linger = Duration::from_secs(60);
    opts.drain.checkpoint_every = Duration::from_secs(60);
    let (sink, _) = DurableSink::open(opts, store.clone()).await.unwrap();
    let within = Duration::from_secs(10);

    // The first record after a pause wakes the drainer, which waits for the rest
    // of its call.
    record_calls(&sink, 1).await;
    sink.wait_drained(within).await.unwrap();
    assert_eq!(count(&store.inner), (1, 1, 0));

    // Right after a write (the drainer lingering before the next one): the next
    // call's Begin and End in one store write.
    let writes = store.writes.load(Ordering::SeqCst);
    record_calls(&sink, 1).await;
    sink.wait_drained(within).await.unwrap();
    assert_eq!(count(&store.inner), (2, 2, 0));
    assert_eq!(
        store.writes.load(Ordering::SeqCst),
        writes + 1,
        "the Begin and the End in one store write"
    );

    record_calls(&sink, 3).await;
    sink.wait_drained(within).await.unwrap();
    assert_eq!(count(&store.inner), (5, 5, 0));
    assert_eq!(sink.stats().records_drained, 10);
}
