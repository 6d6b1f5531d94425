//! A flood of half-open connections against a real `soulbased` started with a low
//! open-file limit, on the HTTP and on the gRPC listener: health and
//! authenticated calls still answer (issue 26).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{
    DEV_CONFIG, H2_PREFACE, Server, as_dev, closed_within, http, nofile_limit, raise_own_nofile,
    wait_metric,
};
use soulbase_grpc::proto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// How many half-open connections the flood holds.
const FLOOD: usize = 2_000;

/// 2,000 connections that send part of a request line and headers and then
/// nothing: the server (started at 1,024 open files, the attacker's setting)
/// raises its limit, sheds the oldest of them for new connections, and
/// `/healthz` and an authenticated invoke answer within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_flood_does_not_starve_health_or_invoke() {
    assert!(raise_own_nofile() >= (FLOOD as u64) + 256, "test fd limit");
    let server = Server::start_with_nofile(DEV_CONFIG, 1024);
    let (soft, hard) = nofile_limit(server.pid());
    assert_eq!(soft, hard, "the server raises its open-file soft limit");

    let mut flood = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        let mut c = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&server.http))
            .await
            .expect("connect timed out")
            .unwrap();
        // The server may already have shed this one: write errors are fine.
        let _ = c
            .write_all(
                format!(
                    "POST /api/tools/soulbase.builtin.echo/invoke HTTP/1.1\r\nHost: {}\r\nX-Flood: {i}\r\nContent-Le",
                    server.http
                )
                .as_bytes(),
            )
            .await;
        flood.push(c);
    }

    let within = Duration::from_secs(1);
    let (status, body) =
        tokio::time::timeout(within, http(&server.http, "GET", "/healthz", &[], ""))
            .await
            .expect("/healthz did not answer within 1 s");
    assert_eq!(status, 200, "{body}");
    let (status, body) = tokio::time::timeout(
        within,
        http(
            &server.http,
            "POST",
            "/api/tools/soulbase.builtin.echo/invoke",
            &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "a")],
            r#"{"flood": "survived"}"#,
        ),
    )
    .await
    .expect("invoke did not answer within 1 s");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["output"]["echo"]["flood"], "survived", "{v}");

    // The oldest half-open connection was closed for newer ones (long before
    // the 10 s header-read timeout could have closed it).
    let mut buf = [0u8; 64];
    let first = flood.first_mut().unwrap();
    match tokio::time::timeout(Duration::from_secs(5), first.read(&mut buf)).await {
        Ok(Ok(0) | Err(_)) => {}
        Ok(Ok(n)) => panic!("the oldest half-open connection got {n} bytes"),
        Err(_) => panic!("the oldest half-open connection was not shed"),
    }
    // And the newest is still held (the cap, 1,024, is below the flood).
    let last = flood.last_mut().unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(100), last.read(&mut buf))
            .await
            .is_err(),
        "the newest half-open connection should still be open"
    );
}

/// 2,000 connections to the gRPC port that send nothing or part of the HTTP/2
/// preface and then nothing: the gRPC listener (its own cap, 1,024) sheds the
/// oldest of them for new connections, and a `grpc.health.v1` check and an
/// authenticated invoke, each on a new connection, answer within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_half_open_flood_does_not_starve_health_or_invoke() {
    assert!(raise_own_nofile() >= (FLOOD as u64) + 256, "test fd limit");
    let server = Server::start_with_nofile(DEV_CONFIG, 1024);

    let mut flood = Vec::with_capacity(FLOOD);
    for i in 0..FLOOD {
        let mut c = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(&server.grpc))
            .await
            .expect("connect timed out")
            .unwrap();
        if i % 2 == 1 {
            // The server may already have shed this one: write errors are fine.
            let _ = c.write_all(&H2_PREFACE[..H2_PREFACE.len() / 2]).await;
        }
        flood.push(c);
    }

    let within = Duration::from_secs(1);
    let mut health = HealthClient::new(server.channel().await);
    let status = tokio::time::timeout(
        within,
        health.check(HealthCheckRequest {
            service: String::new(),
        }),
    )
    .await
    .expect("the gRPC health check did not answer within 1 s")
    .unwrap()
    .into_inner()
    .status;
    assert_eq!(status, ServingStatus::Serving as i32);
    let mut invoker = server.invoker().await;
    let answer = tokio::time::timeout(
        within,
        invoker.invoke(as_dev(
            proto::InvokeRequest {
                tool_id: "soulbase.builtin.echo".into(),
                arguments_json: r#"{"flood": "survived"}"#.into(),
                ..Default::default()
            },
            "acme",
            "a",
        )),
    )
    .await
    .expect("the gRPC invoke did not answer within 1 s")
    .unwrap()
    .into_inner();
    let output: serde_json::Value = serde_json::from_str(&answer.output_json).unwrap();
    assert_eq!(output["echo"]["flood"], "survived", "{output}");

    // The oldest half-open connection was closed for newer ones (long before the
    // 10 s preface timeout could have closed it), the newest is still held, and
    // the listener holds no more than its cap.
    let first = flood.first_mut().unwrap();
    assert!(
        closed_within(first, Duration::from_secs(5)).await,
        "the oldest half-open gRPC connection was not shed"
    );
    let last = flood.last_mut().unwrap();
    assert!(
        !closed_within(last, Duration::from_millis(100)).await,
        "the newest half-open gRPC connection should still be open"
    );
    wait_metric(&server.http, "soulbase_grpc_connections", |v| v <= 1024.0).await;
}
