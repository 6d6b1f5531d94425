//! MCP session limits against a real `soulbased` (issue 26): caps per tenant and
//! in total refused in the JSON error envelope, idle sessions closed, and the
//! server's memory bounded under 10,000 `initialize` calls.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{DEV_CONFIG, Server, config_with as config, rss_kib, wait_metric};
use futures_util::StreamExt as _;
use serde_json::{Value, json};

struct Answer {
    status: u16,
    session: Option<String>,
    body: String,
}

impl Answer {
    /// The JSON error envelope's `error` object.
    fn error(&self) -> Value {
        let v: Value = serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body));
        v["error"].clone()
    }
}

/// Posts one JSON-RPC message to `/mcp` as `tenant` (on `session` when given).
async fn post(
    client: &reqwest::Client,
    server: &Server,
    tenant: &str,
    session: Option<&str>,
    message: &Value,
) -> Answer {
    let mut req = client
        .post(format!("http://{}/mcp", server.http))
        .header("x-soulbase-tenant", tenant)
        .header("x-soulbase-actor", "agent")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(message.to_string());
    if let Some(s) = session {
        req = req
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let session = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = r.text().await.unwrap();
    Answer {
        status,
        session,
        body,
    }
}

fn initialize() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "sessions-test", "version": "1"}
        }
    })
}

fn tools_list() -> Value {
    json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
}

async fn open(client: &reqwest::Client, server: &Server, tenant: &str) -> String {
    let a = post(client, server, tenant, None, &initialize()).await;
    assert_eq!(a.status, 200, "{}", a.body);
    a.session.expect("an initialize answer names its session")
}

fn assert_refused(a: &Answer, limit: &str, max: usize) {
    assert_eq!(a.status, 429, "{}", a.body);
    let e = a.error();
    assert_eq!(e["code"], "QUOTA.RATE_LIMITED", "{e}");
    assert_eq!(e["fields"]["limit"], limit, "{e}");
    assert_eq!(e["fields"]["max"], max.to_string(), "{e}");
    assert!(e["retry_after_ms"].as_u64().is_some_and(|ms| ms > 0), "{e}");
    assert!(a.session.is_none());
}

/// `server.mcp_max_sessions_per_tenant` and `server.mcp_max_sessions`: beyond
/// them an `initialize` is refused (429, `QUOTA.RATE_LIMITED` naming the limit);
/// a DELETE frees a place; a session is its own tenant's only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_capped_per_tenant_and_in_total() {
    let server = Server::start(&config(
        "  mcp_max_sessions: 4\n  mcp_max_sessions_per_tenant: 2\n  mcp_session_idle_ms: 600000\n",
    ));
    let client = reqwest::Client::new();
    let a1 = open(&client, &server, "acme").await;
    let _a2 = open(&client, &server, "acme").await;
    let refused = post(&client, &server, "acme", None, &initialize()).await;
    assert_refused(&refused, "server.mcp_max_sessions_per_tenant", 2);
    // Sessions still work, and only for their tenant.
    let listed = post(&client, &server, "acme", Some(&a1), &tools_list()).await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert!(
        listed.body.contains("soulbase.builtin.echo"),
        "{}",
        listed.body
    );
    let stolen = post(&client, &server, "other", Some(&a1), &tools_list()).await;
    assert_eq!(stolen.status, 403, "{}", stolen.body);
    assert_eq!(stolen.error()["code"], "AUTH.FORBIDDEN");

    let _b1 = open(&client, &server, "beta").await;
    let _b2 = open(&client, &server, "beta").await;
    let refused = post(&client, &server, "gamma", None, &initialize()).await;
    assert_refused(&refused, "server.mcp_max_sessions", 4);
    wait_metric(&server.http, "soulbase_mcp_sessions", |v| v == 4.0).await;

    // Requests that create no session are not counted.
    let listed = post(&client, &server, "gamma", None, &tools_list()).await;
    assert_ne!(listed.status, 429, "{}", listed.body);

    // Closing a session makes room.
    let closed = client
        .delete(format!("http://{}/mcp", server.http))
        .header("x-soulbase-tenant", "acme")
        .header("x-soulbase-actor", "agent")
        .header("mcp-session-id", &a1)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    let _g1 = open(&client, &server, "gamma").await;
}

