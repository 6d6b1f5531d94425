//! Durable evidence, idempotency and registry state through a real `soulbased`:
//! `GET /api/evidence/{call_id}` reads a call's Begin/End back from the store
//! (tenant-scoped, `read_evidence` under policy), and a restart on the same data
//! directory restores the registry, the evidence and the idempotency records.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Server, as_dev, http};
use serde_json::{Value, json};
use soulbase_grpc::proto;
use soulbase_grpc::proto::OwnerScope;

/// `acme` may do everything; `globex` may invoke and read evidence (of its own
/// tenant); `blind` may invoke but not read evidence.
const CONFIG: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: ["*"] }
    - { effect: allow, tenant: globex, tools: ["*"], actions: [invoke, read_evidence] }
    - { effect: allow, tenant: blind, tools: ["*"], actions: [invoke] }
"#;

fn dev(tenant: &'static str) -> [(&'static str, &'static str); 2] {
    [("x-soulbase-tenant", tenant), ("x-soulbase-actor", "bob")]
}

async fn invoke(server: &Server, tenant: &'static str, tool: &str, key: Option<&str>) -> Value {
    let mut headers = dev(tenant).to_vec();
    if let Some(k) = key {
        headers.push(("idempotency-key", k));
    }
    let (status, body) = http(
        &server.http,
        "POST",
        &format!("/api/tools/{tool}/invoke"),
        &headers,
        r#"{"n": 7}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn evidence(server: &Server, tenant: &'static str, call_id: &str) -> (u16, Value) {
    let (status, body) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{call_id}"),
        &dev(tenant),
        "",
    )
    .await;
    (status, serde_json::from_str(&body).unwrap())
}

fn kinds(body: &Value) -> Vec<String> {
    body["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["payload"]["event"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_evidence_is_read_back_and_everything_survives_a_restart() {
    // The embedded default: SQLite at ./data/evidence.db, spool at ./data/spool.
    let server = read_back_and_restart(Server::start(CONFIG)).await;
    assert!(server.dir().join("data/evidence.db").is_file());
    assert!(server.dir().join("data/spool").is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_evidence_is_read_back_and_everything_survives_a_restart() {
    let server_url = soulbase_testkit::database_url();
    let name = soulbase_testkit::unique_name("sbd_evidence");
    let admin = sqlx::PgPool::connect(&server_url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let url = soulbase_testkit::with_database(&server_url, &name);
    let config = format!("{CONFIG}evidence:\n  backend: postgres\n  url: {url}\n");
    let server = Server::start(&config);
    let server = read_back_and_restart(server).await;
    assert!(
        !server.dir().join("data/evidence.db").exists(),
        "the Postgres backend must not write SQLite"
    );
    drop(server);
    let admin = sqlx::PgPool::connect(&server_url).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE {name} WITH (FORCE)"
    )))
    .execute(&admin)
    .await
    .unwrap();
}

/// Invoke over HTTP, read the call back, check tenant scoping and policy, restart
/// on the same data directory, and find the registry, evidence and idempotency
/// records restored.
async fn read_back_and_restart(server: Server) -> Server {
    // A tenant tool registered over gRPC (persisted on change).
    let mut registry = server.registry().await;
    let manifest = json!({
        "id": "demo.saved.tool",
        "version": "1.0.0",
        "description": "a tenant tool that must survive a restart",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "output_schema": {"type": "object"},
        "side_effect": "none",
        "idempotency": "keyed",
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

    // Invoke over HTTP, then read the call's Begin and End back.
    let result = invoke(&server, "acme", "demo.saved.tool", Some("key-1")).await;
    assert_eq!(result["status"], "ok", "{result}");
    let call_id = result["call_id"].as_str().unwrap().to_owned();
    let (status, body) = evidence(&server, "acme", &call_id).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["call_id"], call_id.as_str());
    let mut k = kinds(&body);
    k.sort();
    assert_eq!(k, ["begin", "end"], "{body}");
    let replay = &body["replay"];
    assert_eq!(replay["tenant"], "acme");
    assert_eq!(replay["outcome"]["kind"], "executed", "{replay}");
    assert_eq!(replay["outcome"]["tool_id"], "demo.saved.tool");
    assert_eq!(replay["outcome"]["status"], "ok");
    assert_eq!(replay["outcome"]["idempotency_key"], "key-1");
    assert!(replay.get("anomalies").is_none(), "{replay}");
    // The evidence reference the caller got is the Begin's envelope id.
    assert_eq!(replay["outcome"]["begin_id"], result["evidence_ref"]);

    // Another tenant's call answers exactly like an unknown call.
    let (status_other, other) = evidence(&server, "globex", &call_id).await;
    let unknown = soulbase_types::CallId::generate();
    let (status_unknown, missing) = evidence(&server, "acme", unknown.as_str()).await;
    assert_eq!((status_other, status_unknown), (404, 404));
    assert_eq!(other["error"]["code"], missing["error"]["code"]);
    assert_eq!(other["error"]["message"], missing["error"]["message"]);
    // Reading evidence is an action of its own under policy.
    let own = invoke(&server, "blind", "soulbase.builtin.echo", None).await;
    let (status, denied) = evidence(&server, "blind", own["call_id"].as_str().unwrap()).await;
    assert_eq!(status, 403, "{denied}");
    assert_eq!(denied["error"]["code"], "POLICY.DENY_TOOL");
    let own = invoke(&server, "globex", "soulbase.builtin.echo", None).await;
    let (status, body) = evidence(&server, "globex", own["call_id"].as_str().unwrap()).await;
    assert_eq!(status, 200, "{body}");

    // Restart on the same data directory.
    let server = server.restart();
    // The registry: the tenant tool is back, enabled, for its tenant only.
    let again = invoke(&server, "acme", "demo.saved.tool", Some("key-2")).await;
    assert_eq!(again["status"], "ok", "{again}");
    assert_eq!(again["output"], json!({"echo": {"n": 7}}));
    // The evidence of the earlier run.
    let (status, body) = evidence(&server, "acme", &call_id).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["replay"]["outcome"]["status"], "ok");
    // The idempotency record: the keyed call is answered from the store, not re-run.
    let replayed = invoke(&server, "acme", "demo.saved.tool", Some("key-1")).await;
    assert_eq!(replayed["replayed"], true, "{replayed}");
    assert_eq!(replayed["output"], result["output"]);
    // It points at the evidence of the execution it replays.
    assert_eq!(replayed["evidence_ref"], result["evidence_ref"]);
    server
}
