//! The operator console (`/ui`) driven by a real browser: Playwright
//! (`playwright-core` from the npm registry, installed by `.ci/node-tools`,
//! `SOULBASE_NODE_TOOLS`) on Debian's Chromium (`.ci/browser`,
//! `SOULBASE_CHROMIUM`), both standard tools, not ours. It signs in with an API
//! key, lists and searches the tenant's tools, finds a failed call and a refused
//! one in the evidence explorer (code and deciding stage), is refused another
//! tenant's call, fits a phone-width screen, and disables a tool for its tenant —
//! which MCP `tools/list` then leaves out and the audit log records; the tenant is
//! refused retrying the evidence quarantine, the operator retries it (two records
//! leave it for the database). Screenshots of
//! each page go to `console-screenshots/` in the target directory's `tmp` (kept
//! out of the repository).
//!
//! The console adds no route that bypasses the API's authorization: every console
//! route answers the same static bytes to anyone (no tenant data in them), and
//! the data routes it calls refuse the unauthenticated and the wrong tenant.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Server, http};
use serde_json::{Value, json};

fn key(id: &str) -> String {
    format!("sbk_{id}_0123456789abcdef0123456789abcdef")
}

fn bearer(id: &str) -> String {
    format!("Bearer {}", key(id))
}

/// Two tenants with an API key each (and a second actor of `acme`, `carl`).
/// `acme` sees the builtin tools and the conformance pack's failing one, may
/// disable them for itself and read its audit and conversations, and is denied
/// the builtin sleep; its `ana` approves consent requests for the `memo` skill;
/// `beta` sees everything. `ops`, of the `global` tenant, is the operator who
/// reads and retries the evidence quarantine. The agent loop's model is at
/// `model` (`…/v1`).
fn config_with_model(model: &str) -> String {
    let digest = |id: &str| soulbase_auth::api_key_digest(&key(id));
    format!(
        r#"
server:
  mcp_conformance_tools: true
skills:
  dir: ./skills
  watch: false
auth:
  api_keys:
    - {{ id: acme, sha256: "{a}", tenant: acme, actor: ana }}
    - {{ id: beta, sha256: "{b}", tenant: beta, actor: ben }}
    - {{ id: carl, sha256: "{c}", tenant: acme, actor: carl }}
    - {{ id: ops, sha256: "{o}", tenant: global, actor: olga }}
policy:
  rules:
    - {{ effect: allow, tenant: acme, tools: ["soulbase.builtin.*", "soulbase.conformance.error_handling", "skills.*"], actions: [list, invoke, read_evidence, enable, disable] }}
    - {{ effect: allow, tenant: acme, tools: ["soulbase.server.audit", "soulbase.server.conversations", "soulbase.server.quarantine"], actions: [read_evidence] }}
    - {{ effect: allow, tenant: acme, tools: ["soulbase.server.simulator"], actions: [preflight] }}
    - {{ effect: deny, tenant: acme, tools: ["soulbase.builtin.sleep"], actions: [invoke] }}
    - {{ effect: allow, tenant: acme, actors: [ana], tools: ["soulbase.server.consent", "skills.memo.*"], actions: [consent_issue] }}
    - {{ effect: allow, tenant: beta, tools: ["*"], actions: [list, invoke, read_evidence] }}
    - {{ effect: allow, tenant: global, tools: ["soulbase.server.quarantine"], actions: [read_evidence, update] }}
    - {{ effect: allow, tenant: global, tools: ["soulbase.server.evidence"], actions: [read_evidence] }}
model:
  upstream: {{ base_url: "{model}", timeout_ms: 10000 }}
  allow:
    - {{ tenant: acme, models: ["gpt-*"] }}
"#,
        a = digest("acme"),
        b = digest("beta"),
        c = digest("carl"),
        o = digest("ops"),
    )
}

/// [`config_with_model`] with no model answering (the tests that make no
/// conversation).
fn config() -> String {
    config_with_model("http://127.0.0.1:9/v1")
}

const DENIED_CALL: &str = "call_console_denied_1";
const BETA_CALL: &str = "call_console_beta_1";

