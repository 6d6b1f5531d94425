//! `soulbase init` end to end: the project the CLI scaffolds, served by the real
//! `soulbased` with the configuration as written, the HTTP skill's example service
//! running under `python3`, and the `curl` command the summary prints for each tool
//! (builtin, http, wasm, process) run as printed — only the server's address is
//! replaced by the ephemeral one it bound.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::{Server, cli_bin, free_addr, http};
use serde_json::Value;

const CONSENT_KEY_ENV: &str = "SOULBASED_CONSENT_HMAC_KEY";
/// The server address the summary's commands name (the default `server.http_addr`).
const PRINTED_HTTP: &str = "127.0.0.1:8080";

/// A child process, killed when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `soulbase` CLI in `dir` (no `SOULBASE_*` variable of the test's own).
fn soulbase(dir: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(cli_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") || k == "SKILLS_DIR" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args).current_dir(dir).output().unwrap()
}

/// Runs one printed command under bash in `dir`, the CLI first on `PATH`, with the
/// consent key exported as the summary says; its stdout as JSON.
fn run_printed(command: &str, dir: &Path, key: &str) -> Value {
    let bin = cli_bin();
    let path = format!(
        "{}:{}",
        bin.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", command])
        .current_dir(dir)
        .env("PATH", path)
        .env(CONSENT_KEY_ENV, key)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{command}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_scaffold_serves_one_working_tool_per_provider_kind() {
    let dir = tempfile::tempdir().unwrap();
    // When the server runs as root (CI), native tools run as nobody: the project
    // must be searchable by other users, as a home directory usually is.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let port = free_addr().rsplit(':').next().unwrap().to_owned();
    let init = soulbase(dir.path(), &["init", "--service-port", &port]);
    let summary = String::from_utf8_lossy(&init.stdout).into_owned();
    assert!(
        init.status.success(),
        "{summary}{}",
        String::from_utf8_lossy(&init.stderr)
    );
    assert!(
        init.stderr.is_empty(),
        "no warning: {}",
        String::from_utf8_lossy(&init.stderr)
    );

    // The HTTP skill's service, started as the summary says; it prints its address
    // once it listens.
    assert!(
        summary.contains("python3 services/hello_service.py &"),
        "{summary}"
    );
    let mut child = Command::new("python3")
        .arg("services/hello_service.py")
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _service = Killed(child);
    let mut listening = String::new();
    BufReader::new(stdout).read_line(&mut listening).unwrap();
    assert!(
        listening.contains(&format!("http://127.0.0.1:{port}/execute")),
        "{listening}"
    );

    let key = "5e".repeat(32);
    let server = Server::start_prepared(dir, &[(CONSENT_KEY_ENV, key.as_str())]);

    // Native tools require consent: without a token the call is refused.
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/skills.hello-native.hello/invoke",
        &[],
        r#"{"name": "Ada"}"#,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("CONSENT.REQUIRED"), "{body}");

    let curls: Vec<String> = summary
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("curl "))
        .map(|l| l.replace(PRINTED_HTTP, &server.http))
        .collect();
    assert_eq!(curls.len(), 4, "{summary}");
    let result = |tool: &str| {
        let command = curls
            .iter()
            .find(|c| c.contains(&format!("/api/tools/{tool}/invoke")))
            .unwrap_or_else(|| panic!("no curl for {tool} in {summary}"));
        let r = run_printed(command, server.dir(), &key);
        assert_eq!(r["status"], "ok", "{tool}: {r}");
        r["output"].clone()
    };
    assert_eq!(result("skills.greet.greet")["echo"]["name"], "Ada");
    assert_eq!(
        result("skills.hello-http.hello-http")["greeting"],
        "Hello, Ada!"
    );
    assert_eq!(result("skills.text-length.count")["length"], 5);
    let native = result("skills.hello-native.hello");
    assert_eq!(native["greeting"], "hello from a native tool", "{native}");
    assert_eq!(native["received"]["name"], "Ada", "{native}");
}
