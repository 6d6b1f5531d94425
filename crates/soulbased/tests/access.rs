//! A tenant's view of the global tools (issue 32, item 3): the configuration's
//! `tenants[]` and the registry API (HTTP `/api/access`, gRPC
//! `ToolRegistry.SetAllowList` / `SetTenantOverride` / `GetTenantAccess`, the CLI's
//! `soulbase access`) decide which global tools a tenant sees and in what state.
//! A reload applies to the next request at once, while a call already running
//! finishes on the view it started with; other tenants are never affected.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{DEV_CONFIG, Server, as_dev, held_service, http, http_skill};
use serde_json::{Value, json};
use soulbase_grpc::proto;

const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];
const LIMITED: [(&str, &str); 2] = [("x-soulbase-tenant", "limited"), ("x-soulbase-actor", "x")];

async fn call(
    server: &Server,
    who: &[(&str, &str)],
    method: &str,
    path: &str,
    body: &str,
) -> (u16, Value) {
    let (status, text) = http(&server.http, method, path, who, body).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The ids of the enabled tools `who` is offered (`GET /api/tools`).
async fn offered(server: &Server, who: &[(&str, &str)]) -> Vec<String> {
    let (status, body) = call(server, who, "GET", "/api/tools", "").await;
    assert_eq!(status, 200, "{body}");
    body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["state"] == "enabled")
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

/// acme may invoke, reload and reach the held service; `TENANTS` is replaced by
/// the configuration's `tenants` section.
const CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: "*", tools: ["*"], actions: [invoke, reload] }
sandbox:
  grants:
    - tenant: acme
      capabilities: [{ kind: net, hosts: ["127.0.0.1"] }]
TENANTS
"#;

fn config(tenants: &str) -> String {
    CONFIG.replace("TENANTS", tenants)
}

