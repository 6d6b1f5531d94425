//! MCP over streamable HTTP against a real `soulbased`, with rmcp's client.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::{DEV_CONFIG, Server, as_dev};
use http::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};
use soulbase_grpc::proto::{self, OwnerScope};

/// Forwards `notifications/tools/list_changed` to a channel.
#[derive(Clone)]
struct Notified(tokio::sync::mpsc::UnboundedSender<()>);

impl rmcp::ClientHandler for Notified {
    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        let _ = self.0.send(());
    }
}

async fn client(
    server: &Server,
    tenant: &str,
) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
    ().serve(transport(server, tenant)).await.unwrap()
}

fn transport(server: &Server, tenant: &str) -> StreamableHttpClientTransport<reqwest::Client> {
    let mut headers = HashMap::new();
    headers.insert(
        HeaderName::from_static("x-soulbase-tenant"),
        HeaderValue::from_str(tenant).unwrap(),
    );
    headers.insert(
        HeaderName::from_static("x-soulbase-actor"),
        HeaderValue::from_static("agent"),
    );
    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", server.http))
            .custom_headers(headers);
    StreamableHttpClientTransport::from_config(config)
}

fn args(v: Value) -> rmcp::model::JsonObject {
    v.as_object().cloned().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_list_and_call_run_through_the_governed_pipeline() {
    let server = Server::start(DEV_CONFIG);
    let mcp = client(&server, "acme").await;
    let tools = mcp.list_all_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(
        names,
        [
            "soulbase.builtin.counter",
            "soulbase.builtin.echo",
            "soulbase.builtin.sleep"
        ]
    );
    let sleep = tools
        .iter()
        .find(|t| t.name == "soulbase.builtin.sleep")
        .unwrap();
    assert_eq!(sleep.input_schema.get("required"), Some(&json!(["ms"])));
    assert!(sleep.output_schema.is_some());
    let ann = sleep.annotations.as_ref().unwrap();
    assert_eq!(ann.read_only_hint, Some(true));
    assert_eq!(ann.destructive_hint, Some(false));

    let ok = mcp
        .call_tool(
            CallToolRequestParams::new("soulbase.builtin.echo")
                .with_arguments(args(json!({"n": 3}))),
        )
        .await
        .unwrap();
    assert_eq!(ok.is_error, Some(false));
    assert_eq!(ok.structured_content, Some(json!({"echo": {"n": 3}})));
    assert!(!ok.content.is_empty());

    // Our schema validation runs (rmcp does none): a failure is an isError result
    // carrying the stable code.
    let bad = mcp
        .call_tool(
            CallToolRequestParams::new("soulbase.builtin.sleep")
                .with_arguments(args(json!({"ms": "x"}))),
        )
        .await
        .unwrap();
    assert_eq!(bad.is_error, Some(true));
    assert_eq!(
        bad.structured_content.as_ref().unwrap()["code"],
        "SCHEMA.VALIDATION_FAILED"
    );
    let missing = mcp
        .call_tool(CallToolRequestParams::new("demo.not.there"))
        .await
        .unwrap();
    assert_eq!(
        missing.structured_content.unwrap()["code"],
        "TOOL.NOT_FOUND"
    );

    // Another tenant without policy is denied by policy.
    let other = client(&server, "other").await;
    let denied = other
        .call_tool(CallToolRequestParams::new("soulbase.builtin.echo"))
        .await
        .unwrap();
    assert_eq!(denied.is_error, Some(true));
    assert_eq!(
        denied.structured_content.unwrap()["code"],
        "POLICY.DENY_TOOL"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_follows_registry_changes() {
    let server = Server::start(DEV_CONFIG);
    let (tx, mut notes) = tokio::sync::mpsc::unbounded_channel();
    let mcp = Notified(tx)
        .serve(transport(&server, "acme"))
        .await
        .unwrap();
    // The session is live once a request round-trips.
    assert_eq!(mcp.list_all_tools().await.unwrap().len(), 3);
    let mut registry = server.registry().await;
    let manifest = json!({
        "id": "demo.fresh.tool",
        "version": "1.0.0",
        "description": "registered while an MCP client listens",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "side_effect": "none",
        "provider": {"type": "builtin", "handler": "soulbase.builtin.echo"}
    });
    registry
        .register_tool(as_dev(
            proto::RegisterToolRequest {
                manifest: manifest.to_string(),
                owner: OwnerScope::Tenant as i32,
                enable: true,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), notes.recv())
        .await
        .expect("no list_changed within 10 s")
        .unwrap();
    let tools = mcp.list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "demo.fresh.tool"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_refuses_unauthenticated_and_foreign_origins() {
    let server = Server::start(DEV_CONFIG);
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}"#;
    let (status, text) = common::http(
        &server.http,
        "POST",
        "/mcp",
        &[
            ("content-type", "application/json"),
            ("accept", "application/json, text/event-stream"),
        ],
        body,
    )
    .await;
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("AUTH.UNAUTHENTICATED"));
    let (status, text) = common::http(
        &server.http,
        "POST",
        "/mcp",
        &[
            ("content-type", "application/json"),
            ("origin", "https://evil.example"),
            ("x-soulbase-tenant", "acme"),
            ("x-soulbase-actor", "bob"),
        ],
        body,
    )
    .await;
    assert_eq!(status, 403, "{text}");
    // A DNS-rebinding page: its own name, resolved to this loopback address.
    let port = server.http.rsplit_once(':').unwrap().1;
    let rebound = format!("http://evil.example:{port}");
    // The server's own loopback origin (a page this listener served) is allowed
    // without configuration; the rebinding page's is not.
    let own = format!("http://{}", server.http);
    for (origin, want) in [(own.as_str(), 200), (rebound.as_str(), 403)] {
        let (status, text) = common::mcp_initialize_from(&server.http, origin).await;
        assert_eq!(status, want, "{origin}: {text}");
    }
}
