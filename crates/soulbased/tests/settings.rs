//! Configuration keys set and their effect observed (issue 32), for the keys no
//! other test observed: each test here sets one or a few keys on a real
//! `soulbased` (or on the function the server builds its parts with) and asserts
//! what changes because of them. `every_setting.rs` names, for every key, the
//! test that observes it.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use common::{Cuttable, DEV_CONFIG, Server, as_dev, config_with, eventually, http};
use serde_json::{Value, json};
use soulbase_grpc::proto::{self, OwnerScope};

const ECHO: &str = "soulbase.builtin.echo";
const SLEEP: &str = "soulbase.builtin.sleep";
const DAY_MS: i64 = 86_400_000;

fn who<'a>(tenant: &'a str, actor: &'a str) -> [(&'a str, &'a str); 2] {
    [("x-soulbase-tenant", tenant), ("x-soulbase-actor", actor)]
}

/// Invokes `tool` with `args` over HTTP with `headers`: the status and the JSON
/// answer.
async fn invoke(
    server: &Server,
    headers: &[(&str, &str)],
    tool: &str,
    args: Value,
) -> (u16, Value) {
    let (status, body) = http(
        &server.http,
        "POST",
        &format!("/api/tools/{tool}/invoke"),
        headers,
        &args.to_string(),
    )
    .await;
    let v = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{status}: {body}"));
    (status, v)
}

/// The stable code of an answer (`error_code` of a call result, `error.code` of
/// an error envelope).
fn code(v: &Value) -> &str {
    v["error_code"]
        .as_str()
        .or_else(|| v["error"]["code"].as_str())
        .unwrap_or("")
}

/// `soulbased` started by hand in a fresh directory, without `RUST_LOG` (so
/// `observe.log_filter` decides) and with only the flags given: stdout read line
/// by line, stderr kept whole.
struct Raw {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    _dir: tempfile::TempDir,
}

impl Raw {
    fn start(config: &str, flags: &[&str]) -> Raw {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_soulbased"));
        for (k, _) in std::env::vars() {
            if k.starts_with("SOULBASE_") || k == "RUST_LOG" {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd
            .current_dir(dir.path())
            .arg("--config")
            .arg(&path)
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().unwrap();
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Raw {
            child,
            lines,
            stderr: Some(stderr),
            _dir: dir,
        }
    }

    /// The stdout lines up to `soulbased: ready` (within 30 s).
    fn ready(&self) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .lines
                .recv_timeout(left)
                .expect("soulbased did not become ready in time");
            let ready = line == "soulbased: ready";
            out.push(line);
            if ready {
                return out;
            }
        }
    }

    /// Kills the process (by its own handle) and answers what it wrote on stderr.
    fn stop(&mut self) -> String {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.stderr.take().unwrap().join().unwrap()
    }
}

impl Drop for Raw {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Dev identities; `acme` may invoke and read its evidence.
const ACME_ONLY: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, read_evidence] }
"#;

async fn evidence_status(server: &Server, call_id: &str) -> u16 {
    let (status, _) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{call_id}"),
        &who("acme", "bob"),
        "",
    )
    .await;
    status
}

// ---- evidence ----

/// `evidence.retention_days`: retention runs at start-up and deletes the calls
/// older than that many days — a call aged 25 days goes under 20, one aged 15
/// stays (under the default 30 both would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_retention_days_deletes_older_calls_at_start() {
    let mut server = Server::start(ACME_ONLY);
    let mut ids = Vec::new();
    for n in 0..2 {
        let (status, v) = invoke(&server, &who("acme", "bob"), ECHO, json!({ "n": n })).await;
        assert_eq!(status, 200, "{v}");
        ids.push(v["call_id"].as_str().unwrap().to_owned());
    }
    server.stop();
    // Age the stored records: the first call 25 days, the second 15.
    let url = format!(
        "sqlite://{}",
        server.dir().join("data/evidence.db").display()
    );
    let pool = sqlx::SqlitePool::connect(&url).await.unwrap();
    for (id, days) in [(&ids[0], 25), (&ids[1], 15)] {
        let done = sqlx::query("UPDATE evidence SET at_ms = at_ms - ?1 WHERE call_id = ?2")
            .bind(days * DAY_MS)
            .bind(id.as_str())
            .execute(&pool)
            .await
            .unwrap();
        assert_eq!(done.rows_affected(), 2, "a Begin and an End of {id}");
    }
    pool.close().await;
    std::fs::write(
        server.config_path(),
        format!("{ACME_ONLY}evidence:\n  retention_days: 20\n"),
    )
    .unwrap();
    let server = server.start_again();
    let old = ids[0].clone();
    eventually("the call older than retention_days is deleted", || {
        let (server, old) = (&server, old.clone());
        async move { evidence_status(server, &old).await == 404 }
    })
    .await;
    assert_eq!(evidence_status(&server, &ids[1]).await, 200);
}

/// `evidence.migrate_on_start: false`: a fresh database is not migrated, and the
/// server cannot start on it (no tables); on a database a first start migrated,
/// the same setting starts and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_migrate_on_start_off_leaves_a_fresh_database_unusable() {
    let off = format!("{ACME_ONLY}evidence:\n  migrate_on_start: false\n");
    let err = common::refused_start(&off, &[]);
    assert!(err.contains("no such table"), "{err}");

    let mut server = Server::start(ACME_ONLY);
    server.stop();
    std::fs::write(server.config_path(), &off).unwrap();
    let server = server.start_again();
    let (status, v) = invoke(&server, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!(status, 200, "{v}");
}

