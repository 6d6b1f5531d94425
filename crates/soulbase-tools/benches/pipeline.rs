//! Pipeline benchmarks (run with `cargo xtask bench -p soulbase-tools --bench pipeline`).
//!
//! Reports percentiles from individually timed operations (not means), and the
//! sustained throughput of in-process invocation on all cores:
//! - preflight of a realistic manifest (10-field input schema, 1,000 policy rules,
//!   a quota check) — target p99 ≤ 20 µs;
//! - registry with 10,000 tools: register, get, list 100 enabled — targets 20 µs,
//!   1 µs, 20 µs;
//! - invoke of a builtin no-op with evidence to an in-memory channel — target
//!   ≥ 100,000 calls/s.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

/// The allocator `soulbased` uses; glibc's malloc spends much of a call's time on
/// frees from another thread (evidence records are dropped by their consumer).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule, QuotaLimit};
use soulbase_observe::ChannelSink;
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{BuiltinExecutor, DeclaredProfiles, LocalSandbox, handler_fn};
use soulbase_tools::pipeline::{Invoker, InvokerBuilder, MemoryIdempotency, ToolCall};
use soulbase_tools::registry::ToolOwner;
use soulbase_tools::{Registry, ToolManifest};
use soulbase_types::{ActorId, Rate, Subject, TenantId, ToolId};

/// CPU time (user + system) this process has used so far, from `/proc/self/stat`.
///
/// Throughput on a shared machine depends on what else runs; CPU per call does not,
/// so the benchmark reports both.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 12th and
    // 13th of them, in clock ticks (100 per second on Linux).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

fn manifest(id: &str) -> ToolManifest {
    let mut props = serde_json::Map::new();
    for i in 0..10 {
        let ty = match i % 3 {
            0 => json!({"type": "string", "maxLength": 200}),
            1 => json!({"type": "integer", "minimum": 0}),
            _ => json!({"type": "boolean"}),
        };
        props.insert(format!("field{i}"), ty);
    }
    let m = json!({
        "id": id,
        "version": "1.2.3",
        "description": "a realistic tool with ten input fields",
        "tags": ["bench", "realistic"],
        "input_schema": {"type": "object", "properties": props, "required": ["field0", "field1"]},
        "output_schema": {"type": "object"},
        "side_effect": "none"
    });
    ToolManifest::from_json_str(&m.to_string()).unwrap()
}

fn args() -> Value {
    json!({"field0": "hello", "field1": 42, "field2": true, "field3": "world", "field4": 7})
}

fn policy(rules: usize) -> PolicyConfig {
    let mut list: Vec<PolicyRule> = (0..rules - 1)
        .map(|i| PolicyRule {
            effect: PolicyEffect::Allow,
            tenant: format!("tenant{i}"),
            actors: vec!["*".into()],
            tools: vec![format!("grp{i}.pkg.*")],
            actions: vec!["invoke".into()],
            require_scopes: false,
            obligations: Vec::new(),
        })
        .collect();
    list.push(PolicyRule {
        effect: PolicyEffect::Allow,
        tenant: "acme".into(),
        actors: vec!["*".into()],
        tools: vec!["bench.*".into()],
        actions: vec!["invoke".into()],
        require_scopes: false,
        obligations: Vec::new(),
    });
    PolicyConfig { rules: list }
}

fn invoker(
    registry: &Registry,
    rules: usize,
) -> (
    Invoker,
    tokio::sync::mpsc::Receiver<soulbase_observe::EvidenceRecord>,
) {
    let builtin = BuiltinExecutor::new();
    builtin.register("bench.noop.run", handler_fn(|_| async { Ok(json!({})) }));
    let (sink, rx) = ChannelSink::new(65_536);
    let quota = LocalQuota::new(&[QuotaLimit {
        tenant: "*".into(),
        tool: "*".into(),
        rate: Rate::new(u64::MAX / 4, Duration::from_secs(1)).unwrap(),
    }]);
    let inv = InvokerBuilder::new(
        Arc::new(registry.clone()),
        Arc::new(StaticPolicy::new(&policy(rules))),
        Arc::new(quota),
        Arc::new(HmacConsent::new(vec![7u8; 32])),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(LocalSandbox::new(builtin)),
        Arc::new(sink),
        Arc::new(MemoryIdempotency::new()),
    )
    .build();
    (inv, rx)
}

