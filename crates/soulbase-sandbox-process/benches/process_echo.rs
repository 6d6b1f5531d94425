//! Process echo tool end to end — spawn, JSON in, JSON out, reap — under each
//! isolation mode, interleaved (rounds of 50 calls alternating between the modes, so
//! both see the same machine): `namespaces` (the default: user/PID/mount/network
//! namespaces, a fresh mount tree, Landlock, seccomp, rlimits) against `landlock-only`
//! (Landlock, seccomp, rlimits). Target: namespaces p50 ≤ 3 ms.
//!
//! `cargo xtask bench -p soulbase-sandbox-process --bench process_echo`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use soulbase_sandbox::{
    BuiltinExecutor, Capability, ExecRequest, LocalSandbox, Profile, ProviderBinding, ProviderKind,
    Sandbox,
};
use soulbase_sandbox_process::{Isolation, ProcessExecutor, ProcessOptions};
use soulbase_types::{CallId, TenantId, ToolId};

const TOOL: &str = env!("CARGO_BIN_EXE_soulbase-sandbox-fixture");
const ROUNDS: usize = 12;
const PER_ROUND: usize = 50;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let provider = ProviderBinding::Process {
        command: TOOL.into(),
        args: vec![],
    };
    let modes = [Isolation::Namespaces, Isolation::LandlockOnly].map(|isolation| {
        let sb = LocalSandbox::new(BuiltinExecutor::new()).with_executor(
            ProviderKind::Process,
            Arc::new(ProcessExecutor::new(ProcessOptions {
                isolation,
                ..ProcessOptions::default()
            })),
        );
        (isolation, sb)
    });
    let profile = Profile::new(vec![Capability::Proc {
        commands: vec![TOOL.into()],
    }]);
    let (call_id, tenant, tool) = (
        CallId::generate(),
        TenantId::new("bench").unwrap(),
        ToolId::new("bench.proc.echo").unwrap(),
    );
    let args = json!({"op": "echo", "text": "hello"});
    let mut samples: [Vec<Duration>; 2] = [Vec::new(), Vec::new()];
    rt.block_on(async {
        // The first round of each mode warms up and is not counted.
        for round in 0..=ROUNDS {
            for (m, (_, sb)) in modes.iter().enumerate() {
                for _ in 0..PER_ROUND {
                    let req = ExecRequest {
                        call_id: &call_id,
                        tenant: &tenant,
                        tool: &tool,
                        provider: &provider,
                        args: args.clone(),
                        profile: &profile,
                        timeout: Duration::from_secs(5),
                        max_bytes_out: Some(65536),
                        max_memory_bytes: None,
                        max_processes: None,
                    };
                    let t = Instant::now();
                    sb.guard(&req).unwrap();
                    let out = sb.execute(req).await.unwrap();
                    let took = t.elapsed();
                    assert_eq!(out.output["echo"], args);
                    if round > 0 {
                        samples[m].push(took);
                    }
                }
            }
        }
    });
    let [ns, ll] = samples;
    let ns = soulbase_testkit::report("process echo (namespaces)", ns);
    let ll = soulbase_testkit::report("process echo (landlock-only)", ll);
    println!(
        "namespaces / landlock-only: p50 x{:.2}, p99 x{:.2}",
        ns.p50.as_secs_f64() / ll.p50.as_secs_f64(),
        ns.p99.as_secs_f64() / ll.p99.as_secs_f64()
    );
}
