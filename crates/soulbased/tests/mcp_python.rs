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
        id: None,
        issued_at: None,
        tenant: TenantId::new("acme").unwrap(),
        actor: ActorId::new("py").unwrap(),
        tool: Some(ToolId::new("skills.memo.memo").unwrap()),
        scope: None,
        args_digest: None,
        expires_at: UnixMillis(UnixMillis::now().0 + 600_000),
    });
    let url = format!("http://{}/mcp", server.http);
    let out = common::run_python("mcp_meta.py", &[&url, &token, TRACEPARENT]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
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

/// Elicitation for consent: a client that declares elicitation is asked before a
/// tool needing consent runs — what the tool is, its scope and how long — and on
/// approval the server mints a consent token bound to the caller, the tool and
/// the arguments (issued as the caller, who must hold `consent_issue`), with
/// which the call runs once; its Begin records the token. Declined, the call is
/// refused `CONSENT.REQUIRED`; a client that cannot be asked is refused as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_is_asked_of_the_user_through_elicitation() {
    let config = CONFIG.replace(
        "actions: [invoke, read_evidence] }",
        "actions: [invoke, read_evidence, consent_issue] }",
    );
    let server = Server::start_env(&config, prepare, &[("SOULBASED_CONSENT_HMAC_KEY", KEY_HEX)]);
    let url = format!("http://{}/mcp", server.http);
    let out = common::run_python("mcp_elicit.py", &[&url]).await;
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let labels: Vec<&str> = lines.iter().map(|l| l["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        [
            "asked-accept",
            "approved",
            "asked-decline",
            "declined",
            "not-asked"
        ],
        "{lines:?}"
    );
    let asked = &lines[0];
    let message = asked["message"].as_str().unwrap();
    assert!(message.contains("skills.memo.memo"), "{message}");
    assert!(message.contains("Keep a memo."), "{message}");
    assert_eq!(
        asked["schema"]["properties"]["approve"]["type"], "boolean",
        "{asked}"
    );
    assert_eq!(lines[1]["is_error"], false, "{:?}", lines[1]);
    for refused in [&lines[3], &lines[4]] {
        assert_eq!(
            refused["structured"]["code"], "CONSENT.REQUIRED",
            "{refused}"
        );
    }
    // The approved call ran once, under the minted token: its Begin names it,
    // bound to the arguments (read once the server has stopped and drained).
    let mut server = server;
    server.stop();
    let out = common::cli(
        server.dir(),
        &[
            "evidence",
            "list",
            "--tool",
            "skills.memo.memo",
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
    let ran: Vec<&str> = page["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "ok")
        .map(|c| c["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ran.len(), 1, "{page}");
    let begin: Value = common::evidence_lines(server.dir(), ran[0])
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["payload"]["event"] == "begin")
        .unwrap();
    let consent = &begin["payload"]["consent"];
    assert!(
        consent["token_id"]
            .as_str()
            .is_some_and(|id| !id.is_empty()),
        "{begin}"
    );
    assert_eq!(consent["args_bound"], true, "{begin}");
}

const RESOURCES_CONFIG: &str = r#"
server:
  dev_insecure: true
  dev_identity: { tenant: acme, actor: py }
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["skills.notes.*"], actions: [invoke] }
    - { effect: allow, tenant: acme, tools: ["soulbase.server.config"], actions: [reload] }
"#;

const NOTES: &str = "---\nname: notes\ndescription: Keep notes.\nprovider: {type: builtin}\n\
tools:\n  - name: note\n    description: Keep a note.\n---\n# Notes\n\nCall `note` with the text.\n";

/// Skills as resources and prompts, read by the official Python SDK: the files
/// byte for byte (text and binary), only the caller's skills, a prompt per skill
/// with the full SKILL.md, completion of skill names, and a subscription told
/// when SKILL.md changes on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_reads_skills_as_resources_and_prompts() {
    let binary: Vec<u8> = vec![0, 159, 146, 150, 255, 10];
    let server = Server::start_in(RESOURCES_CONFIG, |dir| {
        let notes = dir.join("skills/notes");
        std::fs::create_dir_all(notes.join("references")).unwrap();
        std::fs::write(notes.join("SKILL.md"), NOTES).unwrap();
        std::fs::write(notes.join("references/guide.md"), "Be brief.\r\n").unwrap();
        std::fs::write(notes.join("logo.bin"), [0u8, 159, 146, 150, 255, 10]).unwrap();
        let hidden = dir.join("skills/hidden");
        std::fs::create_dir_all(&hidden).unwrap();
        std::fs::write(
            hidden.join("SKILL.md"),
            NOTES.replace("name: notes", "name: hidden"),
        )
        .unwrap();
    });
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/mcp_resources.py");
    let mut child = Command::new(python())
        .arg(script)
        .arg(format!("http://{}/mcp", server.http))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let next = || {
        rx.recv_timeout(std::time::Duration::from_secs(60))
            .expect("the Python client stopped answering")
    };
    let seen: Value = serde_json::from_str(&next()).unwrap();
    let uris: Vec<&str> = seen["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap())
        .collect();
    assert_eq!(
        uris,
        [
            "skill://notes/SKILL.md",
            "skill://notes/logo.bin",
            "skill://notes/references/guide.md"
        ],
        "only the caller's skill, its SKILL.md first: {seen}"
    );
    let reads = &seen["reads"];
    assert_eq!(reads["skill://notes/SKILL.md"]["text"], NOTES);
    assert_eq!(reads["skill://notes/SKILL.md"]["mime"], "text/markdown");
    assert_eq!(
        reads["skill://notes/references/guide.md"]["text"],
        "Be brief.\r\n"
    );
    let hex: String = binary.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(reads["skill://notes/logo.bin"]["blob_hex"], hex.as_str());
    assert_eq!(
        seen["templates"],
        serde_json::json!(["skill://{name}/SKILL.md", "skill://{name}/{path}"])
    );
    assert_eq!(seen["prompts"], serde_json::json!(["notes"]));
    assert_eq!(
        seen["prompt"],
        serde_json::json!([NOTES, "Summarize my notes."])
    );
    assert_eq!(seen["complete"], serde_json::json!(["notes"]));
    assert!(
        seen["hidden"].as_str().unwrap().contains("not found"),
        "another skill's file is not served: {seen}"
    );

    // Followed: an edit on disk, once the skills are reloaded, is announced.
    assert_eq!(next(), "LISTENING");
    std::fs::write(
        server.dir().join("skills/notes/SKILL.md"),
        format!("{NOTES}\nAlso: dates.\n"),
    )
    .unwrap();
    let (status, body) = common::http(&server.http, "POST", "/api/reload", &[], "").await;
    assert_eq!(status, 200, "{body}");
    let event: Value = serde_json::from_str(&next()).unwrap();
    assert_eq!(event["event"], "ResourceUpdated", "{event}");
    assert_eq!(event["uri"], "skill://notes/SKILL.md");
    let status = child.wait().unwrap();
    assert!(status.success());
}

/// One session's extras with the official Python SDK: `logging/setLevel` then a
/// `notifications/message` per call at or above the level (never for other
/// sessions), progress for a call that carries a token, and a call the client
/// cancels ending `cancelled` in the evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_gets_logs_progress_and_cancels_calls() {
    let config = common::config_with("  dev_identity: { tenant: acme, actor: py }\n").replacen(
        "reload]",
        "reload, read_evidence]",
        1,
    );
    let server = Server::start(&config);
    let url = format!("http://{}/mcp", server.http);
    let cancelled = "call_cancelled_by_the_client";
    let out = common::run_python("mcp_session.py", &[&url, cancelled]).await;
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["ok"], serde_json::json!({"echo": {"a": 1}}), "{seen}");
    assert_eq!(seen["refused"]["code"], "SCHEMA.VALIDATION_FAILED");
    assert_eq!(seen["cancelled"], true);
    assert_eq!(seen["after"], serde_json::json!({"echo": {"b": 2}}));
    let logs = seen["logs"].as_array().unwrap();
    let summary: Vec<(&str, &str, &str)> = logs
        .iter()
        .map(|l| {
            (
                l["level"].as_str().unwrap(),
                l["data"]["tool"].as_str().unwrap(),
                l["data"]["status"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("info", "soulbase.builtin.echo", "ok"),
            ("warning", "soulbase.builtin.sleep", "denied"),
            ("info", "soulbase.builtin.echo", "ok"),
        ],
        "one message per call of the session that asked for them: {seen}"
    );
    assert!(logs.iter().all(|l| l["logger"] == "soulbase.calls"));
    let progress = seen["progress"].as_array().unwrap();
    assert_eq!(
        progress
            .iter()
            .map(|p| p["message"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["started", "finished"],
        "{seen}"
    );
    assert_eq!(progress[1]["progress"], progress[1]["total"]);
    // The cancelled call began, and ended cancelled.
    let path = format!("/api/evidence/{cancelled}");
    let acme = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "py")];
    let (status, body) = common::http(&server.http, "GET", &path, &acme, "").await;
    assert_eq!(status, 200, "{body}");
    let evidence: Value = serde_json::from_str(&body).unwrap();
    let ends: Vec<&Value> = evidence["records"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["payload"]["event"] == "end")
        .collect();
    assert_eq!(ends.len(), 1, "{body}");
    assert_eq!(ends[0]["payload"]["status"], "cancelled", "{body}");
}

/// The conformance pack, with tenant `acme` granted elicitation but not sampling.
const ASKS_CONFIG: &str = r#"
server:
  dev_insecure: true
  mcp_conformance_tools: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, read_evidence] }
sandbox:
  grants:
    - tenant: acme
      capabilities:
        - { kind: client, requests: [elicitation] }
"#;

/// The End of the one call of `tool` that ended `status` (read once the server
/// has stopped and drained).
fn end_of(dir: &Path, tool: &str, status: &str) -> Value {
    let out = common::cli(
        dir,
        &["evidence", "list", "--tool", tool, "--format", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page: Value = serde_json::from_slice(&out.stdout).unwrap();
    let calls: Vec<&str> = page["calls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == status)
        .map(|c| c["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(calls.len(), 1, "{tool} {status}: {page}");
    common::evidence_lines(dir, calls[0])
        .iter()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["payload"]["event"] == "end")
        .unwrap()
}

/// A tool's own requests to the client, from the official Python SDK: the user
/// is asked (elicitation) and the answer reaches the tool, recorded in its End by
/// digest; sampling, which the tenant's grant does not allow, never reaches the
/// client and the tool fails with `SANDBOX.CAPABILITY_BLOCKED`, recorded as
/// refused; a client that declared neither cannot be asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_ask_the_client_only_what_their_profile_grants() {
    let server = Server::start(ASKS_CONFIG);
    let url = format!("http://{}/mcp", server.http);
    let out = common::run_python("mcp_asks.py", &[&url]).await;
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let labels: Vec<&str> = lines.iter().map(|l| l["label"].as_str().unwrap()).collect();
    assert_eq!(
        labels,
        ["asked-elicitation", "elicitation", "sampling", "no-client"],
        "{lines:?}"
    );
    assert_eq!(lines[0]["message"], "Who are you?");
    assert_eq!(
        lines[0]["schema"]["required"],
        serde_json::json!(["username", "email"])
    );
    assert_eq!(lines[1]["is_error"], false, "{:?}", lines[1]);
    let text = lines[1]["text"].as_str().unwrap();
    assert!(text.starts_with("User response: action=accept"), "{text}");
    assert!(text.contains("ada@example.com"), "{text}");
    for refused in [&lines[2], &lines[3]] {
        assert_eq!(refused["is_error"], true, "{refused}");
        assert_eq!(
            refused["structured"]["code"], "SANDBOX.CAPABILITY_BLOCKED",
            "{refused}"
        );
    }
    let mut server = server;
    server.stop();
    let end = end_of(server.dir(), "soulbase.conformance.elicitation", "ok");
    let asked = &end["payload"]["client_requests"];
    assert_eq!(asked.as_array().unwrap().len(), 1, "{end}");
    assert_eq!(asked[0]["kind"], "elicitation");
    assert_eq!(asked[0]["outcome"], "accept");
    assert!(
        asked[0]["request_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    assert!(
        asked[0]["response_digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:")
    );
    // Digests only: what the user typed is not in the evidence.
    assert!(!end.to_string().contains("ada@example.com"), "{end}");
    let end = end_of(server.dir(), "soulbase.conformance.sampling", "error");
    assert_eq!(end["payload"]["error_code"], "SANDBOX.CAPABILITY_BLOCKED");
    let asked = &end["payload"]["client_requests"][0];
    assert_eq!(asked["kind"], "sampling");
    assert_eq!(asked["outcome"], "refused");
    assert_eq!(asked["error_code"], "SANDBOX.CAPABILITY_BLOCKED");
    assert!(asked.get("response_digest").is_none(), "{asked}");
}
