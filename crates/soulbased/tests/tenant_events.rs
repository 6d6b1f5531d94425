//! Registry change streams are per tenant end to end: tenant `beta` is not told
//! about tenant `acme`'s tools, on gRPC `WatchRegistry` nor on MCP `list_changed`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{ListChanged as Counter, Server, as_dev, mcp_transport};
use futures_util::StreamExt;
use rmcp::ServiceExt;
use serde_json::json;
use soulbase_grpc::proto::{self, OwnerScope, RegistryEventKind};

const CONFIG: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, register, enable] }
    - { effect: allow, tenant: beta, tools: ["*"], actions: [invoke, register, enable] }
"#;

fn manifest(id: &str) -> String {
    json!({
        "id": id,
        "version": "1.0.0",
        "description": "tenant-scoped",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "side_effect": "none",
        "provider": {"type": "builtin", "handler": "soulbase.builtin.echo"}
    })
    .to_string()
}

async fn register(server: &Server, tenant: &str, id: &str, enable: bool) {
    server
        .registry()
        .await
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: manifest(id),
                owner: OwnerScope::Tenant as i32,
                enable,
            },
            tenant,
            "admin",
        ))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_registry_does_not_show_another_tenants_registration() {
    let server = Server::start(CONFIG);
    let mut registry = server.registry().await;
    let mut beta = registry
        .watch_registry(as_dev(proto::WatchRegistryRequest {}, "beta", "b"))
        .await
        .unwrap()
        .into_inner();
    let mut acme = registry
        .watch_registry(as_dev(proto::WatchRegistryRequest {}, "acme", "a"))
        .await
        .unwrap()
        .into_inner();
    register(&server, "acme", "acme.secret.tool", true).await;
    // acme sees its own registration (so the streams are live) …
    let ev = acme.next().await.unwrap().unwrap();
    assert_eq!(ev.tool_id, "acme.secret.tool");
    // … then beta registers; events arrive in commit order, so beta's first event
    // being its own registration proves acme's two events were filtered out.
    register(&server, "beta", "beta.own.tool", false).await;
    let ev = tokio::time::timeout(Duration::from_secs(10), beta.next())
        .await
        .expect("beta got no event")
        .unwrap()
        .unwrap();
    assert_eq!(ev.kind, RegistryEventKind::Registered as i32);
    assert_eq!(ev.tool_id, "beta.own.tool");
    assert_eq!(ev.tenant, "beta");
}

async fn until(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_list_changed_is_not_sent_for_another_tenants_registration() {
    let server = Server::start(CONFIG);
    let (acme_n, beta_n) = (Counter::default(), Counter::default());
    let acme = acme_n
        .clone()
        .serve(mcp_transport(&server.http, "acme"))
        .await
        .unwrap();
    let beta = beta_n
        .clone()
        .serve(mcp_transport(&server.http, "beta"))
        .await
        .unwrap();
    // Both sessions are live once a request round-trips.
    assert_eq!(acme.list_all_tools().await.unwrap().len(), 3);
    assert_eq!(beta.list_all_tools().await.unwrap().len(), 3);

    // acme registers (one event, not enabled) and is notified.
    register(&server, "acme", "acme.secret.tool", false).await;
    until("acme notified", || acme_n.0.load(Ordering::SeqCst) >= 1).await;
    // beta then registers its own (one event). Its notifications are sent in
    // commit order on one stream: had acme's event leaked, beta would count 2.
    register(&server, "beta", "beta.own.tool", false).await;
    until("beta notified", || beta_n.0.load(Ordering::SeqCst) >= 1).await;
    // A second own change as a barrier: after its notification, every earlier one
    // has arrived.
    register(&server, "beta", "beta.other.tool", false).await;
    until("beta notified twice", || {
        beta_n.0.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert_eq!(
        beta_n.0.load(Ordering::SeqCst),
        2,
        "beta was notified only of its own two registrations"
    );
    assert!(
        !beta
            .list_all_tools()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name.starts_with("acme."))
    );
}
