#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 4's acceptance: a database outage, a SIGKILL, a full spool and two replicas
//! sharing idempotency — each against real databases and a real pipeline.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{KEYED, WORK, call, counts, fresh_postgres_on, open_begins, pipeline, pipeline_gated};
use soulbase_errors::ErrorCode;
use soulbase_evidence::SpoolOptions;
use soulbase_observe::{EndStatus, EvidenceEvent, EvidenceSink, EvidenceStore, MemorySink};
use soulbase_store::{Db, Persistence, SqlIdempotency};
use soulbase_testkit::PgCluster;
use soulbase_tools::pipeline::{CallStatus, MemoryIdempotency};
use soulbase_types::CallId;

async fn run_calls(invoker: &soulbase_tools::pipeline::Invoker, n: usize, wave: usize) {
    for start in (0..n).step_by(wave) {
        let mut tasks = Vec::new();
        for i in start..(start + wave).min(n) {
            let inv = invoker.clone();
            tasks.push(tokio::spawn(async move {
                inv.invoke(call(WORK, i as i64)).await
            }));
        }
        for t in tasks {
            let r = t.await.unwrap();
            assert_eq!(r.status, CallStatus::Ok, "{r:?}");
        }
    }
}

/// Postgres stops in the middle of a run of N calls and comes back: calls go on,
/// and afterwards the database holds exactly N Begins and N Ends, no duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_outage_loses_nothing_and_duplicates_nothing() {
    let cluster = Arc::new(PgCluster::start());
    let (_, url) = fresh_postgres_on(&cluster.url()).await;
    let spool = tempfile::tempdir().unwrap();
    let p = Persistence::open_with(&url, true, SpoolOptions::new(spool.path()))
        .await
        .unwrap();
    let (invoker, executed) = pipeline(
        Arc::new(p.sink.clone()),
        Arc::new(MemoryIdempotency::new()),
        Duration::ZERO,
    );
    run_calls(&invoker, 100, 10).await;

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop_server())
        .await
        .unwrap();
    run_calls(&invoker, 100, 10).await;
    // The drainer has noticed the outage (poll with a deadline).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while p.sink.stats().store_error.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "outage never seen");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_server())
        .await
        .unwrap();
    run_calls(&invoker, 100, 10).await;

    p.sink.wait_drained(Duration::from_secs(60)).await.unwrap();
    assert_eq!(executed.load(Ordering::SeqCst), 300);
    assert_eq!(counts(&p.db).await, (300, 300, 300, 0));
    assert_eq!(open_begins(&p.db).await, 0);
    assert!(p.sink.stats().store_error.is_none());
}

/// With the store down, the spool fills up: new calls are refused with
/// `EVIDENCE.UNAVAILABLE` before execution (the handler counter proves it), and
/// everything accepted reaches the database once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_spool_refuses_calls_before_execution_and_loses_nothing() {
    let cluster = Arc::new(PgCluster::start());
    let (_, url) = fresh_postgres_on(&cluster.url()).await;
    let spool = tempfile::tempdir().unwrap();
    let p = Persistence::open_with(
        &url,
        true,
        SpoolOptions::new(spool.path()).max_bytes(48 << 10),
    )
    .await
    .unwrap();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop_server())
        .await
        .unwrap();
    let (invoker, executed) = pipeline(
        Arc::new(p.sink.clone()),
        Arc::new(MemoryIdempotency::new()),
        Duration::ZERO,
    );
    let mut accepted = 0usize;
    let refused = loop {
        let r = invoker.invoke(call(WORK, accepted as i64)).await;
        if r.status != CallStatus::Ok {
            break r;
        }
        accepted += 1;
        assert!(accepted < 100_000, "the spool never filled");
    };
    assert_eq!(refused.error_code, Some(ErrorCode::EvidenceUnavailable));
    assert!(refused.evidence_ref.is_none());
    assert!(accepted > 10, "{accepted}");
    for i in 0..5 {
        let r = invoker.invoke(call(WORK, i)).await;
        assert_eq!(r.error_code, Some(ErrorCode::EvidenceUnavailable));
    }
    // Nothing ran for the refused calls.
    assert_eq!(executed.load(Ordering::SeqCst), accepted);

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_server())
        .await
        .unwrap();
    p.sink.wait_drained(Duration::from_secs(60)).await.unwrap();
    let n = accepted as i64;
    assert_eq!(counts(&p.db).await, (n, n, n, 0));
    // Drained, the spool has room again.
    assert_eq!(invoker.invoke(call(WORK, 0)).await.status, CallStatus::Ok);
}

