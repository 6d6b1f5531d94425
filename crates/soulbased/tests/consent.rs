//! Consent end to end, from the outside: an approver issues a token with the real
//! `soulbase consent issue --server` (gRPC `Consent.Issue`) or `POST /api/consent`,
//! a caller runs a consent-requiring tool with it through the CLI once, the Begin
//! evidence names the token, and every token that must not pass — expired, for
//! another tool, from another tenant, revoked, tampered — is `CONSENT.REQUIRED`.
//! A refused call leaves a consent request that an approver of its tenant lists
//! and approves (the requester fetches its token and the call runs) or declines,
//! on SQLite and on Postgres.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{Server, http};
use serde_json::Value;

/// Development headers. `approver` of `acme` may consent to the `memo` skill and
/// revoke, and so may `boss` of `other`; every actor of `acme` and `other` may
/// invoke and read evidence.
const CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, actors: [approver], tools: ["skills.memo.*", "soulbase.server.consent"], actions: [consent_issue] }
    - { effect: allow, tenant: other, actors: [boss], tools: ["skills.memo.*", "soulbase.server.consent"], actions: [consent_issue] }
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, read_evidence] }
    - { effect: allow, tenant: other, tools: ["*"], actions: [invoke] }
"#;

/// Two skills whose tools need consent (risk `write`).
fn prepare(dir: &Path) {
    let skills = dir.join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    for name in ["memo", "note"] {
        std::fs::write(
            skills.join(format!("{name}.yaml")),
            format!(
                "name: {name}\ndescription: Keep a {name}.\nprovider: builtin\n\
                 handler: soulbase.builtin.echo\nrisk_level: write\nparameters:\n  type: object\n  \
                 properties:\n    text: {{type: string}}\n"
            ),
        )
        .unwrap();
    }
}

const MEMO: &str = "skills.memo.memo";

use common::remote_cli as soulbase;

fn ok_json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "stdout {} stderr {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Issues a token for `alice` of `acme` through the CLI, as `approver`.
fn issue(server: &Server, tool: &str, extra: &[&str]) -> Value {
    let args: Vec<&str> = ["consent", "issue", tool, "--for", "alice"]
        .iter()
        .chain(extra)
        .copied()
        .collect();
    ok_json(&soulbase(server, "acme", "approver", &args))
}