async fn invoke(
    server: &Server,
    who: &str,
    tool: &str,
    args: &str,
    call_id: Option<&str>,
) -> Value {
    let auth = bearer(who);
    let mut headers = vec![
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    if let Some(id) = call_id {
        headers.push(("x-soulbase-call-id", id));
    }
    let (_, body) = http(
        &server.http,
        "POST",
        &format!("/api/tools/{tool}/invoke"),
        &headers,
        args,
    )
    .await;
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// The tool names MCP `tools/list` gives `who` (streamable HTTP, API key).
async fn mcp_tools(server: &Server, who: &str) -> Vec<String> {
    let client = reqwest::Client::new();
    let url = format!("http://{}/mcp", server.http);
    let post = |session: Option<String>, body: Value| {
        let mut req = client
            .post(&url)
            .header("authorization", bearer(who))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(s) = session {
            req = req
                .header("mcp-session-id", s)
                .header("mcp-protocol-version", "2025-06-18");
        }
        req.send()
    };
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "console-test", "version": "1"}}});
    let r = post(None, init).await.unwrap();
    assert_eq!(r.status(), 200);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    post(Some(session.clone()), note).await.unwrap();
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let text = post(Some(session), list)
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // An SSE answer (`data: {...}`) or plain JSON.
    let answer: Value = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .chain(std::iter::once(text.as_str()))
        .find_map(|d| {
            serde_json::from_str::<Value>(d.trim())
                .ok()
                .filter(|v| v.get("result").is_some())
        })
        .unwrap_or_else(|| panic!("no tools/list result in {text}"));
    answer["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect()
}

fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs the browser script with `args`; its JSON lines by label.
async fn node_script(args: Vec<String>) -> std::collections::HashMap<String, Value> {
    let bin = PathBuf::from(std::env::var("SOULBASE_NODE_TOOLS").expect(
        "SOULBASE_NODE_TOOLS is not set: run `.ci/node-tools` and set it to the directory \
         it prints, or run the suite with `cargo xtask test`",
    ));
    let chromium = std::env::var("SOULBASE_CHROMIUM").expect(
        "SOULBASE_CHROMIUM is not set: run `.ci/browser` (it installs Debian's chromium as \
         root) and set it to the path it prints, or run the suite with `cargo xtask test`",
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node/console.mjs");
    let args: Vec<String> = std::iter::once(script.display().to_string())
        .chain(args)
        .collect();
    let node_modules = bin.parent().unwrap().to_path_buf();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin.join("node"))
            .args(&args)
            .env("SOULBASE_NODE_MODULES", node_modules)
            .env("SOULBASE_CHROMIUM", chromium)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the browser script failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v["label"].as_str().unwrap().to_owned(), v)
        })
        .collect()
}

/// A quarantine file in the spool of a server started in `dir`: one record of
/// `acme`'s, one of `beta`'s, as the drainer writes them.
fn quarantine_two_records(dir: &Path) {
    use soulbase_observe::{Denial, EvidenceEvent};
    use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId};
    let spool = dir.join("data/spool");
    std::fs::create_dir_all(&spool).unwrap();
    let line = |tenant: &str, call: &str| {
        let record = Envelope::new(
            TenantId::new(tenant).unwrap(),
            ActorId::new("someone").unwrap(),
            Origin::Api,
            EvidenceEvent::Denied(Denial {
                call_id: CallId::new(call).unwrap(),
                tool: "soulbase.builtin.echo".into(),
                code: soulbase_errors::ErrorCode::PolicyDenyTool,
            }),
        );
        json!({"refused": "value too long for the column", "record": record}).to_string()
    };
    std::fs::write(
        spool.join("quarantine.jsonl"),
        format!(
            "{}\n{}\n",
            line("acme", "call_quarantined_acme"),
            line("beta", "call_quarantined_beta")
        ),
    )
    .unwrap();
}

/// The browser scenario (see the script), its screenshots into `shots`.
async fn browse(
    server: &Server,
    conversation: &str,
    consent_request: &str,
    shots: &Path,
) -> std::collections::HashMap<String, Value> {
    node_script(vec![
        format!("http://{}", server.http),
        key("acme"),
        DENIED_CALL.into(),
        BETA_CALL.into(),
        shots.display().to_string(),
        conversation.to_owned(),
        consent_request.to_owned(),
        key("ops"),
    ])
    .await
}

/// A skill whose tool needs consent (risk `write`).
const MEMO_SKILL: &str = "name: memo\ndescription: Keep a memo.\nprovider: builtin\n\
    handler: soulbase.builtin.echo\nrisk_level: write\nparameters:\n  type: object\n  \
    properties:\n    text: {type: string}\n";

