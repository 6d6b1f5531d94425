//! The process executor with the native fixture tool, and the process escape corpus.
//! CI runs these as root: without Landlock, root could read `/etc/shadow`, so these
//! tests prove the confinement, not file permissions.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{
    T, call_with_max_files, fs, marked_process_alive, ok, open_to_tools, proc_only, refused, run,
    sandbox, tool,
};
use serde_json::json;
use soulbase_errors::ErrorCode;
use soulbase_sandbox::{Capability, ExecRequest, FsAccess, Profile, ProviderBinding, Sandbox};
use soulbase_sandbox_process::ProcessOptions;
use soulbase_types::{CallId, TenantId, ToolId};

#[tokio::test]
async fn echoes_json_with_a_scrubbed_environment() {
    let p = proc_only(vec![]);
    let out = run(&p, json!({"op": "echo", "x": [1, 2]}), T, None)
        .await
        .unwrap();
    assert_eq!(out.output, json!({"echo": {"op": "echo", "x": [1, 2]}}));
    assert_eq!(out.side_effects[0].kind, "proc.spawn");
    // The End evidence says which confinement was applied.
    assert_eq!(out.side_effects[1].kind, "sandbox.confinement");
    assert_eq!(
        out.side_effects[1].target,
        format!(
            "isolation=namespaces; memory=rlimit_data:{}; pids=rlimit_nproc:64; files=rlimit_nofile:64",
            512u64 << 20
        )
    );
    let env = ok(&p, json!({"op": "env"})).await;
    let keys: Vec<&str> = env["env"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["HOME", "LANG", "PATH"]);
}

#[tokio::test]
async fn secrets_outside_the_grants_are_unreadable_even_as_root() {
    let p = proc_only(vec![]);
    for path in [
        "/etc/shadow",
        "/etc/passwd",
        "/root/.bashrc",
        "/proc/1/environ",
    ] {
        let out = ok(&p, json!({"op": "read", "path": path})).await;
        assert!(out.get("read").is_none(), "{path}: {out}");
    }
    let out = ok(&p, json!({"op": "read", "path": "/etc/shadow"})).await;
    assert!(refused(&out), "{out}");
    let out = ok(&p, json!({"op": "list", "path": "/root"})).await;
    assert!(refused(&out), "{out}");
}

#[tokio::test]
async fn only_granted_paths_by_components_and_after_symlinks() {
    let base = tempfile::tempdir().unwrap();
    open_to_tools(base.path(), 0o755);
    let data = base.path().join("data");
    let database = base.path().join("database");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&database).unwrap();
    std::fs::write(data.join("ok.txt"), "ok").unwrap();
    std::fs::write(database.join("secret.txt"), "no").unwrap();
    std::fs::write(base.path().join("outside.txt"), "no").unwrap();
    std::os::unix::fs::symlink(base.path().join("outside.txt"), data.join("link.txt")).unwrap();
    let p = proc_only(vec![fs(&data, &[FsAccess::Read, FsAccess::List])]);

    let out = ok(&p, json!({"op": "read", "path": data.join("ok.txt")})).await;
    assert_eq!(out, json!({"read": 2}));
    for path in [
        database.join("secret.txt"),
        data.join("../outside.txt"),
        data.join("link.txt"),
    ] {
        let out = ok(&p, json!({"op": "read", "path": path})).await;
        assert!(refused(&out), "{}: {out}", path.display());
    }
    // Read-only: no writing inside the granted directory.
    let out = ok(&p, json!({"op": "write", "path": data.join("new.txt")})).await;
    assert!(refused(&out), "{out}");
}

#[tokio::test]
async fn writes_only_inside_the_scratch_dir_and_within_its_size() {
    let p = proc_only(vec![Capability::Tmp { max_bytes: 1000 }]);
    let out = ok(
        &p,
        json!({"op": "write", "path": "inside.txt", "bytes": 10}),
    )
    .await;
    assert_eq!(out, json!({"wrote": 10}));
    let outside = std::env::temp_dir().join(format!("sb-escape-{}", std::process::id()));
    let out = ok(&p, json!({"op": "write", "path": outside})).await;
    assert!(refused(&out), "{out}");
    assert!(!outside.exists());
    // Past the tmp grant: the file-size limit stops the write (SIGXFSZ ends the tool),
    // with namespaces and without.
    for isolation in [
        soulbase_sandbox_process::Isolation::Namespaces,
        soulbase_sandbox_process::Isolation::LandlockOnly,
    ] {
        let sb = sandbox(ProcessOptions {
            isolation,
            ..ProcessOptions::default()
        });
        let e = common::call(
            &sb,
            &p,
            json!({"op": "write", "path": "big.bin", "bytes": 5000}),
            T,
            None,
        )
        .await
        .unwrap_err();
        assert_eq!(
            e.code(),
            ErrorCode::SandboxCapabilityBlocked,
            "{isolation:?}: {e:?}"
        );
    }
    // The scratch dir is gone after the call.
    let env = ok(&p, json!({"op": "env"})).await;
    let home = env["env"]["TMPDIR"].as_str().unwrap().to_owned();
    assert!(!Path::new(&home).exists());
    // Without tmp there is nowhere to write at all.
    let out = ok(&proc_only(vec![]), json!({"op": "write", "path": "x.txt"})).await;
    assert!(out.get("wrote").is_none(), "{out}");
}

