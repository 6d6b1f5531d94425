//! The process escape corpus: a native tool, granted only itself, tries to reach past
//! its sandbox the ways an attacker would — local services' UNIX sockets, the
//! server's resource limits, priority, affinity and signals, host capabilities (host
//! name, clock, device nodes, `/dev/kvm`), a gigabyte of memory, a fork bomb and
//! another tool's scratch directory. Every attempt must fail and the host process
//! must be unchanged and still serving. CI runs this as root; the corpus is run again
//! as an unprivileged uid (`nobody`) by re-running this test binary as that user.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{T, TOOL_ENV, call, fs, open_to_tools, proc_only, sandbox, tool};
use serde_json::{Value, json};
use soulbase_errors::ErrorCode;
use soulbase_sandbox::{Capability, FsAccess, LocalSandbox, Profile};
use soulbase_sandbox_process::{Isolation, ProcessExecutor, ProcessOptions};

/// What the tool may not change about the host process; compared before and after.
#[derive(Debug, PartialEq)]
struct HostState {
    cpu_limit: (u64, u64),
    nice: i32,
    affinity: Vec<usize>,
    hostname: String,
}

#[allow(unsafe_code)]
fn host_state() -> HostState {
    // SAFETY: plain system calls writing into locals.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_CPU, &mut lim);
        let nice = libc::getpriority(libc::PRIO_PROCESS, 0);
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set);
        let affinity = (0..libc::CPU_SETSIZE as usize)
            .filter(|c| libc::CPU_ISSET(*c, &set))
            .collect();
        HostState {
            cpu_limit: (lim.rlim_cur, lim.rlim_max),
            nice,
            affinity,
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default(),
        }
    }
}

async fn probe(sb: &LocalSandbox, profile: &Profile, args: Value) -> Value {
    match call(sb, profile, args.clone(), T, None).await {
        Ok(out) => out.output,
        // A tool killed for what it tried also failed to do it.
        Err(e) => json!({"error": e.code().as_str(), "note": format!("{e:?}")}),
    }
}

fn succeeded(v: &Value) -> bool {
    v["ok"] == true
}

/// Waits (at most 10 s) until a running tool has written `name` in its scratch
/// directory under `parent`, and returns that file's path.
async fn scratch_file(parent: &Path, name: &str) -> std::path::PathBuf {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let found = std::fs::read_dir(parent)
            .unwrap()
            .flatten()
            .map(|e| e.path().join(name))
            .find(|p| p.exists());
        if let Some(p) = found {
            return p;
        }
        assert!(Instant::now() < deadline, "no tool wrote {name}");
        tokio::task::yield_now().await;
    }
}

