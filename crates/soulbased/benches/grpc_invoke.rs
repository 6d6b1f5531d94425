//! gRPC invoke round trips against an in-process `soulbased` on loopback
//! (`cargo bench -p soulbased --bench grpc_invoke`).
//!
//! - sequential: one client, one call at a time — p50/p99 of the round trip;
//! - concurrent: 32 streams on one HTTP/2 connection — throughput and p50/p99.
//!
//! The tool is the builtin `soulbase.builtin.echo`; evidence goes to the durable
//! spool (sync durability: every Begin and End on disk before the call goes on;
//! `BENCH_DURABILITY=async` measures the `async` mode)
//! draining into Postgres when `DATABASE_URL` is set (`cargo xtask bench` sets it;
//! a fresh database per run), else into SQLite in a temporary data directory.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::{Duration, Instant};

use soulbase_config::ConfigLoader;
use soulbase_grpc::proto::InvokeRequest;
use soulbase_grpc::proto::tool_invoker_client::ToolInvokerClient;
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

fn request() -> tonic::Request<InvokeRequest> {
    let mut req = tonic::Request::new(InvokeRequest {
        tool_id: "soulbase.builtin.echo".into(),
        arguments_json: r#"{"text":"hello","n":1}"#.into(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-soulbase-tenant", "acme".parse().unwrap());
    req.metadata_mut()
        .insert("x-soulbase-actor", "bench".parse().unwrap());
    req
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let durability = std::env::var("BENCH_DURABILITY").unwrap_or_else(|_| "sync".into());
        let grpc = format!("127.0.0.1:{}", free_port());
        let http = format!("127.0.0.1:{}", free_port());
        // BENCH_DATA_DIR puts the spool elsewhere (e.g. on another disk or tmpfs,
        // to see how much of the tail is the spool disk's fsync).
        let data = match std::env::var("BENCH_DATA_DIR") {
            Ok(d) => tempfile::tempdir_in(d).unwrap(),
            Err(_) => tempfile::tempdir().unwrap(),
        };
        let loader = ConfigLoader::new()
            .with_flag("data_dir", data.path().to_str().unwrap())
            .with_flag("server.grpc_addr", &grpc)
            .with_flag("server.http_addr", &http)
            .with_flag("server.dev_insecure", "true")
            .with_flag("evidence.durability", &durability)
            .with_flag(
                "policy.rules",
                r#"[{"effect":"allow","tenant":"acme","tools":["*"]}]"#,
            );
        let loader = match std::env::var("DATABASE_URL") {
            Ok(url) if !url.is_empty() => {
                let name = soulbase_testkit::unique_name("bench_grpc");
                let admin = sqlx::PgPool::connect(&url).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&admin)
                    .await
                    .unwrap();
                admin.close().await;
                let db = soulbase_testkit::with_database(&url, &name);
                println!("evidence: Postgres ({name}), {durability} durability");
                loader
                    .with_flag("evidence.backend", "postgres")
                    .with_flag("evidence.url", &db)
            }
            _ => {
                println!(
                    "evidence: SQLite (set DATABASE_URL for Postgres), {durability} durability"
                );
                loader
            }
        };
        let (app, flush) = App::build(loader).await.unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(soulbased::server::run(app, flush, async move {
            let _ = stopped.await;
        }));
        let endpoint = format!("http://{grpc}");
        let channel = loop {
            match tonic::transport::Channel::from_shared(endpoint.clone())
                .unwrap()
                .connect()
                .await
            {
                Ok(c) => break c,
                Err(_) => tokio::task::yield_now().await,
            }
        };
        let client = ToolInvokerClient::new(channel);

        // Warm up.
        for _ in 0..500 {
            client.clone().invoke(request()).await.unwrap();
        }

        let mut samples = Vec::with_capacity(5000);
        for _ in 0..5000 {
            let t = Instant::now();
            client.clone().invoke(request()).await.unwrap();
            samples.push(t.elapsed());
        }
        soulbase_testkit::report("grpc invoke echo, sequential round trip", samples);

        const STREAMS: usize = 32;
        const PER_STREAM: usize = 1000;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..STREAMS {
            let mut c = client.clone();
            tasks.push(tokio::spawn(async move {
                let mut s = Vec::with_capacity(PER_STREAM);
                for _ in 0..PER_STREAM {
                    let t = Instant::now();
                    c.invoke(request()).await.unwrap();
                    s.push(t.elapsed());
                }
                s
            }));
        }
        let mut all: Vec<Duration> = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        let elapsed = started.elapsed();
        let calls = (STREAMS * PER_STREAM) as f64;
        soulbase_testkit::report("grpc invoke echo, 32 concurrent streams", all);
        println!(
            "grpc invoke echo, 32 concurrent streams: {:.0} calls/s ({} calls in {:.2?})",
            calls / elapsed.as_secs_f64(),
            STREAMS * PER_STREAM,
            elapsed
        );
        let _ = stop.send(());
        let _ = server.await;
    });
}
