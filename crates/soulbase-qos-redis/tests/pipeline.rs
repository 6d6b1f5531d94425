#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Two pipeline instances (replicas) sharing one real Redis for quotas, with Cedar
//! authorization: the limit holds exactly across them, and tenant isolation holds.

use std::sync::Arc;

use serde_json::json;
use soulbase_auth::{CedarPolicy, HmacConsent};
use soulbase_errors::ErrorCode;
use soulbase_observe::MemorySink;
use soulbase_qos::QuotaPlan;
use soulbase_qos_redis::{RedisQuota, RedisQuotaOptions};
use soulbase_sandbox::{BuiltinExecutor, DeclaredProfiles, LocalSandbox, handler_fn};
use soulbase_tools::pipeline::{Invoker, InvokerBuilder, MemoryIdempotency, ToolCall};
use soulbase_tools::registry::ToolOwner;
use soulbase_tools::{Registry, ToolManifest};
use soulbase_types::{ActorId, Rate, Subject, TenantId, ToolId};

fn manifest(id: &str) -> ToolManifest {
    let m = json!({
        "id": id,
        "version": "1.0.0",
        "description": "echo",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "side_effect": "none"
    });
    ToolManifest::from_json_str(&m.to_string()).unwrap()
}

fn replica(registry: &Registry, quota: RedisQuota) -> Invoker {
    let builtin = BuiltinExecutor::new();
    builtin.register("demo.echo.say", handler_fn(|args| async move { Ok(args) }));
    builtin.register(
        "beta.secret.read",
        handler_fn(|_| async { Ok(json!({"secret": 1})) }),
    );
    let policy = CedarPolicy::from_sources(&[(
        "all.cedar".into(),
        "permit(principal, action == Soul::Action::\"invoke\", resource);".into(),
    )])
    .unwrap();
    InvokerBuilder::new(
        Arc::new(registry.clone()),
        Arc::new(policy),
        Arc::new(quota),
        Arc::new(HmacConsent::new(vec![7u8; 32])),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(LocalSandbox::new(builtin)),
        Arc::new(MemorySink::new()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build()
}

fn subject(tenant: &str) -> Subject {
    Subject::new(
        TenantId::new(tenant).unwrap(),
        ActorId::new("alice").unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_share_a_redis_limit_exactly_and_isolate_tenants() {
    let registry = Registry::new();
    let echo = ToolId::new("demo.echo.say").unwrap();
    registry.register(manifest("demo.echo.say")).unwrap();
    registry.enable(&ToolOwner::Global, &echo).unwrap();
    let beta = TenantId::new("beta").unwrap();
    let secret = ToolId::new("beta.secret.read").unwrap();
    registry
        .register_for(&beta, manifest("beta.secret.read"))
        .unwrap();
    registry
        .enable(&ToolOwner::tenant(beta.clone()), &secret)
        .unwrap();

    let url = soulbase_testkit::redis_url();
    let mut options = RedisQuotaOptions::new(url);
    options.prefix = format!("{}:", soulbase_testkit::unique_name("qos_pipeline"));
    let limits = [soulbase_config::QuotaLimit {
        tenant: "*".into(),
        tool: "*".into(),
        rate: Rate::parse("50/min").unwrap(),
    }];
    let a = Arc::new(replica(
        &registry,
        RedisQuota::new(options.clone(), QuotaPlan::new(&limits, &[])).unwrap(),
    ));
    let b = Arc::new(replica(
        &registry,
        RedisQuota::new(options, QuotaPlan::new(&limits, &[])).unwrap(),
    ));

    let mut tasks = Vec::new();
    for i in 0..200 {
        let inv = if i % 2 == 0 { a.clone() } else { b.clone() };
        let call = ToolCall::new(subject("acme"), echo.clone(), json!({"i": i}));
        tasks.push(tokio::spawn(async move { inv.invoke(call).await }));
    }
    let (mut ok, mut limited) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        if r.is_ok() {
            ok += 1;
        } else {
            assert_eq!(r.error_code, Some(ErrorCode::QuotaRateLimited), "{r:?}");
            let hint = r.error().unwrap().retry_after_ms().expect("retry hint");
            assert!(hint > 0 && hint <= 60_000);
            limited += 1;
        }
    }
    assert_eq!((ok, limited), (50, 150));

    // Tenant isolation: acme cannot invoke or preflight beta's tool, even with a
    // permit-all policy, and the answer is the same as for a tool that does not exist.
    let stolen = a
        .invoke(ToolCall::new(subject("acme"), secret.clone(), json!({})))
        .await;
    assert_eq!(stolen.error_code, Some(ErrorCode::ToolNotFound));
    let missing = a
        .invoke(ToolCall::new(
            subject("acme"),
            ToolId::new("no.such.tool").unwrap(),
            json!({}),
        ))
        .await;
    assert_eq!(missing.error_code, Some(ErrorCode::ToolNotFound));
    assert_eq!(
        stolen
            .error
            .as_ref()
            .unwrap()
            .message
            .replace("beta.secret.read", "no.such.tool"),
        missing.error.as_ref().unwrap().message,
        "the same answer as for a tool that does not exist"
    );
    let pre = a
        .preflight(&ToolCall::new(subject("acme"), secret.clone(), json!({})))
        .await
        .unwrap_err();
    assert_eq!(pre.code(), ErrorCode::ToolNotFound);
    // beta itself may.
    let own = a
        .invoke(ToolCall::new(subject("beta"), secret, json!({})))
        .await;
    assert!(own.is_ok(), "{own:?}");
}
