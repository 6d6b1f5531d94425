//! gRPC invoke round trips against an in-process `soulbased` on loopback
//! (`cargo bench -p soulbased --bench grpc_invoke`).
//!
//! - sequential: one client, one call at a time — p50/p99 of the round trip;
//! - paced: 32 streams offering a fixed load together (`BENCH_RATE`, default
//!   10,000 calls/s) — p50/p99 as a client at that rate sees them, each call timed
//!   from when it was due if the server had fallen behind;
//! - saturated: 32 streams, each sending its next call as soon as the last returns
//!   — the most calls/s, and p50/p99 at that load (queueing included).
//!
//! The streams share one HTTP/2 connection (`BENCH_CONNECTIONS` spreads them over
//! more); `BENCH_TIMELINE` prints slow calls per 50 ms window, which tells
//! periodic stalls from steady queueing.
//!
//! Scheduling experiments: `BENCH_CLIENT_THREADS=N` runs the client on a runtime of
//! its own (0: one thread), as a separate client process would; `BENCH_SERVER_THREADS`,
//! `BENCH_GQI` and `BENCH_EVI` set the server runtime's worker threads, global queue
//! interval and event interval.
//!
//! The tool is the builtin `soulbase.builtin.echo`; evidence goes to the durable
//! spool (sync durability: every Begin and End on disk before the call goes on;
//! `BENCH_DURABILITY=async` measures the `async` mode)
//! draining into Postgres when `DATABASE_URL` is set (`cargo xtask bench` sets it;
//! a fresh database per run, dropped at the end unless `BENCH_KEEP_DB` is set), else
//! into SQLite in a temporary data directory.
//!
//! `BENCH_ONLY=saturated` runs only the saturated run; `BENCH_PER_STREAM` sets the
//! calls per stream of the 32-stream runs (default 1,000), e.g. a longer window for `perf`.
//!
//! `BENCH_FLOOR=1` serves a bare tonic `ToolInvoker` instead — no pipeline, no
//! evidence, the request's arguments echoed back — to the same client: the cost of
//! tonic, HTTP/2 and the client alone on this machine, the floor under the figures.
//! With `BENCH_FLOOR_FSYNC=1` besides, the floor answers each call only once its
//! arguments are in a journal on disk (one `pwrite` and `fdatasync` per round of
//! the calls queued meanwhile, as `mcp_load`'s durable floor): what durability
//! alone costs a server on this disk.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "common/journal.rs"]
mod journal;

use std::time::{Duration, Instant};

use soulbase_config::ConfigLoader;
use soulbase_grpc::proto::tool_invoker_client::ToolInvokerClient;
use soulbase_grpc::proto::tool_invoker_server::{ToolInvoker, ToolInvokerServer};
use soulbase_grpc::proto::{
    ExportToolsRequest, ExportToolsResponse, InvokeRequest, InvokeResponse, PreflightResponse,
    RouteToolCallsRequest, RouteToolCallsResponse,
};
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

/// A numeric knob from the environment (unset or not a number: the default).
fn env_num(name: &str) -> Option<u32> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The floor: a `ToolInvoker` that does nothing but echo the arguments.
struct Floor;

#[tonic::async_trait]
impl ToolInvoker for Floor {
    async fn preflight(
        &self,
        _request: tonic::Request<InvokeRequest>,
    ) -> Result<tonic::Response<PreflightResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("the floor only invokes"))
    }

    async fn invoke(
        &self,
        request: tonic::Request<InvokeRequest>,
    ) -> Result<tonic::Response<InvokeResponse>, tonic::Status> {
        let arguments_json = request.into_inner().arguments_json;
        journal::record(arguments_json.as_bytes()).await;
        Ok(tonic::Response::new(InvokeResponse {
            call_id: "floor".into(),
            output_json: arguments_json,
            evidence_ref: String::new(),
            replayed: false,
            warnings: Vec::new(),
        }))
    }

    async fn export_tools(
        &self,
        _request: tonic::Request<ExportToolsRequest>,
    ) -> Result<tonic::Response<ExportToolsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("the floor only invokes"))
    }

    async fn route_tool_calls(
        &self,
        _request: tonic::Request<RouteToolCallsRequest>,
    ) -> Result<tonic::Response<RouteToolCallsResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("the floor only invokes"))
    }
}

/// Serves [`Floor`] on `addr` until `stopped` resolves.
async fn serve_floor(
    addr: &str,
    stopped: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| e.to_string())?;
    tonic::transport::Server::builder()
        .add_service(ToolInvokerServer::new(Floor))
        .serve_with_incoming_shutdown(
            tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            stopped,
        )
        .await
        .map_err(|e| e.to_string())
}

