//! A WASM tool through the whole governed pipeline (`soulbase-tools`'s `Invoker`)
//! with `IntersectingProfiles` and the real executor: exactly one Begin and one End,
//! also when the tool runs past its deadline.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::json;
use sha2::{Digest, Sha256};
use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule};
use soulbase_errors::ErrorCode;
use soulbase_observe::{EndStatus, EvidenceEvent, MemorySink};
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{BuiltinExecutor, IntersectingProfiles, LocalSandbox, ProviderKind};
use soulbase_sandbox_wasm::{WasmExecutor, WasmOptions};
use soulbase_tools::pipeline::{CallStatus, InvokerBuilder, MemoryIdempotency, ToolCall};
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

#[tokio::test]
async fn wasm_tools_run_through_the_pipeline_with_evidence() {
    let registry = Registry::new();
    for (id, module, timeout) in [
        ("demo.wasm.echo", "echo.wasm", 5000),
        ("demo.wasm.spin", "spin.wasm", 100),
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
        }],
    };
    let sandbox = LocalSandbox::new(BuiltinExecutor::new()).with_executor(
        ProviderKind::Wasm,
        Arc::new(WasmExecutor::new(WasmOptions::new(fixtures())).unwrap()),
    );
    let sink = MemorySink::new();
    let invoker = InvokerBuilder::new(
        Arc::new(registry),
        Arc::new(StaticPolicy::new(&policy)),
        Arc::new(LocalQuota::new(&[])),
        Arc::new(HmacConsent::new(
            b"0123456789abcdef0123456789abcdef".to_vec(),
        )),
        Arc::new(IntersectingProfiles::new(None)),
        Arc::new(sandbox),
        Arc::new(sink.clone()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build();
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
