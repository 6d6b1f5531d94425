//! `soulbase tools|invoke|preflight` end to end: the real binary, locally on a
//! temporary directory. (Against a running server over gRPC: soulbased's
//! `tests/cli_remote.rs`, which starts the real server.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

/// `acme` may do everything; `other` has no rule (denied).
const CONFIG: &str = r#"
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"], actions: [invoke, preflight, register, update, unregister, enable, disable, deprecate, reload] }
"#;

fn soulbase(cwd: &Path, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_soulbase"));
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

fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.yaml"), CONFIG).unwrap();
    dir
}

const ACME: [&str; 4] = ["--tenant", "acme", "--actor", "me"];

fn local(dir: &Path, args: &[&str]) -> Output {
    let all: Vec<&str> = ACME.iter().chain(args).copied().collect();
    soulbase(dir, &all)
}

#[test]
fn local_list_get_invoke_preflight() {
    let dir = workdir();
    let d = dir.path();

    let list = json(&local(d, &["tools", "list", "--json"]));
    let ids: Vec<&str> = list["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"soulbase.builtin.echo"), "{ids:?}");

    let table = local(d, &["tools", "list"]);
    assert_eq!(table.status.code(), Some(0), "{}", err(&table));
    let text = out(&table);
    let header = text.lines().next().unwrap();
    assert!(header.starts_with("ID "), "{text}");
    for col in ["VERSION", "STATE", "SIDE EFFECT", "DESCRIPTION"] {
        assert!(header.contains(col), "{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("soulbase.builtin.echo ") && l.contains("enabled")),
        "{text}"
    );

    let get = json(&local(
        d,
        &["tools", "get", "soulbase.builtin.echo", "--json"],
    ));
    assert_eq!(get["id"], "soulbase.builtin.echo");
    assert_eq!(get["state"], "enabled");

    let r = json(&local(
        d,
        &[
            "invoke",
            "soulbase.builtin.echo",
            "--args",
            r#"{"n":1}"#,
            "--json",
        ],
    ));
    assert_eq!(r["status"], "ok");
    assert_eq!(r["output"]["echo"]["n"], 1);
    assert_eq!(r["replayed"], false);

    let text = local(
        d,
        &["invoke", "soulbase.builtin.echo", "--args", r#"{"n":2}"#],
    );
    assert_eq!(text.status.code(), Some(0), "{}", err(&text));
    assert!(out(&text).contains("\"n\": 2"), "{}", out(&text));

    let p = json(&local(
        d,
        &[
            "preflight",
            "soulbase.builtin.echo",
            "--args",
            "{}",
            "--json",
        ],
    ));
    assert_eq!(p["tool"], "soulbase.builtin.echo");
    assert_eq!(p["version"], "1.0.0");
}

#[test]
fn local_denied_and_usage_errors() {
    let dir = workdir();
    let d = dir.path();
    let denied = soulbase(
        d,
        &[
            "invoke",
            "soulbase.builtin.echo",
            "--tenant",
            "other",
            "--actor",
            "me",
            "--args",
            "{}",
        ],
    );
    assert_eq!(denied.status.code(), Some(1), "{}", err(&denied));
    assert!(
        err(&denied).contains("POLICY.DENY_TOOL"),
        "{}",
        err(&denied)
    );

    let pre = soulbase(
        d,
        &[
            "preflight",
            "soulbase.builtin.echo",
            "--tenant",
            "other",
            "--actor",
            "me",
        ],
    );
    assert_eq!(pre.status.code(), Some(1), "{}", err(&pre));
    assert!(err(&pre).contains("POLICY.DENY_TOOL"), "{}", err(&pre));

    for bad in ["{not json", "[1,2]"] {
        let o = local(d, &["invoke", "soulbase.builtin.echo", "--args", bad]);
        assert_eq!(o.status.code(), Some(2), "{}", err(&o));
        assert!(err(&o).contains("--args"), "{}", err(&o));
    }

    let no_tenant = soulbase(d, &["tools", "list"]);
    assert_eq!(no_tenant.status.code(), Some(2), "{}", err(&no_tenant));
    assert!(err(&no_tenant).contains("--tenant"), "{}", err(&no_tenant));

    let missing = local(d, &["tools", "get", "no.such.tool"]);
    assert_eq!(missing.status.code(), Some(1), "{}", err(&missing));
    assert!(
        err(&missing).contains("TOOL.NOT_FOUND"),
        "{}",
        err(&missing)
    );
}

#[test]
fn local_disable_enable_persists() {
    let dir = workdir();
    let d = dir.path();
    let off = json(&local(
        d,
        &["tools", "disable", "soulbase.builtin.echo", "--json"],
    ));
    assert_eq!(off["state"], "paused");
    // A new process: the registry state was saved under ./data.
    let get = json(&local(
        d,
        &["tools", "get", "soulbase.builtin.echo", "--json"],
    ));
    assert_eq!(get["state"], "paused");
    let call = local(d, &["invoke", "soulbase.builtin.echo"]);
    assert_eq!(call.status.code(), Some(1), "{}", err(&call));
    assert!(err(&call).contains("TOOL.DISABLED"), "{}", err(&call));

    let on = json(&local(
        d,
        &["tools", "enable", "soulbase.builtin.echo", "--json"],
    ));
    assert_eq!(on["state"], "enabled");
    let get = json(&local(
        d,
        &["tools", "get", "soulbase.builtin.echo", "--json"],
    ));
    assert_eq!(get["state"], "enabled");
}

#[test]
fn local_idempotency_key_replays() {
    let dir = workdir();
    let d = dir.path();
    let args = [
        "invoke",
        "soulbase.builtin.counter",
        "--idempotency-key",
        "k-1",
        "--json",
    ];
    let first = json(&local(d, &args));
    assert_eq!(first["status"], "ok", "{first}");
    assert_eq!(first["replayed"], false);
    let second = json(&local(d, &args));
    assert_eq!(second["replayed"], true, "{second}");
    assert_eq!(second["output"], first["output"]);
}

#[test]
fn mcp_over_stdio() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;

    let dir = workdir();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_soulbase"));
    for (k, _) in std::env::vars() {
        if k.starts_with("SOULBASE_") || k == "SKILLS_DIR" {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd
        .args(["mcp", "--tenant", "acme", "--actor", "me"])
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"protocolVersion":"2025-03-26","capabilities":{{}},"clientInfo":{{"name":"test","version":"0"}}}}}}"#
    )
    .unwrap();
    let init: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(init["id"], 1, "{init}");
    assert!(init["result"]["serverInfo"].is_object(), "{init}");
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .unwrap();
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list"}}"#).unwrap();
    let list: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(list["id"], 2, "{list}");
    let names: Vec<String> = list["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(names.iter().any(|n| n.contains("echo")), "{names:?}");
    drop(stdin);
    assert!(child.wait().unwrap().success());
}
