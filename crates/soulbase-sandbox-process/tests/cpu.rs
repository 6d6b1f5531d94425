//! CPU time: every call reports the CPU its processes used (`cpu_ms`), children
//! included, under both isolations, fresh or from a spare launch, and never another
//! call's.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{T, call, proc_only, sandbox, tool};
use serde_json::json;
use soulbase_sandbox::{Capability, Profile};
use soulbase_sandbox_process::{Isolation, ProcessOptions};

fn options(isolation: Isolation) -> ProcessOptions {
    ProcessOptions {
        isolation,
        ..ProcessOptions::default()
    }
}

#[tokio::test]
async fn a_burning_tool_reports_its_cpu_time() {
    for isolation in [Isolation::Namespaces, Isolation::LandlockOnly] {
        let sb = sandbox(options(isolation));
        let p = proc_only(vec![]);
        // Twice: the second call runs on the spare launch the first one left.
        for _ in 0..2 {
            let out = call(&sb, &p, json!({"op": "burn", "ms": 60}), T, None)
                .await
                .unwrap();
            assert_eq!(out.output, json!({"burned": 60}));
            let cpu = out.cpu_ms.unwrap();
            assert!(cpu >= 60, "{isolation:?}: {cpu} ms");
        }
        // A call that hardly works reports little, but something (rounded up).
        let out = call(&sb, &p, json!({"op": "echo"}), T, None).await.unwrap();
        let cpu = out.cpu_ms.unwrap();
        assert!((1..60).contains(&cpu), "{isolation:?}: {cpu} ms");
    }
}

#[tokio::test]
async fn the_cpu_of_the_tools_children_counts() {
    for isolation in [Isolation::Namespaces, Isolation::LandlockOnly] {
        let sb = sandbox(options(isolation));
        // Granting a second command allows the tool to start processes.
        let p = Profile::new(vec![Capability::Proc {
            commands: vec![tool().into(), "/bin/true".into()],
        }]);
        let out = call(
            &sb,
            &p,
            json!({"op": "burn", "ms": 60, "child": true}),
            T,
            None,
        )
        .await
        .unwrap();
        assert_eq!(out.output, json!({"burned": 60}), "{isolation:?}");
        let cpu = out.cpu_ms.unwrap();
        assert!(cpu >= 60, "{isolation:?}: {cpu} ms");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_are_measured_apart() {
    let sb = sandbox(ProcessOptions::default());
    let p = proc_only(vec![]);
    let burning = call(&sb, &p, json!({"op": "burn", "ms": 300}), T, None);
    let quick = async {
        let mut reported = Vec::new();
        for _ in 0..3 {
            let out = call(&sb, &p, json!({"op": "echo"}), T, None).await.unwrap();
            reported.push(out.cpu_ms.unwrap());
        }
        reported
    };
    let (burning, quick) = tokio::join!(burning, quick);
    assert!(burning.unwrap().cpu_ms.unwrap() >= 300);
    // No quick call is charged the burning call's CPU.
    assert!(quick.iter().all(|ms| *ms < 150), "{quick:?}");
}
