//! Process echo tool end to end — spawn, JSON in, JSON out, reap — under each
//! isolation mode, interleaved (rounds of 50 calls alternating between the modes, so
//! all see the same machine): `namespaces` (the default: user/PID/mount/network
//! namespaces, a fresh mount tree, Landlock, seccomp, rlimits) with spare launches
//! (the default: each call finds its sandbox built ahead), the same launching every
//! call afresh (`sandbox.process_spares: 0`), and `landlock-only` (Landlock, seccomp,
//! rlimits) with spares. Target: namespaces p50 ≤ 3 ms.
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
    let modes = [
        (Isolation::Namespaces, 8),
        (Isolation::Namespaces, 0),
        (Isolation::LandlockOnly, 8),
    ]
    .map(|(isolation, spares)| {
        let sb = LocalSandbox::new(BuiltinExecutor::new()).with_executor(
            ProviderKind::Process,
            Arc::new(ProcessExecutor::new(ProcessOptions {
                isolation,
                spares,
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
    let mut samples: [Vec<Duration>; 3] = [Vec::new(), Vec::new(), Vec::new()];
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
                        max_files: None,
                        reporter: soulbase_sandbox::Reporter::none(),
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
    let [ns, fresh, ll] = samples;
    let ns = soulbase_testkit::report("process echo (namespaces)", ns);
    let fresh = soulbase_testkit::report("process echo (namespaces, no spares)", fresh);
    let ll = soulbase_testkit::report("process echo (landlock-only)", ll);
    let ratio = |a: &soulbase_testkit::Percentiles, b: &soulbase_testkit::Percentiles| {
        format!(
            "p50 x{:.2}, p99 x{:.2}",
            a.p50.as_secs_f64() / b.p50.as_secs_f64(),
            a.p99.as_secs_f64() / b.p99.as_secs_f64()
        )
    };
    println!("namespaces / landlock-only: {}", ratio(&ns, &ll));
    println!("namespaces / no spares: {}", ratio(&ns, &fresh));
}
