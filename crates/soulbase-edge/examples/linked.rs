//! Soulbase linked into a service: one tool, the governed pipeline, and the one
//! stack every surface calls. `docs/architecture.md` shows this file verbatim.

use std::sync::Arc;

use serde_json::json;
use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule};
use soulbase_edge::{CallRequest, Stack, Surface};
use soulbase_observe::MemorySink;
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{BuiltinExecutor, DeclaredProfiles, LocalSandbox, handler_fn};
use soulbase_tools::pipeline::{InvokerBuilder, MemoryIdempotency};
use soulbase_tools::{Registry, ToolManifest, ToolOwner};
use soulbase_types::{ActorId, Subject, TenantId};

const MANIFEST: &str = r#"
id: demo.echo.say
version: 1.0.0
description: Says the text back.
input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
output_schema: {type: object}
side_effect: none
"#;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The registry, with one enabled tool and its handler.
    let registry = Registry::new();
    let tool = registry.register(ToolManifest::from_yaml_str(MANIFEST)?)?;
    registry.enable(&ToolOwner::Global, &tool.manifest.id)?;
    let builtin = BuiltinExecutor::new();
    builtin.register("demo.echo.say", handler_fn(|args| async move { Ok(args) }));

    // Policy: tenant acme may invoke (and so list and preflight) every tool.
    let policy = PolicyConfig {
        rules: vec![PolicyRule {
            effect: PolicyEffect::Allow,
            tenant: "acme".into(),
            actors: vec!["*".into()],
            tools: vec!["*".into()],
            actions: vec!["invoke".into()],
            require_scopes: false,
            obligations: Vec::new(),
        }],
    };
    let evidence = MemorySink::new();
    let invoker = InvokerBuilder::new(
        Arc::new(registry),
        Arc::new(StaticPolicy::new(&policy)),
        Arc::new(LocalQuota::new(&[])),
        Arc::new(HmacConsent::new(
            b"a consent key of at least 32 bytes!".to_vec(),
        )),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(LocalSandbox::new(builtin)),
        Arc::new(evidence.clone()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build();
    let stack = Stack::builder(invoker).build();

    // The caller's governed list, then one call through the stack.
    let acme = Subject::new(TenantId::new("acme")?, ActorId::new("alice")?);
    let offered = stack
        .available(Surface::Http, &acme, &Default::default())
        .await?;
    assert_eq!(offered.len(), 1);
    let call = CallRequest::new(Surface::Http, acme, "demo.echo.say", json!({"text": "hi"}));
    let result = stack.invoke(call).await;
    assert!(result.is_ok(), "{result:?}");
    println!("{}", serde_json::to_string(&result)?);
    // Its Begin and End are in the evidence.
    assert_eq!(evidence.records().len(), 2);
    Ok(())
}