fn subject() -> Subject {
    Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    )
}

fn bench_registry() {
    let registry = Registry::new();
    let owner = ToolOwner::Global;
    let compiled: Vec<_> = (0..10_000)
        .map(|i| {
            Arc::new(
                soulbase_tools::compile(manifest(&format!("bench.p{}.t{i}", i % 100))).unwrap(),
            )
        })
        .collect();
    let mut reg = Vec::with_capacity(compiled.len());
    for c in &compiled {
        let t = Instant::now();
        registry.register_compiled(&owner, c.clone()).unwrap();
        reg.push(t.elapsed());
    }
    soulbase_testkit::report("registry register (to 10k tools)", reg);
    for c in compiled.iter().take(100) {
        registry.enable(&owner, c.id()).unwrap();
    }
    let tenant = TenantId::new("acme").unwrap();
    let ids: Vec<ToolId> = compiled.iter().map(|c| c.id().clone()).collect();
    let mut get = Vec::with_capacity(100_000);
    for i in 0..100_000 {
        let t = Instant::now();
        let r = registry.get(&tenant, &ids[(i * 7919) % ids.len()]);
        get.push(t.elapsed());
        assert!(r.is_ok());
    }
    soulbase_testkit::report("registry get (10k tools)", get);
    let mut list = Vec::with_capacity(2_000);
    for _ in 0..2_000 {
        let t = Instant::now();
        let l = registry.list_enabled(&tenant);
        list.push(t.elapsed());
        assert_eq!(l.len(), 100);
    }
    soulbase_testkit::report("registry list 100 enabled (10k)", list);
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let registry = Registry::new();
    registry.register(manifest("bench.noop.run")).unwrap();
    registry
        .enable(&ToolOwner::Global, &ToolId::new("bench.noop.run").unwrap())
        .unwrap();
    let (inv, mut rx) = invoker(&registry, 1_000);
    rt.spawn(async move { while rx.recv().await.is_some() {} });
    let tool = ToolId::new("bench.noop.run").unwrap();

    // Preflight, one at a time.
    let samples = rt.block_on(async {
        let call = ToolCall::new(subject(), tool.clone(), args());
        for _ in 0..2_000 {
            inv.preflight(&call).await.unwrap();
        }
        let mut s = Vec::with_capacity(50_000);
        for _ in 0..50_000 {
            let t = Instant::now();
            inv.preflight(&call).await.unwrap();
            s.push(t.elapsed());
        }
        s
    });
    soulbase_testkit::report("preflight (10 fields, 1k rules)", samples);

    // Invoke latency, one at a time.
    let samples = rt.block_on(async {
        let mut s = Vec::with_capacity(50_000);
        for _ in 0..50_000 {
            let call = ToolCall::new(subject(), tool.clone(), args());
            let t = Instant::now();
            let r = inv.invoke(call).await;
            s.push(t.elapsed());
            assert!(r.is_ok());
        }
        s
    });
    soulbase_testkit::report("invoke builtin no-op (sequential)", samples);

    // Invoke throughput on all cores.
    let total = 400_000usize;
    let tasks = 64usize;
    let cpu_before = process_cpu();
    let elapsed = rt.block_on(async {
        let start = Instant::now();
        let handles: Vec<_> = (0..tasks)
            .map(|_| {
                let inv = inv.clone();
                let tool = tool.clone();
                tokio::spawn(async move {
                    for _ in 0..total / tasks {
                        let r = inv
                            .invoke(ToolCall::new(subject(), tool.clone(), args()))
                            .await;
                        assert!(r.is_ok());
                    }
                })
            })
            .collect();
        for h in handles {
            h.await.unwrap();
        }
        start.elapsed()
    });
    let cpu = process_cpu().saturating_sub(cpu_before);
    println!(
        "{:<40} {:.0} calls/s ({total} calls, {tasks} tasks, 2 workers); \
         {:.2} µs of CPU per call = {:.0} calls per core-second",
        "invoke builtin no-op (throughput)",
        total as f64 / elapsed.as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / total as f64,
        total as f64 / cpu.as_secs_f64().max(f64::EPSILON),
    );

    bench_registry();
}