#[tokio::test]
async fn max_files_caps_open_files_and_what_is_left_in_scratch() {
    let sb = sandbox(ProcessOptions::default());
    let p = proc_only(vec![Capability::Tmp { max_bytes: 1 << 20 }]);
    let files = |count: u64, close: bool| json!({"op": "files", "count": count, "close": close});
    // Within the cap: three files created, held open and left behind.
    let out = call_with_max_files(&sb, &p, files(3, false), T, None, Some(3))
        .await
        .unwrap();
    assert_eq!(out.output, json!({"created": 3, "error": null}));
    assert!(
        out.side_effects
            .iter()
            .any(|s| s.target.ends_with("files=rlimit_nofile:6")),
        "stdio plus max_files descriptors: {:?}",
        out.side_effects
    );
    // Holding more open than max_files: the kernel refuses the next descriptor.
    let out = call_with_max_files(&sb, &p, files(10, false), T, None, Some(3))
        .await
        .unwrap();
    assert_eq!(out.output["created"], 3, "{}", out.output);
    assert!(!out.output["error"].is_null(), "{}", out.output);
    // Closing each file keeps descriptors free, but the files stay: counted when
    // the tool ends, and the call is refused.
    let err = call_with_max_files(&sb, &p, files(5, true), T, None, Some(3))
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::SandboxCapabilityBlocked, "{err}");
    assert_eq!(err.field("max_files"), Some("3"), "{err:?}");
}

#[tokio::test]
async fn sockets_need_a_net_grant() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let out = ok(&proc_only(vec![]), json!({"op": "connect", "addr": addr})).await;
    assert_eq!(out["os"], libc_eacces(), "{out}");
    let net = Capability::Net {
        hosts: vec!["127.0.0.1".into()],
        schemes: vec![],
        ports: vec![],
        methods: vec![],
    };
    let out = ok(
        &proc_only(vec![net]),
        json!({"op": "connect", "addr": addr}),
    )
    .await;
    assert_eq!(out, json!({"connected": true}));
}

fn libc_eacces() -> i64 {
    13
}

#[tokio::test]
async fn a_fork_bomb_is_contained() {
    let started = Instant::now();
    let out = ok(&proc_only(vec![]), json!({"op": "spawn", "count": 10000})).await;
    assert_eq!(out["spawned"], 0, "{out}");
    assert!(out["error"].is_object(), "{out}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("child.pid");
    let marker = format!("sb-timeout-{}", CallId::generate());
    open_to_tools(dir.path(), 0o777);
    // Granting a second command allows the tool to start processes.
    let p = Profile::new(vec![
        Capability::Proc {
            commands: vec![tool().into(), "/bin/true".into()],
        },
        fs(dir.path(), &[FsAccess::Read, FsAccess::Write]),
    ]);
    let started = Instant::now();
    let e = run(
        &p,
        json!({"op": "sleep", "ms": 30000, "child": true, "pidfile": pidfile, "marker": marker}),
        Duration::from_millis(300),
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
    // The child started (its pid, as its namespace numbers it, was written)...
    assert!(pidfile.exists());
    // ...and is gone: found on the host by its marker.
    let deadline = Instant::now() + Duration::from_secs(5);
    while marked_process_alive(&marker) && Instant::now() < deadline {
        std::thread::yield_now();
    }
    assert!(
        !marked_process_alive(&marker),
        "the tool's child survived the timeout"
    );
}

#[tokio::test]
async fn a_gigabyte_of_stdout_is_capped() {
    let started = Instant::now();
    let e = run(
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

#[tokio::test]
async fn failures_and_refusals_have_the_right_codes() {
    let e = run(
        &proc_only(vec![]),
        json!({"op": "exit", "code": 3}),
        T,
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ToolExecutionFailed);
    assert_eq!(e.field("exit_code"), Some("3"));
    // The command is not granted.
    let sandbox_default = || sandbox(ProcessOptions::default());
    let e = run(&Profile::new(vec![]), json!({}), T, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::SandboxCapabilityBlocked);
    // Granted but missing.
    let sb = sandbox_default();
    let missing = ProviderBinding::Process {
        command: "/nonexistent/tool".into(),
        args: vec![],
    };
    let p = Profile::new(vec![Capability::Proc {
        commands: vec!["/nonexistent/tool".into()],
    }]);
    let (call_id, tenant, tool) = (
        CallId::generate(),
        TenantId::new("t1").unwrap(),
        ToolId::new("demo.proc.fixture").unwrap(),
    );
    let req = ExecRequest {
        call_id: &call_id,
        tenant: &tenant,
        tool: &tool,
        provider: &missing,
        args: json!({}),
        profile: &p,
        timeout: T,
        max_bytes_out: None,
        max_memory_bytes: None,
        max_processes: None,
        max_files: None,
        reporter: soulbase_sandbox::Reporter::none(),
    };
    assert_eq!(
        sb.guard(&req).unwrap_err().code(),
        ErrorCode::ProviderUnavailable
    );
}
