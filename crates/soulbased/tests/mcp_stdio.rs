//! `soulbased mcp`: MCP over stdio for one tenant and actor, with rmcp's client.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::process::Stdio;

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_lists_and_calls_as_the_configured_subject() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "policy:\n  rules:\n    - { effect: allow, tenant: acme, tools: [\"soulbase.builtin.echo\"] }\n",
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_soulbased"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .current_dir(dir.path())
        .arg("--config")
        .arg(&config)
        .args(["mcp", "--tenant", "acme", "--actor", "agent"])
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let client = ().serve((stdout, stdin)).await.unwrap();
    // The list is the subject's governed list: only what policy lets it call.
    let tools = client.list_all_tools().await.unwrap();
    let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    assert_eq!(names, ["soulbase.builtin.echo"]);
    let ok = client
        .call_tool(
            CallToolRequestParams::new("soulbase.builtin.echo")
                .with_arguments(json!({"a": 1}).as_object().cloned().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(ok.structured_content, Some(json!({"echo": {"a": 1}})));
    // The policy allows only echo for this subject.
    let denied = client
        .call_tool(
            CallToolRequestParams::new("soulbase.builtin.sleep")
                .with_arguments(json!({"ms": 1}).as_object().cloned().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(denied.is_error, Some(true));
    assert_eq!(
        denied.structured_content.unwrap()["code"],
        "POLICY.DENY_TOOL"
    );
    client.cancel().await.unwrap();
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait())
        .await
        .expect("soulbased mcp did not exit after stdin closed")
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// An MCP host starts stdio servers from its own directory: the configured skills
/// (a package with a sub-folder and a WASM module) are served from wherever the
/// configuration puts them, whatever the working directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_started_from_another_directory_serves_the_configured_skills() {
    let home = tempfile::tempdir().unwrap();
    let host_cwd = tempfile::tempdir().unwrap();
    let skills = home.path().join("skills");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../skills/text-length");
    std::fs::create_dir_all(skills.join("text-length")).unwrap();
    for f in ["SKILL.md", "text_length.wat"] {
        std::fs::copy(repo.join(f), skills.join("text-length").join(f)).unwrap();
    }
    let config = home.path().join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "skills:\n  dir: {}\n  watch: false\npolicy:\n  rules:\n    - {{ effect: allow, tenant: acme, tools: [\"skills.text-length.count\"] }}\n",
            skills.display()
        ),
    )
    .unwrap();
    assert!(!skills.starts_with(host_cwd.path()));
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_soulbased"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") || k == "SKILLS_DIR" {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .current_dir(host_cwd.path())
        .arg("--config")
        .arg(&config)
        .args(["mcp", "--tenant", "acme", "--actor", "agent"])
        .env("RUST_LOG", "error")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let stdin = child.stdin.take().unwrap();
    let client = ().serve((stdout, stdin)).await.unwrap();
    let tools = client.list_all_tools().await.unwrap();
    assert!(
        tools.iter().any(|t| t.name == "skills.text-length.count"),
        "{:?}",
        tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>()
    );
    let ok = client
        .call_tool(
            CallToolRequestParams::new("skills.text-length.count")
                .with_arguments(json!({"text": "héllo"}).as_object().cloned().unwrap()),
        )
        .await
        .unwrap();
    assert_eq!(ok.structured_content, Some(json!({"length": 5})), "{ok:?}");
    client.cancel().await.unwrap();
    let status = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait())
        .await
        .expect("soulbased mcp did not exit after stdin closed")
        .unwrap();
    assert!(status.success(), "{status:?}");
}