/// `evidence.url_file`: the database URL is read from the file, so evidence is
/// stored where it says and not in `<data_dir>/evidence.db`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_url_file_names_the_database_used() {
    let config = format!("{ACME_ONLY}evidence:\n  url_file: ./evidence-url\n");
    let server = Server::start_in(&config, |dir| {
        let db = dir.join("elsewhere/calls.db");
        std::fs::write(
            dir.join("evidence-url"),
            format!("sqlite://{}\n", db.display()),
        )
        .unwrap();
    });
    let (status, v) = invoke(&server, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        evidence_status(&server, v["call_id"].as_str().unwrap()).await,
        200
    );
    assert!(server.dir().join("elsewhere/calls.db").is_file());
    assert!(!server.dir().join("data/evidence.db").exists());
}

/// Calls (each with a 4 kB argument, ~1 kB of evidence) accepted by a server with
/// `spool_max_bytes: cap` and its database down, before one is refused
/// (`EVIDENCE.UNAVAILABLE`, before running); then the database returns and calls
/// are taken again.
async fn calls_until_the_spool_is_full(cap: u64) -> usize {
    let url = common::fresh_database("sbd_spool_cap").await;
    let target = url
        .split_once("://")
        .map(|(_, rest)| rest.rsplit_once('@').map_or(rest, |(_, h)| h))
        .and_then(|h| h.split('/').next())
        .unwrap()
        .to_owned();
    let db = Cuttable::start(target).await;
    let config = format!(
        "{ACME_ONLY}evidence:\n  backend: postgres\n  url: {}\n  spool_max_bytes: {cap}\n",
        db.route(&url)
    );
    let server = Server::start(&config);
    db.cut();
    let pad = "x".repeat(4_000);
    let mut accepted = 0;
    let refused = loop {
        assert!(accepted < 20_000, "the spool never reached its cap");
        let (status, v) = invoke(&server, &who("acme", "bob"), ECHO, json!({ "pad": pad })).await;
        if status == 200 {
            accepted += 1;
            continue;
        }
        break v;
    };
    assert_eq!(code(&refused), "EVIDENCE.UNAVAILABLE", "{refused}");
    assert_eq!(
        refused["status"], "denied",
        "refused before running: {refused}"
    );
    db.restore();
    eventually("calls are accepted once the spool drained", || {
        let server = &server;
        async move { invoke(server, &who("acme", "bob"), ECHO, json!({})).await.0 == 200 }
    })
    .await;
    drop(server);
    let name = url.rsplit('/').next().unwrap().split('?').next().unwrap();
    let admin = sqlx::PgPool::connect(&soulbase_testkit::database_url())
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
    accepted
}

/// `evidence.spool_max_bytes`: with the database down, the spool holds the
/// evidence until it reaches the cap, then calls are refused before they run —
/// after about a thousand calls under 1 MiB, twice as many under 2 MiB (the
/// default, derived from the volume's free space, is up to 1 GiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_spool_max_bytes_refuses_calls_past_the_cap() {
    let one = calls_until_the_spool_is_full(1 << 20).await;
    let two = calls_until_the_spool_is_full(2 << 20).await;
    assert!((100..=3_000).contains(&one), "{one} calls under 1 MiB");
    assert!(
        two * 10 >= one * 15 && two * 10 <= one * 25,
        "{two} calls under 2 MiB, {one} under 1 MiB"
    );
}

/// `evidence.durability`: the spool the server opens is in that mode (`async`
/// acknowledges a record before it is on disk, `sync` — the default — after),
/// and the running server says which it opened. (The difference itself shows
/// only when the machine stops between the answer and the write.)
#[test]
fn evidence_durability_sets_the_spools_mode() {
    let load = |yaml: &str| -> soulbase_config::Config { serde_saphyr::from_str(yaml).unwrap() };
    let async_mode = load("evidence:\n  durability: async\n");
    let mode =
        |c: &soulbase_config::Config| format!("{:?}", soulbase_store::spool_options(c).durability);
    assert_eq!(mode(&async_mode), "Async");
    assert_eq!(mode(&load("{}")), "Sync");

    let mut raw = Raw::start(
        &format!("{ACME_ONLY}evidence:\n  durability: async\nobserve:\n  log_filter: info\n"),
        &["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
    );
    raw.ready();
    let log = raw.stop();
    let opened = log
        .lines()
        .find(|l| l.contains("evidence persistence opened"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(opened.contains("Async"), "{opened}");
}

// ---- model ----

/// A model turn asking for a tool (echo), so a conversation runs until its
/// iteration bound.
fn echo_call() -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-test",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "soulbase__builtin__echo", "arguments": "{\"n\": 1}"}}]}}]})
}

