//! `quota.backend: redis` in real `soulbased` processes: limits (the tool quotas
//! and the skills' per-tool rate limits) shared across replicas through one
//! Redis, and fail-closed / fail-open when Redis is down.
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

/// Invokes `tool` with `{}` over HTTP as `tenant`; the status and the JSON body.
async fn invoke(server: &Server, tool: &str, tenant: &str) -> (u16, Value) {
    let (status, body) = http(
        &server.http,
        "POST",
        &format!("/api/tools/{tool}/invoke"),
        &[("x-soulbase-tenant", tenant), ("x-soulbase-actor", "a")],
        "{}",
    )
    .await;
    (status, serde_json::from_str(&body).unwrap())
}

async fn echo(server: &Server, tenant: &str) -> (u16, Value) {
    invoke(server, "soulbase.builtin.echo", tenant).await
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

/// A skill `p` whose exported tool `t` (the builtin echo) allows 3 calls a minute.
const RATED_SKILL: &str = r#"---
name: p
description: provider
provider: {type: builtin, handler: soulbase.builtin.echo}
exports:
  api_version: "1.0"
  tools:
    - name: t
      description: x
      input_schema: {type: object}
      output_schema: {type: object}
  access:
    rate_limit:
      t: 3/min
---
"#;

/// `config` serving the skills in `./skills`, which `with_rated_skill` fills.
fn skills_config(tenant: &str, redis_url: &str, on_failure: &str) -> String {
    // The tool quota (100/min on echo) is not what limits the skill's calls.
    format!(
        "{}skills:\n  dir: ./skills\n  watch: false\n",
        config(tenant, redis_url, "100/min", on_failure)
    )
}

fn with_rated_skill(dir: &std::path::Path) {
    std::fs::create_dir_all(dir.join("skills/p")).unwrap();
    std::fs::write(dir.join("skills/p/SKILL.md"), RATED_SKILL).unwrap();
}

async fn skill_call(server: &Server, tenant: &str) -> (u16, Value) {
    invoke(server, "skills.p.t", tenant).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_a_skills_rate_limit_through_redis() {
    let url = soulbase_testkit::redis_url();
    let tenant = soulbase_testkit::unique_name("s").replace('_', "-");
    let cfg = skills_config(&tenant, &url, "closed");
    let a = Server::start_in(&cfg, with_rated_skill);
    let b = Server::start_in(&cfg, with_rated_skill);
    let mut outcomes = Vec::new();
    for i in 0..6 {
        let server = if i % 2 == 0 { &a } else { &b };
        let (status, v) = skill_call(server, &tenant).await;
        outcomes.push(if status == 200 {
            "ok".to_owned()
        } else {
            assert_eq!(
                v["error"]["fields"]["limit"], "3/min",
                "the skill's limit: {v}"
            );
            v["error_code"].as_str().unwrap_or_default().to_owned()
        });
    }
    assert_eq!(
        outcomes,
        [
            "ok",
            "ok",
            "ok",
            "QUOTA.RATE_LIMITED",
            "QUOTA.RATE_LIMITED",
            "QUOTA.RATE_LIMITED"
        ],
        "the skill's 3/min is shared by both replicas"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_redis_fails_closed_by_default_and_open_when_configured() {
    // Port 1 on loopback: nothing listens, connecting is refused at once.
    let down = "redis://127.0.0.1:1";
    let closed = Server::start_in(&skills_config("acme", down, "closed"), with_rated_skill);
    let (status, v) = echo(&closed, "acme").await;
    // Not a rate limit (429): the backend is unavailable (503), and the call was
    // refused before execution.
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error_code"], "QUOTA.UNAVAILABLE", "{v}");
    assert_eq!(v["status"], "denied", "{v}");
    assert_eq!(v["error"]["fields"]["backend"], "redis", "{v}");
    assert!(
        v["error"]["retry_after_ms"]
            .as_u64()
            .is_some_and(|ms| ms > 0),
        "{v}"
    );
    let (status, v) = skill_call(&closed, "acme").await;
    assert_ne!(status, 200, "{v}");
    assert_eq!(
        v["error_code"], "QUOTA.UNAVAILABLE",
        "the skill's limit too: {v}"
    );

    let open = Server::start_in(&skills_config("acme", down, "open"), with_rated_skill);
    let (status, v) = echo(&open, "acme").await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = skill_call(&open, "acme").await;
    assert_eq!(status, 200, "the skill's limit too: {v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_without_a_url_refuses_start_up() {
    let err = common::refused_start("quota:\n  backend: redis\n", &[]);
    assert!(err.contains("quota.redis_url"), "{err}");
}
