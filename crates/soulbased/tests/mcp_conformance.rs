//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! `.ci/node-tools.json`, run on the Node 22 that `.ci/node-tools` installs from the
//! npm registry) against `soulbased`'s `/mcp`, configured as the development preset
//! (`--dev`) with the repository's example skills and the suite's fixture tools
//! (`server.mcp_conformance_tools`): stock clients, no custom headers, no proxy.
//! Every scenario of the server suite runs, the pending ones included, and every
//! one passes: `mcp_conformance-baseline.yml` (the scenarios allowed to fail) is
//! empty, and the suite fails the test on any failure.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::Command;

use common::Server;

/// The directory holding `node` (22) and `conformance`.
fn node_tools() -> std::path::PathBuf {
    let dir = std::env::var_os("SOULBASE_NODE_TOOLS").expect(
        "SOULBASE_NODE_TOOLS is not set: run `.ci/node-tools` and set it to the \
         directory it prints, or run the suite with `cargo xtask test`",
    );
    std::path::PathBuf::from(dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_conformance_suite_passes_beyond_its_baseline() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // The development preset with the suite's fixture tools (`test_simple_text`,
    // …: `server.mcp_conformance_tools`).
    let config = soulbase_config::DEV_PRESET.replacen(
        "server:\n",
        "server:\n  mcp_conformance_tools: true\n",
        1,
    );
    assert!(config.contains("mcp_conformance_tools"));
    let server = Server::start_in(&config, |dir| {
        let copied = Command::new("cp")
            .arg("-R")
            .arg(root.join("skills"))
            .arg(dir.join("skills"))
            .status()
            .unwrap();
        assert!(copied.success());
    });
    let bin = node_tools();
    let baseline = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_conformance-baseline.yml");
    let results = tempfile::tempdir().unwrap();
    let url = format!("http://{}/mcp", server.http);
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = tokio::task::spawn_blocking(move || {
        Command::new(bin.join("conformance"))
            .args([
                "server",
                "--url",
                &url,
                "--suite",
                "all",
                "--expected-failures",
            ])
            .arg(&baseline)
            .arg("--output-dir")
            .arg(results.path())
            .env("PATH", path)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = stdout
        .rfind("=== SUMMARY ===")
        .map_or(stdout.as_ref(), |at| &stdout[at..]);
    assert!(
        out.status.success(),
        "the MCP conformance suite found a regression or a stale baseline entry:\n{summary}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(summary.contains("server-initialize: 1 passed"), "{summary}");
    assert!(summary.contains("passed, 0 failed"), "{summary}");
}
