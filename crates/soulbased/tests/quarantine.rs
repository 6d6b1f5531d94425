//! The evidence quarantine offered to the database again by a running
//! `soulbased` (`POST /api/quarantine/retry`): the operator — a caller of the
//! `global` tenant with action `update` on `soulbase.server.quarantine` — retries
//! it, what the database takes leaves the file and can be read as evidence, what
//! it still refuses stays with its reason now, unreadable lines stay; anyone else
//! is refused with a stable code and the file stays as it was; the retry that
//! changed the file is audited as the operator's. A tools process whose
//! evidence goes to a remote evidence role offers it there.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use common::{Server, fresh_database, http};
use serde_json::{Value, json};
use soulbase_observe::{Denial, EvidenceEvent, EvidenceRecord};
use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId};

/// Dev identities: `acme` may do anything (the quarantine's `update`
/// included, but it is not the operator), `limited` may only read, `global`'s
/// `olga` is the operator.
const POLICY: &str = r#"
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, read_evidence, update] }
    - { effect: allow, tenant: limited, tools: ["*"], actions: [invoke, read_evidence] }
    - { effect: allow, tenant: global, tools: ["soulbase.server.quarantine", "soulbase.server.audit"], actions: [read_evidence, update] }
"#;

fn config(evidence: &str) -> String {
    format!("server:\n  dev_insecure: true\n{POLICY}{evidence}")
}

const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "ana")];
const LIMITED: [(&str, &str); 2] = [
    ("x-soulbase-tenant", "limited"),
    ("x-soulbase-actor", "lou"),
];
const OPS: [(&str, &str); 2] = [
    ("x-soulbase-tenant", "global"),
    ("x-soulbase-actor", "olga"),
];

/// A denial of `tenant`'s call `call` of `tool`, as the pipeline records one.
fn denial(tenant: &str, call: &str, tool: &str) -> EvidenceRecord {
    Envelope::new(
        TenantId::new(tenant).unwrap(),
        ActorId::new("someone").unwrap(),
        Origin::Api,
        EvidenceEvent::Denied(Denial {
            call_id: CallId::new(call).unwrap(),
            tool: tool.into(),
            code: soulbase_errors::ErrorCode::PolicyDenyTool,
        }),
    )
}

/// A quarantine file, as the drainer writes it, in the spool of a server
/// started in `dir`: `records` with the reason the store gave then, then `extra`
/// lines as they are.
fn quarantine(dir: &Path, records: &[&EvidenceRecord], extra: &[&str]) {
    let spool = dir.join("data/spool");
    std::fs::create_dir_all(&spool).unwrap();
    let mut text = String::new();
    for r in records {
        text.push_str(
            &json!({"refused": "value too long for the column", "record": r}).to_string(),
        );
        text.push('\n');
    }
    for l in extra {
        text.push_str(l);
        text.push('\n');
    }
    std::fs::write(spool.join("quarantine.jsonl"), text).unwrap();
}

async fn call(server: &Server, method: &str, path: &str, who: &[(&str, &str)]) -> (u16, Value) {
    let (status, text) = http(&server.http, method, path, who, "").await;
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {status} {text}"));
    (status, v)
}

async fn listed(server: &Server, who: &[(&str, &str)]) -> Vec<Value> {
    let (status, v) = call(server, "GET", "/api/quarantine", who).await;
    assert_eq!(status, 200, "{v}");
    v["records"].as_array().unwrap().clone()
}

async fn retry(server: &Server, who: &[(&str, &str)]) -> (u16, Value) {
    call(server, "POST", "/api/quarantine/retry", who).await
}

