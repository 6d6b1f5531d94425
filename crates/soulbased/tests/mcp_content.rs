//! Content beyond JSON, plain MCP names, and a tool's own progress and log
//! messages, through the conformance fixture pack (`server.mcp_conformance_tools`)
//! and the official MCP Python SDK (from `.ci/python-tools`,
//! `SOULBASE_PYTHON_TOOLS`): the tools are listed and called by their `mcp_name`,
//! answer image, audio, embedded-resource and mixed content blocks, report
//! progress and log messages while they run; HTTP answers the same output as
//! JSON; evidence keeps the output's digest and size, never its bytes.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::Server;
use serde_json::{Value, json};
use soulbase_app::conformance::{PNG, WAV};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conformance_pack_answers_content_progress_and_logs_by_plain_names() {
    let config = common::config_with(
        "  dev_identity: { tenant: acme, actor: py }\n  mcp_conformance_tools: true\n",
    )
    .replacen("reload]", "reload, read_evidence]", 1);
    let server = Server::start(&config);
    let url = format!("http://{}/mcp", server.http);
    let image_call = "call_image_content";
    let out = common::run_python("mcp_content.py", &[&url, image_call]).await;
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();

    // Listed by their plain names, never by id; the 2020-12 schema as declared.
    let tools = seen["tools"].as_object().unwrap();
    assert!(tools.contains_key("test_image_content"), "{seen}");
    assert!(!tools.contains_key("soulbase.conformance.image_content"));
    let schema = &tools["json_schema_2020_12_tool"]["inputSchema"];
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert!(schema["$defs"]["address"].is_object(), "{schema}");
    assert_eq!(schema["additionalProperties"], false);

    let calls = &seen["calls"];
    let content = |name: &str| calls[name]["content"].clone();
    assert_eq!(
        content("test_simple_text"),
        json!([{"type": "text", "text": "This is a simple text response for testing."}])
    );
    assert_eq!(calls["test_simple_text"]["structured"], json!({}));
    assert_eq!(content("by_id"), content("test_simple_text"));
    assert_eq!(
        content("test_image_content"),
        json!([{"type": "image", "data": PNG, "mimeType": "image/png"}])
    );
    assert_eq!(
        content("test_audio_content"),
        json!([{"type": "audio", "data": WAV, "mimeType": "audio/wav"}])
    );
    let resource = &content("test_embedded_resource")[0];
    assert_eq!(resource["type"], "resource");
    assert_eq!(resource["resource"]["uri"], "test://embedded-resource");
    assert_eq!(resource["resource"]["mimeType"], "text/plain");
    let kinds: Vec<Value> = content("test_multiple_content_types")
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].clone())
        .collect();
    assert_eq!(kinds, [json!("text"), json!("image"), json!("resource")]);
    assert_eq!(calls["test_error_handling"]["is_error"], true);
    assert_eq!(calls["json_schema_2020_12_tool"]["is_error"], false);
    assert_eq!(calls["json_schema_refused"]["is_error"], true);
    assert_eq!(
        calls["json_schema_refused"]["structured"]["code"],
        "SCHEMA.VALIDATION_FAILED"
    );

    // The logging tool's three messages, then the call's own (both name the tool
    // as called).
    let logs: Vec<(String, String)> = seen["logging_logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let text = l["data"]["message"]
                .as_str()
                .or(l["data"]["status"].as_str())
                .unwrap_or_default();
            (l["logger"].as_str().unwrap().to_owned(), text.to_owned())
        })
        .collect();
    let tool = |m: &str| ("soulbase.tool".to_owned(), m.to_owned());
    assert_eq!(
        logs,
        [
            tool("Tool execution started"),
            tool("Tool processing data"),
            tool("Tool execution completed"),
            ("soulbase.calls".to_owned(), "ok".to_owned()),
        ],
        "{seen}"
    );

    // Progress only ever increases: started, the tool's 50 and 100 of 100 (its
    // 0 is not above "started"), and no "finished" after 100%.
    let progress: Vec<(f64, f64)> = seen["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["progress"].as_f64().unwrap(),
                p["total"].as_f64().unwrap(),
            )
        })
        .collect();
    assert_eq!(progress, [(0.0, 1.0), (0.5, 1.0), (1.0, 1.0)], "{seen}");

    // HTTP answers the same output as JSON, content blocks included.
    let acme = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "py")];
    let (status, body) = common::http(
        &server.http,
        "POST",
        "/api/tools/soulbase.conformance.image_content/invoke",
        &acme,
        "{}",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answered: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        answered["output"],
        json!({"content": [{"type": "image", "data": PNG, "mimeType": "image/png"}]}),
        "{body}"
    );

    // Evidence keeps the output's digest and size, never the image's bytes.
    let path = format!("/api/evidence/{image_call}");
    let (status, body) = common::http(&server.http, "GET", &path, &acme, "").await;
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains(PNG), "raw content in evidence: {body}");
    let evidence: Value = serde_json::from_str(&body).unwrap();
    let end = evidence["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["payload"]["event"] == "end")
        .unwrap_or_else(|| panic!("an End: {body}"))
        .clone();
    assert_eq!(end["payload"]["status"], "ok", "{end}");
    assert!(end["payload"]["output_digest"].is_string(), "{end}");
    assert!(
        end["payload"]["usage"]["bytes_out"].as_u64().unwrap() > PNG.len() as u64,
        "{end}"
    );
}