/// `server.mcp_session_idle_ms`: a session with no request in progress for that
/// long is closed (its id is then unknown), and its place is free again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sessions_expire() {
    let server = Server::start(&config(
        "  mcp_max_sessions_per_tenant: 1\n  mcp_session_idle_ms: 200\n",
    ));
    let client = reqwest::Client::new();
    let s1 = open(&client, &server, "acme").await;
    wait_metric(&server.http, "soulbase_mcp_sessions", |v| v == 0.0).await;
    let gone = post(&client, &server, "acme", Some(&s1), &tools_list()).await;
    assert_eq!(gone.status, 404, "{}", gone.body);
    let _s2 = open(&client, &server, "acme").await;
}

/// The bound documented for `server.mcp_max_sessions` at its default (256
/// sessions of ~140 KiB): the server's RSS grows by less than this under any
/// number of `initialize` calls.
const RSS_GROWTH_BOUND_KIB: u64 = 48 * 1024;

/// 10,000 `initialize` calls from 50 tenants with the default limits: 256
/// sessions are created (32 for each of the first tenants), every other call is
/// refused with `QUOTA.RATE_LIMITED`, and the server's RSS stays within
/// [`RSS_GROWTH_BOUND_KIB`] of what it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_initialize_calls_stay_within_the_memory_bound() {
    let server = Server::start(DEV_CONFIG);
    let client = reqwest::Client::new();
    // Warm up (first-use allocations), then measure from here.
    let warm = open(&client, &server, "warmup").await;
    let _ = post(&client, &server, "warmup", Some(&warm), &tools_list()).await;
    let before = rss_kib(server.pid());
    let started = Instant::now();
    let answers: Vec<(u16, bool)> = futures_util::stream::iter(0..10_000usize)
        .map(|i| {
            let (client, server) = (&client, &server);
            async move {
                let tenant = format!("tenant-{}", i % 50);
                let a = post(client, server, &tenant, None, &initialize()).await;
                let limited = a.status == 429 && a.error()["code"] == "QUOTA.RATE_LIMITED";
                (a.status, limited)
            }
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let elapsed = started.elapsed();
    let after = rss_kib(server.pid());
    let created = answers.iter().filter(|(s, _)| *s == 200).count();
    let refused = answers.iter().filter(|(_, l)| *l).count();
    eprintln!(
        "10,000 initialize in {elapsed:?}: {created} created, {refused} refused; \
         RSS {before} KiB -> {after} KiB (+{} KiB)",
        after.saturating_sub(before)
    );
    // 256 in total, the warm-up session among them.
    assert_eq!(created, 255);
    assert_eq!(refused, 10_000 - 255);
    assert!(
        after.saturating_sub(before) < RSS_GROWTH_BOUND_KIB,
        "RSS grew from {before} KiB to {after} KiB"
    );
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
}

/// `server.body_read_timeout_ms` times request bodies only: an MCP call whose
/// streamed (SSE) answer takes longer than it is answered whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_answers_outlive_the_body_read_timeout() {
    let server = Server::start(&config("  body_read_timeout_ms: 200\n"));
    let client = reqwest::Client::new();
    let session = open(&client, &server, "acme").await;
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let a = post(&client, &server, "acme", Some(&session), &initialized).await;
    assert_eq!(a.status, 202, "{}", a.body);
    let call = json!({
        "jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "soulbase.builtin.sleep", "arguments": {"ms": 800}}
    });
    let started = Instant::now();
    let a = post(&client, &server, "acme", Some(&session), &call).await;
    assert!(started.elapsed() >= Duration::from_millis(800));
    assert_eq!(a.status, 200, "{}", a.body);
    assert!(
        a.body.starts_with("data:") || a.body.contains("\ndata:"),
        "{}",
        a.body
    );
    assert!(a.body.contains("slept_ms"), "{}", a.body);
}