/// Writes `calls` finished calls of `soulbase.builtin.echo` by tenant `acme`
/// (a Begin and an End each) into the SQLite evidence store a server started
/// in `dir` with the default `data_dir` will open.
fn seed_evidence(dir: &Path, calls: usize) {
    use soulbase_observe::{
        BudgetUsage, EndStatus, EvidenceBegin, EvidenceEnd, EvidenceEvent, EvidenceRecord,
        EvidenceStore,
    };
    use soulbase_types::{ActorId, CallId, Envelope, Origin, TenantId, ToolId};
    let url = format!("sqlite:{}", dir.join("data/evidence.db").display());
    let run = async move {
        let db = soulbase_store::Db::connect(&url, true).await.unwrap();
        let store = soulbase_store::SqlEvidenceStore::new(db);
        let (tenant, actor) = (TenantId::new("acme").unwrap(), ActorId::new("ana").unwrap());
        let tool = ToolId::new("soulbase.builtin.echo").unwrap();
        let mut batch: Vec<EvidenceRecord> = Vec::with_capacity(2_000);
        for i in 0..calls {
            let call_id = CallId::generate();
            let begin = Envelope::new(
                tenant.clone(),
                actor.clone(),
                Origin::Api,
                EvidenceEvent::Begin(EvidenceBegin {
                    call_id: call_id.clone(),
                    tool_id: tool.clone(),
                    tool_version: "1.0.0".into(),
                    manifest_digest: "sha256:seeded".into(),
                    profile_hash: "sha256:seeded".into(),
                    policy_hash: "sha256:seeded".into(),
                    config_hash: "sha256:seeded".into(),
                    args_digest: format!("sha256:{i:064x}"),
                    idempotency_key: None,
                    calling_skill: None,
                    consent: None,
                    conversation: None,
                    surface: None,
                }),
            );
            let end = Envelope::new(
                tenant.clone(),
                actor.clone(),
                Origin::Api,
                EvidenceEvent::End(EvidenceEnd {
                    call_id,
                    begin_id: begin.id.clone(),
                    status: if i % 10 == 0 {
                        EndStatus::Error
                    } else {
                        EndStatus::Ok
                    },
                    error_code: (i % 10 == 0)
                        .then_some(soulbase_errors::ErrorCode::ToolExecutionFailed),
                    output_digest: None,
                    side_effects: Vec::new(),
                    usage: BudgetUsage::default(),
                    duration_us: 100,
                    client_requests: Vec::new(),
                }),
            );
            batch.push(begin);
            batch.push(end);
            if batch.len() >= 2_000 {
                store.write_batch(&batch).await.unwrap();
                batch.clear();
            }
        }
        if !batch.is_empty() {
            store.write_batch(&batch).await.unwrap();
        }
    };
    // Called from within the test's runtime: seed on a runtime of its own.
    std::thread::scope(|s| {
        s.spawn(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(run)
        })
        .join()
        .unwrap()
    });
}

