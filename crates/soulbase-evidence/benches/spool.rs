//! Spool benchmarks (run with `cargo xtask bench -p soulbase-evidence --bench spool`).
//!
//! The evidence an invocation adds is one Begin and one End through the durable
//! sink. Each sample is the time of both `record` calls of one invocation:
//! - `sync`: both fsynced in the spool (group commit) — target p99 ≤ 2 ms;
//! - `async`: both queued for the spool writer — target p99 ≤ 50 µs;
//!
//! with 1 caller and with 32 concurrent callers. The store behind is the in-process
//! `MemoryStore`, so the figures are the spool's alone (the Postgres ingest is
//! measured in `soulbase-store`'s `ingest` bench).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use soulbase_evidence::{Durability, DurableSink, SpoolOptions};
use soulbase_observe::{
    BudgetUsage, EndStatus, EvidenceBegin, EvidenceEnd, EvidenceEvent, EvidenceRecord,
    EvidenceSink, MemoryStore,
};
use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId, ToolId};

fn pair() -> (EvidenceRecord, EvidenceRecord) {
    let call_id = CallId::generate();
    let begin = Envelope::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
        Origin::Llm,
        EvidenceEvent::Begin(EvidenceBegin {
            call_id: call_id.clone(),
            tool_id: ToolId::new("bench.noop.run").unwrap(),
            tool_version: "1.2.3".into(),
            manifest_digest:
                "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0".into(),
            profile_hash: "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
                .into(),
            policy_hash: "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
                .into(),
            config_hash: "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
                .into(),
            args_digest: "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
                .into(),
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
            output_digest: Some(
                "sha256:0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0".into(),
            ),
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
    (begin, end)
}

async fn run(name: &str, durability: Durability, callers: usize, per_caller: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (sink, _) = DurableSink::open(
        SpoolOptions::new(dir.path()).durability(durability),
        Arc::new(MemoryStore::new()),
    )
    .await
    .unwrap();
    // Warm up.
    for _ in 0..200 {
        let (b, e) = pair();
        sink.record(b).await.unwrap();
        sink.record(e).await.unwrap();
    }
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..callers {
        let sink = sink.clone();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::with_capacity(per_caller);
            for _ in 0..per_caller {
                let (b, e) = pair();
                let t = Instant::now();
                sink.record(b).await.unwrap();
                sink.record(e).await.unwrap();
                samples.push(t.elapsed());
            }
            samples
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = started.elapsed();
    let n = all.len();
    soulbase_testkit::report(name, all);
    println!(
        "{:<40} {:.0} invocations/s ({} events/s)",
        "",
        n as f64 / elapsed.as_secs_f64(),
        (2.0 * n as f64 / elapsed.as_secs_f64()) as u64
    );
    sink.wait_drained(Duration::from_secs(60)).await.unwrap();
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        run("sync begin+end, 1 caller", Durability::Sync, 1, 2_000).await;
        run("sync begin+end, 32 callers", Durability::Sync, 32, 300).await;
        run("async begin+end, 1 caller", Durability::Async, 1, 20_000).await;
        run("async begin+end, 32 callers", Durability::Async, 32, 2_000).await;
    });
}