/// Calls `tool` through the CLI with `token`; the CLI's JSON result.
fn call(server: &Server, tenant: &str, tool: &str, token: &str) -> Value {
    let o = soulbase(
        server,
        tenant,
        "alice",
        &[
            "invoke",
            tool,
            "--args",
            r#"{"text":"hi"}"#,
            "--consent-token",
            token,
        ],
    );
    serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
        panic!(
            "stdout {} stderr {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

async fn evidence(server: &Server, call_id: &str) -> Vec<Value> {
    let (status, body) = http(
        &server.http,
        "GET",
        &format!("/api/evidence/{call_id}"),
        &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "alice")],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    v["records"].as_array().unwrap().clone()
}

fn flip_payload_char(token: &str) -> String {
    let mut t = token.to_owned();
    // Inside the payload (after "e1."), a character swapped for another.
    let i = 10;
    let c = if &t[i..=i] == "A" { "B" } else { "A" };
    t.replace_range(i..=i, c);
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_from_consent_issue_runs_the_tool_once_and_bad_tokens_are_refused() {
    let server = Server::start_in(CONFIG, prepare);

    // Issued by the server to an approver, for alice.
    let issued = issue(&server, MEMO, &["--ttl", "10m"]);
    let token = issued["token"].as_str().unwrap().to_owned();
    let id = issued["id"].as_str().unwrap().to_owned();
    assert!(token.starts_with("e1."), "Ed25519 by default: {token}");
    assert_eq!(issued["tenant"], "acme");
    assert_eq!(issued["actor"], "alice");
    let lifetime = issued["expires_at"].as_i64().unwrap() - issued["issued_at"].as_i64().unwrap();
    assert_eq!(lifetime, 600_000, "{issued}");

    // It runs once, and its Begin names the token.
    let result = call(&server, "acme", MEMO, &token);
    assert_eq!(result["status"], "ok", "{result}");
    let call_id = result["call_id"].as_str().unwrap();
    let records = evidence(&server, call_id).await;
    let begins: Vec<&Value> = records
        .iter()
        .filter(|r| r["payload"]["event"] == "begin")
        .collect();
    let ends = records
        .iter()
        .filter(|r| r["payload"]["event"] == "end")
        .count();
    assert_eq!((begins.len(), ends), (1, 1), "{records:?}");
    let consent = &begins[0]["payload"]["consent"];
    assert_eq!(consent["token_id"], id.as_str(), "{consent}");
    assert!(
        consent["token_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert!(
        !begins[0].to_string().contains(&token),
        "the token itself is never stored"
    );

    // Not an approver: refused by policy, nothing issued.
    let o = soulbase(&server, "acme", "alice", &["consent", "issue", MEMO]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("POLICY.DENY_TOOL"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Every token that must not pass is the same CONSENT.REQUIRED.
    let expired = issue(&server, MEMO, &["--ttl", "1ms"]);
    let revoked = issue(&server, MEMO, &[]);
    let revoked_id = revoked["id"].as_str().unwrap();
    ok_json(&soulbase(
        &server,
        "acme",
        "approver",
        &["consent", "revoke", revoked_id],
    ));
    let cases = [
        (
            "expired",
            "acme",
            MEMO,
            expired["token"].as_str().unwrap().to_owned(),
        ),
        ("wrong tool", "acme", "skills.note.note", token.clone()),
        ("wrong tenant", "other", MEMO, token.clone()),
        (
            "revoked",
            "acme",
            MEMO,
            revoked["token"].as_str().unwrap().to_owned(),
        ),
        ("tampered", "acme", MEMO, flip_payload_char(&token)),
        ("missing", "acme", MEMO, String::new()),
    ];
    for (name, tenant, tool, t) in &cases {
        let r = call(&server, tenant, tool, t);
        assert_eq!(r["error_code"], "CONSENT.REQUIRED", "{name}: {r}");
    }

    // The token that was not revoked still works.
    let again = call(&server, "acme", MEMO, &token);
    assert_eq!(again["status"], "ok", "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_issues_binds_arguments_and_revokes() {
    let server = Server::start_in(CONFIG, prepare);
    let approver = [
        ("x-soulbase-tenant", "acme"),
        ("x-soulbase-actor", "approver"),
    ];
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/consent",
        &approver,
        r#"{"tool":"skills.memo.memo","actor":"alice","args":{"text":"hi"},"ttl_ms":100000000}"#,
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let issued: Value = serde_json::from_str(&body).unwrap();
    let lifetime = issued["expires_at"].as_i64().unwrap() - issued["issued_at"].as_i64().unwrap();
    assert_eq!(lifetime, 3_600_000, "capped by auth.consent.max_ttl_ms");
    assert!(
        issued["args_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    let token = issued["token"].as_str().unwrap();

    // Bound to {"text": "hi"}: those arguments pass, others do not.
    assert_eq!(call(&server, "acme", MEMO, token)["status"], "ok");
    let (_, metrics) = http(&server.http, "GET", "/metrics", &[], "").await;
    assert!(
        metrics.contains("soulbase_consent_issued_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("soulbase_tool_calls_total{tool=\"skills.memo.memo\",status=\"ok\"} 1"),
        "{metrics}"
    );
    let o = soulbase(
        &server,
        "acme",
        "alice",
        &[
            "invoke",
            MEMO,
            "--args",
            r#"{"text":"bye"}"#,
            "--consent-token",
            token,
        ],
    );
    let r: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["error_code"], "CONSENT.REQUIRED", "{r}");

    // Bad requests name the field; a tool the tenant cannot see is not found.
    for (body, code, field) in [
        (r#"{"tool":"skills.memo.memo","ttl_ms":0}"#, 400, "ttl_ms"),
        (r#"{"tool":"skills.memo.memo","args":[1]}"#, 400, "args"),
        (r#"{"tool":"not a tool"}"#, 400, "tool"),
        (r#"{"tool":"skills.memo.memo","color":"red"}"#, 400, "body"),
    ] {
        let (status, text) = http(&server.http, "POST", "/api/consent", &approver, body).await;
        assert_eq!(status, code, "{body}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["fields"]["field"], field, "{body}: {text}");
    }
    let (status, _) = http(
        &server.http,
        "POST",
        "/api/consent",
        &approver,
        r#"{"tool":"nowhere.to.be"}"#,
    )
    .await;
    assert_eq!(status, 404);

    // Revoked over HTTP: refused from the next call on.
    let id = issued["id"].as_str().unwrap();
    let (status, body) = http(
        &server.http,
        "POST",
        &format!("/api/consent/{id}/revoke"),
        &approver,
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        call(&server, "acme", MEMO, token)["error_code"],
        "CONSENT.REQUIRED"
    );
    // Revoking needs the approver's action too.
    let (status, _) = http(
        &server.http,
        "POST",
        &format!("/api/consent/{id}/revoke"),
        &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "alice")],
        "",
    )
    .await;
    assert_eq!(status, 403);
}

/// `method path` as `tenant`/`actor` (development headers); status and JSON.
async fn as_who(
    server: &Server,
    tenant: &str,
    actor: &str,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let mut headers = vec![
        ("x-soulbase-tenant", tenant),
        ("x-soulbase-actor", actor),
        ("content-type", "application/json"),
    ];
    headers.extend_from_slice(extra);
    let (status, text) = http(&server.http, method, path, &headers, body).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {status} {text}"));
    (status, v)
}

/// alice of `acme` calls the memo tool over HTTP with `args` and `token`.
async fn alice_calls(server: &Server, args: &str, token: Option<&str>) -> (u16, Value) {
    let extra: Vec<(&str, &str)> = token
        .map(|t| vec![("x-soulbase-consent", t)])
        .unwrap_or_default();
    as_who(
        server,
        "acme",
        "alice",
        "POST",
        &format!("/api/tools/{MEMO}/invoke"),
        &extra,
        args,
    )
    .await
}

fn request_of(refused: &Value) -> String {
    assert_eq!(refused["error_code"], "CONSENT.REQUIRED", "{refused}");
    refused["error"]["fields"]["consent_request"]
        .as_str()
        .unwrap_or_else(|| panic!("no consent_request in {refused}"))
        .to_owned()
}

/// The whole flow: refused → request → listed → approved → the requester's
/// token runs the call (those arguments only); declined; isolated by tenant;
/// audited.
async fn requests_are_approved_and_declined(server: &Server) {
    // alice is refused, and told which request to follow; a retry reuses it.
    let (status, refused) = alice_calls(server, r#"{"text":"hi"}"#, None).await;
    assert_eq!(status, 403, "{refused}");
    let id = request_of(&refused);
    assert!(id.starts_with("creq_"), "{id}");
    let first_call = refused["call_id"].as_str().unwrap().to_owned();
    let (_, again) = alice_calls(server, r#"{"text": "hi"}"#, None).await;
    assert_eq!(request_of(&again), id, "the same call reuses its request");

    // The approver lists it: who, what, which arguments, which call.
    let (status, list) = as_who(
        server,
        "acme",
        "approver",
        "GET",
        "/api/consent/requests?status=pending",
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200, "{list}");
    let listed = list["requests"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{list}");
    let r = &listed[0];
    assert_eq!(r["id"], id.as_str());
    assert_eq!(r["actor"], "alice");
    assert_eq!(r["tenant"], "acme");
    assert_eq!(r["tool"], MEMO);
    assert_eq!(r["status"], "pending");
    assert_eq!(r["call_id"], first_call.as_str());
    assert!(r["args_digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(
        r["expires_at"].as_i64().unwrap() - r["requested_at"].as_i64().unwrap(),
        86_400_000
    );
    // The refused call is in the evidence under that call id.
    let records = evidence(server, &first_call).await;
    assert_eq!(records[0]["payload"]["event"], "denied", "{records:?}");

    // Another tenant's approver neither sees nor decides it; alice cannot
    // approve her own request, nor list.
    let (status, theirs) = as_who(
        server,
        "other",
        "boss",
        "GET",
        "/api/consent/requests",
        &[],
        "",
    )
    .await;
    assert_eq!(status, 200, "{theirs}");
    assert_eq!(theirs["requests"], serde_json::json!([]));
    for (method, path) in [
        ("GET", format!("/api/consent/requests/{id}")),
        ("POST", format!("/api/consent/requests/{id}/approve")),
        ("POST", format!("/api/consent/requests/{id}/decline")),
    ] {
        let (status, v) = as_who(server, "other", "boss", method, &path, &[], "").await;
        assert_eq!(status, 404, "{method} {path}: {v}");
        assert_eq!(v["error"]["code"], "CONSENT.REQUEST_NOT_FOUND", "{v}");
    }
    let approve = format!("/api/consent/requests/{id}/approve");
    let (status, v) = as_who(server, "acme", "alice", "POST", &approve, &[], "{}").await;
    assert_eq!(status, 403, "{v}");
    let (status, _) = as_who(
        server,
        "acme",
        "alice",
        "GET",
        "/api/consent/requests",
        &[],
        "",
    )
    .await;
    assert_eq!(status, 403);
    // Another actor of acme, neither requester nor approver: not found.
    let (status, _) = as_who(
        server,
        "acme",
        "mallory",
        "GET",
        &format!("/api/consent/requests/{id}"),
        &[],
        "",
    )
    .await;
    assert_eq!(status, 404);
    // alice sees it pending, no token yet.
    let mine = format!("/api/consent/requests/{id}");
    let (status, v) = as_who(server, "acme", "alice", "GET", &mine, &[], "").await;
    assert_eq!(
        (status, &v["status"]),
        (200, &Value::from("pending")),
        "{v}"
    );
    assert!(v.get("token").is_none(), "{v}");
    // Bad input names its field.
    let (status, v) = as_who(
        server,
        "acme",
        "approver",
        "POST",
        &approve,
        &[],
        r#"{"scope":"everything"}"#,
    )
    .await;
    assert_eq!(
        (status, &v["error"]["fields"]["field"]),
        (400, &Value::from("body")),
        "{v}"
    );
    let (status, v) = as_who(
        server,
        "acme",
        "approver",
        "GET",
        "/api/consent/requests/creq_nope",
        &[],
        "",
    )
    .await;
    assert_eq!(
        (status, &v["error"]["fields"]["field"]),
        (400, &Value::from("id")),
        "{v}"
    );
    let (status, v) = as_who(
        server,
        "acme",
        "approver",
        "GET",
        "/api/consent/requests?status=maybe",
        &[],
        "",
    )
    .await;
    assert_eq!(
        (status, &v["error"]["fields"]["field"]),
        (400, &Value::from("status")),
        "{v}"
    );

    // The approver approves it for this call's arguments.
    let (status, approved) = as_who(
        server,
        "acme",
        "approver",
        "POST",
        &approve,
        &[],
        r#"{"scope":"call","ttl_ms":600000}"#,
    )
    .await;
    assert_eq!(status, 200, "{approved}");
    assert_eq!(approved["status"], "approved");
    assert_eq!(approved["decided_by"], "approver");
    assert_eq!(approved["scope"], "call");
    assert!(
        approved.get("token").is_none(),
        "the token is the requester's: {approved}"
    );
    let token_id = approved["token_id"].as_str().unwrap().to_owned();
    let (status, twice) = as_who(server, "acme", "approver", "POST", &approve, &[], "{}").await;
    assert_eq!(status, 409, "{twice}");
    assert_eq!(twice["error"]["code"], "CONSENT.REQUEST_DECIDED");
    assert_eq!(twice["error"]["fields"]["status"], "approved");

    // alice takes her token; the approver still does not see it.
    let (_, mine_now) = as_who(server, "acme", "alice", "GET", &mine, &[], "").await;
    assert_eq!(mine_now["status"], "approved", "{mine_now}");
    let token = mine_now["token"].as_str().unwrap().to_owned();
    let (_, seen) = as_who(server, "acme", "approver", "GET", &mine, &[], "").await;
    assert_eq!(seen["status"], "approved");
    assert!(seen.get("token").is_none(), "{seen}");

    // The call runs with it — those arguments only — and its Begin names it.
    let (status, ran) = alice_calls(server, r#"{"text":"hi"}"#, Some(&token)).await;
    assert_eq!((status, &ran["status"]), (200, &Value::from("ok")), "{ran}");
    let begin = evidence(server, ran["call_id"].as_str().unwrap()).await;
    assert_eq!(
        begin[0]["payload"]["consent"]["token_id"],
        token_id.as_str()
    );
    assert_eq!(begin[0]["payload"]["consent"]["args_bound"], true);
    let (status, other_args) = alice_calls(server, r#"{"text":"bye"}"#, Some(&token)).await;
    assert_eq!(status, 403, "{other_args}");
    let second = request_of(&other_args);
    assert_ne!(second, id, "other arguments, another request");
    // The same refusal through gRPC (the CLI) names the same request.
    let o = soulbase(
        server,
        "acme",
        "alice",
        &["invoke", MEMO, "--args", r#"{"text":"bye"}"#],
    );
    let cli: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
        panic!("{}", String::from_utf8_lossy(&o.stderr));
    });
    assert_eq!(request_of(&cli), second, "{cli}");

    // Declined with a reason: alice reads it; deciding again is a conflict.
    let decline = format!("/api/consent/requests/{second}/decline");
    let (status, declined) = as_who(
        server,
        "acme",
        "approver",
        "POST",
        &decline,
        &[],
        r#"{"reason":"not during the freeze"}"#,
    )
    .await;
    assert_eq!(status, 200, "{declined}");
    let (_, hers) = as_who(
        server,
        "acme",
        "alice",
        "GET",
        &format!("/api/consent/requests/{second}"),
        &[],
        "",
    )
    .await;
    assert_eq!(hers["status"], "declined", "{hers}");
    assert_eq!(hers["reason"], "not during the freeze");
    assert!(hers.get("token").is_none());
    let (status, v) = as_who(
        server,
        "acme",
        "approver",
        "POST",
        &format!("/api/consent/requests/{second}/approve"),
        &[],
        "",
    )
    .await;
    assert_eq!(
        (status, &v["error"]["fields"]["status"]),
        (409, &Value::from("declined")),
        "{v}"
    );

    // Nothing pending now; both listed otherwise, newest first.
    let (_, pending) = as_who(
        server,
        "acme",
        "approver",
        "GET",
        "/api/consent/requests?status=pending",
        &[],
        "",
    )
    .await;
    assert_eq!(pending["requests"], serde_json::json!([]), "{pending}");
    let (_, all) = as_who(
        server,
        "acme",
        "approver",
        "GET",
        "/api/consent/requests?limit=10",
        &[],
        "",
    )
    .await;
    let ids: Vec<&str> = all["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [second.as_str(), id.as_str()], "{all}");

    // Both decisions are in the audit log, naming the approver.
    for (kind, target) in [("consent.approve", &id), ("consent.decline", &second)] {
        let (status, audit) = as_who(
            server,
            "acme",
            "approver",
            "GET",
            &format!("/api/audit?kind={kind}"),
            &[],
            "",
        )
        .await;
        assert_eq!(status, 200, "{audit}");
        let records = audit["records"].as_array().unwrap();
        assert_eq!(records.len(), 1, "{audit}");
        assert_eq!(records[0]["actor"], "approver");
        assert_eq!(records[0]["tenant"], "acme");
        assert_eq!(records[0]["target"], target.as_str());
        assert!(
            records[0]["detail"].as_str().unwrap().contains("alice"),
            "{audit}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_requests_are_approved_and_declined_on_sqlite() {
    let server = Server::start_in(CONFIG, prepare);
    requests_are_approved_and_declined(&server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_requests_are_approved_and_declined_on_postgres() {
    let url = common::fresh_database("sbd_consent").await;
    let config = format!("{CONFIG}evidence:\n  backend: postgres\n  url: \"{url}\"\n");
    let server = Server::start_in(&config, prepare);
    requests_are_approved_and_declined(&server).await;
}