async fn reload(server: &Server, config: &str) {
    std::fs::write(server.config_path(), config).unwrap();
    let (status, body) = call(server, &ACME, "POST", "/api/reload", "").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body["status"] == "applied" || body["status"] == "unchanged",
        "{body}"
    );
    assert_eq!(
        body["needs_restart"],
        json!([]),
        "tenants reload live: {body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_view_reloads_and_a_running_call_finishes_on_the_old_one() {
    let (port, mut started, release, hits) = held_service().await;
    let narrow = "tenants:\n  - { tenant: acme, allow: [soulbase.builtin.echo, skills.held.held] }";
    let server = Server::start_in(&config(narrow), |dir| {
        std::fs::create_dir_all(dir.join("skills")).unwrap();
        std::fs::write(dir.join("skills/held.yaml"), http_skill(&port)).unwrap();
    });
    // The configured allow-list: acme sees two global tools; other tenants all.
    assert_eq!(
        offered(&server, &ACME).await,
        ["skills.held.held", "soulbase.builtin.echo"]
    );
    assert!(
        offered(&server, &LIMITED)
            .await
            .contains(&"soulbase.builtin.sleep".to_owned())
    );
    let (status, hidden) = call(
        &server,
        &ACME,
        "POST",
        "/api/tools/soulbase.builtin.sleep/invoke",
        r#"{"args": {"ms": 1}}"#,
    )
    .await;
    assert_eq!(
        (status, hidden["error_code"].as_str()),
        (404, Some("TOOL.NOT_FOUND")),
        "{hidden}"
    );
    let (_, access) = call(&server, &ACME, "GET", "/api/access", "").await;
    assert_eq!(
        access["configured"]["allow"],
        json!(["skills.held.held", "soulbase.builtin.echo"]),
        "{access}"
    );
    assert_eq!(access["allow"], Value::Null, "nothing stored: {access}");

    // A call of the held tool is running when the configuration pauses it.
    let bound = Duration::from_secs(60);
    let addr = server.http.clone();
    let running = tokio::spawn(async move {
        http(
            &addr,
            "POST",
            "/api/tools/skills.held.held/invoke",
            &ACME,
            r#"{"args": {"keyword": "x"}}"#,
        )
        .await
    });
    tokio::time::timeout(bound, started.recv())
        .await
        .expect("never reached the service")
        .unwrap();
    let paused = "tenants:\n  - { tenant: acme, allow: [soulbase.builtin.echo, skills.held.held], pause: [skills.held.held] }";
    reload(&server, &config(paused)).await;
    // The next call sees the new view at once.
    let (status, out) = call(
        &server,
        &ACME,
        "POST",
        "/api/tools/skills.held.held/invoke",
        r#"{"args": {"keyword": "x"}}"#,
    )
    .await;
    assert_eq!(out["error_code"], "TOOL.DISABLED", "{status} {out}");
    assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The running one finishes on the view it started with.
    release.add_permits(1);
    let (status, text) = tokio::time::timeout(bound, running).await.unwrap().unwrap();
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("held and released"), "{text}");

    // The section removed: acme sees every global tool again.
    reload(&server, &config("")).await;
    assert!(
        offered(&server, &ACME)
            .await
            .contains(&"soulbase.builtin.sleep".to_owned())
    );
    let (_, access) = call(&server, &ACME, "GET", "/api/access", "").await;
    assert_eq!(access["configured"], Value::Null, "{access}");

    // A tenants section naming a bad tool id is refused, naming the field.
    std::fs::write(
        server.config_path(),
        config("tenants:\n  - { tenant: acme, allow: [Not An Id] }"),
    )
    .unwrap();
    let (status, body) = call(&server, &ACME, "POST", "/api/reload", "").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("tenants[0].allow[0]"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_api_changes_a_tenants_own_view_on_every_surface() {
    let server = Server::start(DEV_CONFIG);
    // HTTP: acme narrows its own view to echo.
    let (status, view) = call(
        &server,
        &ACME,
        "PUT",
        "/api/access/allow-list",
        r#"{"tools": ["soulbase.builtin.echo", "soulbase.builtin.counter"]}"#,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["tenant"], "acme");
    assert_eq!(
        view["allow"],
        json!(["soulbase.builtin.counter", "soulbase.builtin.echo"])
    );
    assert_eq!(
        offered(&server, &ACME).await,
        ["soulbase.builtin.counter", "soulbase.builtin.echo"]
    );
    assert!(
        offered(&server, &LIMITED).await.len() > 2,
        "other tenants unaffected"
    );
    // Paused for acme only.
    let (status, view) = call(
        &server,
        &ACME,
        "PUT",
        "/api/access/overrides/soulbase.builtin.echo",
        r#"{"state": "paused"}"#,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["overrides"],
        json!({"soulbase.builtin.echo": "paused"})
    );
    let (_, out) = call(
        &server,
        &ACME,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        r#"{"args": {}}"#,
    )
    .await;
    assert_eq!(out["error_code"], "TOOL.DISABLED", "{out}");
    let (status, _) = call(
        &server,
        &LIMITED,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        r#"{"args": {}}"#,
    )
    .await;
    assert_eq!(status, 200);

    // Bad bodies name their field; a caller without the actions is refused.
    for (path, body, field) in [
        ("/api/access/allow-list", r#"{"tools": "x"}"#, "tools"),
        ("/api/access/allow-list", "{}", "tools"),
        (
            "/api/access/allow-list",
            r#"{"tools": ["Not An Id"]}"#,
            "tools[0]",
        ),
        (
            "/api/access/overrides/soulbase.builtin.echo",
            r#"{"state": "on"}"#,
            "state",
        ),
        (
            "/api/access/overrides/Not%20An%20Id",
            r#"{"state": null}"#,
            "id",
        ),
    ] {
        let (status, err) = call(&server, &ACME, "PUT", path, body).await;
        assert_eq!(status, 400, "{path} {body}: {err}");
        assert_eq!(err["error"]["fields"]["field"], field, "{err}");
    }
    let (status, err) = call(
        &server,
        &LIMITED,
        "PUT",
        "/api/access/allow-list",
        r#"{"tools": null}"#,
    )
    .await;
    assert_eq!(status, 403, "{err}");
    assert!(
        err["error"]["code"]
            .as_str()
            .unwrap()
            .starts_with("POLICY."),
        "{err}"
    );

    // gRPC: the override cleared, read back.
    let mut registry = server.registry().await;
    let view = registry
        .set_tenant_override(as_dev(
            proto::SetTenantOverrideRequest {
                tool_id: "soulbase.builtin.echo".into(),
                state: proto::TenantToolState::Unspecified as i32,
            },
            "acme",
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    let view: Value = serde_json::from_str(&view.access_json).unwrap();
    assert_eq!(view["overrides"], json!({}), "{view}");
    let (status, _) = call(
        &server,
        &ACME,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        r#"{"args": {}}"#,
    )
    .await;
    assert_eq!(status, 200);
    let denied = registry
        .set_allow_list(as_dev(
            proto::SetAllowListRequest {
                tools: vec![],
                every_tool: true,
            },
            "limited",
            "x",
        ))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");

    // The CLI over gRPC: every global tool again.
    let cli = |args: &[&str]| common::remote_cli(&server, "acme", "bob", args);
    let out = cli(&["access", "allow", "--every-tool"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["allow"], Value::Null, "{view}");
    assert!(
        offered(&server, &ACME)
            .await
            .contains(&"soulbase.builtin.sleep".to_owned())
    );
    let out = cli(&["access", "override", "soulbase.builtin.sleep", "paused"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli(&["access", "show"]);
    let view: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        view["overrides"],
        json!({"soulbase.builtin.sleep": "paused"}),
        "{view}"
    );
    assert!(
        !offered(&server, &ACME)
            .await
            .contains(&"soulbase.builtin.sleep".to_owned())
    );
}
