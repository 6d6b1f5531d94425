#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 27's full-disk drills: a real pipeline over the durable spool on a small
//! tmpfs of its own, draining into a store that is switched off and on in process,
//! 32 concurrent clients. Every call id sent is reconciled against the stored
//! evidence: an `ok` answer always has its durable End; a call refused before
//! execution (`denied`) has no Begin; a call that ran but whose End could not be
//! made durable is answered `error` / `EVIDENCE.UNAVAILABLE` with `executed: true`,
//! and its End lands once there is room — no Begin is ever left open.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::{KEYED, WORK, call};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_evidence::{DurableSink, RecoveryReport, SpoolOptions};
use soulbase_observe::{
    CallEvidence, CallPage, EndStatus, EvidenceEvent, EvidenceQuery, EvidenceRecord, EvidenceStore,
    MemoryStore,
};
use soulbase_testkit::volume::{SmallVolume, as_root};
use soulbase_tools::pipeline::{CallResult, CallStatus, Invoker, MemoryIdempotency};
use soulbase_types::{CallId, TenantId, UnixMillis};

/// The database: a [`MemoryStore`] that can be switched down (every write fails
/// as an outage, like an unreachable Postgres).
#[derive(Default)]
struct Database {
    inner: MemoryStore,
    down: AtomicBool,
}

#[async_trait]
impl EvidenceStore for Database {
    async fn write_batch(&self, records: &[EvidenceRecord]) -> Result<(), SoulError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(SoulError::of(ErrorCode::EvidenceUnavailable).with_note("database down"));
        }
        self.inner.write_batch(records).await
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

/// Concurrent clients, as in the drill.
const CLIENTS: usize = 32;
/// A client stops after this many refusals in a row (the spool is full).
const REFUSALS_TO_STOP: usize = 5;
/// Most calls one client sends in a phase (the volume fills long before).
const MAX_CALLS_PER_CLIENT: usize = 5_000;
/// Bound on every wait for the spool or the store.
const LIMIT: Duration = Duration::from_secs(30);

/// Spool options on `dir`: the defaults (no cap below the volume: the disk fills
/// first), with segments small enough for a 4 MiB volume.
fn spool_options(dir: &Path) -> SpoolOptions {
    let mut opts = SpoolOptions::new(dir);
    opts.segment_bytes = 256 << 10;
    opts
}

/// Opens the spool, once any earlier sink of it has released it.
async fn open(dir: &Path, db: &Arc<Database>) -> (DurableSink, RecoveryReport) {
    let until = Instant::now() + LIMIT;
    loop {
        match DurableSink::open(spool_options(dir), db.clone()).await {
            Err(e) if e.message().contains("in use") && Instant::now() < until => {
                tokio::task::yield_now().await
            }
            opened => return opened.unwrap(),
        }
    }
}

/// The pipeline over `sink`: a tool that can change nothing (its Begin written
/// while it runs) and a keyed one (its Begin durable before it runs).
fn pipeline(sink: &DurableSink) -> Invoker {
    common::pipeline(
        Arc::new(sink.clone()),
        Arc::new(MemoryIdempotency::new()),
        Duration::from_millis(1),
    )
    .0
}

/// The `n`th call of a client: the plain tool or, every other one, the keyed tool
/// with a key of its own.
fn nth_call(n: usize) -> soulbase_tools::pipeline::ToolCall {
    if n.is_multiple_of(2) {
        call(WORK, n as i64)
    } else {
        let c = call(KEYED, n as i64);
        let key = c.call_id.to_string();
        c.with_idempotency_key(key)
    }
}

/// Runs `CLIENTS` clients until each has been refused `REFUSALS_TO_STOP` times
/// in a row; `on_first_refusal` runs (on a blocking thread) once, as soon as any
/// call is refused, while the clients go on. Returns every answer by call id.
async fn clients_until_refused(
    invoker: &Invoker,
    on_first_refusal: impl FnOnce() + Send + 'static,
) -> HashMap<CallId, CallResult> {
    let refused = Arc::new(tokio::sync::Notify::new());
    let hook = {
        let refused = refused.clone();
        tokio::spawn(async move {
            refused.notified().await;
            tokio::task::spawn_blocking(on_first_refusal).await.unwrap();
        })
    };
    let mut tasks = Vec::new();
    for client in 0..CLIENTS {
        let (invoker, refused) = (invoker.clone(), refused.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            let mut in_a_row = 0;
            for n in 0..MAX_CALLS_PER_CLIENT {
                let r = invoker
                    .invoke(nth_call(client * MAX_CALLS_PER_CLIENT + n))
                    .await;
                if r.status == CallStatus::Denied {
                    refused.notify_one();
                    in_a_row += 1;
                } else {
                    in_a_row = 0;
                }
                answers.push(r);
                if in_a_row >= REFUSALS_TO_STOP {
                    return answers;
                }
            }
            panic!("client {client}: the volume never filled");
        }));
    }
    let mut all = HashMap::new();
    for t in tasks {
        for r in t.await.unwrap() {
            all.insert(r.call_id.clone(), r);
        }
    }
    // The hook has run once a call was refused (every client was).
    tokio::time::timeout(LIMIT, hook).await.unwrap().unwrap();
    all
}