fn main() {
    let mut b = tokio::runtime::Builder::new_multi_thread();
    b.enable_all();
    if let Some(n) = env_num("BENCH_GQI") {
        b.global_queue_interval(n);
    }
    if let Some(n) = env_num("BENCH_EVI") {
        b.event_interval(n);
    }
    if let Some(n) = env_num("BENCH_SERVER_THREADS") {
        b.worker_threads(n as usize);
    }
    let rt = b.build().unwrap();
    let client_rt = env_num("BENCH_CLIENT_THREADS").map(|n| {
        if n == 0 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(n as usize)
                .enable_all()
                .build()
                .unwrap()
        }
    });
    // `data` is returned so the spool directory outlives the setup block; `bench_db`
    // (the admin URL and the database's name) so the database can be dropped after.
    let (grpc, stop, server, _data, bench_db) = rt.block_on(async {
        let durability = std::env::var("BENCH_DURABILITY").unwrap_or_else(|_| "sync".into());
        let grpc = format!("127.0.0.1:{}", free_port());
        let http = format!("127.0.0.1:{}", free_port());
        // BENCH_DATA_DIR puts the spool elsewhere (e.g. on another disk or tmpfs,
        // to see how much of the tail is the spool disk's fsync).
        let data = match std::env::var("BENCH_DATA_DIR") {
            Ok(d) => tempfile::tempdir_in(d).unwrap(),
            Err(_) => tempfile::tempdir().unwrap(),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async move {
            let _ = stopped.await;
        };
        if std::env::var_os("BENCH_FLOOR").is_some() {
            if std::env::var_os(journal::ENV).is_some() {
                // Where the governed server's spool would be (`BENCH_DATA_DIR`).
                journal::open(data.path());
                println!("floor: bare tonic ToolInvoker, each call answered once on disk");
            } else {
                println!("floor: bare tonic ToolInvoker, no pipeline, no evidence");
            }
            let addr = grpc.clone();
            let server = tokio::spawn(async move { serve_floor(&addr, stopped).await });
            return (grpc, stop, server, data, None);
        }
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
        let mut bench_db = None;
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
                bench_db = Some((url, name));
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
        let (app, flush) = App::build(loader, Default::default()).await.unwrap();
        let server = tokio::spawn(async move {
            soulbased::server::run(app, flush, stopped)
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        });
        (grpc, stop, server, data, bench_db)
    });
    // Runs the client; false when the server stopped before it could connect.
    let client_part = async {
        let endpoint = format!("http://{grpc}");
        let channel = loop {
            match tonic::transport::Channel::from_shared(endpoint.clone())
                .unwrap()
                .connect()
                .await
            {
                Ok(c) => break c,
                // A server that failed to start (e.g. a port taken between
                // free_port and bind) would otherwise leave this loop spinning.
                Err(_) if server.is_finished() => return false,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        };
        let client = ToolInvokerClient::new(channel);
        // BENCH_CONNECTIONS spreads the concurrent streams over that many HTTP/2
        // connections (default 1: all 32 streams on one connection).
        let connections: usize = std::env::var("BENCH_CONNECTIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1);
        let mut clients = vec![client.clone()];
        for _ in 1..connections {
            let channel = tonic::transport::Channel::from_shared(endpoint.clone())
                .unwrap()
                .connect()
                .await
                .unwrap();
            clients.push(ToolInvokerClient::new(channel));
        }

        // Warm up.
        for _ in 0..500 {
            client.clone().invoke(request()).await.unwrap();
        }

        // BENCH_ONLY=saturated skips the sequential and paced runs (for profiling).
        let saturated_only = std::env::var("BENCH_ONLY").is_ok_and(|v| v == "saturated");
        let per_stream = env_num("BENCH_PER_STREAM").map_or(PER_STREAM, |n| n as usize);
        if !saturated_only {
            paced_runs(client.clone(), &clients, per_stream).await;
        }
        // Saturation: every stream sends its next call as soon as the last returns.
        let (timed, elapsed) = run_streams(&clients, None, per_stream).await;
        if std::env::var_os("BENCH_TIMELINE").is_some() {
            timeline(&timed);
        }
        let all: Vec<Duration> = timed.iter().map(|&(_, d)| d).collect();
        let calls = all.len() as f64;
        soulbase_testkit::report("grpc invoke echo, 32 concurrent streams", all);
        println!(
            "grpc invoke echo, 32 concurrent streams: {:.0} calls/s ({} calls in {:.2?})",
            calls / elapsed.as_secs_f64(),
            calls,
            elapsed
        );
        true
    };
    let ran = match &client_rt {
        Some(c) => c.block_on(client_part),
        None => rt.block_on(client_part),
    };
    if !ran {
        panic!("the server stopped: {:?}", rt.block_on(server));
    }
    let _ = stop.send(());
    let _ = rt.block_on(server);
    // Each run's database holds every record it made; BENCH_KEEP_DB keeps it for a look.
    if let Some((url, name)) = bench_db {
        if std::env::var_os("BENCH_KEEP_DB").is_some() {
            println!("kept database {name}");
        } else {
            rt.block_on(async {
                let admin = sqlx::PgPool::connect(&url).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                )))
                .execute(&admin)
                .await
                .unwrap();
                admin.close().await;
            });
        }
    }
}

