//! The process executor with bubblewrap: the escape corpus again under `bwrap` (when
//! it is installed), and what `required` / `auto` do when it is not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::{
    BuiltinExecutor, Capability, ExecOutput, ExecRequest, FsAccess, LocalSandbox, Profile,
    ProviderBinding, ProviderKind, Sandbox,
};
use soulbase_sandbox_process::{Bubblewrap, ProcessExecutor, ProcessOptions};
use soulbase_types::{CallId, TenantId, ToolId};

const TOOL: &str = env!("CARGO_BIN_EXE_soulbase-sandbox-fixture");
const T: Duration = Duration::from_secs(10);

/// Options with bubblewrap `required`, or `None` (the test is skipped, with a note)
/// when `bwrap` is not installed.
fn bwrap_options() -> Option<ProcessOptions> {
    let o = ProcessOptions {
        bubblewrap: Bubblewrap::Required,
        ..ProcessOptions::default()
    };
    if o.bwrap_path.is_file() {
        Some(o)
    } else {
        eprintln!("bwrap is not installed; skipping the bubblewrap escape corpus");
        None
    }
}

fn missing_bwrap(mode: Bubblewrap) -> ProcessOptions {
    ProcessOptions {
        bubblewrap: mode,
        bwrap_path: PathBuf::from("/nonexistent/bwrap"),
        ..ProcessOptions::default()
    }
}

fn proc_only(extra: Vec<Capability>) -> Profile {
    let mut caps = vec![Capability::Proc {
        commands: vec![TOOL.into()],
    }];
    caps.extend(extra);
    Profile::new(caps)
}

fn fs(path: &Path, access: &[FsAccess]) -> Capability {
    Capability::Fs {
        paths: vec![path.to_string_lossy().into_owned()],
        access: access.iter().copied().collect(),
    }
}

async fn run(
    options: &ProcessOptions,
    profile: &Profile,
    args: Value,
    timeout: Duration,
    max_out: Option<u64>,
) -> Result<ExecOutput, SoulError> {
    let sb = LocalSandbox::new(BuiltinExecutor::new()).with_executor(
        ProviderKind::Process,
        Arc::new(ProcessExecutor::new(options.clone())),
    );
    let provider = ProviderBinding::Process {
        command: TOOL.into(),
        args: vec![],
    };
    let call_id = CallId::generate();
    let tenant = TenantId::new("t1").unwrap();
    let tool = ToolId::new("demo.proc.fixture").unwrap();
    let req = ExecRequest {
        call_id: &call_id,
        tenant: &tenant,
        tool: &tool,
        provider: &provider,
        args,
        profile,
        timeout,
        max_bytes_out: max_out,
    };
    sb.guard(&req)?;
    sb.execute(req).await
}

async fn ok(o: &ProcessOptions, profile: &Profile, args: Value) -> Value {
    run(o, profile, args, T, None).await.unwrap().output
}

#[tokio::test]
async fn required_without_bwrap_is_refused() {
    let o = missing_bwrap(Bubblewrap::Required);
    let e = run(&o, &proc_only(vec![]), json!({"op": "echo"}), T, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ProviderUnavailable, "{e:?}");
}