/// Calls until one is answered `ok`, within `bound` of `since`; returns how long
/// that took. Refusals meanwhile are kept in `answers` (to be reconciled too).
async fn first_ok_within(
    invoker: &Invoker,
    since: Instant,
    bound: Duration,
    answers: &mut HashMap<CallId, CallResult>,
) -> Duration {
    let mut n = 0;
    loop {
        let r = invoker.invoke(nth_call(1_000_000_000 + n)).await;
        let ok = r.is_ok();
        answers.insert(r.call_id.clone(), r);
        if ok {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < bound,
            "no call accepted within {bound:?} of the database's return"
        );
        n += 1;
        tokio::task::yield_now().await;
    }
}

/// Waits (bounded) until everything in the spool is in the store.
async fn drained(sink: &DurableSink) {
    sink.wait_drained(LIMIT).await.unwrap();
}

/// What the store holds for one call: its Begins and Ends.
#[derive(Default)]
struct Stored {
    begins: usize,
    ends: Vec<EndStatus>,
}

/// Reconciles every answer against the store; returns (ok, denied, pending) counts.
fn reconcile(db: &Database, answers: &HashMap<CallId, CallResult>) -> (usize, usize, usize) {
    let mut stored: HashMap<CallId, Stored> = HashMap::new();
    let records = db.inner.records();
    let begin_ids: std::collections::HashSet<_> = records
        .iter()
        .filter(|r| matches!(r.payload, EvidenceEvent::Begin(_)))
        .map(|r| r.id.clone())
        .collect();
    for r in &records {
        match &r.payload {
            EvidenceEvent::Begin(b) => stored.entry(b.call_id.clone()).or_default().begins += 1,
            EvidenceEvent::End(e) => {
                assert!(begin_ids.contains(&e.begin_id), "an End without its Begin");
                stored
                    .entry(e.call_id.clone())
                    .or_default()
                    .ends
                    .push(e.status)
            }
            EvidenceEvent::Denied(_) | EvidenceEvent::Conversation(_) => {}
        }
    }
    for (id, s) in &stored {
        assert!(answers.contains_key(id), "evidence of a call never sent");
        assert_eq!(s.begins, 1, "{id}: one Begin");
        assert_eq!(s.ends.len(), 1, "{id}: one End, no open Begin");
        assert_ne!(s.ends[0], EndStatus::Aborted, "{id}");
    }
    let (mut ok, mut denied, mut pending) = (0, 0, 0);
    for (id, r) in answers {
        let s = stored.get(id);
        match r.status {
            CallStatus::Ok => {
                ok += 1;
                let s = s.unwrap_or_else(|| panic!("{id} answered ok without evidence"));
                assert_eq!(s.ends, [EndStatus::Ok], "{id}: answered ok");
                assert!(r.evidence_ref.is_some());
            }
            CallStatus::Denied => {
                denied += 1;
                assert!(s.is_none(), "{id}: denied, yet it has a Begin");
                assert_eq!(r.error_code, Some(ErrorCode::EvidenceUnavailable), "{r:?}");
                assert!(r.evidence_ref.is_none());
            }
            CallStatus::Error => {
                // Ran, and its End was not durable when it returned: told so.
                pending += 1;
                assert_eq!(r.error_code, Some(ErrorCode::EvidenceUnavailable), "{r:?}");
                let e = r.error().unwrap();
                assert_eq!(e.field("executed"), Some("true"), "{r:?}");
                assert_eq!(e.field("end"), Some("pending"), "{r:?}");
                assert!(r.output.is_none());
                let s = s.unwrap_or_else(|| panic!("{id}: ran, but no evidence"));
                assert_eq!(s.ends, [EndStatus::Ok], "{id}: its End landed");
            }
        }
    }
    (ok, denied, pending)
}

/// Begins without their End in the store.
fn open_begins(db: &Database) -> usize {
    let records = db.inner.records();
    let ended: std::collections::HashSet<_> = records
        .iter()
        .filter_map(|r| match &r.payload {
            EvidenceEvent::End(e) => Some(e.begin_id.clone()),
            _ => None,
        })
        .collect();
    records
        .iter()
        .filter(|r| matches!(r.payload, EvidenceEvent::Begin(_)) && !ended.contains(&r.id))
        .count()
}

