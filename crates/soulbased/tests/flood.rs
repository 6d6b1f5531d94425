//! A flood of half-open connections against a real `soulbased` started with a low
//! open-file limit: health and authenticated calls still answer (issue 26).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{DEV_CONFIG, Server, http, nofile_limit, raise_own_nofile};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