async fn chat(server: &Server, tenant: &str, body: Value) -> (u16, Value) {
    let (status, text) = http(
        &server.http,
        "POST",
        "/v1/chat/completions",
        &who(tenant, "bob"),
        &body.to_string(),
    )
    .await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// `model.max_iterations` bounds a conversation asking for none (and the prompt
/// says so), `model.max_iterations_cap` refuses a request asking for more,
/// `model.upstream.api_key_env` is sent as the bearer token, and `model.allow`
/// decides which models (`models`) each tenant (`tenant`) may use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_settings_bound_the_loop_and_reach_the_upstream() {
    let (base, up) = common::scripted_model(vec![echo_call()]).await;
    let config = format!(
        "{DEV_CONFIG}model:\n  max_iterations: 3\n  max_iterations_cap: 4\n  \
         upstream: {{ base_url: \"{base}\", api_key_env: SB_TEST_MODEL_KEY, timeout_ms: 10000 }}\n  \
         allow:\n    - {{ tenant: acme, models: [\"gpt-*\"] }}\n"
    );
    let server = Server::start_env(&config, |_| {}, &[("SB_TEST_MODEL_KEY", "sk-test-0123")]);
    let hi = json!([{"role": "user", "content": "Echo."}]);

    // max_iterations: three model turns, then stopped.
    let (status, body) = chat(
        &server,
        "acme",
        json!({"model": "gpt-test", "messages": hi}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["soulbase"]["reason"], "max_iterations", "{body}");
    assert_eq!(body["soulbase"]["iterations"], 3, "{body}");
    {
        let seen = up.seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        let system = seen[0]["messages"][0]["content"].as_str().unwrap();
        assert!(system.contains("Maximum iterations: 3"), "{system}");
        // api_key_env: the variable's value, as a bearer token, on every turn.
        for auth in up.auth.lock().unwrap().iter() {
            assert_eq!(auth.as_deref(), Some("Bearer sk-test-0123"));
        }
    }

    // max_iterations_cap: 4 may be asked for, 5 may not (the default cap is 32).
    let (status, body) = chat(
        &server,
        "acme",
        json!({"model": "gpt-test", "max_iterations": 4, "messages": hi}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["soulbase"]["iterations"], 4, "{body}");
    let (_, body) = chat(
        &server,
        "acme",
        json!({"model": "gpt-test", "max_iterations": 5, "messages": hi}),
    )
    .await;
    assert_eq!(code(&body), "SCHEMA.VALIDATION_FAILED", "{body}");

    // model.allow[].models: only gpt-* for acme; allow[].tenant: none for limited.
    let (_, body) = chat(
        &server,
        "acme",
        json!({"model": "claude-x", "messages": hi}),
    )
    .await;
    assert_eq!(code(&body), "AUTH.FORBIDDEN", "{body}");
    let (_, body) = chat(
        &server,
        "limited",
        json!({"model": "gpt-test", "messages": hi}),
    )
    .await;
    assert_eq!(code(&body), "AUTH.FORBIDDEN", "{body}");
    assert_eq!(
        up.seen.lock().unwrap().len(),
        7,
        "refusals never reach the model"
    );
}

// ---- observe ----

/// `observe.log_filter` (when `RUST_LOG` is unset): `warn` keeps the warnings
/// and drops the info lines, `info` keeps both.
#[test]
fn observe_log_filter_decides_what_is_logged() {
    let flags = ["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"];
    let run = |filter: &str| {
        let mut raw = Raw::start(
            &format!("{ACME_ONLY}observe:\n  log_filter: \"{filter}\"\n"),
            &flags,
        );
        raw.ready();
        raw.stop()
    };
    let warn = run("warn");
    assert!(warn.contains("server.dev_insecure is set"), "{warn}");
    assert!(!warn.contains("evidence persistence opened"), "{warn}");
    let info = run("info");
    assert!(info.contains("server.dev_insecure is set"), "{info}");
    assert!(info.contains("evidence persistence opened"), "{info}");
}

/// `observe.metrics_max_tools` and `observe.metrics_max_tenants` (1 each): the
/// first tool and tenant seen are labelled by name, the others counted as
/// `other`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_metrics_caps_count_the_rest_as_other() {
    let server = Server::start(&format!(
        "{DEV_CONFIG}observe:\n  metrics_max_tools: 1\n  metrics_max_tenants: 1\n"
    ));
    for (tenant, tool, args) in [
        ("acme", ECHO, json!({})),
        ("acme", SLEEP, json!({"ms": 1})),
        ("limited", ECHO, json!({})),
    ] {
        let (status, v) = invoke(&server, &who(tenant, "bob"), tool, args).await;
        assert_eq!(status, 200, "{v}");
    }
    let (_, metrics) = http(&server.http, "GET", "/metrics", &[], "").await;
    for line in [
        "soulbase_tool_calls_total{tool=\"soulbase.builtin.echo\",status=\"ok\"} 2",
        "soulbase_tool_calls_total{tool=\"other\",status=\"ok\"} 1",
        "soulbase_budget_consumed_total{tenant=\"acme\",resource=\"calls\"} 2",
        "soulbase_budget_consumed_total{tenant=\"other\",resource=\"calls\"} 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    assert!(
        !metrics.contains("tool=\"soulbase.builtin.sleep\""),
        "{metrics}"
    );
    assert!(!metrics.contains("tenant=\"limited\""), "{metrics}");
}

// ---- policy ----

/// Each field of a static rule decides: `tools` (echo only), `effect: deny` with
/// `actors` (mallory only), `tenant` (acme only), `actions` (only the auditor
/// reads evidence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_rules_decide_by_each_field() {
    let server = Server::start(
        r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["soulbase.builtin.echo"], actions: [invoke] }
    - { effect: deny, tenant: acme, actors: [mallory], tools: ["*"] }
    - { effect: allow, tenant: acme, actors: [auditor], tools: ["*"], actions: [read_evidence] }
"#,
    );
    let (status, ok) = invoke(&server, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!(status, 200, "{ok}");
    // tools: sleep is not covered.
    let (status, v) = invoke(&server, &who("acme", "bob"), SLEEP, json!({"ms": 1})).await;
    assert_eq!((status, code(&v)), (403, "POLICY.DENY_TOOL"), "{v}");
    // effect deny, for the actors it names.
    let (status, v) = invoke(&server, &who("acme", "mallory"), ECHO, json!({})).await;
    assert_eq!((status, code(&v)), (403, "POLICY.DENY_TOOL"), "{v}");
    // tenant: another tenant has no rule.
    let (status, v) = invoke(&server, &who("beta", "bob"), ECHO, json!({})).await;
    assert_eq!((status, code(&v)), (403, "POLICY.DENY_TOOL"), "{v}");
    // actions: invoke does not read evidence; the auditor's read_evidence does.
    let path = format!("/api/evidence/{}", ok["call_id"].as_str().unwrap());
    let (status, _) = http(&server.http, "GET", &path, &who("acme", "bob"), "").await;
    assert_eq!(status, 403);
    let (status, body) = http(&server.http, "GET", &path, &who("acme", "auditor"), "").await;
    assert_eq!(status, 200, "{body}");
}

