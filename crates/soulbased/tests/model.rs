//! The model-facing HTTP surface (issue 33, items 1–3): the caller's governed
//! tools as OpenAI (plain, strict), Anthropic and MCP definitions; a model's tool
//! calls routed through the one stack and answered in its API's shape, in order,
//! malformed and refused entries answered in place; exported names accepted where
//! a tool id is, strict-mode nulls restored; the prompt sections; a disabled skill
//! gone from the next request's tools and sections.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;

use common::{Server, http};
use serde_json::{Value, json};

const CONFIG: &str = r#"
server:
  dev_insecure: true
skills:
  dir: ./skills
  watch: false
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, enable, disable] }
    - { effect: deny, tenant: acme, tools: ["soulbase.builtin.sleep"], actions: [invoke] }
"#;

const ACME: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "agent")];

/// `skills/` with the repository's zodiac package (SKILL.md copied verbatim).
fn prepare(dir: &Path) {
    let skills = dir.join("skills").join("zodiac");
    std::fs::create_dir_all(&skills).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/zodiac/SKILL.md");
    std::fs::copy(repo, skills.join("SKILL.md")).unwrap();
}

async fn get(server: &Server, path: &str) -> (u16, Value) {
    let (status, body) = http(&server.http, "GET", path, &ACME, "").await;
    (status, serde_json::from_str(&body).unwrap())
}

async fn post(server: &Server, path: &str, body: &Value) -> (u16, Value) {
    let (status, text) = http(&server.http, "POST", path, &ACME, &body.to_string()).await;
    (status, serde_json::from_str(&text).unwrap())
}

