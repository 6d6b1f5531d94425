//! `soulbase tools|invoke|preflight` end to end: the real binary, locally on a
//! temporary directory and against an in-process `soulbased` over gRPC.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use soulbase_config::ConfigLoader;
use soulbased::app::App;

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

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// An in-process `soulbased` (development headers on) serving until dropped.
struct Server {
    url: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    _data: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        let data = tempfile::tempdir().unwrap();
        let grpc = free_addr();
        let http = free_addr();
        let loader = ConfigLoader::new()
            .with_flag("data_dir", data.path().to_str().unwrap())
            // skills.dir stays ./skills, absent in the crate directory: no skills.
            .with_flag("server.grpc_addr", &grpc)
            .with_flag("server.http_addr", &http)
            .with_flag("server.dev_insecure", "true")
            .with_flag(
                "policy.rules",
                r#"[{"effect":"allow","tenant":"acme","tools":["*"],"actions":["invoke","preflight","enable","disable"]}]"#,
            );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (app, flush) = App::build(loader).await.unwrap();
                soulbased::server::run(app, flush, async move {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
            });
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(&grpc).is_err() {
            assert!(
                Instant::now() < deadline && !thread.is_finished(),
                "the server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Server {
            url: format!("http://{grpc}"),
            stop: Some(stop),
            thread: Some(thread),
            _data: data,
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn server_mode_over_grpc() {
    let server = Server::start();
    let cwd = tempfile::tempdir().unwrap();
    let d = cwd.path();
    let remote = |args: &[&str]| {
        let all: Vec<&str> = [
            "--server",
            server.url.as_str(),
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
            &server.url,
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
    let anon = soulbase(d, &["--server", &server.url, "tools", "list"]);
    assert_eq!(anon.status.code(), Some(1), "{}", err(&anon));
    assert!(
        err(&anon).contains("AUTH.UNAUTHENTICATED"),
        "{}",
        err(&anon)
    );
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