/// `policy.rules[].obligations[].value`: the redaction's replacement and the
/// watermark's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_obligation_values_replace_and_mark() {
    let server = Server::start(
        r#"
server:
  dev_insecure: true
policy:
  rules:
    - effect: allow
      tenant: acme
      tools: ["soulbase.builtin.echo"]
      obligations:
        - { kind: redact, pointer: /echo/ssn, value: "<removed>" }
        - { kind: watermark, pointer: /echo/note, value: "(c) acme" }
"#,
    );
    let (status, v) = invoke(
        &server,
        &who("acme", "bob"),
        ECHO,
        json!({"ssn": "123-45-6789", "note": "hi"}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["output"],
        json!({"echo": {"ssn": "<removed>", "note": "hi (c) acme"}}),
        "{v}"
    );
}

// ---- quota ----

/// `quota.redis_url_file`: the Redis URL is read from the file — here one where
/// nothing listens, so the Redis backend answers `QUOTA.UNAVAILABLE` (the memory
/// backend never does).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_redis_url_file_is_the_redis_asked() {
    let config = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"] }
quota:
  backend: redis
  redis_url_file: ./redis-url
  limits:
    - { tenant: acme, tool: soulbase.builtin.echo, rate: 100/min }
"#;
    let server = Server::start_in(config, |dir| {
        std::fs::write(dir.join("redis-url"), "redis://127.0.0.1:1\n").unwrap();
    });
    let (status, v) = invoke(&server, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!((status, code(&v)), (503, "QUOTA.UNAVAILABLE"), "{v}");
    assert_eq!(v["error"]["fields"]["backend"], "redis", "{v}");
}

/// `quota.budgets[]`: each amount (`calls`, `bytes_in`, `bytes_out`) refuses
/// the call after it is used up, within its scope (`tenant`, `tool`, `actor`,
/// `per_actor`) and `window` (named in the refusal, and the retry hint within
/// it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quota_budgets_count_each_amount_in_their_scope() {
    let server = Server::start(
        r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: "*", tools: ["*"] }
quota:
  budgets:
    - { tenant: acme, tool: soulbase.builtin.echo, window: min, calls: 2 }
    - { tenant: beta, window: hour, bytes_in: 10 }
    - { tenant: gamma, window: day, bytes_out: 10 }
    - { tenant: delta, actor: robot, window: min, calls: 1 }
    - { tenant: eps, per_actor: true, window: min, calls: 1 }
"#,
    );
    let call = |tenant: &'static str, actor: &'static str, tool: &'static str| {
        let server = &server;
        async move {
            let args = if tool == SLEEP {
                json!({"ms": 1})
            } else {
                json!({"a": "0123456789"})
            };
            invoke(server, &who(tenant, actor), tool, args).await
        }
    };
    let refused = |v: &Value, budget: &str| {
        assert_eq!(code(v), "QUOTA.BUDGET_EXCEEDED", "{v}");
        assert_eq!(v["error"]["fields"]["budget"], budget, "{v}");
    };

    // calls, tenant, tool, window.
    for _ in 0..2 {
        assert_eq!(call("acme", "bob", ECHO).await.0, 200);
    }
    let (_, v) = call("acme", "bob", ECHO).await;
    refused(&v, "calls 2 per 60000 ms on soulbase.builtin.echo");
    let hint = v["error"]["retry_after_ms"].as_u64().unwrap();
    assert!(hint > 0 && hint <= 60_000, "within the minute: {v}");
    assert_eq!(call("acme", "bob", SLEEP).await.0, 200, "another tool");
    for _ in 0..3 {
        assert_eq!(call("zeta", "bob", ECHO).await.0, 200, "another tenant");
    }
    // bytes_in: the first call's arguments use it up.
    assert_eq!(call("beta", "bob", ECHO).await.0, 200);
    refused(
        &call("beta", "bob", ECHO).await.1,
        "bytes_in 10 per 3600000 ms on *",
    );
    // bytes_out: the first call's output uses it up.
    assert_eq!(call("gamma", "bob", ECHO).await.0, 200);
    refused(
        &call("gamma", "bob", ECHO).await.1,
        "bytes_out 10 per 86400000 ms on *",
    );
    // actor: only robot's calls count.
    assert_eq!(call("delta", "robot", ECHO).await.0, 200);
    refused(
        &call("delta", "robot", ECHO).await.1,
        "calls 1 per 60000 ms on *",
    );
    for _ in 0..2 {
        assert_eq!(call("delta", "alice", ECHO).await.0, 200);
    }
    // per_actor: each actor has its own count.
    assert_eq!(call("eps", "alice", ECHO).await.0, 200);
    refused(
        &call("eps", "alice", ECHO).await.1,
        "calls 1 per 60000 ms on *",
    );
    assert_eq!(call("eps", "bob", ECHO).await.0, 200);
}

// ---- server ----

/// `server.dev_insecure`: the development headers are an identity only with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_dev_insecure_trusts_the_development_headers() {
    let rules = "policy:\n  rules:\n    - { effect: allow, tenant: acme, tools: [\"*\"] }\n";
    let strict = Server::start(rules);
    let (status, v) = invoke(&strict, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!((status, code(&v)), (401, "AUTH.UNAUTHENTICATED"), "{v}");
    let dev = Server::start(&format!("server:\n  dev_insecure: true\n{rules}"));
    let (status, v) = invoke(&dev, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!(status, 200, "{v}");
}

/// `server.grpc_addr` and `server.http_addr` (no address flags given): the
/// listeners bind there and serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_listen_addresses_come_from_the_configuration() {
    let (grpc, http_addr) = (common::free_addr(), common::free_addr());
    let raw = Raw::start(
        &format!("server:\n  grpc_addr: \"{grpc}\"\n  http_addr: \"{http_addr}\"\n"),
        &[],
    );
    let lines = raw.ready();
    assert!(
        lines.contains(&format!("soulbased: grpc listening on {grpc}")),
        "{lines:?}"
    );
    assert!(
        lines.contains(&format!("soulbased: http listening on {http_addr}")),
        "{lines:?}"
    );
    let (status, _) = http(&http_addr, "GET", "/healthz", &[], "").await;
    assert_eq!(status, 200);
    let mut health = tonic_health::pb::health_client::HealthClient::new(
        tonic::transport::Channel::from_shared(format!("http://{grpc}"))
            .unwrap()
            .connect_lazy(),
    );
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();
}