/// The content of a `role: tool` message, parsed.
fn content(message: &Value) -> Value {
    serde_json::from_str(message["content"].as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_exported_per_caller_in_every_model_format() {
    let server = Server::start_in(CONFIG, prepare);
    let (status, strict) = get(&server, "/api/model/tools?format=openai-strict").await;
    assert_eq!(status, 200, "{strict}");
    assert_eq!(strict["format"], "openai-strict");
    let snapshot = strict["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "skills__zodiac__get_chart_snapshot")
        .unwrap_or_else(|| panic!("{strict}"));
    assert_eq!(snapshot["function"]["strict"], true);
    assert_eq!(
        strict["names"]["skills__zodiac__get_chart_snapshot"],
        "skills.zodiac.get_chart_snapshot"
    );
    // The governed list: the denied builtin is not offered.
    let names: Vec<&str> = strict["names"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert!(names.contains(&"soulbase__builtin__echo"), "{names:?}");
    assert!(!names.contains(&"soulbase__builtin__sleep"), "{names:?}");
    // Phase 1 of the two-phase skill use: name and short description.
    assert_eq!(strict["skills"][0]["name"], "zodiac");
    assert!(
        strict["skills"][0]["description"]
            .as_str()
            .unwrap()
            .starts_with("Compute")
    );

    let (_, anthropic) = get(&server, "/api/model/tools?format=anthropic").await;
    assert!(
        anthropic["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["name"] == "skills__zodiac__get_chart_snapshot"
                && t["input_schema"].is_object())
    );
    let (_, mcp) = get(&server, "/api/model/tools?format=mcp").await;
    assert!(
        mcp["tools"].as_array().unwrap().iter().any(|t| t["name"]
            == "skills.zodiac.get_chart_snapshot"
            && t["inputSchema"].is_object())
    );
    let (status, bad) = get(&server, "/api/model/tools?format=gemini").await;
    assert_eq!(status, 400, "{bad}");
    assert_eq!(bad["error"]["code"], "SCHEMA.VALIDATION_FAILED");
    assert_eq!(bad["error"]["fields"]["field"], "format");

    // Phase 2: the SKILL.md, byte for byte.
    let (status, info) = get(&server, "/api/skills/zodiac").await;
    assert_eq!(status, 200, "{info}");
    let file = std::fs::read_to_string(server.dir().join("skills/zodiac/SKILL.md")).unwrap();
    assert_eq!(info["content"].as_str().unwrap(), file);
    let (status, none) = get(&server, "/api/skills/nope").await;
    assert_eq!(
        (status, none["error"]["code"].as_str()),
        (404, Some("TOOL.NOT_FOUND"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_tool_calls_are_governed_and_answered_in_order() {
    let server = Server::start_in(CONFIG, prepare);
    let calls = json!({"tool_calls": [
        // A strict export's call: `include_aspects: null` means "absent".
        {"id": "call_1", "type": "function", "function": {
            "name": "skills__zodiac__get_chart_snapshot",
            "arguments": "{\"birth_date\": \"1990-07-04\", \"include_aspects\": null}"}},
        // Refused by policy: answered in place with its stable code.
        {"id": "call_2", "type": "function", "function": {
            "name": "soulbase__builtin__sleep", "arguments": "{\"ms\": 1}"}},
        // Malformed: no function.
        {"id": "call_3", "type": "function"},
        // A name no export gave.
        {"id": "call_4", "type": "function", "function": {"name": "made_up", "arguments": "{}"}},
        // Arguments that are not JSON.
        {"id": "call_5", "type": "function", "function": {
            "name": "soulbase__builtin__echo", "arguments": "{not json"}},
        {"id": "call_6", "type": "function", "function": {
            "name": "soulbase__builtin__echo", "arguments": "{\"hi\": 1}"}},
    ]});
    let (status, v) = post(&server, "/api/model/tool_calls", &calls).await;
    assert_eq!(status, 200, "{v}");
    let messages = v["messages"].as_array().unwrap();
    let ids: Vec<&str> = messages
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        ["call_1", "call_2", "call_3", "call_4", "call_5", "call_6"]
    );
    assert!(messages.iter().all(|m| m["role"] == "tool"));
    assert_eq!(
        content(&messages[0])["sun_sign"],
        "cancer",
        "{}",
        messages[0]
    );
    let code = |m: &Value| content(m)["error"]["code"].as_str().unwrap().to_owned();
    assert_eq!(code(&messages[1]), "POLICY.DENY_TOOL");
    assert_eq!(code(&messages[2]), "SCHEMA.VALIDATION_FAILED");
    assert_eq!(code(&messages[3]), "TOOL.NOT_FOUND");
    assert_eq!(code(&messages[4]), "SCHEMA.VALIDATION_FAILED");
    assert_eq!(content(&messages[5])["echo"], json!({"hi": 1}));

    // Anthropic: tool_use blocks in (text blocks are the model's words), tool_result
    // blocks out.
    let turn = json!({"content": [
        {"type": "text", "text": "Let me look that up."},
        {"type": "tool_use", "id": "toolu_1", "name": "skills__zodiac__get_chart_snapshot",
         "input": {"birth_date": "1990-07-04"}},
        {"type": "tool_use", "id": "toolu_2", "name": "soulbase__builtin__sleep", "input": {"ms": 1}},
    ]});
    let (status, v) = post(&server, "/api/model/tool_calls", &turn).await;
    assert_eq!(status, 200, "{v}");
    let blocks = v["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0]["type"], "tool_result");
    assert_eq!(blocks[0]["tool_use_id"], "toolu_1");
    assert_eq!(blocks[0]["is_error"], false);
    assert_eq!(blocks[1]["is_error"], true);
    assert_eq!(code(blocks.get(1).unwrap()), "POLICY.DENY_TOOL");

    // An exported name is accepted where a tool id is; an `llm` call's strict
    // nulls are restored on every surface.
    let (status, text) = http(
        &server.http,
        "POST",
        "/api/tools/skills__zodiac__get_chart_snapshot/invoke",
        &ACME,
        r#"{"birth_date": "1990-07-04"}"#,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (status, v) = post(&server, "/api/model/tool_calls", &json!({"bad": 1})).await;
    assert_eq!(status, 400, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prompt_sections_follow_the_callers_skills() {
    let server = Server::start_in(CONFIG, prepare);
    let (status, v) = get(&server, "/api/model/prompt?max_iterations=5").await;
    assert_eq!(status, 200, "{v}");
    let prompt = v["prompt"].as_str().unwrap();
    for part in [
        "## Available Tools",
        "`skills__zodiac__get_chart_snapshot`",
        "## Skills (Available)",
        "- `zodiac`:",
        "## Tool Calling Guidelines",
        "Maximum iterations: 5",
    ] {
        assert!(prompt.contains(part), "{part} missing from:\n{prompt}");
    }
    assert!(!prompt.contains("soulbase__builtin__sleep"), "{prompt}");
    let (status, bad) = get(&server, "/api/model/prompt?max_iterations=0").await;
    assert_eq!(status, 400, "{bad}");

    // A skill disabled between two requests is gone from the next one's sections
    // and tools.
    let (status, text) = http(
        &server.http,
        "PATCH",
        "/api/skills/zodiac",
        &ACME,
        r#"{"enabled": false}"#,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    let (_, v) = get(&server, "/api/model/prompt?max_iterations=5").await;
    let prompt = v["prompt"].as_str().unwrap();
    assert!(!prompt.contains("zodiac"), "{prompt}");
    let (_, tools) = get(&server, "/api/model/tools").await;
    assert!(!tools.to_string().contains("zodiac"), "{tools}");
    let (status, _) = get(&server, "/api/skills/zodiac").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_surface_over_grpc_is_the_same() {
    use soulbase_grpc::proto;
    let server = Server::start_in(CONFIG, prepare);
    let mut invoker = server.invoker().await;
    let exported = invoker
        .export_tools(common::as_dev(
            proto::ExportToolsRequest {
                format: proto::ExportFormat::OpenaiStrict as i32,
                model: String::new(),
            },
            "acme",
            "agent",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(exported.format, "openai-strict");
    assert_eq!(
        exported.names["skills__zodiac__get_chart_snapshot"],
        "skills.zodiac.get_chart_snapshot"
    );
    let tools: Value = serde_json::from_str(&exported.tools_json).unwrap();
    // The same list as over HTTP.
    let (_, http_tools) = get(&server, "/api/model/tools?format=openai-strict").await;
    assert_eq!(tools, http_tools["tools"]);

    let calls = json!([
        {"id": "call_1", "type": "function", "function": {
            "name": "skills__zodiac__get_chart_snapshot",
            "arguments": "{\"birth_date\": \"1990-07-04\", \"include_aspects\": null}"}},
        {"id": "call_2", "type": "function"},
    ]);
    let routed = invoker
        .route_tool_calls(common::as_dev(
            proto::RouteToolCallsRequest {
                style: proto::CallStyle::Openai as i32,
                calls_json: calls.to_string(),
            },
            "acme",
            "agent",
        ))
        .await
        .unwrap()
        .into_inner();
    let answers: Value = serde_json::from_str(&routed.answers_json).unwrap();
    assert_eq!(content(&answers[0])["sun_sign"], "cancer", "{answers}");
    assert_eq!(
        content(&answers[1])["error"]["code"],
        "SCHEMA.VALIDATION_FAILED"
    );
    let bad = invoker
        .route_tool_calls(common::as_dev(
            proto::RouteToolCallsRequest {
                style: proto::CallStyle::Anthropic as i32,
                calls_json: "{}".into(),
            },
            "acme",
            "agent",
        ))
        .await
        .unwrap_err();
    assert_eq!(common::code_of(&bad), "SCHEMA.VALIDATION_FAILED");
}
