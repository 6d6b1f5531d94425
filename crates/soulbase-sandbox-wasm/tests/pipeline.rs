//! A WASM tool through the whole governed pipeline (`soulbase-tools`'s `Invoker`)
//! with `IntersectingProfiles` and the real executor: exactly one Begin and one End,
//! also when the tool runs past its deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;
use sha2::{Digest, Sha256};
use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_config::{BudgetWindow, PolicyConfig, PolicyEffect, PolicyRule, QuotaBudget};
use soulbase_errors::ErrorCode;
use soulbase_observe::{EndStatus, EvidenceEvent, MemorySink};
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{BuiltinExecutor, IntersectingProfiles, LocalSandbox, ProviderKind};
use soulbase_sandbox_wasm::{WasmExecutor, WasmOptions};
use soulbase_tools::pipeline::{CallStatus, Invoker, InvokerBuilder, MemoryIdempotency, ToolCall};
use soulbase_tools::registry::ToolOwner;
use soulbase_tools::{Registry, ToolManifest};
use soulbase_types::{ActorId, Subject, TenantId, ToolId};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/wasm")
}

fn manifest(id: &str, module: &str, timeout_ms: u64) -> ToolManifest {
    let bytes = std::fs::read(fixtures().join(module)).unwrap();
    let m = json!({
        "id": id,
        "version": "1.0.0",
        "description": "a wasm tool",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "side_effect": "none",
        "limits": {"timeout_ms": timeout_ms},
        "provider": {"type": "wasm", "module": module, "sha256": hex::encode(Sha256::digest(&bytes))}
    });
    ToolManifest::from_json_str(&m.to_string()).unwrap()
}

/// An invoker over `wasm` with the echo, spin, sleep and burn tools (all tenants
/// allowed).
fn invoker(wasm: WasmExecutor, sink: &MemorySink) -> Invoker {
    invoker_with_quota(wasm, sink, LocalQuota::new(&[]))
}

