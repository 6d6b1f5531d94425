//! The instance pool under pressure, on real wasmtime: a module blocked in a host call
//! gives its slot back at the call's deadline, and each tenant gets a share of the pool.
//!
//! Calls are started by polling them once: `execute` takes its slot before it first
//! waits, so after that poll a call is admitted (and counted) or already refused. No
//! test waits on a clock to see that something happened.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use soulbase_config::{Config, SandboxConfig};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_sandbox::{
    BuiltinExecutor, Capability, ExecOutput, ExecRequest, Executor, FsAccess, LocalSandbox,
    Profile, ProviderBinding, ProviderKind, Sandbox,
};
use soulbase_sandbox_wasm::{WasmExecutor, WasmOptions};
use soulbase_types::{CallId, TenantId, ToolId};
use tokio::task::JoinHandle;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/wasm")
}

fn binding(name: &str) -> ProviderBinding {
    let bytes = std::fs::read(fixtures().join(name)).unwrap();
    ProviderBinding::Wasm {
        module: name.into(),
        sha256: hex::encode(Sha256::digest(&bytes)),
    }
}

/// The executor (for its counters) and a sandbox running it, with `sleep.wasm` and
/// `echo.wasm` compiled up front so a call's first poll reaches its slot.
fn setup(options: WasmOptions) -> (WasmExecutor, Arc<LocalSandbox>) {
    let wasm = WasmExecutor::new(options).unwrap();
    for name in ["sleep.wasm", "echo.wasm", "readfile.wasm"] {
        let ProviderBinding::Wasm { module, sha256 } = binding(name) else {
            unreachable!()
        };
        wasm.load(&module, &sha256).unwrap();
    }
    let sb = LocalSandbox::new(BuiltinExecutor::new())
        .with_executor(ProviderKind::Wasm, Arc::new(wasm.clone()));
    (wasm, Arc::new(sb))
}

fn tenant(name: &str) -> TenantId {
    TenantId::new(name).unwrap()
}

type Outcome = Result<ExecOutput, SoulError>;
type Call = Pin<Box<dyn Future<Output = Outcome> + Send>>;

/// One call through the sandbox (guard, then execute) as `tenant`.
fn call(
    sb: &Arc<LocalSandbox>,
    tenant: &str,
    module: &str,
    profile: Profile,
    args: Value,
    timeout: Duration,
) -> Call {
    let (sb, tenant, provider) = (sb.clone(), self::tenant(tenant), binding(module));
    Box::pin(async move {
        let call_id = CallId::generate();
        let tool = ToolId::new("demo.wasm.tool").unwrap();
        let req = ExecRequest {
            call_id: &call_id,
            tenant: &tenant,
            tool: &tool,
            provider: &provider,
            args,
            profile: &profile,
            timeout,
            max_bytes_out: None,
            max_memory_bytes: None,
            max_processes: None,
            max_files: None,
            reporter: soulbase_sandbox::Reporter::none(),
        };
        sb.guard(&req)?;
        sb.execute(req).await
    })
}

/// Polls `call` once — far enough to be admitted or refused — and lets it run on.
async fn start(mut call: Call) -> JoinHandle<Outcome> {
    match std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await {
        Poll::Ready(done) => tokio::spawn(async move { done }),
        Poll::Pending => tokio::spawn(call),
    }
}

fn sleeper(sb: &Arc<LocalSandbox>, tenant: &str, timeout: Duration) -> Call {
    call(
        sb,
        tenant,
        "sleep.wasm",
        Profile::new(vec![]),
        json!({}),
        timeout,
    )
}

fn echo(sb: &Arc<LocalSandbox>, tenant: &str, n: usize) -> Call {
    let t = Duration::from_secs(10);
    call(
        sb,
        tenant,
        "echo.wasm",
        Profile::new(vec![]),
        json!({"n": n}),
        t,
    )
}

fn code(outcome: &Outcome) -> Option<ErrorCode> {
    outcome.as_ref().err().map(SoulError::code)
}

