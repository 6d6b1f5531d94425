//! HTTP tool to an allowed loopback server: the executor (guard, profile and address
//! checks, JSON in and out, size cap) against a bare reqwest POST to the same server.
//! Target: executor p50 ≤ bare p50 + 300 µs.
//!
//! `cargo xtask bench -p soulbase-sandbox-http --bench http_overhead`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use soulbase_sandbox::{
    BuiltinExecutor, Capability, ExecRequest, LocalSandbox, Profile, ProviderBinding, ProviderKind,
    Sandbox,
};
use soulbase_sandbox_http::{HttpExecutor, HttpOptions};
use soulbase_types::{CallId, TenantId, ToolId};

const N: usize = 3000;
const WARMUP: usize = 300;

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let addr = common::serve().await;
        let args = json!({"q": "hello"});
        let body = serde_json::to_vec(&args).unwrap();

        let bare = reqwest::Client::builder().no_proxy().build().unwrap();
        let url = format!("http://{addr}/execute");
        let mut bare_samples = Vec::new();
        for i in 0..N + WARMUP {
            let t = Instant::now();
            let resp = bare
                .post(&url)
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
                .unwrap();
            let bytes = resp.bytes().await.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let took = t.elapsed();
            assert_eq!(v["echo"], args);
            if i >= WARMUP {
                bare_samples.push(took);
            }
        }

        let sb = LocalSandbox::new(BuiltinExecutor::new()).with_executor(
            ProviderKind::Http,
            Arc::new(HttpExecutor::new(HttpOptions::default())),
        );
        let provider = ProviderBinding::Http {
            endpoint: format!("http://{addr}"),
            path: None,
            headers: BTreeMap::new(),
            timeout_ms: None,
        };
        let profile = Profile::new(vec![Capability::Net {
            hosts: vec!["127.0.0.1".into()],
            schemes: vec!["http".into()],
            ports: vec![],
            methods: vec!["POST".into()],
        }]);
        let (call_id, tenant, tool) = (
            CallId::generate(),
            TenantId::new("bench").unwrap(),
            ToolId::new("bench.http.echo").unwrap(),
        );
        let mut exec_samples = Vec::new();
        for i in 0..N + WARMUP {
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
            if i >= WARMUP {
                exec_samples.push(took);
            }
        }
        let b = soulbase_testkit::report("bare reqwest POST (loopback)", bare_samples);
        let e = soulbase_testkit::report("http executor call (loopback)", exec_samples);
        println!(
            "{:<40} p50 overhead = {:?}",
            "http executor over bare reqwest",
            e.p50.saturating_sub(b.p50)
        );
    });
}
