//! MCP `tools/call` over streamable HTTP against an in-process `soulbased` on
//! loopback, with rmcp's client (`cargo bench -p soulbased --bench mcp_call`).
//!
//! - sequential: one session, one call at a time — p50/p99 of the round trip;
//! - concurrent: 32 calls in flight (8 sessions × 4 tasks) — throughput and p50/p99.
//!
//! The tool is the builtin `soulbase.builtin.echo` through the whole governed
//! pipeline; evidence goes to the durable spool (sync durability) draining into
//! SQLite in a temporary data directory.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http::{HeaderName, HeaderValue};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use soulbase_config::ConfigLoader;
use soulbased::app::App;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

type Client = rmcp::service::RunningService<rmcp::RoleClient, ()>;

async fn session(http: &str) -> Client {
    let mut headers = HashMap::new();
    headers.insert(
        HeaderName::from_static("x-soulbase-tenant"),
        HeaderValue::from_static("acme"),
    );
    headers.insert(
        HeaderName::from_static("x-soulbase-actor"),
        HeaderValue::from_static("bench"),
    );
    let config = StreamableHttpClientTransportConfig::with_uri(format!("http://{http}/mcp"))
        .custom_headers(headers);
    ().serve(StreamableHttpClientTransport::from_config(config))
        .await
        .unwrap()
}

fn call() -> CallToolRequestParams {
    let args = serde_json::json!({"text": "hello", "n": 1});
    CallToolRequestParams::new("soulbase.builtin.echo")
        .with_arguments(args.as_object().cloned().unwrap())
}

async fn one(peer: &rmcp::Peer<rmcp::RoleClient>) {
    let r = peer.call_tool(call()).await.unwrap();
    assert_eq!(r.is_error, Some(false));
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let grpc = format!("127.0.0.1:{}", free_port());
        let http = format!("127.0.0.1:{}", free_port());
        let data = tempfile::tempdir().unwrap();
        let loader = ConfigLoader::new()
            .with_flag("data_dir", data.path().to_str().unwrap())
            .with_flag("server.grpc_addr", &grpc)
            .with_flag("server.http_addr", &http)
            .with_flag("server.dev_insecure", "true")
            .with_flag(
                "policy.rules",
                r#"[{"effect":"allow","tenant":"acme","tools":["*"]}]"#,
            );
        let (app, flush) = App::build(loader, Default::default()).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(soulbased::server::run(app, flush, async move {
            let _ = stopped.await;
        }));
        while tokio::net::TcpStream::connect(&http).await.is_err() {
            // A server that failed to start would otherwise leave this loop spinning.
            assert!(!server.is_finished(), "the server stopped before it served");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }

        let first = session(&http).await;
        for _ in 0..300 {
            one(first.peer()).await;
        }
        let mut samples = Vec::with_capacity(3000);
        for _ in 0..3000 {
            let t = Instant::now();
            one(first.peer()).await;
            samples.push(t.elapsed());
        }
        soulbase_testkit::report("mcp tools/call echo, sequential round trip", samples);

        const SESSIONS: usize = 8;
        const TASKS_PER_SESSION: usize = 4;
        const PER_TASK: usize = 500;
        let mut sessions = vec![first];
        while sessions.len() < SESSIONS {
            sessions.push(session(&http).await);
        }
        let started = Instant::now();
        let mut tasks = Vec::new();
        for s in &sessions {
            for _ in 0..TASKS_PER_SESSION {
                let peer = s.peer().clone();
                tasks.push(tokio::spawn(async move {
                    let mut out = Vec::with_capacity(PER_TASK);
                    for _ in 0..PER_TASK {
                        let t = Instant::now();
                        one(&peer).await;
                        out.push(t.elapsed());
                    }
                    out
                }));
            }
        }
        let mut all: Vec<Duration> = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let elapsed = started.elapsed();
        let calls = SESSIONS * TASKS_PER_SESSION * PER_TASK;
        soulbase_testkit::report("mcp tools/call echo, 32 in flight", all);
        println!(
            "mcp tools/call echo, 32 in flight: {:.0} calls/s ({calls} calls in {elapsed:.2?})",
            calls as f64 / elapsed.as_secs_f64(),
        );
        for s in sessions {
            let _ = s.cancel().await;
        }
        let _ = stop.send(());
        let _ = server.await;
    });
}
