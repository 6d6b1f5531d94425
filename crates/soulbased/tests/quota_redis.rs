//! `quota.backend: redis` in real `soulbased` processes: limits shared across
//! replicas through one Redis, and fail-closed / fail-open when Redis is down.
//! Needs `REDIS_URL` (`cargo xtask test` provisions one).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Server, http};
use serde_json::Value;

/// Dev identities; `tenant` may invoke anything; echo limited to `rate` for it.
fn config(tenant: &str, redis_url: &str, rate: &str, on_failure: &str) -> String {
    format!(
        r#"
server:
  dev_insecure: true
policy:
  rules:
    - {{ effect: allow, tenant: {tenant}, tools: ["*"] }}
quota:
  backend: redis
  redis_url: "{redis_url}"
  on_backend_failure: {on_failure}
  limits:
    - {{ tenant: {tenant}, tool: soulbase.builtin.echo, rate: {rate} }}
"#
    )
}

async fn echo(server: &Server, tenant: &str) -> (u16, Value) {
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-soulbase-tenant", tenant), ("x-soulbase-actor", "a")],
        "{}",
    )
    .await;
    (status, serde_json::from_str(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_redis_limit_exactly() {
    let url = soulbase_testkit::redis_url();
    // A tenant no other run uses, so counters start empty.
    let tenant = soulbase_testkit::unique_name("q").replace('_', "-");
    let cfg = config(&tenant, &url, "5/min", "closed");
    let a = Server::start(&cfg);
    let b = Server::start(&cfg);
    let (mut ok, mut limited) = (0, 0);
    for i in 0..12 {
        let server = if i % 2 == 0 { &a } else { &b };
        let (status, v) = echo(server, &tenant).await;
        match status {
            200 => ok += 1,
            _ => {
                assert_eq!(v["error_code"], "QUOTA.RATE_LIMITED", "{v}");
                assert!(
                    v["error"]["retry_after_ms"]
                        .as_u64()
                        .is_some_and(|ms| ms > 0),
                    "retry hint: {v}"
                );
                limited += 1;
            }
        }
    }
    assert_eq!((ok, limited), (5, 7), "exactly the shared limit succeeds");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_fails_closed_by_default_and_open_when_configured() {
    // Port 1 on loopback: nothing listens, connecting is refused at once.
    let down = "redis://127.0.0.1:1";
    let closed = Server::start(&config("acme", down, "100/min", "closed"));
    let (status, v) = echo(&closed, "acme").await;
    assert_ne!(status, 200, "{v}");
    assert_eq!(v["error_code"], "QUOTA.RATE_LIMITED", "{v}");
    assert!(
        v["error"]["retry_after_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0),
        "{v}"
    );

    let open = Server::start(&config("acme", down, "100/min", "open"));
    let (status, v) = echo(&open, "acme").await;
    assert_eq!(status, 200, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_a_url_refuses_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "quota:\n  backend: redis\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_soulbased"))
        .current_dir(dir.path())
        .arg("--config")
        .arg(&path)
        .args(["--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("quota.redis_url"), "{err}");
}
