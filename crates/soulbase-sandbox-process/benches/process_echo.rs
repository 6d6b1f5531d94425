//! Process echo tool end to end under Landlock + seccomp + rlimits: spawn, JSON in,
//! JSON out, reap. Target: p50 ≤ 3 ms.
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
use soulbase_sandbox_process::{ProcessExecutor, ProcessOptions};
use soulbase_types::{CallId, TenantId, ToolId};

const TOOL: &str = env!("CARGO_BIN_EXE_soulbase-sandbox-fixture");

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
    let sb = LocalSandbox::new(BuiltinExecutor::new()).with_executor(
        ProviderKind::Process,
        Arc::new(ProcessExecutor::new(ProcessOptions::default())),
    );
    let profile = Profile::new(vec![Capability::Proc {
        commands: vec![TOOL.into()],
    }]);
    let (call_id, tenant, tool) = (
        CallId::generate(),
        TenantId::new("bench").unwrap(),
        ToolId::new("bench.proc.echo").unwrap(),
    );
    let args = json!({"op": "echo", "text": "hello"});
    let samples: Vec<Duration> = rt.block_on(async {
        let mut samples = Vec::new();
        for i in 0..550 {
            let req = ExecRequest {
                call_id: &call_id,
                tenant: &tenant,
                tool: &tool,
                provider: &provider,
                args: args.clone(),
                profile: &profile,
                timeout: Duration::from_secs(5),
                max_bytes_out: Some(65536),
            };
            let t = Instant::now();
            sb.guard(&req).unwrap();
            let out = sb.execute(req).await.unwrap();
            let took = t.elapsed();
            assert_eq!(out.output["echo"], args);
            if i >= 50 {
                samples.push(took);
            }
        }
        samples
    });
    soulbase_testkit::report("process echo call (landlock+seccomp)", samples);
}