/// `server.internal_token_file`: role services require the token the file holds,
/// and a tools process sends the one its own file holds — the same token works,
/// another is refused (`PROVIDER.UNAVAILABLE`: the deployment's tokens disagree).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_internal_token_file_is_the_token_roles_require() {
    let with_token = |token: &'static str| {
        move |dir: &Path| {
            std::fs::write(dir.join("token"), format!("{token}\n")).unwrap();
        }
    };
    let roles = Server::start_in(
        &config_with("  roles: [auth, qos]\n  internal_token_file: ./token\n"),
        with_token("internal-token-0123456789abcdef"),
    );
    let tools_config = format!(
        "server:\n  dev_insecure: true\n  roles: [tools]\n  internal_token_file: ./token\n  \
         remote:\n    auth: http://{0}\n    qos: http://{0}\n",
        roles.grpc
    );
    let same = Server::start_in(&tools_config, with_token("internal-token-0123456789abcdef"));
    let (status, v) = invoke(&same, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!(status, 200, "{v}");
    let other = Server::start_in(&tools_config, with_token("another-token-0123456789abcdef"));
    let (_, v) = invoke(&other, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!(code(&v), "PROVIDER.UNAVAILABLE", "{v}");
}

/// `server.mcp_allowed_origins`: a browser origin it lists may use the MCP
/// endpoint; any other is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_mcp_allowed_origins_admit_a_browser_origin() {
    let server = Server::start(&config_with(
        "  mcp_allowed_origins: [\"https://ok.example\"]\n",
    ));
    for (origin, want) in [("https://ok.example", 200), ("https://evil.example", 403)] {
        let (status, text) = common::mcp_initialize_from(&server.http, origin).await;
        assert_eq!(status, want, "{origin}: {text}");
    }
}

// ---- skills ----

/// The context switches of `pid`'s thread named `name` (as `/proc` shows it,
/// cut to 15 bytes), if there is one.
fn thread_switches(pid: u32, name: &str) -> Option<u64> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()? {
        let dir = task.ok()?.path();
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim_end() != name {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).ok()?;
        return Some(
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum(),
        );
    }
    None
}

/// The skills watcher thread (`soulbase-skills-watch`, cut by the kernel).
const WATCHER: &str = "soulbase-skills";

