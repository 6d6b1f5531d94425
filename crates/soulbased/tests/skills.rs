//! Skills in a real `soulbased`: loading at start, `/api/skills`, enabling and
//! disabling (seed 003), reload by API and SIGHUP, the gateway on HTTP invokes,
//! and the two-phase protocol plus list_changed over MCP (rmcp client).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Server, eventually, http};
use http::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

/// Dev identities; `acme` may do everything; no subscriptions; watching off so
/// only an explicit reload (API, SIGHUP) applies file changes.
const CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, preflight, register, update, unregister, enable, disable, deprecate, reload] }
    - { effect: allow, tenant: beta, tools: ["*"], actions: [invoke, preflight, register, enable] }
"#;

const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "bob")];

fn repo_skill(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../skills/{name}/SKILL.md")),
    )
    .unwrap()
}

fn note(name: &str, description: &str) -> String {
    format!(
        "name: {name}\ndescription: {description}\nprovider: builtin\nhandler: soulbase.builtin.echo\n\
         risk_level: read\nparameters:\n  type: object\n  properties:\n    text: {{type: string}}\n"
    )
}

/// `skills/` with the repository's zodiac + jungastro pair and a builtin `note`.
fn prepare(dir: &Path) {
    let skills = dir.join("skills");
    for s in ["zodiac", "jungastro"] {
        std::fs::create_dir_all(skills.join(s)).unwrap();
        std::fs::write(skills.join(s).join("SKILL.md"), repo_skill(s)).unwrap();
    }
    std::fs::write(skills.join("note.yaml"), note("note", "Echo a note.")).unwrap();
}

fn with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut h = ACME.to_vec();
    h.extend_from_slice(extra);
    h
}

async fn json_of(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Value) {
    let (status, text) = http(&server.http, method, path, headers, body).await;
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    (status, v)
}

async fn skills(server: &Server) -> Vec<(String, bool)> {
    let (status, v) = json_of(server, "GET", "/api/skills?all=true", &ACME, "").await;
    assert_eq!(status, 200, "{v}");
    v["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["name"].as_str().unwrap().to_owned(),
                s["enabled"].as_bool().unwrap(),
            )
        })
        .collect()
}

