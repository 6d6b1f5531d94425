//! Evidence ingest into Postgres (run with `cargo xtask bench -p soulbase-store --bench ingest`).
//!
//! - `write_batch`: the store alone, batches of 2,000 records (one binary `COPY`
//!   each on Postgres) — sustained events/s, target ≥ 50,000;
//! - end to end: 4 producers record through the durable sink (async mode) while the
//!   drainer ships the spool to Postgres; events/s until everything is in the table;
//! - the same through the embedded SQLite store, for comparison.
//! - the pipeline: invoke latency of a builtin no-op with a `MemorySink` and with
//!   the durable sink in sync and async mode — the difference is what evidence adds.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use soulbase_evidence::{Durability, SpoolOptions};
use soulbase_observe::{
    BudgetUsage, EndStatus, EvidenceBegin, EvidenceEnd, EvidenceEvent, EvidenceRecord,
    EvidenceSink, EvidenceStore, MemorySink,
};
use soulbase_store::{Db, Persistence, SqlEvidenceStore};
use soulbase_tools::pipeline::MemoryIdempotency;
use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId, ToolId};

const H: &str = "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

fn pair() -> [EvidenceRecord; 2] {
    let call_id = CallId::generate();
    let begin = Envelope::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
        Origin::Llm,
        EvidenceEvent::Begin(EvidenceBegin {
            call_id: call_id.clone(),
            tool_id: ToolId::new("bench.noop.run").unwrap(),
            tool_version: "1.2.3".into(),
            manifest_digest: H.into(),
            profile_hash: H.into(),
            policy_hash: H.into(),
            config_hash: H.into(),
            args_digest: H.into(),
            idempotency_key: None,
            calling_skill: None,
            consent: None,
            conversation: None,
            surface: None,
        }),
    );
    let end = Envelope::new(
        begin.tenant.clone(),
        begin.actor.clone(),
        begin.origin,
        EvidenceEvent::End(EvidenceEnd {
            call_id,
            begin_id: begin.id.clone(),
            status: EndStatus::Ok,
            error_code: None,
            output_digest: Some(H.into()),
            side_effects: vec![],
            usage: BudgetUsage {
                calls: 1,
                bytes_in: 20,
                bytes_out: 30,
                cpu_ms: 0,
            },
            duration_us: 12,
            client_requests: Vec::new(),
        }),
    );
    [begin, end]
}

async fn store_alone(db: Db, name: &str) {
    let store = SqlEvidenceStore::new(db);
    let batches: Vec<Vec<EvidenceRecord>> = (0..50)
        .map(|_| (0..1_000).flat_map(|_| pair()).collect())
        .collect();
    store.write_batch(&batches[0]).await.unwrap();
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut events = 0usize;
    for b in &batches[1..] {
        let t = Instant::now();
        store.write_batch(b).await.unwrap();
        samples.push(t.elapsed());
        events += b.len();
    }
    let secs = started.elapsed().as_secs_f64();
    soulbase_testkit::report(&format!("{name} write_batch(2000)"), samples);
    println!("{:<40} {:.0} events/s", "", events as f64 / secs);
    // Two batches at a time, as the drainer writes them.
    let fresh: Vec<Vec<EvidenceRecord>> = (0..50)
        .map(|_| (0..1_000).flat_map(|_| pair()).collect())
        .collect();
    let started = Instant::now();
    for two in fresh.chunks(2) {
        futures_util::future::join_all(two.iter().map(|b| store.write_batch(b)))
            .await
            .into_iter()
            .collect::<Result<Vec<()>, _>>()
            .unwrap();
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{:<40} {:.0} events/s",
        format!("{name} write_batch(2000) x2 concurrent"),
        100_000.0 / secs
    );
}

async fn end_to_end(url: &str, name: &str) {
    let spool = tempfile::tempdir().unwrap();
    let p = Persistence::open_with(
        url,
        true,
        SpoolOptions::new(spool.path()).durability(Durability::Async),
    )
    .await
    .unwrap();
    let producers = 4;
    let per = 25_000;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..producers {
        let sink = p.sink.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..per {
                for r in pair() {
                    sink.record(r).await.unwrap();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    p.sink.wait_drained(Duration::from_secs(300)).await.unwrap();
    let secs = started.elapsed().as_secs_f64();
    let events = producers * per * 2;
    println!(
        "{:<40} {events} events in {secs:.2}s = {:.0} events/s",
        format!("{name} sink → spool → store"),
        events as f64 / secs
    );
}

async fn invoke_latency(sink: Arc<dyn EvidenceSink>, name: &str) {
    let (invoker, _) = common::pipeline(sink, Arc::new(MemoryIdempotency::new()), Duration::ZERO);
    for i in 0..200 {
        invoker.invoke(common::call(common::WORK, i)).await;
    }
    // Enough calls that the run spans several drain rounds (async: ~150 ms), so the
    // p99 is not decided by whether one round happened to fall inside it.
    let mut samples = Vec::new();
    for i in 0..20_000 {
        let t = Instant::now();
        let r = invoker.invoke(common::call(common::WORK, i)).await;
        samples.push(t.elapsed());
        assert!(r.error_code.is_none(), "{r:?}");
    }
    soulbase_testkit::report(name, samples);
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (db, url) = common::fresh_postgres_on(&soulbase_testkit::database_url()).await;
        store_alone(db, "postgres").await;
        let (_, url2) = common::fresh_postgres_on(&soulbase_testkit::database_url()).await;
        end_to_end(&url2, "postgres").await;
        let dir = tempfile::tempdir().unwrap();
        let sqlite = format!("sqlite://{}", dir.path().join("e.db").display());
        store_alone(Db::connect(&sqlite, true).await.unwrap(), "sqlite").await;
        let sqlite2 = format!("sqlite://{}", dir.path().join("e2.db").display());
        end_to_end(&sqlite2, "sqlite").await;

        invoke_latency(Arc::new(MemorySink::new()), "invoke, memory sink").await;
        for (mode, d) in [("sync", Durability::Sync), ("async", Durability::Async)] {
            let spool = tempfile::tempdir().unwrap();
            let p =
                Persistence::open_with(&url, true, SpoolOptions::new(spool.path()).durability(d))
                    .await
                    .unwrap();
            invoke_latency(
                Arc::new(p.sink.clone()),
                &format!("invoke, durable sink {mode}"),
            )
            .await;
            p.sink.wait_drained(Duration::from_secs(60)).await.unwrap();
        }
    });
}