/// Two pipeline instances (own pools, own idempotency stores) sharing one Postgres:
/// 50 concurrent same-key calls to a keyed tool execute exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_sharing_postgres_execute_a_keyed_call_once() {
    let (_, url) = fresh_postgres_on(&soulbase_testkit::database_url()).await;
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let db = Db::connect(&url, false).await.unwrap();
        replicas.push(pipeline(
            Arc::new(MemorySink::new()),
            Arc::new(SqlIdempotency::new(db)),
            Duration::from_millis(200),
        ));
    }
    let mut tasks = Vec::new();
    for i in 0..50 {
        let inv = replicas[i % 2].0.clone();
        tasks.push(tokio::spawn(async move {
            inv.invoke(call(KEYED, 7).with_idempotency_key("order-42"))
                .await
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let executions: usize = replicas.iter().map(|(_, n)| n.load(Ordering::SeqCst)).sum();
    assert_eq!(executions, 1);
    assert!(
        results.iter().all(|r| r.status == CallStatus::Ok),
        "{results:?}"
    );
    assert_eq!(results.iter().filter(|r| !r.replayed).count(), 1);
    let output = &results[0].output;
    assert!(results.iter().all(|r| &r.output == output));
}

/// A replica whose key lapsed while its call ran (its lease was not renewed, as
/// through a database outage) and was settled as interrupted by a retry on another
/// replica: when the call finishes, its completion is refused, and it answers and
/// records what the key says — the caller, the retries and the evidence agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_key_was_settled_while_it_ran_answers_the_settled_outcome() {
    let (db, url) = fresh_postgres_on(&soulbase_testkit::database_url()).await;
    let a_sink = MemorySink::new();
    // A: no heartbeat, a short lease, a call that outlives it.
    let (a, a_runs) = pipeline(
        Arc::new(a_sink.clone()),
        Arc::new(
            SqlIdempotency::new(db.clone())
                .with_lease(Duration::from_millis(150))
                .with_evidence(true),
        ),
        Duration::from_millis(800),
    );
    let b_db = Db::connect(&url, false).await.unwrap();
    let (b, b_runs) = pipeline(
        Arc::new(MemorySink::new()),
        Arc::new(SqlIdempotency::new(b_db).with_evidence(true)),
        Duration::ZERO,
    );
    let first = call(KEYED, 1).with_idempotency_key("k-lapsed");
    let a_call = first.call_id.clone();
    let running = tokio::spawn(async move { a.invoke(first).await });
    // A's tool is running once its Begin is recorded.
    while a_sink.records().is_empty() {
        tokio::task::yield_now().await;
    }
    let retry = b
        .invoke(call(KEYED, 1).with_idempotency_key("k-lapsed"))
        .await;
    assert!(retry.replayed, "{retry:?}");
    assert_eq!(retry.error_code, Some(ErrorCode::ProviderUnavailable));
    let answered = running.await.unwrap();
    assert!(answered.replayed, "{answered:?}");
    assert_eq!(answered.error_code, Some(ErrorCode::ProviderUnavailable));
    assert_eq!(answered.error, retry.error);
    assert_eq!(
        (a_runs.load(Ordering::SeqCst), b_runs.load(Ordering::SeqCst)),
        (1, 0)
    );
    // A's spool copy of its End says aborted, as the store does (one End).
    let a_end = a_sink.records().into_iter().find_map(|r| match r.payload {
        EvidenceEvent::End(e) => Some(e.status),
        _ => None,
    });
    assert_eq!(a_end, Some(EndStatus::Aborted));
    let stored = soulbase_store::SqlEvidenceStore::new(db)
        .call(None, &a_call)
        .await
        .unwrap();
    assert_eq!(
        (stored.begins().count(), stored.ends().count()),
        (1, 1),
        "{stored:?}"
    );
    assert!(
        stored
            .ends()
            .all(|r| matches!(&r.payload, EvidenceEvent::End(e) if e.status == EndStatus::Aborted)),
        "{stored:?}"
    );
}

// ---- Crash: the test re-executes its own binary as the process to kill. ----

const CHILD_MODE: &str = "SOULBASE_CRASH_CHILD";
const CHILD_URL: &str = "SOULBASE_CRASH_URL";
const CHILD_SPOOL: &str = "SOULBASE_CRASH_SPOOL";

/// The child side of the crash test. Does nothing unless the crash test started
/// this binary with `SOULBASE_CRASH_CHILD` set: `run` drives calls forever,
/// printing `OK <call id>` for each success; `recover` opens the spool (recovery),
/// drains it and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_child() {
    let Ok(mode) = std::env::var(CHILD_MODE) else {
        return;
    };
    let url = std::env::var(CHILD_URL).unwrap();
    let spool = std::env::var(CHILD_SPOOL).unwrap();
    let p = Persistence::open_with(&url, true, SpoolOptions::new(&spool))
        .await
        .unwrap();
    if mode == "recover" {
        p.sink.wait_drained(Duration::from_secs(60)).await.unwrap();
        println!("RECOVERED {}", p.recovery.aborted.len());
        return;
    }
    let (invoker, _) = pipeline(
        Arc::new(p.sink.clone()),
        Arc::new(MemoryIdempotency::new()),
        Duration::from_millis(15),
    );
    let mut workers = Vec::new();
    for w in 0..8i64 {
        let inv = invoker.clone();
        workers.push(tokio::spawn(async move {
            for i in 0.. {
                let r = inv.invoke(call(WORK, w * 1_000_000 + i)).await;
                if r.status == CallStatus::Ok {
                    use std::io::Write;
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "OK {}", r.call_id);
                    let _ = out.flush();
                }
            }
        }));
    }
    // Killed long before this.
    tokio::time::sleep(Duration::from_secs(120)).await;
}