/// `skills.watch` and `skills.poll_interval_ms`: with `watch: true` the watcher
/// thread runs and wakes every `poll_interval_ms` to fingerprint the directory —
/// at 50 ms its thread switches 60 times in under 2 s (measured: ~35 a second),
/// where the default 5 s gives a handful in 6 s; with
/// `watch: false` there is no watcher, and a new skill file is served only after
/// an explicit reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_watch_and_poll_interval_ms_drive_the_watcher() {
    let skills = |watch: &str| {
        format!("{DEV_CONFIG}skills:\n  dir: ./skills\n  watch: {watch}\n  poll_interval_ms: 50\n")
    };
    let mkdir = |dir: &Path| std::fs::create_dir_all(dir.join("skills")).unwrap();
    let watched = Server::start_in(&skills("true"), mkdir);
    let before = thread_switches(watched.pid(), WATCHER).expect("no skills watcher thread");
    let started = Instant::now();
    loop {
        let now = thread_switches(watched.pid(), WATCHER).unwrap();
        if now >= before + 60 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "the watcher thread switched {} times in 6 s",
            now - before
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(watched);

    let unwatched = Server::start_in(&skills("false"), mkdir);
    assert_eq!(thread_switches(unwatched.pid(), WATCHER), None);
    std::fs::write(
        unwatched.dir().join("skills/late.yaml"),
        "name: late\ndescription: Added after start.\nprovider: builtin\n\
         handler: soulbase.builtin.echo\nrisk_level: read\nparameters:\n  type: object\n",
    )
    .unwrap();
    let listed = |server: &Server| {
        let addr = server.http.clone();
        async move {
            let (_, body) = http(&addr, "GET", "/api/tools", &who("acme", "bob"), "").await;
            body.contains("skills.late.late")
        }
    };
    assert!(!listed(&unwatched).await);
    let (status, body) = http(
        &unwatched.http,
        "POST",
        "/api/reload",
        &who("acme", "bob"),
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(listed(&unwatched).await);
}

// ---- tenants ----

/// `tenants[].enable`: a global tool the tenant paused through the registry API
/// is enabled all the same while the configuration says so, and paused again
/// once it no longer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_enable_wins_over_a_stored_pause() {
    let enabled =
        format!("{DEV_CONFIG}tenants:\n  - {{ tenant: acme, enable: [soulbase.builtin.echo] }}\n");
    let server = Server::start(&enabled);
    let (status, view) = http(
        &server.http,
        "PUT",
        "/api/access/overrides/soulbase.builtin.echo",
        &who("acme", "bob"),
        r#"{"state": "paused"}"#,
    )
    .await;
    assert_eq!(status, 200, "{view}");
    let (status, v) = invoke(&server, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!(status, 200, "the configured enable wins: {v}");

    std::fs::write(server.config_path(), DEV_CONFIG).unwrap();
    let (status, body) = http(&server.http, "POST", "/api/reload", &who("acme", "bob"), "").await;
    assert_eq!(status, 200, "{body}");
    let (_, v) = invoke(&server, &who("acme", "bob"), ECHO, json!({})).await;
    assert_eq!(code(&v), "TOOL.DISABLED", "the stored pause applies: {v}");
}

// ---- auth ----

/// A key whose id part is `id`.
fn key(id: &str) -> String {
    format!("sbk_{id}_0123456789abcdef0123456789abcdef")
}

/// Each field of `auth.api_keys[]`: `id` and `sha256` decide which key is
/// accepted, `tenant` and `actor` who it is (in the evidence, and to the
/// policy), `roles` what a role-based policy grants it, `revoked` refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_api_key_entries_decide_who_a_key_is() {
    let digest = |k: &str| soulbase_auth::api_key_digest(k);
    let config = format!(
        r#"
auth:
  api_keys:
    - {{ id: ci, sha256: "{ci}", tenant: acme, actor: ci-bot }}
    - {{ id: aud, sha256: "{aud}", tenant: acme, actor: aud, roles: [auditor] }}
    - {{ id: old, sha256: "{old}", tenant: acme, actor: old, revoked: true }}
    - {{ id: elsewhere, sha256: "{moved}", tenant: acme, actor: moved }}
    - {{ id: forged, sha256: "{forged}", tenant: acme, actor: forged }}
    - {{ id: beta, sha256: "{beta}", tenant: beta, actor: ci-bot }}
  cedar:
    policies: |
      permit(principal in Soul::Tenant::"acme", action == Soul::Action::"invoke", resource == Soul::Tool::"soulbase.builtin.echo");
      permit(principal in Soul::Role::"auditor", action == Soul::Action::"invoke", resource == Soul::Tool::"soulbase.builtin.sleep");
      permit(principal in Soul::Tenant::"acme", action == Soul::Action::"read_evidence", resource);
"#,
        ci = digest(&key("ci")),
        aud = digest(&key("aud")),
        old = digest(&key("old")),
        moved = digest(&key("moved")),
        forged = digest("sbk_forged_ffffffffffffffffffffffffffffffff"),
        beta = digest(&key("beta")),
    );
    let server = Server::start(&config);
    let call = |k: String, tool: &'static str| {
        let server = &server;
        async move {
            let args = if tool == SLEEP {
                json!({"ms": 1})
            } else {
                json!({})
            };
            invoke(server, &[("x-api-key", k.as_str())], tool, args).await
        }
    };

    // tenant and actor: who the evidence says called.
    let (status, ok) = call(key("ci"), ECHO).await;
    assert_eq!(status, 200, "{ok}");
    let ci = key("ci");
    let (status, evidence) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{}", ok["call_id"].as_str().unwrap()),
        &[("x-api-key", ci.as_str())],
        "",
    )
    .await;
    assert_eq!(status, 200, "{evidence}");
    assert!(evidence.contains("\"tenant\":\"acme\""), "{evidence}");
    assert!(evidence.contains("\"actor\":\"ci-bot\""), "{evidence}");
    // tenant, to the policy: the same actor of beta is not permitted.
    let (status, v) = call(key("beta"), ECHO).await;
    assert_eq!((status, code(&v)), (403, "POLICY.DENY_TOOL"), "{v}");
    // roles: only the auditor's key may sleep.
    let (status, v) = call(key("ci"), SLEEP).await;
    assert_eq!((status, code(&v)), (403, "POLICY.DENY_TOOL"), "{v}");
    let (status, v) = call(key("aud"), SLEEP).await;
    assert_eq!(status, 200, "{v}");
    // revoked; an id not listed (its digest is, under another id); a digest that
    // is not the key's.
    for k in [key("old"), key("moved"), key("forged")] {
        let (status, v) = call(k.clone(), ECHO).await;
        assert_eq!(
            (status, code(&v)),
            (401, "AUTH.UNAUTHENTICATED"),
            "{k}: {v}"
        );
    }
}

/// The `memo` skill, whose tool needs consent (risk `write`).
fn memo_skill(dir: &Path) {
    let skills = dir.join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(
        skills.join("memo.yaml"),
        "name: memo\ndescription: Keep a memo.\nprovider: builtin\n\
         handler: soulbase.builtin.echo\nrisk_level: write\nparameters:\n  type: object\n",
    )
    .unwrap();
}

/// `auth.consent.default_ttl_ms` is the lifetime of a token issued without one
/// asked for; `auth.consent.max_ttl_ms` caps what is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_consent_lifetimes_come_from_the_configuration() {
    let config = r#"
server:
  dev_insecure: true
skills:
  dir: skills
  watch: false
auth:
  consent: { default_ttl_ms: 120000, max_ttl_ms: 300000 }
policy:
  rules:
    - { effect: allow, tenant: acme, actors: [approver], tools: ["skills.memo.*"], actions: [consent_issue] }
"#;
    let server = Server::start_in(config, memo_skill);
    let lifetime = |body: &'static str| {
        let addr = server.http.clone();
        async move {
            let (status, text) = http(
                &addr,
                "POST",
                "/api/consent",
                &who("acme", "approver"),
                body,
            )
            .await;
            assert_eq!(status, 201, "{text}");
            let v: Value = serde_json::from_str(&text).unwrap();
            v["expires_at"].as_i64().unwrap() - v["issued_at"].as_i64().unwrap()
        }
    };
    assert_eq!(
        lifetime(r#"{"tool":"skills.memo.memo","actor":"alice"}"#).await,
        120_000
    );
    assert_eq!(
        lifetime(r#"{"tool":"skills.memo.memo","actor":"alice","ttl_ms":100000000}"#).await,
        300_000
    );
}

// ---- sandbox ----

/// Requests a loopback service received: (path, headers).
type Seen = Arc<Mutex<Vec<(String, HeaderMap)>>>;

/// A loopback JSON service: `/execute` answers `{"lines": ["direct"]}`, `/moved`
/// redirects (307) to `/final`, which answers `{"lines": ["final"]}`. Its port
/// and what it received.
async fn service() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let answer = |lines: &'static str| {
        move |State(seen): State<Seen>, uri: axum::http::Uri, headers: HeaderMap| async move {
            seen.lock().unwrap().push((uri.path().to_owned(), headers));
            let out = json!({ "lines": [lines] });
            ([("content-type", "application/json")], out.to_string())
        }
    };
    let app = axum::Router::new()
        .route("/execute", post(answer("direct")))
        .route("/final", post(answer("final")))
        .route(
            "/moved",
            post(|State(seen): State<Seen>, headers: HeaderMap| async move {
                seen.lock().unwrap().push(("/moved".to_owned(), headers));
                axum::response::Redirect::temporary("/final")
            }),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, seen)
}