/// The console's page loads over 100,000 evidence records (50,000 calls) in the
/// embedded store, each view timed in the browser from navigation to its data on
/// screen, five rounds. Printed, not asserted (the suite is no benchmark); the
/// target is 300 ms per view.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_page_loads_over_100_000_evidence_records() {
    let server = Server::start_in(&config(), |dir| seed_evidence(dir, 50_000));
    // The seeded calls are there for the API.
    let (status, body) = http(
        &server.http,
        "GET",
        "/api/evidence?limit=1&status=error",
        &[("authorization", &bearer("acme"))],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("TOOL.EXECUTION_FAILED"), "{body}");
    let found = node_script(vec![
        "--timing".into(),
        format!("http://{}", server.http),
        key("acme"),
        "5".into(),
    ])
    .await;
    let found = found.get("timing").unwrap();
    assert_eq!(found["rows"], 2, "the last call's Begin and End: {found}");
    let mut report = Vec::new();
    for view in ["tools", "evidence", "call"] {
        let mut ms: Vec<u64> = found["ms"][view]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(ms.len(), 5, "{found}");
        ms.sort_unstable();
        report.push(format!("{view} median {} ms, max {} ms", ms[2], ms[4]));
    }
    println!(
        "console page loads with 100,000 evidence records: {}",
        report.join("; ")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser_shows_and_steers_only_the_callers_tenant() {
    // An agent-loop conversation: one echo call, then the answer.
    let (model, _script) = common::scripted_model(vec![
        common::model_turn(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "soulbase__builtin__echo", "arguments": "{\"said\": \"hi\"}"}}]})),
        common::model_turn(json!({"role": "assistant", "content": "It said hi."})),
    ])
    .await;
    let server = Server::start_in(&config_with_model(&model), |dir| {
        let guide = dir.join("skills").join("guide");
        std::fs::create_dir_all(&guide).unwrap();
        quarantine_two_records(dir);
        std::fs::write(dir.join("skills").join("memo.yaml"), MEMO_SKILL).unwrap();
        std::fs::write(
            guide.join("SKILL.md"),
            "---\nname: guide\ndescription: How to greet people well.\n---\n# Greeting guide\n\n\
             Greet by **name**, then call `soulbase.builtin.echo`.\n\n- be brief\n- be kind\n",
        )
        .unwrap();
    });
    // What the explorer will show: an ok call, a failed one, a refused one, and
    // another tenant's call.
    let ok = invoke(
        &server,
        "acme",
        "soulbase.builtin.echo",
        r#"{"hello": "console"}"#,
        None,
    )
    .await;
    assert_eq!(ok["status"], "ok", "{ok}");
    let failed = invoke(
        &server,
        "acme",
        "soulbase.conformance.error_handling",
        "{}",
        None,
    )
    .await;
    assert_eq!(failed["error_code"], "TOOL.EXECUTION_FAILED", "{failed}");
    let denied = invoke(
        &server,
        "acme",
        "soulbase.builtin.sleep",
        r#"{"ms": 1}"#,
        Some(DENIED_CALL),
    )
    .await;
    assert_eq!(denied["status"], "denied", "{denied}");
    let code = denied["error_code"].as_str().unwrap().to_owned();
    let theirs = invoke(
        &server,
        "beta",
        "soulbase.builtin.echo",
        "{}",
        Some(BETA_CALL),
    )
    .await;
    assert_eq!(theirs["status"], "ok", "{theirs}");
    assert!(
        mcp_tools(&server, "acme")
            .await
            .contains(&"soulbase.builtin.echo".to_owned())
    );

    let auth = bearer("acme");
    let (status, chat) = http(
        &server.http,
        "POST",
        "/v1/chat/completions",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        &json!({"model": "gpt-test", "messages": [{"role": "user", "content": "Echo hi."}]})
            .to_string(),
    )
    .await;
    assert_eq!(status, 200, "{chat}");
    let chat: Value = serde_json::from_str(&chat).unwrap();
    let conversation = chat["soulbase"]["conversation_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // carl is refused the memo tool for want of consent: a pending request.
    let memo = r#"{"text": "remember the milk"}"#;
    let refused = invoke(&server, "carl", "skills.memo.memo", memo, None).await;
    assert_eq!(refused["error_code"], "CONSENT.REQUIRED", "{refused}");
    let consent_request = refused["error"]["fields"]["consent_request"]
        .as_str()
        .unwrap()
        .to_owned();

    let shots = screenshots();
    let found = browse(&server, &conversation, &consent_request, &shots).await;

    let tools: Vec<&str> = found["tools"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(tools.contains(&"soulbase.builtin.echo"), "{tools:?}");
    assert!(
        tools.contains(&"soulbase.conformance.error_handling"),
        "{tools:?}"
    );
    // What only the other tenant may list is not there.
    assert!(
        !tools.contains(&"soulbase.conformance.simple_text"),
        "{tools:?}"
    );
    let searched = found["search"]["tools"].as_array().unwrap();
    assert!(
        !searched.is_empty()
            && searched
                .iter()
                .all(|t| t.as_str().unwrap().contains("echo")),
        "{searched:?}"
    );

    let errors = found["errors"]["calls"].as_array().unwrap();
    assert!(
        errors.iter().any(|row| {
            let cells = row.as_array().unwrap();
            cells[1] == "soulbase.conformance.error_handling" && cells[4] == "TOOL.EXECUTION_FAILED"
        }),
        "{errors:?}"
    );
    // Consent: the request listed (who, what, which call), approved from the
    // page after a confirmation; carl's token then runs his call.
    let consent = &found["consent"];
    let listed = consent["listed"].as_str().unwrap();
    assert!(
        listed.contains("carl") && listed.contains("skills.memo.memo"),
        "{consent}"
    );
    assert!(
        listed.contains(refused["call_id"].as_str().unwrap()),
        "{consent}"
    );
    assert!(
        consent["confirm"]
            .as_str()
            .unwrap()
            .contains("Approve carl's request for skills.memo.memo (scope call)"),
        "{consent}"
    );
    assert!(
        consent["outcome"]
            .as_str()
            .unwrap()
            .contains("approved by ana (scope call)"),
        "{consent}"
    );
    assert_eq!(consent["left"], 0, "{consent}");
    let (status, mine) = http(
        &server.http,
        "GET",
        &format!("/api/consent/requests/{consent_request}"),
        &[("authorization", &bearer("carl"))],
        "",
    )
    .await;
    assert_eq!(status, 200, "{mine}");
    let mine: Value = serde_json::from_str(&mine).unwrap();
    let token = mine["token"].as_str().unwrap();
    let (status, ran) = http(
        &server.http,
        "POST",
        "/api/tools/skills.memo.memo/invoke",
        &[
            ("authorization", &bearer("carl")),
            ("content-type", "application/json"),
            ("x-soulbase-consent", token),
        ],
        memo,
    )
    .await;
    assert_eq!(status, 200, "{ran}");
    // The quarantine: this tenant's record only, with its reason.
    let quarantine = found["quarantine"]["text"].as_str().unwrap();
    assert!(quarantine.contains("call_quarantined_acme"), "{quarantine}");
    assert!(
        quarantine.contains("value too long for the column"),
        "{quarantine}"
    );
    assert!(
        !quarantine.contains("call_quarantined_beta"),
        "{quarantine}"
    );
    // Retrying is the operator's: the tenant's caller is refused (policy gives it
    // no `update` on the quarantine), the page says so, the list stays.
    let refused_retry = &found["retry-refused"];
    assert!(
        refused_retry["text"]
            .as_str()
            .unwrap()
            .contains("POLICY.DENY_TOOL"),
        "{refused_retry}"
    );
    assert_eq!(refused_retry["rows"], 1, "{refused_retry}");
    // The operator saw both tenants' records, confirmed, and both left the
    // quarantine for the database.
    let retried = &found["retried"];
    assert_eq!(retried["before"], 2, "{retried}");
    assert!(
        retried["result"]
            .as_str()
            .unwrap()
            .contains("The database took 2 record(s); 0 refused again"),
        "{retried}"
    );
    assert_eq!(
        (retried["rows"].as_u64(), retried["empty"].as_u64()),
        (Some(0), Some(1)),
        "{retried}"
    );
    assert!(
        found["retry-confirm"]["message"]
            .as_str()
            .unwrap()
            .contains("Offer every quarantined record to the database again"),
        "{:?}",
        found["retry-confirm"]
    );
    // The skill's SKILL.md, rendered.
    let skill = &found["skill"];
    assert!(
        skill["skills"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "guide"),
        "{skill}"
    );
    assert_eq!(skill["heading"], "Greeting guide", "{skill}");
    assert_eq!(skill["strong"], "name", "{skill}");
    assert_eq!(skill["items"], json!(["be brief", "be kind"]), "{skill}");
    assert_eq!(skill["code"], "soulbase.builtin.echo", "{skill}");
    // The conversation, turn by turn, its call linked.
    let turns = found["conversation"]["text"].as_str().unwrap();
    let mut at = 0;
    for part in [
        "Conversation started: gpt-test",
        "Turn 1",
        "soulbase.builtin.echo",
        "Turn 2",
        "Conversation ended: answered",
    ] {
        let found = turns[at..].find(part).map(|i| at + i);
        assert!(found.is_some(), "{part}, in this order: {turns}");
        at = found.unwrap_or(at);
    }
    assert_eq!(
        found["before-2001"]["rows"], 0,
        "{:?}",
        found["before-2001"]
    );
    let refused = found["refused"]["text"].as_str().unwrap();
    assert!(refused.contains(&format!("Refused: {code}")), "{refused}");
    assert!(
        refused.contains("authorization"),
        "the deciding stage: {refused}"
    );
    // The operator, naming the tenant, finds and opens its refused call.
    let operator = found["operator-call"]["text"].as_str().unwrap();
    assert!(operator.contains(&format!("Refused: {code}")), "{operator}");
    let other = found["other-tenant"]["text"].as_str().unwrap();
    assert!(other.contains("EVIDENCE.NOT_FOUND"), "{other}");
    assert!(
        found["phone"]["scroll_width"].as_u64().unwrap() <= 390,
        "{:?}",
        found["phone"]
    );
    assert!(
        found["confirm"]["message"]
            .as_str()
            .unwrap()
            .contains("Disable soulbase.builtin.echo"),
        "{:?}",
        found["confirm"]
    );
    assert!(
        found["disabled"]["text"]
            .as_str()
            .unwrap()
            .contains("paused"),
        "{:?}",
        found["disabled"]
    );
    // The policy simulator: every stage passed for an allowed call; for a denied
    // one, the stages before the deciding one passed, it refused, none after ran.
    let verdicts = |label: &str| -> Vec<(String, String)> {
        found[label]["stages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s[0].as_str().unwrap().to_owned(),
                    s[1].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let allowed = verdicts("sim-allowed");
    assert_eq!(allowed.len(), 7, "{allowed:?}");
    assert!(allowed.iter().all(|(_, v)| v == "passed"), "{allowed:?}");
    assert!(
        found["sim-allowed"]["text"]
            .as_str()
            .unwrap()
            .contains("Policy hash")
    );
    assert_eq!(found["sim-denied"]["heading"], format!("Refused: {code}"));
    let denied = verdicts("sim-denied");
    let verdict_of = |stage: &str| denied.iter().find(|(s, _)| s == stage).unwrap().1.clone();
    assert_eq!(verdict_of("schema"), "passed", "{denied:?}");
    assert_eq!(
        verdict_of("authorization"),
        format!("refused: {code}"),
        "{denied:?}"
    );
    assert_eq!(verdict_of("quota"), "not reached", "{denied:?}");
    // As another actor of the tenant (the caller may ask: `preflight` on
    // `soulbase.server.simulator`), every stage passed; another tenant's actor is
    // not simulated for a caller outside the global tenant.
    let as_ivy = verdicts("sim-as");
    assert_eq!(as_ivy.len(), 7, "{as_ivy:?}");
    assert!(as_ivy.iter().all(|(_, v)| v == "passed"), "{as_ivy:?}");
    let other = found["sim-other-tenant"]["text"].as_str().unwrap();
    assert!(other.contains("Not simulated: AUTH.FORBIDDEN"), "{other}");
    assert!(other.contains("global tenant"), "{other}");
    // Denials in the explorer: the refused call, found by its code; none by an
    // actor who made none.
    let denials = found["denials"]["calls"].as_array().unwrap();
    assert!(
        denials.iter().any(|row| {
            let cells = row.as_array().unwrap();
            cells[0] == DENIED_CALL && cells[3] == "denied" && cells[4] == code.as_str()
        }),
        "{denials:?}"
    );
    assert_eq!(found["denials-nobody"]["rows"], 0);
    // The skill disabled and enabled again from the skills page; no imports.
    let toggled = &found["skill-toggle"];
    assert_eq!(
        (&toggled["off"], &toggled["on"]),
        (&json!("no"), &json!("yes")),
        "{toggled}"
    );
    assert!(
        toggled["graph"]
            .as_str()
            .unwrap()
            .contains("No skill imports"),
        "{toggled}"
    );
    // The overview: a burst of 20 calls moves its counters; the tools' latency
    // and the charts are there.
    let overview = &found["overview"];
    assert!(
        overview["statuses"]
            .as_array()
            .unwrap()
            .iter()
            .all(|s| s == 200),
        "{overview}"
    );
    let (before, after) = (
        overview["before"].as_u64().unwrap(),
        overview["after"].as_u64().unwrap(),
    );
    assert!(after >= before + 20, "{overview}");
    assert!(
        overview["latency"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "soulbase.builtin.echo"),
        "{overview}"
    );
    assert!(overview["charts"].as_u64().unwrap() >= 5, "{overview}");
    // The refused call counts among the denials; HTTP calls show by surface.
    assert!(overview["denied"].as_u64().unwrap() >= 1, "{overview}");
    assert!(
        overview["surfaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == "http"),
        "{overview}"
    );
    // Network refusals the page shows on purpose (another tenant's call) are the
    // only errors the browser saw.
    let problems: Vec<&str> = found["problems"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .filter(|p| !p.contains("Failed to load resource"))
        .collect();
    assert!(problems.is_empty(), "{problems:?}");
    for shot in [
        "quarantine.png",
        "quarantine-retried.png",
        "skill.png",
        "conversation.png",
        "overview.png",
        "simulator-allowed.png",
        "simulator-denied.png",
        "tools.png",
        "evidence.png",
        "refused.png",
        "tools-phone.png",
        "tool-disabled.png",
        "evidence-denials.png",
        "simulator-as.png",
        "skills.png",
        "consent.png",
        "consent-approved.png",
        "operator-evidence.png",
    ] {
        assert!(shots.join(shot).metadata().unwrap().len() > 1000, "{shot}");
    }
    println!(
        "console page loads on loopback: tools {} ms, evidence {} ms",
        found["tools"]["ms"], found["errors"]["ms"]
    );

    // Disabled for acme: gone from its MCP list, still in beta's, and audited.
    assert!(
        !mcp_tools(&server, "acme")
            .await
            .contains(&"soulbase.builtin.echo".to_owned())
    );
    assert!(
        mcp_tools(&server, "beta")
            .await
            .contains(&"soulbase.builtin.echo".to_owned())
    );
    let (status, audit) = http(
        &server.http,
        "GET",
        "/api/audit?target=soulbase.builtin.echo",
        &[("authorization", &bearer("acme"))],
        "",
    )
    .await;
    assert_eq!(status, 200, "{audit}");
    let audit: Value = serde_json::from_str(&audit).unwrap();
    assert!(
        audit["records"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["actor"] == "ana"),
        "{audit}"
    );
    // Both left the quarantine file.
    let (status, body) = http(
        &server.http,
        "GET",
        "/api/quarantine",
        &[("authorization", &bearer("ops"))],
        "",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let left: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(left["records"], json!([]), "{body}");
}

/// Every console route answers the same static bytes to anyone, with a strict
/// CSP; the data it shows comes only through the API, which refuses the
/// unauthenticated and shows each tenant only its own calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_routes_hold_no_data_and_the_api_they_call_is_governed() {
    let server = Server::start(&config());
    invoke(&server, "acme", "soulbase.builtin.echo", "{}", None).await;
    invoke(
        &server,
        "beta",
        "soulbase.builtin.echo",
        "{}",
        Some(BETA_CALL),
    )
    .await;
    let (acme, beta) = (bearer("acme"), bearer("beta"));
    for path in soulbased::console::PATHS {
        let (status, anonymous) = http(&server.http, "GET", path, &[], "").await;
        assert_eq!(status, 200, "{path}");
        for auth in [&acme, &beta] {
            let (_, signed_in) =
                http(&server.http, "GET", path, &[("authorization", auth)], "").await;
            assert_eq!(signed_in, anonymous, "{path}");
        }
        assert!(
            !anonymous.contains("acme") && !anonymous.contains("beta"),
            "{path}"
        );
    }
    let r = reqwest::get(format!("http://{}/ui", server.http))
        .await
        .unwrap();
    let csp = r.headers()["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("script-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");

    // The data routes the console calls: refused without credentials, and a
    // tenant's listing holds only its own calls.
    for path in [
        "/api/evidence",
        "/api/tools",
        "/api/evidence/call_console_beta_1",
        "/api/audit",
        "/api/overview",
        "/api/quarantine",
        "/api/skills",
        "/api/denials",
        "/api/consent/requests",
        "/api/consent/requests/creq_0123456789abcdef0123456789abcdef",
    ] {
        let (status, body) = http(&server.http, "GET", path, &[], "").await;
        assert_eq!(status, 401, "{path}: {body}");
    }
    // Denials, like calls, are listed to their own tenant only.
    let refused = invoke(
        &server,
        "acme",
        "soulbase.builtin.sleep",
        r#"{"ms": 1}"#,
        None,
    )
    .await;
    assert_eq!(refused["status"], "denied", "{refused}");
    let denials = |auth: String| {
        let addr = server.http.clone();
        async move {
            let (status, body) = http(
                &addr,
                "GET",
                "/api/denials?code=POLICY.DENY_TOOL",
                &[("authorization", &auth)],
                "",
            )
            .await;
            assert_eq!(status, 200, "{body}");
            let page: Value = serde_json::from_str(&body).unwrap();
            page["denials"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["call_id"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    let refused_id = refused["call_id"].as_str().unwrap().to_owned();
    assert_eq!(denials(acme.clone()).await, [refused_id]);
    assert!(denials(beta.clone()).await.is_empty());
    // The simulator asks about another tenant's actor only for a caller of the
    // global tenant (beta's `invoke` on `*` implies `preflight` on the
    // simulator, so the tenant is what refuses it).
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/preflight?actor=ana&tenant=acme",
        &[
            ("authorization", &beta),
            ("content-type", "application/json"),
        ],
        "{}",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("AUTH.FORBIDDEN") && body.contains("\"tenant\""),
        "{body}"
    );
    // Without the simulator's action (the operator here holds only the
    // quarantine's and the evidence's), asking about another actor is refused
    // before any stage, naming `actor`.
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/preflight?actor=someone",
        &[
            ("authorization", &bearer("ops")),
            ("content-type", "application/json"),
        ],
        "{}",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body.contains("AUTH.FORBIDDEN")
            && body.contains("\"actor\"")
            && body.contains("soulbase.server.simulator"),
        "{body}"
    );
    let (status, body) = http(&server.http, "POST", "/api/quarantine/retry", &[], "").await;
    assert_eq!(status, 401, "{body}");
    let list = |auth: String| {
        let addr = server.http.clone();
        async move {
            let (status, body) = http(
                &addr,
                "GET",
                "/api/evidence?tool=soulbase.builtin.echo",
                &[("authorization", &auth)],
                "",
            )
            .await;
            assert_eq!(status, 200, "{body}");
            let page: Value = serde_json::from_str(&body).unwrap();
            page["calls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| {
                    (
                        c["tenant"].as_str().unwrap().to_owned(),
                        c["call_id"].as_str().unwrap().to_owned(),
                    )
                })
                .collect::<Vec<_>>()
        }
    };
    // Each call is listed once the drain has stored it.
    common::eventually("both calls stored", || async {
        !list(acme.clone()).await.is_empty() && !list(beta.clone()).await.is_empty()
    })
    .await;
    let acme_calls = list(acme.clone()).await;
    assert_eq!(acme_calls.len(), 1, "{acme_calls:?}");
    assert!(
        acme_calls.iter().all(|(t, _)| t == "acme"),
        "{acme_calls:?}"
    );
    let beta_calls = list(beta.clone()).await;
    assert_eq!(beta_calls, [("beta".to_owned(), BETA_CALL.to_owned())]);
    // The operator (global tenant, `read_evidence` on `soulbase.server.evidence`)
    // reads a tenant's evidence by naming it; a tenant naming another is refused.
    let ops = bearer("ops");
    let get = |path: String, auth: String| {
        let addr = server.http.clone();
        async move {
            let (status, body) = http(&addr, "GET", &path, &[("authorization", &auth)], "").await;
            (status, serde_json::from_str::<Value>(&body).unwrap())
        }
    };
    let (status, page) = get("/api/evidence?tenant=acme".into(), ops.clone()).await;
    assert_eq!(status, 200, "{page}");
    let seen: Vec<&str> = page["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["call_id"].as_str().unwrap())
        .collect();
    assert!(seen.contains(&acme_calls[0].1.as_str()), "{page}");
    assert!(!seen.contains(&BETA_CALL), "{page}");
    let (status, call) = get(
        format!("/api/evidence/{}?tenant=acme", acme_calls[0].1),
        ops.clone(),
    )
    .await;
    assert_eq!(
        (status, &call["call_id"]),
        (200, &json!(acme_calls[0].1)),
        "{call}"
    );
    let (status, denials) = get("/api/denials?tenant=acme".into(), ops.clone()).await;
    assert_eq!(status, 200, "{denials}");
    assert!(
        denials["denials"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["call_id"] == refused["call_id"]),
        "{denials}"
    );
    for path in [
        "/api/evidence?tenant=acme".to_owned(),
        "/api/denials?tenant=acme".to_owned(),
        format!("/api/evidence/{}?tenant=acme", acme_calls[0].1),
    ] {
        let (status, refused) = get(path.clone(), beta.clone()).await;
        assert_eq!(status, 403, "{path}: {refused}");
        assert_eq!(refused["error"]["code"], "AUTH.FORBIDDEN", "{path}");
        assert_eq!(refused["error"]["fields"]["field"], "tenant", "{path}");
    }
    let (status, _) = http(
        &server.http,
        "GET",
        "/api/evidence/call_console_beta_1",
        &[("authorization", &acme)],
        "",
    )
    .await;
    assert_eq!(status, 404);
    // A malformed filter names its field.
    let (status, body) = http(
        &server.http,
        "GET",
        "/api/evidence?status=fine",
        &[("authorization", &acme)],
        "",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"status\""), "{body}");
    // A denial has no end status: the denials listing takes none.
    let (status, body) = http(
        &server.http,
        "GET",
        "/api/denials?status=ok",
        &[("authorization", &acme)],
        "",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("\"query\""), "{body}");
}