fn child(mode: &str, url: &str, spool: &std::path::Path) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
        .env(CHILD_MODE, mode)
        .env(CHILD_URL, url)
        .env(CHILD_SPOOL, spool)
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    cmd
}

async fn crash_and_recover(db: Db, url: String) {
    let spool = tempfile::tempdir().unwrap();
    // Run, then SIGKILL mid-run once enough calls have succeeded.
    let mut proc = child("run", &url, spool.path()).spawn().unwrap();
    let stdout = proc.stdout.take().unwrap();
    let seen = tokio::task::spawn_blocking(move || {
        let mut ok = Vec::new();
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            // libtest may print its own "test crash_child ... " before the first line.
            if let Some(id) = line.split("OK ").nth(1) {
                ok.push(id.to_owned());
                if ok.len() == 150 {
                    break;
                }
            }
        }
        ok
    })
    .await
    .unwrap();
    proc.kill().unwrap(); // SIGKILL
    proc.wait().unwrap();
    assert_eq!(seen.len(), 150, "the child stopped before 150 calls");

    // Restart: recovery closes orphans and drains everything.
    let out = child("recover", &url, spool.path()).output().unwrap();
    assert!(out.status.success(), "recovery run failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let aborted: i64 = text
        .lines()
        .find_map(|l| l.split("RECOVERED ").nth(1))
        .unwrap_or_else(|| panic!("no RECOVERED line in: {text}"))
        .trim()
        .parse()
        .unwrap();

    // Every Begin has an End, real or aborted.
    assert_eq!(open_begins(&db).await, 0);
    let (begins, ends, distinct, aborted_rows) = counts(&db).await;
    assert_eq!(begins, ends);
    assert_eq!(begins, distinct);
    assert_eq!(aborted_rows, aborted);
    assert!(begins >= 150);
    // Every call the client saw succeed has its real End.
    let store = soulbase_store::SqlEvidenceStore::new(db.clone());
    for id in &seen {
        let ev = store
            .call(None, &CallId::new(id.clone()).unwrap())
            .await
            .unwrap();
        let ends: Vec<_> = ev
            .ends()
            .map(|r| match &r.payload {
                EvidenceEvent::End(e) => e.status,
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(ends, vec![EndStatus::Ok], "call {id}");
    }
}

/// SIGKILL mid-run with SQLite (the embedded default) behind the spool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loses_nothing_acknowledged_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("evidence.db").display());
    let db = Db::connect(&url, true).await.unwrap();
    crash_and_recover(db, url).await;
}

/// SIGKILL mid-run with Postgres behind the spool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loses_nothing_acknowledged_on_postgres() {
    let (db, url) = fresh_postgres_on(&soulbase_testkit::database_url()).await;
    crash_and_recover(db, url).await;
}

