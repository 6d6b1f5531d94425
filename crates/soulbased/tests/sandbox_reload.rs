//! Sandbox grants and the ceiling reload live (R9): a reload that removes a grant
//! refuses the next call with `SANDBOX.CAPABILITY_BLOCKED` while a call already
//! running under the old grant finishes; a grant given back applies to the next
//! call; a grant the profiles cannot compile is refused and the previous one stays.
//! The reload's answer never names the grants as waiting for a restart.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Server, held_service, http, http_skill};
use serde_json::{Value, json};

/// Every tenant may invoke and reload; `acme` may reach 127.0.0.1 (`GRANT` is
/// replaced to change its grant).
const CONFIG: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: "*", tools: ["*"], actions: [invoke, reload] }
sandbox:
  grants:
    - tenant: acme
      capabilities: GRANT
"#;

const NET: &str = r#"[{ kind: net, hosts: ["127.0.0.1"] }]"#;
const NOTHING: &str = "[]";
/// Not a grant the profiles accept: hosts must be names or IP literals.
const BAD: &str = r#"[{ kind: net, hosts: ["*.com"] }]"#;

fn config(grant: &str) -> String {
    CONFIG.replace("GRANT", grant)
}

const TOOL: &str = "/api/tools/skills.held.held/invoke";
const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];

async fn invoke(addr: &str) -> (u16, Value) {
    let (status, body) = http(addr, "POST", TOOL, &ACME, r#"{"keyword": "x"}"#).await;
    (status, serde_json::from_str(&body).unwrap())
}

/// Writes `config` and reloads it (`POST /api/reload`; the file watcher may have
/// applied it first, which the answer then reports as unchanged).
async fn reload(server: &Server, config: &str) -> (u16, Value) {
    std::fs::write(server.config_path(), config).unwrap();
    let (status, body) = http(&server.http, "POST", "/api/reload", &ACME, "").await;
    (status, serde_json::from_str(&body).unwrap())
}

fn assert_accepted(status: u16, answer: &Value) {
    assert_eq!(status, 200, "{answer}");
    assert!(
        answer["status"] == "applied" || answer["status"] == "unchanged",
        "{answer}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_removing_a_grant_blocks_the_next_call_and_the_running_one_finishes() {
    let (port, mut started, release, hits) = held_service().await;
    let server = Server::start_in(&config(NET), |dir| {
        std::fs::create_dir_all(dir.join("skills")).unwrap();
        std::fs::write(dir.join("skills/held.yaml"), http_skill(&port)).unwrap();
    });
    let bound = Duration::from_secs(60);

    // A call under the grant reaches the service and is held there.
    let addr = server.http.clone();
    let running = tokio::spawn(async move { invoke(&addr).await });
    tokio::time::timeout(bound, started.recv())
        .await
        .expect("the first call never reached the service")
        .unwrap();

    // The grant is removed: applied live, so not waiting for a restart.
    let (status, answer) = reload(&server, &config(NOTHING)).await;
    assert_accepted(status, &answer);
    assert_eq!(answer["needs_restart"], json!([]), "{answer}");

    // The next call is refused by the guard, before reaching the service.
    let (status, out) = invoke(&server.http).await;
    assert_eq!(status, 403, "{out}");
    assert_eq!(out["error_code"], "SANDBOX.CAPABILITY_BLOCKED", "{out}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);

    // The call in flight finishes under the grant it started with.
    release.add_permits(1);
    let (status, out) = tokio::time::timeout(bound, running)
        .await
        .expect("the running call never finished")
        .unwrap();
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["status"], "ok", "{out}");
    assert_eq!(
        out["output"],
        json!({"lines": ["held and released"]}),
        "{out}"
    );

    // Granted again, with an executor setting changed too: the grant applies to the
    // next call, and only the executor setting waits for a restart.
    let restored = config(NET).replace("sandbox:\n", "sandbox:\n  http_max_redirects: 2\n");
    let (status, answer) = reload(&server, &restored).await;
    assert_accepted(status, &answer);
    assert_eq!(
        answer["needs_restart"],
        json!(["sandbox.http_max_redirects"]),
        "{answer}"
    );
    release.add_permits(1);
    let (status, out) = invoke(&server.http).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["status"], "ok", "{out}");
    assert_eq!(hits.load(Ordering::SeqCst), 2);

    // A grant the profiles refuse rejects the reload, naming the field; the
    // previous grant stays in force.
    let (status, answer) = reload(&server, &config(BAD)).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["code"], "CONFIG.INVALID", "{answer}");
    assert!(
        answer
            .to_string()
            .contains("sandbox.grants[0].capabilities[0].hosts[0]"),
        "{answer}"
    );
    release.add_permits(1);
    let (status, out) = invoke(&server.http).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(hits.load(Ordering::SeqCst), 3);
}
