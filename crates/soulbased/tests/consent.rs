//! Consent end to end, from the outside: an approver issues a token with the real
//! `soulbase consent issue --server` (gRPC `Consent.Issue`) or `POST /api/consent`,
//! a caller runs a consent-requiring tool with it through the CLI once, the Begin
//! evidence names the token, and every token that must not pass — expired, for
//! another tool, from another tenant, revoked, tampered — is `CONSENT.REQUIRED`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Output;

use common::{Server, http};
use serde_json::Value;

/// Development headers. `approver` of `acme` may consent to the `memo` skill and
/// revoke; every actor of `acme` and `other` may invoke and read evidence.
const CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, actors: [approver], tools: ["skills.memo.*", "soulbase.server.consent"], actions: [consent_issue] }
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