#[tokio::test]
async fn auto_without_bwrap_falls_back_to_landlock_and_seccomp() {
    let o = missing_bwrap(Bubblewrap::Auto);
    let p = proc_only(vec![]);
    let out = ok(&o, &p, json!({"op": "echo", "x": 1})).await;
    assert_eq!(out, json!({"echo": {"op": "echo", "x": 1}}));
    // Still confined: Landlock denies the secret, seccomp the socket.
    let out = ok(&o, &p, json!({"op": "read", "path": "/etc/shadow"})).await;
    assert_eq!(out["error"], "PermissionDenied", "{out}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let out = ok(&o, &p, json!({"op": "connect", "addr": addr})).await;
    assert_eq!(out["os"], 13, "{out}");
}

#[tokio::test]
async fn under_bwrap_echo_and_environment() {
    let Some(o) = bwrap_options() else { return };
    let p = proc_only(vec![Capability::Tmp { max_bytes: 1000 }]);
    let out = ok(&o, &p, json!({"op": "echo", "x": [1, 2]})).await;
    assert_eq!(out, json!({"echo": {"op": "echo", "x": [1, 2]}}));
    let env = ok(&o, &p, json!({"op": "env"})).await;
    let keys: Vec<&str> = env["env"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    // bwrap sets PWD (the scratch directory) after `--chdir`; nothing else leaks.
    assert_eq!(keys, ["HOME", "LANG", "PATH", "PWD", "TMPDIR"]);
    assert_eq!(env["env"]["PWD"], env["env"]["TMPDIR"]);
}

#[tokio::test]
async fn under_bwrap_secrets_are_unreadable() {
    let Some(o) = bwrap_options() else { return };
    let p = proc_only(vec![]);
    for path in ["/etc/shadow", "/etc/passwd", "/root/.bashrc"] {
        let out = ok(&o, &p, json!({"op": "read", "path": path})).await;
        assert!(out.get("read").is_none(), "{path}: {out}");
        assert!(out.get("error").is_some(), "{path}: {out}");
    }
    // pid 1 is bwrap's own init in the new pid namespace, with an empty environment:
    // the host's init is out of sight.
    let out = ok(&o, &p, json!({"op": "read", "path": "/proc/1/environ"})).await;
    assert!(out.get("read").is_none() || out["read"] == 0, "{out}");
    let out = ok(&o, &p, json!({"op": "list", "path": "/root"})).await;
    assert!(out.get("error").is_some(), "{out}");
}

#[tokio::test]
async fn under_bwrap_grants_are_read_only_unless_write() {
    let Some(o) = bwrap_options() else { return };
    let base = tempfile::tempdir().unwrap();
    let data = base.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("ok.txt"), "ok").unwrap();
    std::fs::write(base.path().join("outside.txt"), "no").unwrap();
    let p = proc_only(vec![fs(&data, &[FsAccess::Read, FsAccess::List])]);
    let out = ok(&o, &p, json!({"op": "read", "path": data.join("ok.txt")})).await;
    assert_eq!(out, json!({"read": 2}));
    let out = ok(
        &o,
        &p,
        json!({"op": "read", "path": base.path().join("outside.txt")}),
    )
    .await;
    assert!(out.get("read").is_none(), "{out}");
    let out = ok(&o, &p, json!({"op": "write", "path": data.join("new.txt")})).await;
    assert!(out.get("wrote").is_none(), "{out}");
    assert!(!data.join("new.txt").exists());
}

#[tokio::test]
async fn under_bwrap_writes_only_inside_the_scratch_dir() {
    let Some(o) = bwrap_options() else { return };
    let p = proc_only(vec![Capability::Tmp { max_bytes: 1000 }]);
    let out = ok(
        &o,
        &p,
        json!({"op": "write", "path": "inside.txt", "bytes": 10}),
    )
    .await;
    assert_eq!(out, json!({"wrote": 10}));
    let outside = std::env::temp_dir().join(format!("sb-bwrap-escape-{}", std::process::id()));
    let out = ok(&o, &p, json!({"op": "write", "path": outside})).await;
    assert!(out.get("wrote").is_none(), "{out}");
    assert!(!outside.exists());
    // Past the tmp grant: the file-size limit still stops the write.
    let e = run(
        &o,
        &p,
        json!({"op": "write", "path": "big.bin", "bytes": 5000}),
        T,
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked, "{e:?}");
}

#[tokio::test]
async fn under_bwrap_sockets_need_a_net_grant() {
    let Some(o) = bwrap_options() else { return };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let out = ok(
        &o,
        &proc_only(vec![]),
        json!({"op": "connect", "addr": addr}),
    )
    .await;
    assert_eq!(out["os"], 13, "{out}");
    let net = Capability::Net {
        hosts: vec!["127.0.0.1".into()],
        schemes: vec![],
        ports: vec![],
        methods: vec![],
    };
    let out = ok(
        &o,
        &proc_only(vec![net]),
        json!({"op": "connect", "addr": addr}),
    )
    .await;
    assert_eq!(out, json!({"connected": true}));
}

#[tokio::test]
async fn under_bwrap_a_fork_bomb_is_contained() {
    let Some(o) = bwrap_options() else { return };
    let started = Instant::now();
    let out = ok(
        &o,
        &proc_only(vec![]),
        json!({"op": "spawn", "count": 10000}),
    )
    .await;
    assert_eq!(out["spawned"], 0, "{out}");
    assert!(out["error"].is_object(), "{out}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// Host pids of fixture processes started with `--sleep` (the timeout test's child).
fn sleeping_fixtures() -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let parts: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true);
        if !zombie
            && parts
                .first()
                .is_some_and(|p| p.ends_with(b"soulbase-sandbox-fixture"))
            && parts.get(1) == Some(&&b"--sleep"[..])
        {
            out.push(pid);
        }
    }
    out
}

#[tokio::test]
async fn under_bwrap_a_timeout_kills_everything() {
    let Some(o) = bwrap_options() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let p = Profile::new(vec![
        Capability::Proc {
            commands: vec![TOOL.into(), "/bin/true".into()],
        },
        fs(dir.path(), &[FsAccess::Read, FsAccess::Write]),
    ]);
    let started = Instant::now();
    let e = run(
        &o,
        &p,
        json!({"op": "sleep", "ms": 30000, "child": true, "pidfile": pidfile}),
        Duration::from_millis(500),
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ProviderTimeout);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // The child really was started (its pid is one in bwrap's pid namespace).
    assert!(pidfile.exists(), "the tool never started its child");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !sleeping_fixtures().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(sleeping_fixtures(), Vec::<u32>::new(), "a child survived");
}

#[tokio::test]
async fn under_bwrap_a_gigabyte_of_stdout_is_capped() {
    let Some(o) = bwrap_options() else { return };
    let started = Instant::now();
    let e = run(
        &o,
        &proc_only(vec![]),
        json!({"op": "flood", "bytes": 1u64 << 30}),
        T,
        Some(1 << 20),
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolExecutionFailed);
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn the_mode_comes_from_the_config_and_is_validated() {
    let mut cfg = soulbase_config::Config::default();
    assert_eq!(
        ProcessOptions::from_config(&cfg.sandbox).bubblewrap,
        Bubblewrap::Off
    );
    assert!(cfg.validate().is_empty(), "{:?}", cfg.validate());
    for (s, mode) in [
        ("auto", Bubblewrap::Auto),
        ("required", Bubblewrap::Required),
    ] {
        cfg.sandbox.process_bubblewrap = s.into();
        assert_eq!(ProcessOptions::from_config(&cfg.sandbox).bubblewrap, mode);
        assert!(cfg.validate().is_empty());
    }
    cfg.sandbox.process_bubblewrap = "sometimes".into();
    let problems = cfg.validate();
    assert!(
        problems
            .iter()
            .any(|(field, _)| field == "sandbox.process_bubblewrap"),
        "{problems:?}"
    );
    // Unknown values fail closed.
    assert_eq!(
        ProcessOptions::from_config(&cfg.sandbox).bubblewrap,
        Bubblewrap::Required
    );
}
