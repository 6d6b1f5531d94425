//! WASM echo tool end to end through `LocalSandbox`: guard + fresh instance from the
//! pool + WASI run + JSON out. Target: p50 ≤ 50 µs, p99 ≤ 200 µs.
//!
//! `cargo xtask bench -p soulbase-sandbox-wasm --bench wasm_echo`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sha2::{Digest, Sha256};
use soulbase_sandbox::{
    BuiltinExecutor, ExecRequest, LocalSandbox, Profile, ProviderBinding, ProviderKind, Sandbox,
};
use soulbase_sandbox_wasm::{WasmExecutor, WasmOptions};
use soulbase_types::{CallId, TenantId, ToolId};

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/wasm");
    let bytes = std::fs::read(dir.join("echo.wasm")).unwrap();
    let provider = ProviderBinding::Wasm {
        module: "echo.wasm".into(),
        sha256: hex::encode(Sha256::digest(&bytes)),
    };
    let sb = LocalSandbox::new(BuiltinExecutor::new()).with_executor(
        ProviderKind::Wasm,
        Arc::new(WasmExecutor::new(WasmOptions::new(dir)).unwrap()),
    );
    let profile = Profile::new(vec![]);
    let (call_id, tenant, tool) = (
        CallId::generate(),
        TenantId::new("bench").unwrap(),
        ToolId::new("bench.wasm.echo").unwrap(),
    );
    let args = json!({"text": "hello", "n": 42});
    let samples: Vec<Duration> = rt.block_on(async {
        let mut samples = Vec::new();
        for i in 0..6000 {
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
            assert_eq!(out.output, args);
            if i >= 1000 {
                samples.push(took);
            }
        }
        samples
    });
    soulbase_testkit::report("wasm echo call (guard+instantiate+run)", samples);
}
