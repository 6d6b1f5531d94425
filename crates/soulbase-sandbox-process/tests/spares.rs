//! Spare launches: the next call of a tool takes a sandbox built ahead, and gets
//! exactly what a fresh launch would give it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{T, call, proc_only};
use serde_json::{Value, json};
use soulbase_sandbox::{BuiltinExecutor, Capability, LocalSandbox, ProviderKind};
use soulbase_sandbox_process::{Isolation, ProcessExecutor, ProcessOptions};

fn executor(isolation: Isolation, scratch: &std::path::Path) -> Arc<ProcessExecutor> {
    Arc::new(ProcessExecutor::new(ProcessOptions {
        isolation,
        scratch_parent: scratch.to_path_buf(),
        ..ProcessOptions::default()
    }))
}

fn sandbox_of(exec: &Arc<ProcessExecutor>) -> LocalSandbox {
    LocalSandbox::new(BuiltinExecutor::new()).with_executor(ProviderKind::Process, exec.clone())
}

fn env_without_scratch(out: &Value) -> Value {
    let mut env = out["env"].clone();
    let map = env.as_object_mut().unwrap();
    map.remove("TMPDIR");
    map.remove("HOME");
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_serves_the_next_call_like_a_fresh_launch() {
    for isolation in [Isolation::Namespaces, Isolation::LandlockOnly] {
        let scratch = tempfile::tempdir().unwrap();
        let exec = executor(isolation, scratch.path());
        let sb = sandbox_of(&exec);
        let p = proc_only(vec![Capability::Tmp { max_bytes: 1 << 20 }]);
        assert_eq!(exec.spares_waiting(), 0);
        let fresh = call(&sb, &p, json!({"op": "env"}), T, None).await.unwrap();
        // The call left a spare for the next one of its kind.
        assert_eq!(exec.spares_waiting(), 1, "{isolation:?}");
        let warm = call(&sb, &p, json!({"op": "env"}), T, None).await.unwrap();
        assert_eq!(exec.spares_waiting(), 1, "{isolation:?}");
        // The same environment and confinement, each call its own scratch directory.
        assert_eq!(
            env_without_scratch(&fresh.output),
            env_without_scratch(&warm.output)
        );
        assert_eq!(fresh.side_effects, warm.side_effects);
        let dirs: Vec<&str> = [&fresh, &warm]
            .iter()
            .map(|o| o.output["env"]["TMPDIR"].as_str().unwrap())
            .collect();
        assert_ne!(dirs[0], dirs[1]);
        assert!(dirs.iter().all(|d| !std::path::Path::new(d).exists()));
        // Inside, the warm call is confined as the fresh one was.
        let ids = call(&sb, &p, json!({"op": "ids"}), T, None).await.unwrap();
        let again = call(&sb, &p, json!({"op": "ids"}), T, None).await.unwrap();
        for field in ["uid", "cap_eff", "cap_bnd"] {
            assert_eq!(
                ids.output[field], again.output[field],
                "{isolation:?} {field}"
            );
        }
        if isolation == Isolation::Namespaces {
            assert_eq!(again.output["cap_eff"], json!("0000000000000000"));
            assert_eq!(again.output["uid"], json!(1000));
        }
    }
}

#[test]
fn a_waiting_spare_holds_no_other_calls_output_open() {
    // Two kinds of call (different timeouts make different launches), alternating:
    // each one's spare waits while the other runs, and must not keep that call's
    // stdout open (the call would then never end). A stuck call would also keep the
    // runtime from shutting down, so the runtime is shut down with a bound of its own.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let exec = executor(Isolation::Namespaces, scratch.path());
    let sb = sandbox_of(&exec);
    let p = proc_only(vec![]);
    let stuck = rt.block_on(async {
        for i in 0..6 {
            let timeout = if i % 2 == 0 {
                T
            } else {
                T + Duration::from_secs(1)
            };
            let out = tokio::time::timeout(
                T,
                call(&sb, &p, json!({"op": "echo", "i": i}), timeout, None),
            )
            .await;
            match out {
                Ok(out) => assert_eq!(out.unwrap().output["echo"]["i"], json!(i)),
                Err(_) => return Some(i),
            }
        }
        None
    });
    rt.shutdown_timeout(Duration::from_secs(1));
    assert_eq!(stuck, None, "a call waited for a spare's pipes");
    assert_eq!(exec.spares_waiting(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_differ_in_their_launch_do_not_share_a_spare() {
    let scratch = tempfile::tempdir().unwrap();
    let exec = executor(Isolation::Namespaces, scratch.path());
    let sb = sandbox_of(&exec);
    let small = proc_only(vec![Capability::Tmp { max_bytes: 1000 }]);
    let large = proc_only(vec![Capability::Tmp { max_bytes: 1 << 20 }]);
    call(&sb, &large, json!({"op": "echo"}), T, None)
        .await
        .unwrap();
    // The small grant's call gets no spare built for the large one: its file-size
    // limit holds.
    let e = call(
        &sb,
        &small,
        json!({"op": "write", "path": "big.bin", "bytes": 5000}),
        T,
        None,
    )
    .await
    .unwrap_err();
    assert_eq!(
        e.code(),
        soulbase_errors::ErrorCode::SandboxCapabilityBlocked,
        "{e:?}"
    );
    assert_eq!(exec.spares_waiting(), 2);
    // And the large grant's spare still writes what it allows.
    let out = call(
        &sb,
        &large,
        json!({"op": "write", "path": "big.bin", "bytes": 5000}),
        T,
        None,
    )
    .await
    .unwrap();
    assert_eq!(out.output, json!({"wrote": 5000}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_executor_ends_its_spares_and_removes_their_scratch() {
    let scratch = tempfile::tempdir().unwrap();
    let exec = executor(Isolation::Namespaces, scratch.path());
    let sb = sandbox_of(&exec);
    let p = proc_only(vec![Capability::Tmp { max_bytes: 1 << 20 }]);
    call(&sb, &p, json!({"op": "echo"}), T, None).await.unwrap();
    let entries = || std::fs::read_dir(scratch.path()).unwrap().count();
    // The call's own scratch is gone; the spare's waits.
    assert_eq!(entries(), 1);
    assert_eq!(exec.spares_waiting(), 1);
    drop(sb);
    drop(exec);
    // The spare's thread removes the scratch directory only after killing and reaping
    // its child, so an empty parent also means no spare process is left.
    let deadline = Instant::now() + Duration::from_secs(10);
    while entries() > 0 {
        assert!(
            Instant::now() < deadline,
            "a dropped spare's scratch stayed"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_spares_every_call_launches_afresh() {
    let scratch = tempfile::tempdir().unwrap();
    let config = soulbase_config::SandboxConfig {
        process_spares: 0,
        scratch_dir: Some(scratch.path().to_path_buf()),
        ..Default::default()
    };
    let options = ProcessOptions::from_config(&config);
    assert_eq!(options.spares, 0);
    let exec = Arc::new(ProcessExecutor::new(options));
    let sb = sandbox_of(&exec);
    let p = proc_only(vec![Capability::Tmp { max_bytes: 1 << 20 }]);
    for _ in 0..3 {
        call(&sb, &p, json!({"op": "echo"}), T, None).await.unwrap();
        assert_eq!(exec.spares_waiting(), 0);
        // No spare's scratch directory waits either.
        assert_eq!(std::fs::read_dir(scratch.path()).unwrap().count(), 0);
    }
}
