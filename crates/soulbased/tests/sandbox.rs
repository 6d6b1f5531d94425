//! The sandbox executors behind a real `soulbased`: the example WASM skill runs end
//! to end, and an HTTP skill reaches a loopback service only when the call's
//! profile (Grant ∩ Manifest ∩ PolicyConfig) names that IP literally — with the
//! sandbox in the tools process, and again with the sandbox role in its own
//! `soulbased` (`soulbase.sandbox.v1`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::body::Bytes;
use axum::routing::post;
use common::{Server, http};
use serde_json::{Value, json};

/// `acme` may reach loopback by name and by IP; `nogrant` has no sandbox grant
/// (the default grant is nothing).
const CONFIG: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: "*", tools: ["*"], actions: [invoke, read_evidence] }
sandbox:
  grants:
    - tenant: acme
      capabilities:
        - { kind: net, hosts: ["localhost", "127.0.0.1"] }
"#;

/// A loopback JSON service counting its requests.
async fn service() -> (String, Arc<AtomicUsize>) {
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let app = axum::Router::new().route(
        "/execute",
        post(move |body: Bytes| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let args: Value = serde_json::from_slice(&body).unwrap_or_default();
                let out = json!({"lines": [format!("seen {}", args["keyword"])]});
                ([("content-type", "application/json")], out.to_string())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr.port().to_string(), hits)
}

fn http_skill(name: &str, endpoint: &str) -> String {
    format!(
        "name: {name}\ndescription: Search logs through {endpoint}.\nprovider: http\n\
         endpoint: {endpoint}\ntimeout: 5\nrisk_level: read\nparameters:\n  type: object\n  \
         properties:\n    keyword: {{type: string}}\n  required: [keyword]\n\
         output_schema:\n  type: object\n  required: [lines]\n"
    )
}

fn prepare(dir: &Path, port: &str) {
    let skills = dir.join("skills");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/text-length");
    std::fs::create_dir_all(skills.join("text-length")).unwrap();
    for f in ["SKILL.md", "text_length.wat"] {
        std::fs::copy(repo.join(f), skills.join("text-length").join(f)).unwrap();
    }
    std::fs::write(
        skills.join("by_name.yaml"),
        http_skill("by_name", &format!("http://localhost:{port}/execute")),
    )
    .unwrap();
    std::fs::write(
        skills.join("by_ip.yaml"),
        http_skill("by_ip", &format!("http://127.0.0.1:{port}/execute")),
    )
    .unwrap();
}

async fn invoke(server: &Server, tenant: &str, tool: &str, args: Value) -> (u16, Value) {
    let (status, body) = http(
        &server.http,
        "POST",
        &format!("/api/tools/{tool}/invoke"),
        &[("x-soulbase-tenant", tenant), ("x-soulbase-actor", "bob")],
        &args.to_string(),
    )
    .await;
    (status, serde_json::from_str(&body).unwrap())
}

/// The replay summary of the call `result` answers, read back over HTTP.
async fn replay_of(server: &Server, tenant: &str, result: &Value) -> Value {
    let call_id = result["call_id"].as_str().unwrap();
    let (status, body) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{call_id}"),
        &[("x-soulbase-tenant", tenant), ("x-soulbase-actor", "bob")],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<Value>(&body).unwrap()["replay"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_and_http_skills_run_under_their_profiles() {
    let (port, hits) = service().await;
    let server = Server::start_in(CONFIG, |dir| prepare(dir, &port));
    scenario(&server, &hits).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_runs_on_a_remote_sandbox_role() {
    let (port, hits) = service().await;
    // Both processes read the same skills directory (as pods mount the same
    // ConfigMap): the tools process plans, the sandbox process executes.
    // Production-like: the role service requires the internal token.
    let token = [(
        "SB_TEST_INTERNAL_TOKEN",
        "internal-token-for-tests-0123456789",
    )];
    let addr = common::free_addr();
    let tools = Server::start_env(
        &CONFIG.replace(
            "server:\n",
            &format!(
                "server:\n  roles: [tools, auth, qos, evidence]\n  \
                 internal_token_env: SB_TEST_INTERNAL_TOKEN\n  remote:\n    sandbox: http://{addr}\n"
            ),
        ),
        |dir| prepare(dir, &port),
        &token,
    );
    let skills = tools.dir().join("skills");
    let sandbox_config = format!(
        "{}skills:\n  dir: {}\n",
        CONFIG.replace(
            "server:\n",
            "server:\n  roles: [sandbox]\n  internal_token_env: SB_TEST_INTERNAL_TOKEN\n"
        ),
        skills.display()
    );
    let _sandbox = Server::start_at(&sandbox_config, &token, &addr);
    scenario(&tools, &hits).await;
}

/// The checks both layouts must pass.
async fn scenario(server: &Server, hits: &AtomicUsize) {
    // The example WASM skill, end to end (no capabilities needed, so any tenant).
    for tenant in ["acme", "nogrant"] {
        let (status, out) = invoke(
            server,
            tenant,
            "skills.text-length.count",
            json!({"text": "héllo"}),
        )
        .await;
        assert_eq!(status, 200, "{out}");
        assert_eq!(out["output"], json!({"length": 5}), "{out}");
    }

    // A name granted by the profile still cannot reach a loopback address: the
    // executor's own resolver refuses it before connecting.
    let (status, out) = invoke(
        server,
        "acme",
        "skills.by_name.by_name",
        json!({"keyword": "x"}),
    )
    .await;
    assert_eq!(status, 403, "{out}");
    assert_eq!(out["error_code"], "SANDBOX.CAPABILITY_BLOCKED", "{out}");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    // It passed the guard and was refused while executing (Begin + End).
    let replay = replay_of(server, "acme", &out).await;
    assert_eq!(replay["outcome"]["kind"], "executed", "{replay}");
    assert_eq!(
        replay["outcome"]["error_code"],
        "SANDBOX.CAPABILITY_BLOCKED"
    );

    // Without a grant the guard refuses before execution.
    let (status, out) = invoke(
        server,
        "nogrant",
        "skills.by_ip.by_ip",
        json!({"keyword": "x"}),
    )
    .await;
    assert_eq!(status, 403, "{out}");
    assert_eq!(out["error_code"], "SANDBOX.CAPABILITY_BLOCKED", "{out}");
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    let replay = replay_of(server, "nogrant", &out).await;
    assert_eq!(replay["outcome"]["kind"], "denied", "{replay}");

    // The profile names 127.0.0.1 literally (grant, manifest and no ceiling agree).
    let (status, out) = invoke(
        server,
        "acme",
        "skills.by_ip.by_ip",
        json!({"keyword": "x"}),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["output"], json!({"lines": ["seen \"x\""]}), "{out}");
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}
