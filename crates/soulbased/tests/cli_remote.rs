//! The `soulbase` CLI against a running `soulbased` over gRPC: the real server
//! binary, the real CLI binary (built beside it by the workspace's test run).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::Server;
use serde_json::Value;

/// Development headers; `acme` may invoke, preflight, enable and disable.
const CONFIG: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, preflight, enable, disable] }
"#;

fn soulbase(cwd: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(common::cli_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") || k == "SKILLS_DIR" {
            cmd.env_remove(k);
        }
    }
    cmd.args(args)
        .current_dir(cwd)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn out(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    assert_eq!(
        o.status.code(),
        Some(0),
        "stdout {} stderr {}",
        out(o),
        err(o)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn server_mode_over_grpc() {
    let server = Server::start(CONFIG);
    let url = format!("http://{}", server.grpc);
    let cwd = tempfile::tempdir().unwrap();
    let d = cwd.path();
    let remote = |args: &[&str]| {
        let all: Vec<&str> = [
            "--server",
            url.as_str(),
            "--tenant",
            "acme",
            "--actor",
            "me",
        ]
        .iter()
        .chain(args)
        .copied()
        .collect();
        soulbase(d, &all)
    };

    let list = json(&remote(&["tools", "list", "--json"]));
    let ids: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"soulbase.builtin.echo"), "{ids:?}");
    let table = remote(&["tools", "list"]);
    assert_eq!(table.status.code(), Some(0), "{}", err(&table));
    assert!(out(&table).starts_with("ID "), "{}", out(&table));

    // The tools as a model API takes them, from the server's governed list.
    let exported = json(&remote(&["tools", "export", "--format", "openai-strict"]));
    let echo = exported
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["function"]["name"] == "soulbase__builtin__echo")
        .unwrap_or_else(|| panic!("{exported}"));
    assert_eq!(echo["function"]["strict"], true, "{echo}");
    let full = json(&remote(&[
        "tools",
        "export",
        "--format",
        "anthropic",
        "--json",
    ]));
    assert_eq!(full["format"], "anthropic");
    assert_eq!(
        full["names"]["soulbase__builtin__echo"],
        "soulbase.builtin.echo"
    );
    let bad = remote(&["tools", "export", "--format", "gemini"]);
    assert_eq!(bad.status.code(), Some(2), "{}", err(&bad));
    assert!(err(&bad).contains("--format"), "{}", err(&bad));

    let r = json(&remote(&[
        "invoke",
        "soulbase.builtin.echo",
        "--args",
        r#"{"n":1}"#,
        "--json",
    ]));
    assert_eq!(r["status"], "ok");
    assert_eq!(r["output"]["echo"]["n"], 1);

    let p = json(&remote(&["preflight", "soulbase.builtin.echo", "--json"]));
    assert_eq!(p["tool"], "soulbase.builtin.echo");

    let off = json(&remote(&[
        "tools",
        "disable",
        "soulbase.builtin.echo",
        "--json",
    ]));
    assert_eq!(off["state"], "paused");
    let call = remote(&["invoke", "soulbase.builtin.echo"]);
    assert_eq!(call.status.code(), Some(1), "{}", err(&call));
    assert!(err(&call).contains("TOOL.DISABLED"), "{}", err(&call));
    let on = json(&remote(&[
        "tools",
        "enable",
        "soulbase.builtin.echo",
        "--json",
    ]));
    assert_eq!(on["state"], "enabled");

    // Another tenant: denied by the policy, exit 1 with the stable code.
    let denied = soulbase(
        d,
        &[
            "--server",
            &url,
            "--tenant",
            "other",
            "--actor",
            "me",
            "invoke",
            "soulbase.builtin.echo",
        ],
    );
    assert_eq!(denied.status.code(), Some(1), "{}", err(&denied));
    assert!(
        err(&denied).contains("POLICY.DENY_TOOL"),
        "{}",
        err(&denied)
    );

    // No credentials at all: the server refuses.
    let anon = soulbase(d, &["--server", &url, "tools", "list"]);
    assert_eq!(anon.status.code(), Some(1), "{}", err(&anon));
    assert!(
        err(&anon).contains("AUTH.UNAUTHENTICATED"),
        "{}",
        err(&anon)
    );
}