/// One run of drill (a) on a volume of its own.
async fn full_disk_database_down_run(run: usize) {
    let volume = SmallVolume::mount("4m");
    let spool = volume.path().join("spool");
    let db = Arc::new(Database::default());
    db.down.store(true, Ordering::SeqCst);
    let (sink, _) = open(&spool, &db).await;
    let invoker = pipeline(&sink);

    // The database is down; 32 clients until every one is refused. When the first
    // refusal comes, something else takes what room is left on the volume too (the
    // reserve given up for the Ends of running calls included), so that some Ends
    // cannot be written for a while.
    let filler = volume.filler();
    let mut answers = clients_until_refused(&invoker, move || {
        filler();
    })
    .await;
    assert!(sink.stats().broken, "run {run}: the spool refuses calls");
    // While running: nothing is open in the pipeline once the clients are done
    // (every call that ran has its End accepted by the spool, if not yet written).
    assert_eq!(invoker.open_calls(), 0, "run {run}");

    // The database returns: the spool drains, its segments are reclaimed, pending
    // Ends land and calls are accepted again within 1 s.
    let back = Instant::now();
    db.down.store(false, Ordering::SeqCst);
    let took = first_ok_within(&invoker, back, Duration::from_secs(1), &mut answers).await;
    for n in 0..64 {
        let r = invoker.invoke(nth_call(2_000_000_000 + n)).await;
        assert!(
            r.is_ok(),
            "run {run}: {r:?} {:?} {:?}",
            sink.stats(),
            std::fs::read_dir(&spool)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (e.file_name(), e.metadata().unwrap().len())
                })
                .collect::<Vec<_>>()
        );
        answers.insert(r.call_id.clone(), r);
    }
    drained(&sink).await;
    let stats = sink.stats();
    assert_eq!(
        stats.open_calls, 0,
        "run {run}: no open Begin while running"
    );
    assert_eq!(open_begins(&db), 0, "run {run}: no open Begin in the store");
    let (ok, denied, pending) = reconcile(&db, &answers);
    assert!(ok > 0 && denied > 0, "run {run}: {ok} ok, {denied} denied");

    // Restart: recovery finds no Begin to close.
    drop(invoker);
    drop(sink);
    let (sink, report) = open(&spool, &db).await;
    assert!(report.aborted.is_empty(), "run {run}: {report:?}");
    drained(&sink).await;
    assert_eq!(open_begins(&db), 0, "run {run}: none after the restart");
    assert_eq!(reconcile(&db, &answers), (ok, denied, pending));
    println!(
        "run {run}: {ok} ok, {denied} denied, {pending} ran with their End pending; calls back {took:?} after the database"
    );
    drop(sink);
    drop(volume);
}

/// Drill (a): full disk, database down, 32 clients — every `ok` has a durable End,
/// no open Begin while running or after a restart, and once the database returns
/// the spool drains and new calls succeed within 1 s. Five runs.
#[test]
fn a_full_disk_with_the_database_down_never_answers_ahead_of_the_evidence() {
    as_root(
        "a_full_disk_with_the_database_down_never_answers_ahead_of_the_evidence",
        || {
            on_runtime(async {
                for run in 0..5 {
                    full_disk_database_down_run(run).await;
                }
            })
        },
    );
}

/// Drill (b): the spool is opened on a volume with zero bytes free and no
/// checkpoint file (its data filled it while the database was down); once the
/// database returns, the space is reclaimed and calls are accepted within 5 s.
#[test]
fn a_spool_opened_on_a_full_disk_takes_calls_within_5_s_of_the_database() {
    as_root(
        "a_spool_opened_on_a_full_disk_takes_calls_within_5_s_of_the_database",
        || on_runtime(opened_on_a_full_disk()),
    );
}

async fn opened_on_a_full_disk() {
    let volume = SmallVolume::mount("4m");
    let spool = volume.path().join("spool");
    let db = Arc::new(Database::default());
    db.down.store(true, Ordering::SeqCst);
    let (sink, _) = open(&spool, &db).await;
    let invoker = pipeline(&sink);
    let mut answers = clients_until_refused(&invoker, || {}).await;
    drop(invoker);
    drop(sink);

    // Down: no checkpoint yet, and not one byte free.
    let _ = std::fs::remove_file(spool.join("checkpoint"));
    volume.fill();
    let (sink, report) = open(&spool, &db).await;
    assert!(report.aborted.is_empty(), "{report:?}");
    let invoker = pipeline(&sink);
    // What room is left in the pages the spool's files already have is soon
    // used up: calls are refused.
    let mut n = 0;
    loop {
        let r = invoker.invoke(nth_call(n)).await;
        let refused = r.status == CallStatus::Denied;
        answers.insert(r.call_id.clone(), r);
        if refused {
            break;
        }
        n += 1;
        assert!(n < 10_000, "the full volume took every call");
    }

    let back = Instant::now();
    db.down.store(false, Ordering::SeqCst);
    let took = first_ok_within(&invoker, back, Duration::from_secs(5), &mut answers).await;
    drained(&sink).await;
    assert_eq!(open_begins(&db), 0);
    let (ok, denied, pending) = reconcile(&db, &answers);
    assert!(ok > 0 && denied > 0);
    println!("{ok} ok, {denied} denied, {pending} pending; calls back {took:?} after the database");
    drop(invoker);
    drop(sink);
    drop(volume);
}

/// Runs `f` to completion on a multi-thread runtime like `#[tokio::test]`'s.
fn on_runtime(f: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(f);
}