fn invoker_with_quota(wasm: WasmExecutor, sink: &MemorySink, quota: LocalQuota) -> Invoker {
    let registry = Registry::new();
    for (id, module, timeout) in [
        ("demo.wasm.echo", "echo.wasm", 5000),
        ("demo.wasm.spin", "spin.wasm", 100),
        ("demo.wasm.sleep", "sleep.wasm", 2000),
        ("demo.wasm.burn", "burn.wasm", 20_000),
    ] {
        registry.register(manifest(id, module, timeout)).unwrap();
        registry
            .enable(&ToolOwner::Global, &ToolId::new(id).unwrap())
            .unwrap();
    }
    let policy = PolicyConfig {
        rules: vec![PolicyRule {
            effect: PolicyEffect::Allow,
            tenant: "*".into(),
            actors: vec!["*".into()],
            tools: vec!["*".into()],
            actions: vec!["invoke".into()],
            require_scopes: false,
            obligations: Vec::new(),
        }],
    };
    let sandbox =
        LocalSandbox::new(BuiltinExecutor::new()).with_executor(ProviderKind::Wasm, Arc::new(wasm));
    InvokerBuilder::new(
        Arc::new(registry),
        Arc::new(StaticPolicy::new(&policy)),
        Arc::new(quota),
        Arc::new(HmacConsent::new(
            b"0123456789abcdef0123456789abcdef".to_vec(),
        )),
        Arc::new(IntersectingProfiles::new(None)),
        Arc::new(sandbox),
        Arc::new(sink.clone()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build()
}

#[tokio::test]
async fn wasm_tools_run_through_the_pipeline_with_evidence() {
    let sink = MemorySink::new();
    let wasm = WasmExecutor::new(WasmOptions::new(fixtures())).unwrap();
    let invoker = invoker(wasm, &sink);
    let subject = Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    );

    let call = ToolCall::new(
        subject.clone(),
        ToolId::new("demo.wasm.echo").unwrap(),
        json!({"text": "hi"}),
    );
    let call_id = call.call_id.clone();
    let r = invoker.invoke(call).await;
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    assert_eq!(r.output, Some(json!({"text": "hi"})));
    assert_eq!(end_status(&sink, &call_id), EndStatus::Ok);

    let call = ToolCall::new(subject, ToolId::new("demo.wasm.spin").unwrap(), json!({}));
    let call_id = call.call_id.clone();
    let r = invoker.invoke(call).await;
    assert_eq!(r.status, CallStatus::Error);
    assert_eq!(r.error_code, Some(ErrorCode::ProviderTimeout));
    assert_eq!(end_status(&sink, &call_id), EndStatus::Timeout);
}

/// A tenant at its share of the WASM pool is refused by the sandbox's guard: `Denied`
/// with `QUOTA.RATE_LIMITED` and no Begin, while another tenant's call runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_its_wasm_share_is_denied_before_any_begin() {
    let sink = MemorySink::new();
    let mut options = WasmOptions::new(fixtures());
    options.max_instances_per_tenant = 1;
    let wasm = WasmExecutor::new(options).unwrap();
    let invoker = Arc::new(invoker(wasm.clone(), &sink));
    let subject = |t: &str| Subject::new(TenantId::new(t).unwrap(), ActorId::new("alice").unwrap());
    let acme = TenantId::new("acme").unwrap();

    // acme's call blocks in `poll_oneoff` and holds acme's one slot until its deadline.
    let sleeping = ToolCall::new(
        subject("acme"),
        ToolId::new("demo.wasm.sleep").unwrap(),
        json!({}),
    );
    let sleeping_id = sleeping.call_id.clone();
    let held = {
        let invoker = invoker.clone();
        tokio::spawn(async move { invoker.invoke(sleeping).await })
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        while wasm.live_instances_of(&acme) == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("acme's call was never admitted");

    let call = ToolCall::new(
        subject("acme"),
        ToolId::new("demo.wasm.echo").unwrap(),
        json!({}),
    );
    let refused_id = call.call_id.clone();
    let r = invoker.invoke(call).await;
    assert_eq!(r.status, CallStatus::Denied, "{r:?}");
    assert_eq!(r.error_code, Some(ErrorCode::QuotaRateLimited));
    let evidence: Vec<_> = sink
        .records()
        .into_iter()
        .filter(|r| r.payload.call_id() == &refused_id)
        .map(|r| r.payload)
        .collect();
    assert!(
        matches!(evidence.as_slice(), [EvidenceEvent::Denied(d)] if d.code == ErrorCode::QuotaRateLimited),
        "{evidence:?}"
    );

    let call = ToolCall::new(
        subject("globex"),
        ToolId::new("demo.wasm.echo").unwrap(),
        json!({"n": 1}),
    );
    let r = invoker.invoke(call).await;
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");

    let r = held.await.unwrap();
    assert_eq!(r.error_code, Some(ErrorCode::ProviderTimeout), "{r:?}");
    assert_eq!(end_status(&sink, &sleeping_id), EndStatus::Timeout);
}

/// The CPU a WASM call used is its End's `usage.cpu_ms` and is charged to a
/// `cpu_ms` budget, which, used up, refuses the next call `QUOTA.BUDGET_EXCEEDED`
/// before it runs; tools outside the budget still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_budget_is_charged_what_calls_use_and_then_refuses() {
    let sink = MemorySink::new();
    let wasm = WasmExecutor::new(WasmOptions::new(fixtures())).unwrap();
    let quota = LocalQuota::with_budgets(
        &[],
        &[QuotaBudget {
            tenant: "acme".into(),
            tool: "demo.wasm.burn".into(),
            actor: "*".into(),
            per_actor: false,
            window: BudgetWindow::Day,
            calls: None,
            bytes_in: None,
            bytes_out: None,
            cpu_ms: Some(5),
        }],
    );
    let invoker = invoker_with_quota(wasm, &sink, quota);
    let acme = Subject::new(
        TenantId::new("acme").unwrap(),
        ActorId::new("alice").unwrap(),
    );
    let burn = || {
        ToolCall::new(
            acme.clone(),
            ToolId::new("demo.wasm.burn").unwrap(),
            json!({}),
        )
    };

    let call = burn();
    let call_id = call.call_id.clone();
    let r = invoker.invoke(call).await;
    assert_eq!(r.status, CallStatus::Ok, "{r:?}");
    assert_eq!(r.output, Some(json!({"burned": true})));
    let used = end_cpu_ms(&sink, &call_id);
    assert!(used >= 5, "the End records {used} ms");

    let r = invoker.invoke(burn()).await;
    assert_eq!(r.status, CallStatus::Denied, "{r:?}");
    assert_eq!(r.error_code, Some(ErrorCode::QuotaBudgetExceeded));

    let echo = ToolCall::new(acme, ToolId::new("demo.wasm.echo").unwrap(), json!({}));
    assert_eq!(invoker.invoke(echo).await.status, CallStatus::Ok);
}

/// The `usage.cpu_ms` of the one End of `call_id`.
fn end_cpu_ms(sink: &MemorySink, call_id: &soulbase_types::CallId) -> u64 {
    let ends: Vec<u64> = sink
        .records()
        .into_iter()
        .filter_map(|r| match r.payload {
            EvidenceEvent::End(e) if &e.call_id == call_id => Some(e.usage.cpu_ms),
            _ => None,
        })
        .collect();
    assert_eq!(ends.len(), 1, "exactly one End");
    ends[0]
}

fn end_status(sink: &MemorySink, call_id: &soulbase_types::CallId) -> EndStatus {
    let mut begins = 0;
    let mut ends: Vec<EndStatus> = Vec::new();
    for r in sink.records() {
        match &r.payload {
            EvidenceEvent::Begin(b) if &b.call_id == call_id => begins += 1,
            EvidenceEvent::End(e) if &e.call_id == call_id => ends.push(e.status),
            _ => {}
        }
    }
    assert_eq!(
        (begins, ends.len()),
        (1, 1),
        "exactly one Begin and one End"
    );
    ends[0]
}
