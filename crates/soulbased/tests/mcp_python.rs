//! MCP call options in `params._meta` from the official MCP Python SDK (a standard
//! client, not ours): a keyed tool runs once across retries of its key, consent and
//! trace context are honoured, a malformed trace context is refused with its code.
//! The SDK comes from the venv `.ci/python-tools` installs (`SOULBASE_PYTHON_TOOLS`).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{Server, python};
use serde_json::Value;
use soulbase_auth::{ConsentGrant, HmacConsent};
use soulbase_types::{ActorId, TenantId, ToolId, UnixMillis};

const KEY_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

const CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, read_evidence] }
"#;

/// A skill whose tool needs consent (risk `write`).
fn prepare(dir: &Path) {
    let skills = dir.join("skills");
    std::fs::create_dir_all(&skills).unwrap();
    std::fs::write(
        skills.join("memo.yaml"),
        "name: memo\ndescription: Keep a memo.\nprovider: builtin\nhandler: soulbase.builtin.echo\n\
         risk_level: write\nparameters:\n  type: object\n  properties:\n    text: {type: string}\n",
    )
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_passes_call_options_in_meta() {
    let server = Server::start_env(CONFIG, prepare, &[("SOULBASED_CONSENT_HMAC_KEY", KEY_HEX)]);
    let key: Vec<u8> = (0..KEY_HEX.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&KEY_HEX[i..i + 2], 16).unwrap())
        .collect();
    let token = HmacConsent::new(key).issue(&ConsentGrant {
        tenant: TenantId::new("acme").unwrap(),
        actor: ActorId::new("py").unwrap(),
        tool: Some(ToolId::new("skills.memo.memo").unwrap()),
        scope: None,
        args_digest: None,
        expires_at: UnixMillis(UnixMillis::now().0 + 600_000),
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mcp_meta.py");
    let url = format!("http://{}/mcp", server.http);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python())
            .arg(script)
            .args([url.as_str(), token.as_str(), TRACEPARENT])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the Python client failed: {stderr}");
    // Closing the session (HTTP DELETE) is answered as the SDK expects.
    assert!(
        !stderr.contains("Session termination failed"),
        "the Python client could not end its session: {stderr}"
    );
    let answers: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let get = |label: &str| {
        answers
            .iter()
            .find(|a| a["label"] == label)
            .unwrap_or_else(|| panic!("no answer {label}: {answers:?}"))
            .clone()
    };
    // One execution across the retries of a key; another key runs again.
    let first = get("keyed-0");
    assert_eq!(first["is_error"], false, "{first}");
    let count = first["structured"]["count"].as_u64().unwrap();
    for label in ["keyed-1", "keyed-2"] {
        let a = get(label);
        assert_eq!(a["is_error"], false, "{a}");
        assert_eq!(a["structured"]["count"].as_u64(), Some(count), "{label}");
    }
    assert_eq!(
        get("keyed-other")["structured"]["count"].as_u64(),
        Some(count + 1)
    );
    let missing = get("keyed-missing");
    assert_eq!(
        missing["structured"]["code"], "SCHEMA.VALIDATION_FAILED",
        "{missing}"
    );
    // Consent: refused without a token, honoured with one in _meta.
    assert_eq!(
        get("consent-missing")["structured"]["code"],
        "CONSENT.REQUIRED"
    );
    let consented = get("consent");
    assert_eq!(consented["is_error"], false, "{consented}");
    // The trace context reaches the evidence; a malformed one is refused.
    let traced = get("trace");
    assert_eq!(traced["is_error"], false, "{traced}");
    let malformed = get("trace-malformed");
    assert_eq!(malformed["structured"]["code"], "SCHEMA.VALIDATION_FAILED");
    assert_eq!(malformed["structured"]["fields"]["field"], "traceparent");
    // The traced call's evidence carries the caller's trace (read from the
    // database once the server has stopped and drained its spool).
    let mut server = server;
    server.stop();
    let out = common::cli(
        server.dir(),
        &[
            "evidence",
            "list",
            "--tool",
            "soulbase.builtin.echo",
            "--format",
            "json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    let trace_id = &TRACEPARENT[3..35];
    let traced: Vec<&str> = page["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["call_id"].as_str().unwrap())
        .filter(|id| {
            common::evidence_lines(server.dir(), id)
                .iter()
                .all(|l| l.contains(trace_id))
        })
        .collect();
    assert_eq!(traced.len(), 1, "{page}");
}