/// The sequential round trip and the run at a fixed offered load.
async fn paced_runs(
    client: ToolInvokerClient<tonic::transport::Channel>,
    clients: &[ToolInvokerClient<tonic::transport::Channel>],
    per_stream: usize,
) {
    let mut samples = Vec::with_capacity(5000);
    for _ in 0..5000 {
        let t = Instant::now();
        client.clone().invoke(request()).await.unwrap();
        samples.push(t.elapsed());
    }
    soulbase_testkit::report("grpc invoke echo, sequential round trip", samples);

    // A fixed offered load (BENCH_RATE calls/s, default 10,000) over the same 32
    // streams: latency as a client sending at that rate sees it. Each call is
    // timed from when the schedule says it should start, so a server that
    // falls behind is charged for the wait (no coordinated omission).
    let rate: f64 = std::env::var("BENCH_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000.0);
    let (timed, elapsed) = run_streams(clients, Some(rate), per_stream).await;
    if std::env::var_os("BENCH_TIMELINE").is_some() {
        timeline(&timed);
    }
    let all: Vec<Duration> = timed.iter().map(|&(_, d)| d).collect();
    let calls = all.len() as f64;
    let name = format!("grpc invoke echo, 32 streams at {rate:.0}/s");
    soulbase_testkit::report(&name, all);
    println!(
        "{name}: {:.0} calls/s achieved ({} calls in {:.2?})",
        calls / elapsed.as_secs_f64(),
        calls,
        elapsed
    );
}

/// Concurrent streams of this many calls each.
const STREAMS: usize = 32;
/// Calls per stream (`BENCH_PER_STREAM` overrides).
const PER_STREAM: usize = 1000;

/// Runs `STREAMS` streams of `per_stream` calls spread over `clients`: back to back,
/// or paced so that all streams together offer `rate` calls/s. Returns each call's
/// (scheduled start since the run began, latency) and the run's duration.
async fn run_streams(
    clients: &[ToolInvokerClient<tonic::transport::Channel>],
    rate: Option<f64>,
    per_stream: usize,
) -> (Vec<(Duration, Duration)>, Duration) {
    let started = tokio::time::Instant::now();
    // Each stream sends every `interval`, streams staggered evenly within it.
    let interval = rate.map(|r| Duration::from_secs_f64(STREAMS as f64 / r));
    let mut tasks = Vec::new();
    for i in 0..STREAMS {
        let mut c = clients[i % clients.len()].clone();
        tasks.push(tokio::spawn(async move {
            let mut s = Vec::with_capacity(per_stream);
            let mut last_done = started;
            for k in 0..per_stream {
                let t = match interval {
                    Some(iv) => {
                        let due = started + iv.mul_f64(k as f64 + i as f64 / STREAMS as f64);
                        tokio::time::sleep_until(due).await;
                        // Late because the previous call overran its slot: the
                        // server's doing, timed from when the call was due. Late
                        // only because the timer fires on millisecond ticks: the
                        // harness's, timed from when it is sent.
                        if last_done > due {
                            due
                        } else {
                            tokio::time::Instant::now()
                        }
                    }
                    None => tokio::time::Instant::now(),
                };
                c.invoke(request()).await.unwrap();
                last_done = tokio::time::Instant::now();
                s.push((t - started, last_done - t));
            }
            s
        }));
    }
    let mut timed = Vec::with_capacity(STREAMS * per_stream);
    for t in tasks {
        timed.extend(t.await.unwrap());
    }
    (timed, started.elapsed())
}

/// Prints, per 50 ms window of the run, how many calls started in it and how many
/// of those took over 5 ms: periodic stalls show up as clustered windows.
fn timeline(timed: &[(Duration, Duration)]) {
    let window = Duration::from_millis(50);
    let mut buckets: std::collections::BTreeMap<u128, (usize, usize, Duration)> =
        std::collections::BTreeMap::new();
    for &(at, took) in timed {
        let b = buckets
            .entry(at.as_millis() / window.as_millis())
            .or_default();
        b.0 += 1;
        if took > Duration::from_millis(5) {
            b.1 += 1;
        }
        b.2 = b.2.max(took);
    }
    for (b, (n, slow, max)) in buckets {
        println!(
            "  t={:>5} ms  calls {n:>5}  >5ms {slow:>4}  max {max:.1?}",
            b * 50
        );
    }
}