/// An HTTP skill `name` posting to `http://127.0.0.1:{port}{path}`, with
/// `headers` (YAML lines under `headers:`, or none).
fn http_skill(dir: &Path, name: &str, port: &str, path: &str, headers: &str) {
    let skills = dir.join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    let headers = if headers.is_empty() {
        String::new()
    } else {
        format!("headers:\n  {headers}\n")
    };
    std::fs::write(
        skills.join(format!("{name}.yaml")),
        format!(
            "name: {name}\ndescription: Calls the test service.\nprovider: http\n\
             endpoint: http://127.0.0.1:{port}{path}\ntimeout: 5\n{headers}risk_level: read\n\
             parameters:\n  type: object\noutput_schema:\n  type: object\n  required: [lines]\n"
        ),
    )
    .unwrap();
}

/// Every tenant may invoke; skills from `./skills`; `SANDBOX` is replaced by the
/// sandbox section.
const SKILLS_CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: "*", tools: ["*"], actions: [invoke, register, enable, consent_issue] }
sandbox:
SANDBOX
"#;

fn sandbox_config(sandbox: &str) -> String {
    if sandbox.is_empty() {
        SKILLS_CONFIG.replace("sandbox:\nSANDBOX\n", "")
    } else {
        SKILLS_CONFIG.replace("SANDBOX\n", sandbox)
    }
}

/// `sandbox.default_grant`: a tenant without a grant of its own gets it (here:
/// the loopback service), a tenant with its own (empty) grant does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_default_grant_applies_to_tenants_without_their_own() {
    let (port, seen) = service().await;
    let config = sandbox_config(
        "  default_grant: [{ kind: net, hosts: [\"127.0.0.1\"] }]\n  grants:\n    - { tenant: acme, capabilities: [] }\n",
    );
    let server = Server::start_in(&config, |dir| http_skill(dir, "svc", &port, "/execute", ""));
    let tool = "skills.svc.svc";
    let (status, v) = invoke(&server, &who("stranger", "bob"), tool, json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"], json!({"lines": ["direct"]}));
    let (status, v) = invoke(&server, &who("acme", "bob"), tool, json!({})).await;
    assert_eq!(
        (status, code(&v)),
        (403, "SANDBOX.CAPABILITY_BLOCKED"),
        "{v}"
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
}

/// `sandbox.http_env_allow`: an HTTP skill's header may name a variable it lists,
/// and the service receives the variable's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_http_env_allow_lets_headers_name_variables() {
    let (port, seen) = service().await;
    let config = sandbox_config(
        "  http_env_allow: [SB_TEST_HTTP_TOKEN]\n  grants:\n    - { tenant: acme, capabilities: [{ kind: net, hosts: [\"127.0.0.1\"] }] }\n",
    );
    let server = Server::start_env(
        &config,
        |dir| {
            http_skill(
                dir,
                "svc",
                &port,
                "/execute",
                "X-Token: ${SB_TEST_HTTP_TOKEN}",
            )
        },
        &[("SB_TEST_HTTP_TOKEN", "s3cret-value")],
    );
    let (status, v) = invoke(&server, &who("acme", "bob"), "skills.svc.svc", json!({})).await;
    assert_eq!(status, 200, "{v}");
    let seen = seen.lock().unwrap();
    assert_eq!(seen[0].1.get("x-token").unwrap(), "s3cret-value");
}

/// `sandbox.http_max_redirects`: with 1, an HTTP skill whose endpoint redirects
/// gets the final answer; with the default 0 the redirect is not followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_http_max_redirects_are_followed() {
    let (port, seen) = service().await;
    let grant = "  grants:\n    - { tenant: acme, capabilities: [{ kind: net, hosts: [\"127.0.0.1\"] }] }\n";
    let prepare = |dir: &Path| http_skill(dir, "moved", &port, "/moved", "");
    let tool = "skills.moved.moved";
    let following = Server::start_in(
        &sandbox_config(&format!("  http_max_redirects: 1\n{grant}")),
        prepare,
    );
    let (status, v) = invoke(&following, &who("acme", "bob"), tool, json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"], json!({"lines": ["final"]}));
    let not_following = Server::start_in(&sandbox_config(grant), prepare);
    let (status, v) = invoke(&not_following, &who("acme", "bob"), tool, json!({})).await;
    assert_eq!(code(&v), "TOOL.EXECUTION_FAILED", "{status} {v}");
    let paths: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(p, _)| p.clone())
        .collect();
    assert_eq!(paths, ["/moved", "/final", "/moved"]);
}

/// A native tool reporting its process id and scratch directory.
const PROBE: &str = r#"#!/bin/sh
input=
while IFS= read -r line || [ -n "$line" ]; do
  input="$input$line"
done
printf '{"pid": %s, "tmp": "%s"}\n' "$$" "$TMPDIR"
"#;