/// Issue 26: 80 calls of tenant B whose module sleeps 30 s in `poll_oneoff` (tool
/// timeout 2 s) neither starve tenant A nor keep their instances past the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocked_host_calls_free_their_slots_at_the_deadline_and_leave_other_tenants_room() {
    let (wasm, sb) = setup(WasmOptions::new(fixtures()));
    let (a, b) = (tenant("tenant-a"), tenant("tenant-b"));
    let deadline = Duration::from_secs(2);
    let began = Instant::now();

    let mut blocked = Vec::new();
    for _ in 0..80 {
        blocked.push(start(sleeper(&sb, "tenant-b", deadline)).await);
    }
    // B holds its share (half the pool) and no more.
    assert_eq!(wasm.live_instances_of(&b), 32);
    assert_eq!(wasm.live_instances(), 32);

    // A's calls run meanwhile, a batch of them at once.
    let mut a_calls = Vec::new();
    for n in 0..32 {
        a_calls.push(start(echo(&sb, "tenant-a", n)).await);
    }
    for (n, c) in a_calls.into_iter().enumerate() {
        assert_eq!(c.await.unwrap().unwrap().output, json!({"n": n}));
    }
    assert_eq!(wasm.live_instances_of(&a), 0);

    let (mut timed_out, mut refused) = (0, 0);
    for c in blocked {
        let outcome = c.await.unwrap();
        match code(&outcome) {
            Some(ErrorCode::ProviderTimeout) => timed_out += 1,
            Some(ErrorCode::QuotaRateLimited) => {
                let e = outcome.unwrap_err();
                assert_eq!(e.field("wasm_max_instances_per_tenant"), Some("32"));
                refused += 1;
            }
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert_eq!((timed_out, refused), (32, 48));
    // Every blocked instance is gone once its call has answered, and that happened at
    // the deadline, not when the module's 30 s sleep would have ended.
    assert_eq!(wasm.live_instances(), 0);
    assert!(
        began.elapsed() < Duration::from_secs(25),
        "{:?}",
        began.elapsed()
    );

    // The whole pool is free again: two tenants fill it, a third finds it full.
    let mut full = Vec::new();
    for who in ["tenant-a", "tenant-c"] {
        for _ in 0..32 {
            full.push(start(sleeper(&sb, who, Duration::from_millis(500))).await);
        }
    }
    assert_eq!(wasm.live_instances(), 64);
    let e = start(sleeper(&sb, "tenant-d", deadline))
        .await
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::ProviderUnavailable, "{e:?}");
    for c in full {
        assert_eq!(code(&c.await.unwrap()), Some(ErrorCode::ProviderTimeout));
    }
    assert_eq!(wasm.live_instances(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configured_share_refuses_a_tenant_at_its_cap_and_no_one_else() {
    // The config field and its validation.
    let mut config = Config::default();
    assert!(config.validate().is_empty());
    config.sandbox.wasm_max_instances_per_tenant = 0;
    let fields: Vec<String> = config.validate().into_iter().map(|p| p.0).collect();
    assert_eq!(fields, ["sandbox.wasm_max_instances_per_tenant"]);
    let default = WasmOptions::from_config(&SandboxConfig::default(), &fixtures());
    assert_eq!(default.max_instances_per_tenant, default.max_instances / 2);

    let sandbox = SandboxConfig {
        wasm_max_instances_per_tenant: 1,
        ..SandboxConfig::default()
    };
    let options = WasmOptions::from_config(&sandbox, &fixtures());
    assert_eq!(options.max_instances_per_tenant, 1);
    let (wasm, sb) = setup(options);
    let b = tenant("tenant-b");

    let held = start(sleeper(&sb, "tenant-b", Duration::from_millis(500))).await;
    assert_eq!(wasm.live_instances_of(&b), 1);
    // A second call of B: refused at the guard (before any evidence of a start)…
    let e = start(echo(&sb, "tenant-b", 0))
        .await
        .await
        .unwrap()
        .unwrap_err();
    assert_eq!(e.code(), ErrorCode::QuotaRateLimited, "{e:?}");
    assert_eq!(e.field("wasm_max_instances_per_tenant"), Some("1"));
    assert!(e.retry_after_ms().is_some());
    assert!(
        e.audit()
            .causes
            .iter()
            .any(|n| n.contains("sandbox.wasm_max_instances_per_tenant")),
        "{e:?}"
    );
    // …and by `execute` itself, which decides when the guard raced.
    let (call_id, tool, provider) = (
        CallId::generate(),
        ToolId::new("demo.wasm.tool").unwrap(),
        binding("echo.wasm"),
    );
    let profile = Profile::new(vec![]);
    let req = ExecRequest {
        call_id: &call_id,
        tenant: &b,
        tool: &tool,
        provider: &provider,
        args: json!({}),
        profile: &profile,
        timeout: Duration::from_secs(10),
        max_bytes_out: None,
        max_memory_bytes: None,
        max_processes: None,
        max_files: None,
        reporter: soulbase_sandbox::Reporter::none(),
    };
    let e = Executor::execute(&wasm, req).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::QuotaRateLimited, "{e:?}");
    assert_eq!(wasm.live_instances(), 1);

    // Another tenant is not affected.
    let out = start(echo(&sb, "tenant-a", 7))
        .await
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.output, json!({"n": 7}));

    // Once B's call is over, B is admitted again.
    assert_eq!(code(&held.await.unwrap()), Some(ErrorCode::ProviderTimeout));
    assert_eq!(wasm.live_instances_of(&b), 0);
    let out = start(echo(&sb, "tenant-b", 8))
        .await
        .await
        .unwrap()
        .unwrap();
    assert_eq!(out.output, json!({"n": 8}));
}

/// A read that blocks (a FIFO with no writer, in a granted directory) is a host call
/// like `poll_oneoff`: the instance goes at the deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_blocked_in_the_host_frees_its_slot_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.json");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let (wasm, sb) = setup(WasmOptions::new(fixtures()));
    let profile = Profile::new(vec![Capability::Fs {
        paths: vec![dir.path().to_string_lossy().into_owned()],
        access: [FsAccess::Read].into(),
    }]);
    let blocked = start(call(
        &sb,
        "tenant-b",
        "readfile.wasm",
        profile,
        json!("pipe.json"),
        Duration::from_millis(500),
    ))
    .await;
    assert_eq!(wasm.live_instances(), 1);
    // Bounded so that a regression fails instead of hanging (the module would wait
    // for a writer forever); the call itself answers at its 500 ms deadline.
    let outcome = tokio::time::timeout(Duration::from_secs(20), blocked).await;
    // Open a writer now (non-blocking: it succeeds only while a reader waits) so the
    // host's blocked open returns and the runtime can shut down.
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(0o4000) // O_NONBLOCK on Linux
        .open(&fifo);
    let outcome = outcome.expect("the blocked call never answered").unwrap();
    assert_eq!(
        code(&outcome),
        Some(ErrorCode::ProviderTimeout),
        "{outcome:?}"
    );
    assert_eq!(wasm.live_instances(), 0);
}