/// The quarantine's audit records, newest first, as the operator reads them.
async fn audited(server: &Server) -> Vec<Value> {
    let (status, v) = call(
        server,
        "GET",
        "/api/audit?kind=evidence.quarantine_retry",
        &OPS,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v["records"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_retries_the_quarantine_of_the_running_server() {
    let (acme, beta) = (
        denial("acme", "call_quarantined_acme", "soulbase.builtin.echo"),
        denial("beta", "call_quarantined_beta", "soulbase.builtin.echo"),
    );
    let server = Server::start_in(&config(""), |dir| {
        quarantine(dir, &[&acme, &beta], &["not a quarantine entry"]);
    });
    assert_eq!(listed(&server, &OPS).await.len(), 3);
    let (_, list) = call(&server, "GET", "/api/quarantine", &OPS).await;
    assert!(
        list["retry"]
            .as_str()
            .unwrap()
            .contains("POST /api/quarantine/retry"),
        "{list}"
    );
    let (status, v) = call(&server, "GET", "/api/evidence/call_quarantined_acme", &ACME).await;
    assert_eq!(status, 404, "not in the database yet: {v}");

    // Not the operator: refused with a stable code, and nothing changes.
    let (status, v) = retry(&server, &LIMITED).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "POLICY.DENY_TOOL", "{v}");
    let (status, v) = retry(&server, &ACME).await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "AUTH.FORBIDDEN", "{v}");
    assert_eq!(v["error"]["fields"]["field"], "tenant", "{v}");
    let (status, v) = http(&server.http, "POST", "/api/quarantine/retry", &[], "").await;
    assert_eq!(status, 401, "{v}");
    assert_eq!(listed(&server, &OPS).await.len(), 3);
    assert!(audited(&server).await.is_empty());

    // The operator: both records go to the database, the unreadable line stays.
    let (status, v) = retry(&server, &OPS).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v,
        json!({"stored": 2, "still_refused": 0, "unreadable": 1, "remaining": 1})
    );
    let (status, v) = call(&server, "GET", "/api/evidence/call_quarantined_acme", &ACME).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["records"][0]["id"], acme.id.to_string(), "{v}");
    let left = listed(&server, &OPS).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0]["unreadable"].is_string(), "{left:?}");
    assert!(listed(&server, &ACME).await.is_empty());
    // Audited as the operator's.
    let records = audited(&server).await;
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    assert_eq!(
        (&r["actor"], &r["actor_tenant"], &r["tenant"]),
        (&json!("olga"), &json!("global"), &json!("global")),
        "{r}"
    );
    assert!(
        r["target"].as_str().unwrap().ends_with("quarantine.jsonl"),
        "{r}"
    );
    assert!(r["detail"].as_str().unwrap().starts_with("2 stored"), "{r}");

    // Again: nothing to take, nothing changes, nothing more is audited.
    let (status, v) = retry(&server, &OPS).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v,
        json!({"stored": 0, "still_refused": 0, "unreadable": 1, "remaining": 1})
    );
    assert_eq!(audited(&server).await.len(), 1);
    // The calls keep being recorded and drained meanwhile.
    let (status, v) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[ACME[0], ACME[1], ("content-type", "application/json")],
        "{}",
    )
    .await;
    assert_eq!(status, 200, "{v}");
}

/// On Postgres, a record the database still refuses (a NUL in a text column)
/// stays in the quarantine with the reason it gives now, beside the one it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_the_database_still_refuses_stays_with_its_reason_now() {
    let url = fresh_database("sbd_quarantine").await;
    let good = denial("acme", "call_quarantined_good", "soulbase.builtin.echo");
    let bad = denial("acme", "call_quarantined_bad", "demo\u{0}z");
    let server = Server::start_in(
        &config(&format!("evidence:\n  backend: postgres\n  url: {url}\n")),
        |dir| quarantine(dir, &[&bad, &good], &[]),
    );
    let (status, v) = retry(&server, &OPS).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v,
        json!({"stored": 1, "still_refused": 1, "unreadable": 0, "remaining": 1})
    );
    let (status, v) = call(&server, "GET", "/api/evidence/call_quarantined_good", &ACME).await;
    assert_eq!(status, 200, "{v}");
    let left = listed(&server, &OPS).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["id"], bad.id.to_string(), "{left:?}");
    assert_eq!(left[0]["line"], 1, "{left:?}");
    let why = left[0]["refused"].as_str().unwrap();
    assert!(why.starts_with("SQLSTATE 22021"), "the reason now: {why}");
    // The tenant sees its record still there.
    assert_eq!(listed(&server, &ACME).await.len(), 1);
}

const TOKEN_ENV: &str = "SB_TEST_INTERNAL_TOKEN";
const TOKEN: &str = "internal-token-for-tests-0123456789";

/// Split roles: the tools process drains its spool into a remote evidence
/// role, so that is where its drainer offers the quarantine again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tools_process_offers_its_quarantine_to_the_remote_evidence_role() {
    let token = [(TOKEN_ENV, TOKEN)];
    let evidence = Server::start_env(
        &format!(
            "server:\n  dev_insecure: true\n  roles: [evidence]\n  internal_token_env: {TOKEN_ENV}\n"
        ),
        |_| {},
        &token,
    );
    let tools_config = config("").replace(
        "server:\n",
        &format!(
            "server:\n  roles: [tools, auth, qos, sandbox]\n  internal_token_env: {TOKEN_ENV}\n  \
             remote:\n    evidence: http://{}\n",
            evidence.grpc
        ),
    );
    let record = denial("acme", "call_quarantined_split", "soulbase.builtin.echo");
    let tools = Server::start_env(
        &tools_config,
        |dir| quarantine(dir, &[&record], &[]),
        &token,
    );
    let (status, v) = retry(&tools, &OPS).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v,
        json!({"stored": 1, "still_refused": 0, "unreadable": 0, "remaining": 0})
    );
    assert!(listed(&tools, &OPS).await.is_empty());
    // In the evidence role's store.
    use soulbase_observe::EvidenceStore;
    let remote = soulbase_grpc::RemoteEvidence::new(evidence.channel().await, Some(TOKEN.into()));
    let stored = remote
        .call(None, &CallId::new("call_quarantined_split").unwrap())
        .await
        .unwrap()
        .records;
    assert_eq!(stored, vec![record]);
}