/// Registers the probe (`demo.native.probe`, running `script`) as acme's tool,
/// has `approver` consent to a call by bob and calls it: the tool's output.
async fn run_probe(server: &Server, script: &str) -> Value {
    let manifest = json!({
        "id": "demo.native.probe",
        "version": "1.0.0",
        "description": "Reports its process id and scratch directory.",
        "input_schema": {"type": "object"},
        "output_schema": {"type": "object"},
        "side_effect": "process",
        "capabilities": [
            {"kind": "proc", "commands": [script]},
            {"kind": "tmp", "max_bytes": 1_048_576}
        ],
        "consent": {"required": true},
        "provider": {"type": "process", "command": script}
    });
    server
        .registry()
        .await
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
    let (status, text) = http(
        &server.http,
        "POST",
        "/api/consent",
        &who("acme", "approver"),
        r#"{"tool":"demo.native.probe","actor":"bob"}"#,
    )
    .await;
    assert_eq!(status, 201, "{text}");
    let issued: Value = serde_json::from_str(&text).unwrap();
    let token = issued["token"].as_str().unwrap();
    let (status, v) = invoke(
        server,
        &[
            ("x-soulbase-tenant", "acme"),
            ("x-soulbase-actor", "bob"),
            ("x-soulbase-consent", token),
        ],
        "demo.native.probe",
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v["output"].clone()
}

/// `sandbox.process_isolation`: under `namespaces` a native tool is the first
/// processes of a PID namespace of its own; under `landlock-only` it is a
/// process of the host's. `sandbox.scratch_dir`: its scratch directory is
/// created there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_process_isolation_and_scratch_dir_shape_native_tools() {
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    // When the server runs as root, native tools run as nobody: the script and
    // the directories on the way to it must be readable by others.
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = home.path().join("probe.sh");
    std::fs::write(&script, PROBE).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = script.canonicalize().unwrap().display().to_string();
    let scratch = home.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o755)).unwrap();
    let scratch = scratch.canonicalize().unwrap().display().to_string();
    let config = |isolation: &str| {
        sandbox_config(&format!(
            "  process_isolation: {isolation}\n  scratch_dir: \"{scratch}\"\n  grants:\n    - tenant: acme\n      \
             capabilities:\n        - {{ kind: proc, commands: [\"{script}\"] }}\n        \
             - {{ kind: tmp, max_bytes: 1048576 }}\n"
        ))
    };

    let host = Server::start_in(&config("landlock-only"), |_| {});
    let out = run_probe(&host, &script).await;
    assert!(out["pid"].as_u64().unwrap() > 2, "a host process: {out}");
    let tmp = out["tmp"].as_str().unwrap();
    assert!(tmp.starts_with(&scratch), "{tmp} under {scratch}");

    let isolated = Server::start_in(&config("namespaces"), |_| {});
    let out = run_probe(&isolated, &script).await;
    assert!(
        out["pid"].as_u64().unwrap() <= 2,
        "its own PID namespace: {out}"
    );
}

/// The fixture module `file` and its recorded digest.
fn wasm_fixture(file: &str) -> (std::path::PathBuf, String) {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/wasm");
    let sums = std::fs::read_to_string(fixtures.join("SHA256SUMS")).unwrap();
    let sha = sums
        .lines()
        .find_map(|l| l.strip_suffix(&format!("  {file}")))
        .unwrap()
        .to_owned();
    (fixtures.join(file), sha)
}

/// A WASM skill package `name` whose tool (`skills.NAME.NAME`) runs the fixture
/// module `file`.
fn wasm_skill(dir: &Path, name: &str, file: &str) {
    let (module, sha) = wasm_fixture(file);
    let package = dir.join("skills").join(name);
    std::fs::create_dir_all(&package).unwrap();
    std::fs::copy(module, package.join(file)).unwrap();
    std::fs::write(
        package.join("SKILL.md"),
        format!(
            "---\nname: {name}\ndescription: Runs {file}.\nversion: 1.0.0\n\
             provider:\n  type: wasm\n  module: {file}\n  sha256: {sha}\n\
             tools:\n  - name: {name}\n    description: Runs {file}.\n    timeout: 20\n\
             \x20   input_schema: {{type: object}}\n\
             \x20   output_schema: {{type: object}}\n---\n# {name}\n\nRuns {file}.\n"
        ),
    )
    .unwrap();
}

/// `sandbox.wasm_max_memory_bytes`: a module growing its memory by 1 GiB runs
/// under a 2 GiB cap and traps under the default 64 MiB. `sandbox.wasm_module_root`:
/// modules are loaded from there (relative to it as to the skills directory), so
/// a module present only in the skills directory does not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_wasm_memory_cap_and_module_root() {
    let prepare = |dir: &Path| {
        wasm_skill(dir, "grow", "grow.wasm");
        wasm_skill(dir, "mirror", "echo.wasm");
        let modules = dir.join("modules/grow");
        std::fs::create_dir_all(&modules).unwrap();
        std::fs::copy(wasm_fixture("grow.wasm").0, modules.join("grow.wasm")).unwrap();
    };
    let server = Server::start_in(
        &sandbox_config("  wasm_max_memory_bytes: 2147483648\n  wasm_module_root: ./modules\n"),
        prepare,
    );
    let (status, v) = invoke(&server, &who("acme", "bob"), "skills.grow.grow", json!({})).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"], json!({"grown": true}));
    let (status, v) = invoke(
        &server,
        &who("acme", "bob"),
        "skills.mirror.mirror",
        json!({"a": 1}),
    )
    .await;
    assert_eq!(
        (status, code(&v)),
        (502, "PROVIDER.UNAVAILABLE"),
        "not under the module root: {v}"
    );

    let defaults = Server::start_in(&sandbox_config(""), prepare);
    let (status, v) = invoke(
        &defaults,
        &who("acme", "bob"),
        "skills.grow.grow",
        json!({}),
    )
    .await;
    assert_eq!(
        code(&v),
        "TOOL.EXECUTION_FAILED",
        "over the default memory cap: {status} {v}"
    );
    let (status, v) = invoke(
        &defaults,
        &who("acme", "bob"),
        "skills.mirror.mirror",
        json!({"a": 1}),
    )
    .await;
    assert_eq!(status, 200, "the skills directory is the default root: {v}");
}
