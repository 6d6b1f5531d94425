//! The HTTP/JSON API of a real `soulbased`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{DEV_CONFIG, Server, config_with, http};
use serde_json::{Value, json};

/// One error case: method, path, headers, body, HTTP status, stable code.
type Case<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    &'a str,
    u16,
    &'a str,
);

const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];

fn with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut h = ACME.to_vec();
    h.extend_from_slice(extra);
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_lists_preflights_and_invokes_with_idempotency_key() {
    let server = Server::start(DEV_CONFIG);
    let (status, body) = http(&server.http, "GET", "/api/tools", &ACME, "").await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tools"].as_array().unwrap().len(), 3);
    let (status, body) = http(&server.http, "GET", "/api/tools?state=paused", &ACME, "").await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["tools"],
        json!([])
    );
    let (status, body) = http(&server.http, "GET", "/api/tools?state=sleepy", &ACME, "").await;
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"]["fields"]["field"],
        "state"
    );

    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/preflight",
        &ACME,
        "{}",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["version"],
        "1.0.0"
    );

    let key = [("idempotency-key", "http-1")];
    let (status, first) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.counter/invoke",
        &with(&key),
        "{}",
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let (_, again) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.counter/invoke",
        &with(&key),
        "{}",
    )
    .await;
    let first: Value = serde_json::from_str(&first).unwrap();
    let again: Value = serde_json::from_str(&again).unwrap();
    assert_eq!(first["output"], again["output"]);
    assert_eq!(again["replayed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_the_public_view_with_the_http_status() {
    let server = Server::start(DEV_CONFIG);
    let cases: [Case; 6] = [
        (
            "POST",
            "/api/tools/soulbase.builtin.echo/invoke",
            vec![],
            "{}",
            401,
            "AUTH.UNAUTHENTICATED",
        ),
        (
            "POST",
            "/api/tools/soulbase.builtin.echo/invoke",
            vec![("x-soulbase-tenant", "other"), ("x-soulbase-actor", "eve")],
            "{}",
            403,
            "POLICY.DENY_TOOL",
        ),
        (
            "POST",
            "/api/tools/demo.not.there/invoke",
            ACME.to_vec(),
            "{}",
            404,
            "TOOL.NOT_FOUND",
        ),
        (
            "POST",
            "/api/tools/soulbase.builtin.sleep/invoke",
            ACME.to_vec(),
            r#"{"ms":"x"}"#,
            400,
            "SCHEMA.VALIDATION_FAILED",
        ),
        (
            "POST",
            "/api/tools/soulbase.builtin.echo/invoke",
            ACME.to_vec(),
            "[1,2]",
            400,
            "SCHEMA.VALIDATION_FAILED",
        ),
        (
            "POST",
            "/api/tools/soulbase.builtin.echo/preflight",
            ACME.to_vec(),
            "{nope",
            400,
            "SCHEMA.VALIDATION_FAILED",
        ),
    ];
    for (method, path, headers, body, want_status, want_code) in cases {
        let (status, text) = http(&server.http, method, path, &headers, body).await;
        assert_eq!(status, want_status, "{path}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let code = v["error"]["code"].as_str().unwrap();
        assert_eq!(code, want_code, "{path}: {text}");
        // The public view never leaks the cause chain.
        assert!(v["error"].get("causes").is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_metrics_and_reload() {
    let server = Server::start(DEV_CONFIG);
    assert_eq!(http(&server.http, "GET", "/healthz", &[], "").await.0, 200);
    assert_eq!(http(&server.http, "GET", "/readyz", &[], "").await.0, 200);
    http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &ACME,
        "{}",
    )
    .await;
    http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-soulbase-tenant", "other"), ("x-soulbase-actor", "eve")],
        "{}",
    )
    .await;
    let (status, text) = http(&server.http, "GET", "/metrics", &[], "").await;
    assert_eq!(status, 200);
    assert!(
        text.contains("soulbase_calls_total{surface=\"http\",status=\"ok\"} 1"),
        "{text}"
    );
    assert!(text.contains("soulbase_denials_total{surface=\"http\",code=\"POLICY.DENY_TOOL\"} 1"));
    assert!(text.contains("soulbase_call_duration_seconds_count{surface=\"http\"} 2"));
    assert!(text.contains("# TYPE soulbase_evidence_queue_depth gauge"));
    assert!(text.contains("# TYPE soulbase_evidence_drain_lag_seconds gauge"));
    assert!(
        text.contains("soulbase_evidence_quarantined_total 0"),
        "{text}"
    );
    common::wait_metric(&server.http, "soulbase_evidence_written_total", |v| {
        v >= 3.0
    })
    .await;
    let (status, body) = http(&server.http, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["status"],
        "unchanged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_new_policy_and_rejects_a_bad_file() {
    let server = Server::start(DEV_CONFIG);
    let other = [("x-soulbase-tenant", "other"), ("x-soulbase-actor", "eve")];
    let path = "/api/tools/soulbase.builtin.echo/invoke";
    assert_eq!(http(&server.http, "POST", path, &other, "{}").await.0, 403);
    let allowed = DEV_CONFIG.replace(
        "    - { effect: allow, tenant: limited",
        "    - { effect: allow, tenant: other, tools: [\"soulbase.builtin.*\"] }\n    - { effect: allow, tenant: limited",
    );
    std::fs::write(server.config_path(), &allowed).unwrap();
    let (status, body) = http(&server.http, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 200, "{body}");
    // Applied by this request or already by the file watcher.
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["status"] == "applied" || v["status"] == "unchanged",
        "{body}"
    );
    assert_eq!(http(&server.http, "POST", path, &other, "{}").await.0, 200);
    assert_eq!(
        v["needs_restart"],
        serde_json::json!([]),
        "a policy reloads live"
    );

    // A start-up-only key is accepted but named as waiting for a restart.
    let later = allowed.replace("shutdown_grace_ms: 10000", "shutdown_grace_ms: 2000");
    std::fs::write(server.config_path(), &later).unwrap();
    let (status, body) = http(&server.http, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        v["needs_restart"],
        serde_json::json!(["server.shutdown_grace_ms"]),
        "{body}"
    );

    // An invalid file is refused and the previous configuration stays.
    std::fs::write(server.config_path(), "server: {roles: []}\n").unwrap();
    let (status, body) = http(&server.http, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "CONFIG.INVALID");
    assert_eq!(http(&server.http, "POST", path, &other, "{}").await.0, 200);
}

/// `GET /api/config/schema` serves the configuration's JSON Schema to anyone (it
/// holds no values): the committed `docs/config.schema.json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_schema_is_served_for_editors() {
    let server = Server::start(DEV_CONFIG);
    let (status, body) = http(&server.http, "GET", "/api/config/schema", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let served: Value = serde_json::from_str(&body).unwrap();
    let committed: Value = serde_json::from_str(
        &std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.schema.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(served, committed, "run `cargo xtask codegen`");
    assert_eq!(
        served["$defs"]["ServerConfig"]["properties"]["http_addr"]["x-reload"],
        "restart"
    );
}

/// `server.dev_identity`: with `dev_insecure`, a request naming no one (no
/// credential, no development header) acts as the configured identity, so curl
/// and stock MCP clients work with no custom headers; headers still win. Without
/// `dev_insecure` the setting is refused at start-up, naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dev_identity_lets_stock_clients_call_without_headers() {
    let config = config_with("  dev_identity: { tenant: acme, actor: dev }\n").replacen(
        "reload]",
        "reload, read_evidence]",
        1,
    );
    let server = Server::start(&config);
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[],
        r#"{"hi": 1}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    let (_, evidence) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{}", v["call_id"].as_str().unwrap()),
        &[],
        "",
    )
    .await;
    assert!(evidence.contains("\"actor\":\"dev\""), "{evidence}");
    // Named headers still decide: tenant `other` has no rule.
    let (status, _) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-soulbase-tenant", "other"), ("x-soulbase-actor", "eve")],
        "{}",
    )
    .await;
    assert_eq!(status, 403);

    let err = common::refused_start(
        "server:\n  dev_identity: { tenant: acme, actor: dev }\n",
        &[],
    );
    assert!(err.contains("server.dev_identity"), "{err}");
}