/// The durable sink is an `EvidenceSink` the pipeline takes as is.
#[allow(dead_code)]
fn sink_is_a_sink(p: &Persistence) -> Arc<dyn EvidenceSink> {
    Arc::new(p.sink.clone())
}

/// A keyed call whose database goes down while its tool runs (issue 27): its
/// outcome cannot be stored with its End, so it is answered `EVIDENCE.UNAVAILABLE`
/// with `executed: true` and `end: pending`, never `ok`. Once the database is
/// back the outcome and the End are stored together; a retry of the key replays
/// the call (same call id, not run again), and the evidence holds one Begin and
/// one `ok` End.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_call_ending_during_an_outage_is_completed_when_the_database_returns() {
    let cluster = Arc::new(PgCluster::start());
    let (_, url) = fresh_postgres_on(&cluster.url()).await;
    let spool = tempfile::tempdir().unwrap();
    let p = Persistence::open_with(&url, true, SpoolOptions::new(spool.path()))
        .await
        .unwrap();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let (invoker, executed) = pipeline_gated(
        Arc::new(p.sink.clone()),
        p.idempotency.clone(),
        Duration::ZERO,
        Some(gate.clone()),
    );
    let mut keyed = call(KEYED, 1);
    keyed.idempotency_key = Some("late".into());
    let running = {
        let (inv, c) = (invoker.clone(), keyed.clone());
        tokio::spawn(async move { inv.invoke(c).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while executed.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the keyed call never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.stop_server())
        .await
        .unwrap();
    gate.add_permits(1);
    let first = running.await.unwrap();
    assert_eq!(first.status, CallStatus::Error, "{first:?}");
    assert_eq!(first.error_code, Some(ErrorCode::EvidenceUnavailable));
    let e = first.error().unwrap();
    assert_eq!(e.field("executed"), Some("true"), "{first:?}");
    assert_eq!(e.field("end"), Some("pending"), "{first:?}");
    assert!(first.output.is_none());

    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.start_server())
        .await
        .unwrap();
    // The retry waits for the key (its owner is alive and completes it) and
    // replays the call.
    let again = invoker.invoke(keyed.clone()).await;
    assert_eq!(again.status, CallStatus::Ok, "{again:?}");
    assert!(again.replayed);
    assert_eq!(again.call_id, first.call_id);
    assert_eq!(executed.load(Ordering::SeqCst), 1, "the tool ran once");
    p.sink.wait_drained(Duration::from_secs(30)).await.unwrap();
    assert_eq!(counts(&p.db).await, (1, 1, 1, 0));
    let status: String = match &p.db {
        Db::Postgres(pool) => {
            sqlx::query_scalar("SELECT status FROM evidence WHERE kind = 'end' AND call_id = $1")
                .bind(first.call_id.as_str())
                .fetch_one(pool)
                .await
                .unwrap()
        }
        Db::Sqlite(_) => unreachable!(),
    };
    assert_eq!(status, "ok");
}