async fn tool_ids(server: &Server) -> Vec<String> {
    let (status, v) = json_of(server, "GET", "/api/tools", &ACME, "").await;
    assert_eq!(status, 200, "{v}");
    v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skills_load_at_start_and_enable_disable_and_reload_over_http() {
    let server = Server::start_in(CONFIG, prepare);
    assert_eq!(
        skills(&server).await,
        [
            ("jungastro".to_owned(), true),
            ("note".to_owned(), true),
            ("zodiac".to_owned(), true)
        ]
    );
    let ids = tool_ids(&server).await;
    assert!(
        ids.contains(&"skills.zodiac.calculate_zodiac".to_owned()),
        "{ids:?}"
    );
    assert!(ids.contains(&"skills.note.note".to_owned()), "{ids:?}");

    // The gateway runs HTTP invokes: the free accessor works, the subscribed tool
    // is refused without a subscription.
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.zodiac.get_chart_snapshot/invoke",
        &ACME,
        r#"{"birth_date": "1990-07-04"}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"]["sun_sign"], "cancer");
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.zodiac.calculate_zodiac/invoke",
        &ACME,
        r#"{"birth_date": "1990-07-04"}"#,
    )
    .await;
    assert_eq!(v["error_code"], "SUBSCRIPTION.REQUIRED", "{v}");
    assert_eq!(v["error"]["fields"]["action"], "show_subscribe_card");
    assert_ne!(status, 200);

    // A call made as a skill (X-Soulbase-Skill) is checked against its imports.
    let (_, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.note.note/invoke",
        &with(&[("x-soulbase-skill", "jungastro")]),
        r#"{"text": "hi"}"#,
    )
    .await;
    assert_eq!(v["error_code"], "SKILL.NOT_IMPORTED", "{v}");
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.note.note/invoke",
        &with(&[("x-soulbase-skill", "note")]),
        r#"{"text": "hi"}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["output"], json!({"echo": {"text": "hi"}}));
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.note.note/invoke",
        &with(&[("x-soulbase-skill", "Not A Skill")]),
        "{}",
    )
    .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "SCHEMA.VALIDATION_FAILED");

    // Seed 003: disabling removes the skill from every view for the next request.
    let (status, v) = json_of(
        &server,
        "PATCH",
        "/api/skills/zodiac",
        &ACME,
        r#"{"enabled": false}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["enabled"], false);
    assert!(
        skills(&server)
            .await
            .contains(&("zodiac".to_owned(), false))
    );
    let ids = tool_ids(&server).await;
    let (_, enabled) = json_of(&server, "GET", "/api/tools?state=enabled", &ACME, "").await;
    assert!(!enabled.to_string().contains("skills.zodiac."), "{enabled}");
    assert!(ids.iter().any(|i| i.starts_with("skills.note.")));
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.zodiac.get_chart_snapshot/invoke",
        &ACME,
        r#"{"birth_date": "1990-07-04"}"#,
    )
    .await;
    assert_ne!(status, 200);
    assert_eq!(v["error_code"], "TOOL.DISABLED", "{v}");
    let (status, _) = json_of(
        &server,
        "PATCH",
        "/api/skills/zodiac",
        &ACME,
        r#"{"enabled": true}"#,
    )
    .await;
    assert_eq!(status, 200);
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.zodiac.get_chart_snapshot/invoke",
        &ACME,
        r#"{"birth_date": "1990-07-04"}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");

    // Bad PATCH input.
    for (path, body, want_status, code) in [
        (
            "/api/skills/zodiac",
            r#"{"enabled": "no"}"#,
            400,
            "SCHEMA.VALIDATION_FAILED",
        ),
        (
            "/api/skills/zodiac",
            r#"{"enabled": true, "x": 1}"#,
            400,
            "SCHEMA.VALIDATION_FAILED",
        ),
        (
            "/api/skills/zodiac",
            "not json",
            400,
            "SCHEMA.VALIDATION_FAILED",
        ),
        (
            "/api/skills/nope",
            r#"{"enabled": false}"#,
            404,
            "TOOL.NOT_FOUND",
        ),
    ] {
        let (status, v) = json_of(&server, "PATCH", path, &ACME, body).await;
        assert_eq!(status, want_status, "{path} {body}: {v}");
        assert_eq!(v["error"]["code"], code, "{path} {body}");
    }
    let (status, _) = json_of(&server, "GET", "/api/skills", &[], "").await;
    assert_eq!(status, 401);

    // POST /api/reload also reloads the skills directory (watching is off).
    let dir = server.dir().join("skills");
    std::fs::write(dir.join("extra.yaml"), note("extra", "Another note.")).unwrap();
    std::fs::remove_file(dir.join("note.yaml")).unwrap();
    let (status, v) = json_of(&server, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["skills"]["added"], json!(["extra"]));
    assert_eq!(v["skills"]["removed"], json!(["note"]));
    let ids = tool_ids(&server).await;
    assert!(ids.contains(&"skills.extra.extra".to_owned()), "{ids:?}");
    assert!(
        !ids.iter().any(|i| i.starts_with("skills.note.")),
        "{ids:?}"
    );

    // SIGHUP reloads too.
    std::fs::write(dir.join("hup.yaml"), note("hup", "Loaded on SIGHUP.")).unwrap();
    server.signal("HUP");
    eventually("SIGHUP loads hup.yaml", || async {
        skills(&server).await.iter().any(|(n, _)| n == "hup")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_configured_skills_dir_refuses_start_up() {
    let err = common::refused_start("skills:\n  dir: ./not-there\n", &[]);
    assert!(
        err.contains("CONFIG.INVALID") && err.contains("skills.dir"),
        "{err}"
    );
}

// ---- MCP -------------------------------------------------------------------

/// Counts `notifications/tools/list_changed`.
#[derive(Clone, Default)]
struct Counter(Arc<AtomicUsize>);

impl rmcp::ClientHandler for Counter {
    async fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<rmcp::RoleClient>,
    ) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Counter {
    fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

fn transport(
    server: &Server,
    tenant: &str,
    skill: Option<&str>,
) -> StreamableHttpClientTransport<reqwest::Client> {
    let mut headers = HashMap::new();
    headers.insert(
        HeaderName::from_static("x-soulbase-tenant"),
        HeaderValue::from_str(tenant).unwrap(),
    );
    headers.insert(
        HeaderName::from_static("x-soulbase-actor"),
        HeaderValue::from_static("agent"),
    );
    if let Some(s) = skill {
        headers.insert(
            HeaderName::from_static("x-soulbase-skill"),
            HeaderValue::from_str(s).unwrap(),
        );
    }
    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", server.http))
            .custom_headers(headers);
    StreamableHttpClientTransport::from_config(config)
}

fn call(name: &str, args: Value) -> CallToolRequestParams {
    CallToolRequestParams::new(name.to_owned()).with_arguments(args.as_object().cloned().unwrap())
}

fn code(r: &rmcp::model::CallToolResult) -> String {
    assert_eq!(r.is_error, Some(true), "{r:?}");
    r.structured_content.as_ref().unwrap()["code"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn text(r: &rmcp::model::CallToolResult) -> String {
    r.content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_two_phase_skill_protocol_over_mcp() {
    let server = Server::start_in(CONFIG, prepare);
    let mcp = ().serve(transport(&server, "acme", None)).await.unwrap();
    let names: Vec<String> = mcp
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    for n in [
        "list_skills",
        "get_skill_info",
        "run_skill",
        "skills.zodiac.calculate_zodiac",
        "skills.note.note",
        "soulbase.builtin.echo",
    ] {
        assert!(names.contains(&n.to_owned()), "{n} missing from {names:?}");
    }
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(names, sorted, "deterministic order");

    // Phase 1: names and short descriptions only.
    let listed = mcp.call_tool(call("list_skills", json!({}))).await.unwrap();
    assert_eq!(listed.is_error, Some(false));
    let skills = &listed.structured_content.as_ref().unwrap()["skills"];
    let names: Vec<&str> = skills
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["jungastro", "note", "zodiac"]);
    let mut keys: Vec<&String> = skills[2].as_object().unwrap().keys().collect();
    keys.sort();
    assert_eq!(keys, ["description", "name"]);

    // Phase 2: the SKILL.md verbatim.
    let info = mcp
        .call_tool(call("get_skill_info", json!({"name": "zodiac"})))
        .await
        .unwrap();
    assert_eq!(info.is_error, Some(false), "{info:?}");
    assert_eq!(text(&info), repo_skill("zodiac"));
    assert_eq!(
        info.structured_content.as_ref().unwrap()["tools"],
        json!(["calculate_zodiac", "get_chart_snapshot"])
    );
    let r = mcp
        .call_tool(call("get_skill_info", json!({"name": "nope"})))
        .await
        .unwrap();
    assert_eq!(code(&r), "TOOL.NOT_FOUND");
    let r = mcp
        .call_tool(call("get_skill_info", json!({})))
        .await
        .unwrap();
    assert_eq!(code(&r), "SCHEMA.VALIDATION_FAILED");

    // Phase 3: run_skill through the gateway and the pipeline.
    let run = mcp
        .call_tool(call(
            "run_skill",
            json!({"skill": "zodiac", "tool": "get_chart_snapshot",
                   "arguments": {"birth_date": "1990-07-04"}}),
        ))
        .await
        .unwrap();
    assert_eq!(run.is_error, Some(false), "{run:?}");
    assert_eq!(
        run.structured_content.as_ref().unwrap()["sun_sign"],
        "cancer"
    );
    let r = mcp
        .call_tool(call(
            "run_skill",
            json!({"skill": "zodiac", "tool": "calculate_zodiac",
                   "arguments": {"birth_date": "1990-07-04"}}),
        ))
        .await
        .unwrap();
    assert_eq!(code(&r), "SUBSCRIPTION.REQUIRED");
    let r = mcp
        .call_tool(call("run_skill", json!({"skill": "zodiac"})))
        .await
        .unwrap();
    assert_eq!(
        code(&r),
        "TOOL.NOT_FOUND",
        "ambiguous: zodiac has two tools"
    );
    let r = mcp
        .call_tool(call(
            "run_skill",
            json!({"skill": "note", "arguments": {"text": 5}}),
        ))
        .await
        .unwrap();
    assert_eq!(code(&r), "SCHEMA.VALIDATION_FAILED");
    let r = mcp
        .call_tool(call(
            "run_skill",
            json!({"skill": "note", "calling_skill": "zodiac"}),
        ))
        .await
        .unwrap();
    assert_eq!(
        code(&r),
        "SCHEMA.VALIDATION_FAILED",
        "no calling skill from the body"
    );
    let r = mcp
        .call_tool(call(
            "run_skill",
            json!({"skill": "note", "arguments": {"text": "x"}}),
        ))
        .await
        .unwrap();
    assert_eq!(r.structured_content, Some(json!({"echo": {"text": "x"}})));

    // A session bound to jungastro sees core ∪ own ∪ imports, and nothing else.
    let bound = ().serve(transport(&server, "acme", Some("jungastro"))).await.unwrap();
    let names: Vec<String> = bound
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(names.contains(&"skills.jungastro.interpret_chart".to_owned()));
    assert!(names.contains(&"skills.zodiac.calculate_zodiac".to_owned()));
    assert!(names.contains(&"soulbase.builtin.echo".to_owned()));
    assert!(!names.contains(&"skills.note.note".to_owned()), "{names:?}");
    let r = bound
        .call_tool(call("skills.note.note", json!({"text": "x"})))
        .await
        .unwrap();
    assert_eq!(code(&r), "SKILL.NOT_IMPORTED");
    let r = bound
        .call_tool(call(
            "run_skill",
            json!({"skill": "zodiac", "tool": "calculate_zodiac",
                   "arguments": {"birth_date": "1990-07-04"}}),
        ))
        .await
        .unwrap();
    assert_eq!(code(&r), "SUBSCRIPTION.REQUIRED");

    // With a subscription in the configuration (hot reload), the import works.
    let config = CONFIG.replace(
        "  watch: false\n",
        "  watch: false\n  subscriptions:\n    - { tenant: acme, skill: zodiac }\n",
    );
    std::fs::write(server.config_path(), config).unwrap();
    let (status, v) = json_of(&server, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 200, "{v}");
    let r = bound
        .call_tool(call(
            "skills.zodiac.calculate_zodiac",
            json!({"birth_date": "1990-07-04", "birth_time": "06:30"}),
        ))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    assert_eq!(r.structured_content.as_ref().unwrap()["sun_sign"], "cancer");

    // Disabling a skill removes it from list_skills, get_skill_info and tools/list.
    let (status, _) = json_of(
        &server,
        "PATCH",
        "/api/skills/zodiac",
        &ACME,
        r#"{"enabled": false}"#,
    )
    .await;
    assert_eq!(status, 200);
    let listed = mcp.call_tool(call("list_skills", json!({}))).await.unwrap();
    let names: Vec<Value> = listed.structured_content.unwrap()["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].clone())
        .collect();
    assert_eq!(names, [json!("jungastro"), json!("note")]);
    let r = mcp
        .call_tool(call("get_skill_info", json!({"name": "zodiac"})))
        .await
        .unwrap();
    assert_eq!(code(&r), "TOOL.NOT_FOUND");
    let names: Vec<String> = mcp
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with("skills.zodiac.")),
        "{names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skill_binding_without_its_scope_is_refused() {
    // Not dev mode: an API key without the skill:<name> scope may not act as it.
    let subject = soulbase_types::Subject::new(
        soulbase_types::TenantId::new("acme").unwrap(),
        soulbase_types::ActorId::new("bob").unwrap(),
    );
    let key = soulbase_auth::generate_api_key("k1", &subject);
    let scoped = soulbase_auth::generate_api_key("k2", &subject);
    let config = format!(
        r#"
auth:
  api_keys:
    - {{ id: k1, sha256: "{}", tenant: acme, actor: bob }}
    - {{ id: k2, sha256: "{}", tenant: acme, actor: eve, scopes: ["skill:note"] }}
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - {{ effect: allow, tenant: acme, tools: ["*"] }}
"#,
        key.config.sha256, scoped.config.sha256
    );
    let server = Server::start_in(&config, prepare);
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.note.note/invoke",
        &[
            ("x-api-key", key.key.as_str()),
            ("x-soulbase-skill", "note"),
        ],
        "{}",
    )
    .await;
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["code"], "AUTH.FORBIDDEN");
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.note.note/invoke",
        &[
            ("x-api-key", scoped.key.as_str()),
            ("x-soulbase-skill", "note"),
        ],
        r#"{"text": "ok"}"#,
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let (status, v) = json_of(
        &server,
        "POST",
        "/api/tools/skills.note.note/invoke",
        &[
            ("x-api-key", scoped.key.as_str()),
            ("x-soulbase-skill", "zodiac"),
        ],
        "{}",
    )
    .await;
    assert_eq!(status, 403, "{v}");
    // gRPC: InvokeRequest.calling_skill is a claim checked the same way.
    let grpc_call = |api_key: &str, skill: &str| {
        let mut r = tonic::Request::new(soulbase_grpc::proto::InvokeRequest {
            tool_id: "skills.note.note".into(),
            arguments_json: r#"{"text": "g"}"#.into(),
            calling_skill: skill.into(),
            ..Default::default()
        });
        r.metadata_mut()
            .insert("x-api-key", api_key.parse().unwrap());
        r
    };
    let mut invoker = server.invoker().await;
    let st = invoker
        .invoke(grpc_call(&key.key, "note"))
        .await
        .unwrap_err();
    assert_eq!(common::code_of(&st), "AUTH.FORBIDDEN");
    let ok = invoker
        .invoke(grpc_call(&scoped.key, "note"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.output_json, r#"{"echo":{"text":"g"}}"#);
    let st = invoker
        .invoke(grpc_call(&scoped.key, "jungastro"))
        .await
        .unwrap_err();
    assert_eq!(common::code_of(&st), "AUTH.FORBIDDEN");

    // PATCH needs the admin role outside dev mode.
    let (status, v) = json_of(
        &server,
        "PATCH",
        "/api/skills/note",
        &[("x-api-key", key.key.as_str())],
        r#"{"enabled": false}"#,
    )
    .await;
    assert_eq!(status, 403, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_follows_skill_file_edits() {
    let config = CONFIG.replace(
        "  watch: false\n",
        "  watch: true\n  poll_interval_ms: 100\n",
    );
    let server = Server::start_in(&config, prepare);
    let counter = Counter::default();
    let mcp = counter
        .clone()
        .serve(transport(&server, "acme", None))
        .await
        .unwrap();
    let before = mcp.list_all_tools().await.unwrap();
    assert!(before.iter().any(|t| t.name == "skills.note.note"));

    // Add a skill: notified, then listed.
    let dir = server.dir().join("skills");
    std::fs::write(
        dir.join("fresh.yaml"),
        note("fresh", "Added while listening."),
    )
    .unwrap();
    eventually("list_changed after adding a skill", || async {
        counter.get() >= 1
    })
    .await;
    eventually("the new skill's tool is listed", || async {
        mcp.list_all_tools()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "skills.fresh.fresh")
    })
    .await;

    // Edit it: notified again, and the new description is served.
    let seen = counter.get();
    std::fs::write(
        dir.join("fresh.yaml"),
        note("fresh", "Edited while listening."),
    )
    .unwrap();
    eventually("list_changed after editing a skill", || async {
        counter.get() > seen
    })
    .await;
    eventually("the edit is served", || async {
        mcp.list_all_tools().await.unwrap().iter().any(|t| {
            t.name == "skills.fresh.fresh"
                && t.description.as_deref() == Some("Edited while listening.")
        })
    })
    .await;

    // Delete it: notified, and gone.
    let seen = counter.get();
    std::fs::remove_file(dir.join("fresh.yaml")).unwrap();
    eventually("list_changed after deleting a skill", || async {
        counter.get() > seen
    })
    .await;
    eventually("the deleted skill's tool is gone", || async {
        !mcp.list_all_tools()
            .await
            .unwrap()
            .iter()
            .any(|t| t.name == "skills.fresh.fresh")
    })
    .await;
}

// One validator (issue 32): `soulbase skills check` and a running server agree
// on every file of an adversarial directory and on the shipped examples. The
// same directory, with warnings compared too, is checked against the catalog's
// load path in soulbase-cli's `skills_cli` tests.

/// `path` relative to the skills directory, `/`-separated.
fn under_skills(path: &str) -> String {
    let p = path.replace('\\', "/");
    match p.rfind("skills/") {
        Some(i) => p[i + "skills/".len()..].to_owned(),
        None => p,
    }
}

/// `soulbase skills check --format json` on the server's directory and
/// configuration: its exit code, the skills it loads and the files with errors.
fn cli_check(dir: &Path) -> (i32, Vec<String>, Vec<String>) {
    let mut cmd = std::process::Command::new(common::cli_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") {
            cmd.env_remove(k);
        }
    }
    let o = cmd
        .current_dir(dir)
        .arg("--config")
        .arg(dir.join("config.yaml"))
        .args(["skills", "check", "--format", "json"])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|_| {
        panic!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    let mut skills: Vec<String> = v["skills"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect();
    skills.sort();
    let mut errors: Vec<String> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["severity"] == "error")
        .map(|p| under_skills(p["path"].as_str().unwrap()))
        .collect();
    errors.sort();
    errors.dedup();
    (o.status.code().unwrap(), skills, errors)
}

/// What the server loaded (every skill, by name) and the files its reload
/// report refuses (`POST /api/reload`), with the refusals' text.
async fn server_load(server: &Server) -> (Vec<String>, Vec<String>, Vec<String>) {
    let mut loaded: Vec<String> = skills(server).await.into_iter().map(|(n, _)| n).collect();
    loaded.sort();
    let (status, v) = json_of(server, "POST", "/api/reload", &ACME, "").await;
    assert_eq!(status, 200, "{v}");
    let text: Vec<String> = v["skills"]["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap().to_owned())
        .collect();
    let mut files: Vec<String> = text
        .iter()
        .map(|e| {
            let rest = e.strip_prefix("error: ").unwrap();
            under_skills(rest.split(':').next().unwrap())
        })
        .collect();
    files.sort();
    files.dedup();
    (loaded, files, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_check_and_the_server_agree_on_an_adversarial_directory() {
    let mut expected = None;
    let server = Server::start_in(CONFIG, |dir| {
        expected = Some(soulbase_testkit::skills::adversarial(dir))
    });
    let (loaded, problems) = expected.unwrap();
    let errors: Vec<String> = problems
        .iter()
        .filter(|(_, sev)| *sev == "error")
        .map(|(f, _)| (*f).to_owned())
        .collect();
    let (code, cli_skills, cli_errors) = cli_check(server.dir());
    let (server_skills, server_errors, text) = server_load(&server).await;
    assert_eq!(code, 1);
    assert_eq!(cli_skills, server_skills, "{text:?}");
    assert_eq!(cli_errors, server_errors, "{text:?}");
    assert_eq!(server_skills, loaded, "{text:?}");
    assert_eq!(server_errors, errors, "{text:?}");
    // The clash is no takeover: both files are refused, each naming both.
    for file in ["clash.yaml", "clash/SKILL.md"] {
        assert!(
            text.iter().any(|e| e.contains(&format!("skills/{file}:"))
                && e.contains("clash.yaml")
                && e.contains("clash/SKILL.md")),
            "{file}: {text:?}"
        );
    }
    // The reload report also names the files that loaded with warnings.
    let warned: Vec<String> = problems
        .iter()
        .filter(|(_, sev)| *sev == "warning")
        .map(|(f, _)| (*f).to_owned())
        .collect();
    let (_, v) = json_of(&server, "POST", "/api/reload", &ACME, "").await;
    let mut reported: Vec<String> = v["skills"]["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            let rest = w.as_str().unwrap().strip_prefix("warning: ").unwrap();
            under_skills(rest.split(':').next().unwrap())
        })
        .collect();
    reported.sort();
    reported.dedup();
    let mut warned = warned;
    warned.sort();
    warned.dedup();
    assert!(
        !warned.is_empty(),
        "the directory has files that load with warnings"
    );
    assert_eq!(reported, warned, "{v}");
    let ids = tool_ids(&server).await;
    assert!(
        !ids.iter().any(|id| id.starts_with("skills.clash.")),
        "{ids:?}"
    );
    assert!(
        !ids.iter().any(|id| id.starts_with("skills.grabby.")),
        "{ids:?}"
    );
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_examples_load_without_errors_in_the_cli_check_and_the_server() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills");
    let server = Server::start_in(CONFIG, |dir| copy_tree(&repo, &dir.join("skills")));
    let (code, cli_skills, cli_errors) = cli_check(server.dir());
    let (server_skills, server_errors, text) = server_load(&server).await;
    assert_eq!(code, 0, "{cli_errors:?}");
    assert!(cli_errors.is_empty(), "{cli_errors:?}");
    assert!(server_errors.is_empty(), "{text:?}");
    assert_eq!(cli_skills, server_skills);
    assert_eq!(
        server_skills,
        ["jungastro", "search_logs", "text-length", "zodiac"]
    );
}
