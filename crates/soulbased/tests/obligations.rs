//! Obligations from policy (issue 32, item 4): a static rule's `obligations` and a
//! Cedar permit's `@obligations` bind the output of the calls they allow, with the
//! manifest's; they apply before the output is digested into the End evidence, so
//! evidence holds the digest of what was answered; a failing obligation refuses
//! (the output withheld, `POLICY.DENY_TOOL`) or degrades (the values withheld, a
//! warning) as it says; preflight lists them; a split auth role carries them.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Server, http};
use serde_json::{Value, json};

const ECHO: &str = "/api/tools/soulbase.builtin.echo/invoke";

/// `acme`'s calls of echo: the SSN redacted, a watermark on `n` that degrades;
/// `strict`'s: an SSN that must be there; `plain`: no obligations.
const STATIC: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - effect: allow
      tenant: acme
      tools: ["soulbase.builtin.echo"]
      actions: [invoke, read_evidence]
      obligations:
        - { kind: redact, pointer: /echo/ssn }
        - { kind: watermark, pointer: /echo/n, on_failure: degrade }
    - effect: allow
      tenant: strict
      tools: ["soulbase.builtin.echo"]
      actions: [invoke, read_evidence]
      obligations:
        - { kind: redact, pointer: /echo/ssn, required: true }
    - { effect: allow, tenant: plain, tools: ["*"], actions: [invoke, read_evidence] }
"#;

fn who(tenant: &str) -> [(&str, &str); 2] {
    [("x-soulbase-tenant", tenant), ("x-soulbase-actor", "bob")]
}

async fn call(server: &Server, tenant: &str, path: &str, args: Value) -> (u16, Value) {
    let body = args.to_string();
    let (status, text) = http(&server.http, "POST", path, &who(tenant), &body).await;
    (status, serde_json::from_str(&text).unwrap())
}

/// The End record of `result`'s call, read back over HTTP.
async fn end_of(server: &Server, tenant: &str, result: &Value) -> Value {
    let call_id = result["call_id"].as_str().unwrap();
    let path = format!("/api/evidence/{call_id}");
    let (status, text) = http(&server.http, "GET", &path, &who(tenant), "").await;
    assert_eq!(status, 200, "{text}");
    let evidence: Value = serde_json::from_str(&text).unwrap();
    evidence["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["payload"]["event"] == "end")
        .unwrap_or_else(|| panic!("no End in {evidence}"))["payload"]
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_rule_obligations_bind_the_output_and_its_evidence() {
    let server = Server::start(STATIC);
    let args = json!({"ssn": "123-45-6789", "n": 5, "note": "hi"});

    // Redacted; the watermark cannot mark a number, so that value is withheld.
    let (status, out) = call(&server, "acme", ECHO, args.clone()).await;
    assert_eq!(status, 200, "{out}");
    let answered = json!({"echo": {"ssn": "[REDACTED]", "n": null, "note": "hi"}});
    assert_eq!(out["output"], answered, "{out}");
    let warnings = out["warnings"].to_string();
    assert!(warnings.contains("watermark /echo/n"), "{out}");

    // The End holds the digest of the output as answered, never of the raw one.
    let end = end_of(&server, "acme", &out).await;
    assert_eq!(end["status"], "ok", "{end}");
    assert_eq!(
        end["output_digest"],
        soulbase_observe::digest_json(&answered)
    );
    assert_ne!(
        end["output_digest"],
        soulbase_observe::digest_json(&json!({ "echo": args }))
    );

    // Preflight says what will be applied.
    let preflight = "/api/tools/soulbase.builtin.echo/preflight";
    let (status, report) = call(&server, "acme", preflight, args.clone()).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(
        report["obligations"],
        json!([
            {"kind": "redact", "pointer": "/echo/ssn"},
            {"kind": "watermark", "pointer": "/echo/n", "on_failure": "degrade"}
        ]),
        "{report}"
    );

    // Another tenant's rule binds nothing: the raw output.
    let (status, out) = call(&server, "plain", ECHO, args.clone()).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["output"], json!({ "echo": args }));

    // A required pointer that reaches nothing refuses: the output is withheld,
    // the call still has its Begin and End.
    let (status, out) = call(&server, "strict", ECHO, json!({"note": "no ssn"})).await;
    assert_eq!(status, 403, "{out}");
    assert_eq!(out["error_code"], "POLICY.DENY_TOOL", "{out}");
    assert_eq!(
        out["error"]["fields"]["obligation"], "redact /echo/ssn",
        "{out}"
    );
    assert!(out.get("output").is_none(), "{out}");
    let end = end_of(&server, "strict", &out).await;
    assert_eq!(
        (end["status"].as_str(), end["error_code"].as_str()),
        (Some("error"), Some("POLICY.DENY_TOOL")),
        "{end}"
    );
    let (status, out) = call(&server, "strict", ECHO, json!({"ssn": "1"})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["output"], json!({"echo": {"ssn": "[REDACTED]"}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cedar_permits_carry_obligations_and_bad_ones_are_refused() {
    let config = r#"
server:
  dev_insecure: true
auth:
  cedar:
    policies: |
      @obligations("[{\"kind\": \"mask\", \"pointer\": \"/echo/card\"}]")
      permit(principal in Soul::Tenant::"acme", action, resource == Soul::Tool::"soulbase.builtin.echo");
      permit(principal in Soul::Tenant::"acme", action == Soul::Action::"read_evidence", resource);
"#;
    let server = Server::start(config);
    let (status, out) = call(&server, "acme", ECHO, json!({"card": "4111111111111111"})).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["output"], json!({"echo": {"card": "************1111"}}));
    let end = end_of(&server, "acme", &out).await;
    assert_eq!(
        end["output_digest"],
        soulbase_observe::digest_json(&json!({"echo": {"card": "************1111"}}))
    );

    // An annotation that is not a list of obligations, or on a forbid, refuses the
    // policies at start, naming the policy.
    for (policies, says) in [
        (
            r#"@obligations("redact /ssn")
      permit(principal, action, resource);"#,
            "@obligations must be a JSON array",
        ),
        (
            r#"@obligations("[{\"kind\": \"redact\", \"pointer\": \"/x\"}]")
      forbid(principal, action, resource);"#,
            "a forbid allows nothing",
        ),
    ] {
        let bad = format!(
            "server:\n  dev_insecure: true\nauth:\n  cedar:\n    policies: |\n      {policies}\n"
        );
        let stderr = common::refused_start(&bad, &[]);
        assert!(stderr.contains(says), "{stderr}");
    }
}