/// Runs the whole corpus against `options` and asserts every attempt failed.
async fn escape_corpus(options: ProcessOptions) {
    let scratch_parent = tempfile::tempdir().unwrap();
    let options = ProcessOptions {
        scratch_parent: scratch_parent.path().to_path_buf(),
        ..options
    };
    let sb = sandbox(options);
    let me = std::process::id();
    let before = host_state();
    let only_itself = proc_only(vec![]);
    let with_tmp = proc_only(vec![Capability::Tmp { max_bytes: 1 << 20 }]);

    // 1. UNIX sockets: a listener of ours outside the grants, and the local services'.
    let sockets = tempfile::tempdir().unwrap();
    let ours = sockets.path().join("service.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&ours).unwrap();
    open_to_tools(sockets.path(), 0o755);
    open_to_tools(&ours, 0o777);
    let mut targets = vec![ours.clone()];
    for known in [
        "/var/run/postgresql/.s.PGSQL.5432",
        "/run/postgresql/.s.PGSQL.5432",
        "/var/run/redis/redis-server.sock",
        "/run/redis/redis.sock",
        "/var/run/docker.sock",
        "/run/dbus/system_bus_socket",
        "/run/systemd/private",
    ] {
        if Path::new(known).exists() {
            targets.push(known.into());
        }
    }
    for path in &targets {
        let out = probe(&sb, &only_itself, json!({"op": "unix", "path": path})).await;
        assert!(!succeeded(&out), "reached {}: {out}", path.display());
    }
    // The probe works: a socket whose directory is granted is reachable.
    let granted = proc_only(vec![fs(sockets.path(), &[FsAccess::Read, FsAccess::Write])]);
    let out = probe(&sb, &granted, json!({"op": "unix", "path": ours})).await;
    assert!(succeeded(&out), "a granted socket: {out}");

    // Abstract UNIX sockets: the host's (another network namespace, and outside the
    // tool's Landlock scope) and another tool's (tools without `net` share one
    // network namespace; each call is a Landlock domain of its own).
    let abstract_listener = |name: &str| {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    let host_name = format!("soulbase-escape-host-{me}");
    let _host_socket = abstract_listener(&host_name);
    let out = probe(
        &sb,
        &only_itself,
        json!({"op": "unix", "path": format!("@{host_name}")}),
    )
    .await;
    assert!(
        !succeeded(&out),
        "reached the host's abstract socket: {out}"
    );
    let tool_name = format!("soulbase-escape-tool-{me}");
    let listening = {
        let (sb, with_tmp, name) = (sb.clone(), with_tmp.clone(), tool_name.clone());
        tokio::spawn(async move {
            call(
                &sb,
                &with_tmp,
                json!({"op": "listen_abstract", "name": name, "then_sleep_ms": 2000}),
                T,
                None,
            )
            .await
        })
    };
    let ready = scratch_file(scratch_parent.path(), "ready").await;
    let out = probe(
        &sb,
        &only_itself,
        json!({"op": "unix", "path": format!("@{tool_name}")}),
    )
    .await;
    assert!(
        !succeeded(&out),
        "reached another tool's abstract socket: {out}"
    );
    assert_eq!(
        listening.await.unwrap().unwrap().output,
        json!({"listened": true})
    );
    assert!(!ready.exists());

    // 2. The server's resource limit, priority, affinity; signals to it and to a
    // process of its own.
    let mut victim = std::process::Command::new(tool())
        .arg("--sleep")
        .spawn()
        .unwrap();
    for (op, pid) in [
        ("prlimit", me),
        ("setpriority", me),
        ("affinity", me),
        ("kill", victim.id()),
    ] {
        let out = probe(
            &sb,
            &only_itself,
            json!({"op": op, "pid": pid, "signal": libc::SIGKILL}),
        )
        .await;
        assert!(!succeeded(&out), "{op} on pid {pid}: {out}");
    }
    let out = probe(
        &sb,
        &only_itself,
        json!({"op": "kill", "pid": me, "signal": 0}),
    )
    .await;
    assert!(!succeeded(&out), "the server is visible: {out}");
    assert!(
        victim.try_wait().unwrap().is_none(),
        "the victim was killed"
    );
    victim.kill().unwrap();
    victim.wait().unwrap();

    // 3. Host capabilities: name, clock, device nodes, devices.
    for args in [
        json!({"op": "sethostname"}),
        json!({"op": "settimeofday"}),
        json!({"op": "mknod", "path": "null-again"}),
        json!({"op": "open", "path": "/dev/kvm"}),
        json!({"op": "open", "path": "/dev/kmsg"}),
        json!({"op": "open", "path": "/dev/mem"}),
        json!({"op": "open", "path": "/proc/sysrq-trigger"}),
    ] {
        let out = probe(&sb, &with_tmp, args.clone()).await;
        assert!(!succeeded(&out), "{args}: {out}");
    }

    // 4. A gigabyte of memory, against the 512 MiB default; 64 MiB is fine.
    let out = probe(
        &sb,
        &only_itself,
        json!({"op": "alloc", "bytes": 1u64 << 30}),
    )
    .await;
    assert!(out.get("allocated").is_none(), "1 GiB: {out}");
    let out = probe(
        &sb,
        &only_itself,
        json!({"op": "alloc", "bytes": 64u64 << 20}),
    )
    .await;
    assert_eq!(out, json!({"allocated": 64u64 << 20}));

    // 5. Fork bombs: none without a second command; with one, at most the cap.
    let out = probe(&sb, &only_itself, json!({"op": "spawn", "count": 10000})).await;
    assert_eq!(out["spawned"], 0, "{out}");
    let spawner = Profile::new(vec![Capability::Proc {
        commands: vec![tool().into(), "/bin/true".into()],
    }]);
    let started = Instant::now();
    let out = probe(&sb, &spawner, json!({"op": "spawn", "count": 10000})).await;
    let spawned = out["spawned"].as_u64().unwrap_or_else(|| panic!("{out}"));
    assert!(spawned < 64, "spawned {spawned}: {out}");
    assert!(out["error"].is_object(), "{out}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // 6. Another tool's scratch directory, while that tool runs.
    let writer = {
        let sb = sb.clone();
        let with_tmp = with_tmp.clone();
        tokio::spawn(async move {
            call(
                &sb,
                &with_tmp,
                json!({"op": "write", "path": "secret.txt", "bytes": 8, "then_sleep_ms": 3000}),
                T,
                None,
            )
            .await
        })
    };
    let secret = scratch_file(scratch_parent.path(), "secret.txt").await;
    let out = probe(&sb, &with_tmp, json!({"op": "read", "path": secret})).await;
    assert!(
        out.get("read").is_none(),
        "read another tool's scratch: {out}"
    );
    assert_eq!(writer.await.unwrap().unwrap().output, json!({"wrote": 8}));

    // The host process is unchanged and still serves.
    assert_eq!(host_state(), before);
    let out = probe(&sb, &only_itself, json!({"op": "echo"})).await;
    assert_eq!(out, json!({"echo": {"op": "echo"}}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_escape_corpus_fails_under_namespaces() {
    escape_corpus(ProcessOptions::default()).await;
}

/// The user the corpus is re-run as when the tests run as root.
const NOBODY: u32 = 65534;

#[test]
fn the_escape_corpus_fails_under_an_unprivileged_server() {
    // SAFETY: geteuid has no arguments.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        // Already unprivileged: run the corpus as this uid.
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(escape_corpus(ProcessOptions::default()));
        return;
    }
    // Copies of this test binary and the fixture where `nobody` can reach them,
    // whatever the permissions of the checkout.
    let dir = tempfile::tempdir().unwrap();
    open_to_tools(dir.path(), 0o755);
    let exe = dir.path().join("escape-test");
    let fixture = dir.path().join("fixture-tool");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    std::fs::copy(tool(), &fixture).unwrap();
    for p in [&exe, &fixture] {
        open_to_tools(p, 0o755);
    }
    let out = std::process::Command::new(&exe)
        .args([
            "--exact",
            "the_escape_corpus_fails_under_namespaces",
            "--nocapture",
            "--test-threads=1",
        ])
        .uid(NOBODY)
        .gid(NOBODY)
        .current_dir("/")
        .env("TMPDIR", "/tmp")
        .env(TOOL_ENV, &fixture)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "as uid {NOBODY}: {}\n{stdout}\n{stderr}",
        out.status
    );
}

#[tokio::test]
async fn inside_the_tool_is_an_unprivileged_process_without_capabilities() {
    let sb = sandbox(ProcessOptions::default());
    let out = probe(&sb, &proc_only(vec![]), json!({"op": "ids"})).await;
    assert_eq!(out["uid"], 1000, "{out}");
    // Its namespace's init is PID 1; the tool is the only other process there.
    assert_eq!(out["pid"], 2, "{out}");
    assert_eq!(out["ppid"], 1, "{out}");
    assert_eq!(out["cap_eff"], "0000000000000000", "{out}");
    assert_eq!(out["cap_bnd"], "0000000000000000", "{out}");
}

#[tokio::test]
async fn landlock_only_still_refuses_what_seccomp_and_capabilities_cover() {
    let sb = sandbox(ProcessOptions {
        isolation: Isolation::LandlockOnly,
        ..ProcessOptions::default()
    });
    let me = std::process::id();
    let before = host_state();
    let p = proc_only(vec![Capability::Tmp { max_bytes: 1 << 20 }]);
    let out = probe(&sb, &p, json!({"op": "ids"})).await;
    assert_eq!(out["cap_eff"], "0000000000000000", "{out}");
    assert_eq!(out["cap_bnd"], "0000000000000000", "{out}");
    let sockets = tempfile::tempdir().unwrap();
    let ours = sockets.path().join("service.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&ours).unwrap();
    for args in [
        json!({"op": "unix", "path": ours}),
        json!({"op": "prlimit", "pid": me}),
        json!({"op": "setpriority", "pid": me}),
        json!({"op": "affinity", "pid": me}),
        json!({"op": "kill", "pid": me, "signal": 0}),
        json!({"op": "sethostname"}),
        json!({"op": "settimeofday"}),
        json!({"op": "mknod", "path": "null-again"}),
        json!({"op": "alloc", "bytes": 1u64 << 30}),
    ] {
        let out = probe(&sb, &p, args.clone()).await;
        assert!(
            !succeeded(&out) && out.get("allocated").is_none(),
            "{args}: {out}"
        );
    }
    assert_eq!(host_state(), before);
    // The evidence names the mode.
    let out = call(&sb, &p, json!({"op": "echo"}), T, None).await.unwrap();
    assert!(
        out.side_effects[1]
            .target
            .starts_with("isolation=landlock-only;")
    );
}

#[test]
fn without_namespaces_native_tools_are_refused_not_run_weaker() {
    // On this thread only, creating namespaces fails as in a container that forbids
    // them; the executor's probe (a fork of this thread) inherits the filter.
    std::thread::spawn(|| {
        let mut rules = std::collections::BTreeMap::new();
        rules.insert(libc::SYS_unshare, Vec::new());
        let filter = seccompiler::SeccompFilter::new(
            rules,
            seccompiler::SeccompAction::Allow,
            seccompiler::SeccompAction::Errno(libc::EPERM as u32),
            std::env::consts::ARCH.try_into().unwrap(),
        )
        .unwrap();
        let prog: seccompiler::BpfProgram = filter.try_into().unwrap();
        seccompiler::apply_filter(&prog).unwrap();

        let refusing = ProcessExecutor::new(ProcessOptions::default());
        let e = refusing.availability().unwrap_err();
        assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
        let note = format!("{e:?}");
        assert!(
            note.contains("unshare") && note.contains("landlock-only"),
            "{note}"
        );
        let sb = LocalSandbox::new(soulbase_sandbox::BuiltinExecutor::new()).with_executor(
            soulbase_sandbox::ProviderKind::Process,
            std::sync::Arc::new(refusing),
        );
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let e = rt
            .block_on(call(
                &sb,
                &proc_only(vec![]),
                json!({"op": "echo"}),
                T,
                None,
            ))
            .unwrap_err();
        assert_eq!(e.code(), ErrorCode::ProviderUnavailable);
        // The explicit opt-out still runs tools.
        let weaker = ProcessExecutor::new(ProcessOptions {
            isolation: Isolation::LandlockOnly,
            ..ProcessOptions::default()
        });
        assert!(weaker.availability().is_ok());
    })
    .join()
    .unwrap();
}
