//! The server's own limits (issue 26): connection caps (HTTP and gRPC, each its
//! own), first-request (header-read), body-read and idle timeouts, body limit,
//! HTTP/2 stream cap and pings — against a real `soulbased`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::{
    DEV_CONFIG, H2, H2_PREFACE, Server, closed_within, config_with as config, http, wait_metric,
};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads one HTTP/1.1 response with a `content-length` body from `c`; returns
/// (status, body).
async fn read_response(c: &mut (impl AsyncRead + Unpin)) -> (u16, String) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = c.read(&mut chunk).await.unwrap();
        assert!(n > 0, "connection closed before a response");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap();
            if body.len() >= len {
                let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                return (status, body[..len].to_owned());
            }
        }
    }
}

async fn half_open(addr: &str) -> TcpStream {
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nUser-Ag")
        .await
        .unwrap();
    c
}

/// At `server.max_connections` the connections that never completed a request go
/// first: a keep-alive connection that did complete one survives a flood of
/// half-open ones, and new connections are still served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_sheds_half_open_connections_first() {
    let server = Server::start(&config("  max_connections: 8\n"));
    let mut served = TcpStream::connect(&server.http).await.unwrap();
    let get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    served.write_all(get).await.unwrap();
    assert_eq!(read_response(&mut served).await.0, 200);

    let mut flood = Vec::new();
    for _ in 0..30 {
        flood.push(half_open(&server.http).await);
    }
    let (status, _) = http(&server.http, "GET", "/healthz", &[], "").await;
    assert_eq!(status, 200);
    // 30 half-open + 1 served + 1 new through a cap of 8: the oldest half-open
    // connections were closed, the served one was kept.
    assert!(closed_within(&mut flood[0], Duration::from_secs(5)).await);
    served.write_all(get).await.unwrap();
    assert_eq!(read_response(&mut served).await.0, 200);
}

/// `server.header_read_timeout_ms`: a client that sends part of its headers and
/// stops is disconnected (the idle timeout, 60 s here, is not what closes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off() {
    let server = Server::start(&config(
        "  header_read_timeout_ms: 200\n  idle_timeout_ms: 60000\n",
    ));
    let mut c = half_open(&server.http).await;
    assert!(closed_within(&mut c, Duration::from_secs(10)).await);
    // A complete request is still answered.
    assert_eq!(http(&server.http, "GET", "/healthz", &[], "").await.0, 200);
}

/// `server.idle_timeout_ms`: a keep-alive connection with no request in progress
/// is closed, on both listeners (the header-read timeout, 60 s here, is not what
/// closes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_keep_alive_connections_are_closed() {
    let server = Server::start(&config(
        "  header_read_timeout_ms: 60000\n  idle_timeout_ms: 200\n",
    ));
    let mut c = TcpStream::connect(&server.http).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut c).await.0, 200);
    assert!(closed_within(&mut c, Duration::from_secs(10)).await);
    let mut grpc = served_grpc(&server.grpc).await;
    assert!(closed_within(&mut grpc.0, Duration::from_secs(10)).await);
}

const HEADERS: u8 = 1;
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// A raw gRPC connection that has completed a request (a health check without
/// its message, answered with an error status) and is idle again.
async fn served_grpc(addr: &str) -> H2 {
    let mut h2 = H2::connect(addr).await;
    h2.grpc_request(1, HEALTH_CHECK).await;
    let answer = tokio::time::timeout(Duration::from_secs(5), h2.until(HEADERS, 1))
        .await
        .expect("the gRPC request was not answered in time");
    assert!(
        answer.is_some(),
        "the gRPC connection closed before answering"
    );
    h2
}

/// Whether `h2` still answers a request on `stream`.
async fn still_served(h2: &mut H2, stream: u32) -> bool {
    h2.grpc_request(stream, HEALTH_CHECK).await;
    tokio::time::timeout(Duration::from_secs(5), h2.until(HEADERS, stream))
        .await
        .is_ok_and(|a| a.is_some())
}

/// `server.grpc_max_connections`: at the gRPC listener's cap the connections
/// that never sent the preface and a request go first (long before the 10 s
/// preface timeout), a connection that did survives, new clients are served —
/// and the HTTP listener's connections, under a cap of their own, are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grpc_connection_cap_sheds_connections_without_a_request_first() {
    let server = Server::start(&config("  grpc_max_connections: 8\n"));
    let mut http_half_open = half_open(&server.http).await;
    let mut served = served_grpc(&server.grpc).await;
    let mut flood = Vec::new();
    for i in 0..30 {
        let mut c = TcpStream::connect(&server.grpc).await.unwrap();
        if i % 2 == 1 {
            // Part of the preface; the server may already have shed it.
            let _ = c.write_all(&H2_PREFACE[..10]).await;
        }
        flood.push(c);
    }
    let mut fresh = served_grpc(&server.grpc).await;
    assert!(still_served(&mut fresh, 3).await);
    assert!(closed_within(&mut flood[0], Duration::from_secs(5)).await);
    assert!(
        still_served(&mut served, 3).await,
        "the served connection was shed"
    );
    wait_metric(&server.http, "soulbase_grpc_connections", |v| v <= 8.0).await;
    assert!(
        !closed_within(&mut http_half_open, Duration::from_millis(200)).await,
        "a gRPC flood closed an HTTP connection"
    );
}

/// `server.header_read_timeout_ms` on the gRPC listener: a connection that sends
/// nothing, part of the preface, or the preface and no request is closed after
/// it; one that has sent a request is not (the idle timeout is 60 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_connections_without_a_request_are_closed_after_the_preface_timeout() {
    let server = Server::start(&config(
        "  header_read_timeout_ms: 300\n  idle_timeout_ms: 60000\n",
    ));
    let opened = Instant::now();
    let silent = TcpStream::connect(&server.grpc).await.unwrap();
    let mut partial = TcpStream::connect(&server.grpc).await.unwrap();
    partial.write_all(&H2_PREFACE[..10]).await.unwrap();
    let preface_only = H2::connect(&server.grpc).await;
    let mut served = served_grpc(&server.grpc).await;
    for (what, mut c) in [
        ("silent", silent),
        ("partial preface", partial),
        ("preface only", preface_only.0),
    ] {
        assert!(
            closed_within(&mut c, Duration::from_secs(10)).await,
            "the {what} connection was not closed"
        );
    }
    assert!(opened.elapsed() >= Duration::from_millis(300));
    assert!(still_served(&mut served, 3).await);
    wait_metric(&server.http, "soulbase_grpc_connections", |v| v == 1.0).await;
}

/// `server.body_read_timeout_ms`: a body trickled slower than that is answered
/// 408 in the JSON error envelope, its connection is closed and no longer
/// counts; a body sent in time is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_bodies_are_answered_408_and_their_connection_closed() {
    let server = Server::start(&config(
        "  body_read_timeout_ms: 300\n  header_read_timeout_ms: 60000\n  idle_timeout_ms: 60000\n",
    ));
    let mut c = TcpStream::connect(&server.http).await.unwrap();
    let head = "POST /api/tools/soulbase.builtin.echo/invoke HTTP/1.1\r\nHost: x\r\n\
                x-soulbase-tenant: acme\r\nx-soulbase-actor: a\r\n\
                content-type: application/json\r\ncontent-length: 64\r\n\r\n{";
    c.write_all(head.as_bytes()).await.unwrap();
    let started = Instant::now();
    let (mut rd, mut wr) = c.into_split();
    // One byte every 50 ms, at most 60 of the 63 left: never the whole body.
    let trickle = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        for _ in 0..60 {
            tick.tick().await;
            if wr.write_all(b" ").await.is_err() {
                return;
            }
        }
    });
    let (status, body) = tokio::time::timeout(Duration::from_secs(10), read_response(&mut rd))
        .await
        .expect("no answer to the slow body");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(status, 408, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "SCHEMA.VALIDATION_FAILED", "{v}");
    assert_eq!(v["error"]["fields"]["field"], "body", "{v}");
    assert_eq!(v["error"]["fields"]["timeout_ms"], "300", "{v}");
    assert!(
        closed_within(&mut rd, Duration::from_secs(5)).await,
        "the slow body's connection was kept open"
    );
    // Only the `/metrics` request's own connection is left.
    wait_metric(&server.http, "soulbase_http_connections", |v| v == 1.0).await;
    trickle.abort();
    let (status, body) = http(
        &server.http,
        "POST",
        "/api/tools/soulbase.builtin.echo/invoke",
        &[("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "a")],
        r#"{"in": "time"}"#,
    )
    .await;
    assert_eq!(status, 200, "{body}");
}

fn assert_too_large(status: u16, body: &str, max: usize) {
    assert_eq!(status, 413, "{body}");
    let v: Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["error"]["code"], "SCHEMA.VALIDATION_FAILED", "{v}");
    assert_eq!(v["error"]["fields"]["field"], "body", "{v}");
    assert_eq!(v["error"]["fields"]["max_bytes"], max.to_string(), "{v}");
}

/// Sends `path` a chunked body of `len` bytes; returns (status, body).
async fn chunked(addr: &str, path: &str, len: usize) -> (u16, String) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nx-soulbase-tenant: acme\r\nx-soulbase-actor: a\r\n\
         content-type: application/json\r\naccept: application/json, text/event-stream\r\n\
         transfer-encoding: chunked\r\n\r\n"
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b' '; 64 * 1024];
    let mut sent = 0;
    // The server may answer (and stop reading) before the whole body is sent.
    while sent < len {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(&chunk);
        frame.extend_from_slice(b"\r\n");
        if c.write_all(&frame).await.is_err() {
            break;
        }
        sent += chunk.len();
    }
    let _ = c.write_all(b"0\r\n\r\n").await;
    read_response(&mut c).await
}

/// A body over `server.max_body_bytes` (default 2 MiB) is answered 413 in the JSON
/// error envelope on the API and on MCP, declared or found while read; a
/// smaller limit is honoured.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_get_the_json_envelope() {
    let server = Server::start(DEV_CONFIG);
    let max = 2 * 1024 * 1024;
    let dev = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "a")];
    let three_mib = format!("{{\"x\": \"{}\"}}", "a".repeat(3 * 1024 * 1024));
    let invoke = "/api/tools/soulbase.builtin.echo/invoke";
    let (status, body) = http(&server.http, "POST", invoke, &dev, &three_mib).await;
    assert_too_large(status, &body, max);
    let (status, body) = chunked(&server.http, invoke, 3 * 1024 * 1024).await;
    assert_too_large(status, &body, max);
    let mcp_headers = [
        ("x-soulbase-tenant", "acme"),
        ("x-soulbase-actor", "a"),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let (status, body) = http(&server.http, "POST", "/mcp", &mcp_headers, &three_mib).await;
    assert_too_large(status, &body, max);
    let (status, body) = chunked(&server.http, "/mcp", 3 * 1024 * 1024).await;
    assert_too_large(status, &body, max);
    // 100 KiB is within the default limit.
    let small = format!("{{\"x\": \"{}\"}}", "a".repeat(100 * 1024));
    let (status, _) = http(&server.http, "POST", invoke, &dev, &small).await;
    assert_ne!(status, 413);

    let server = Server::start(&config("  max_body_bytes: 65536\n"));
    let (status, body) = http(&server.http, "POST", invoke, &dev, &small).await;
    assert_too_large(status, &body, 65536);
}

const SETTINGS: u8 = 4;
const PING: u8 = 6;
const GOAWAY: u8 = 7;
const MAX_CONCURRENT_STREAMS: u16 = 3;

/// Checks one listener: its SETTINGS carry the stream cap, an idle connection is
/// pinged, and one that does not answer the ping is closed.
async fn check_h2(addr: &str, streams: u32) {
    let mut h2 = H2::connect(addr).await;
    let (kind, flags, payload) = h2.frame().await.unwrap();
    assert_eq!((kind, flags), (SETTINGS, 0), "the server's first frame");
    let advertised = payload.chunks(6).find_map(|s| {
        (u16::from_be_bytes([s[0], s[1]]) == MAX_CONCURRENT_STREAMS)
            .then(|| u32::from_be_bytes([s[2], s[3], s[4], s[5]]))
    });
    assert_eq!(advertised, Some(streams));
    // Acknowledge the settings, then answer nothing.
    h2.0.write_all(&[0, 0, 0, 4, 1, 0, 0, 0, 0]).await.unwrap();
    let (mut pinged, mut goaway) = (false, false);
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some((kind, flags, _)) = h2.frame().await {
            match kind {
                PING if flags & 1 == 0 => pinged = true,
                GOAWAY => goaway = true,
                _ => {}
            }
        }
    })
    .await
    .expect("the connection with an unanswered ping was not closed");
    assert!(pinged, "the idle connection was not pinged");
    let _ = goaway;
}

/// `server.http2_max_concurrent_streams` and `server.http2_keepalive_*` on both
/// listeners: gRPC and HTTP (h2c).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_connections_are_capped_and_pinged() {
    let server = Server::start(&config(
        "  http2_max_concurrent_streams: 7\n  http2_keepalive_interval_ms: 100\n  \
         http2_keepalive_timeout_ms: 100\n",
    ));
    check_h2(&server.grpc, 7).await;
    check_h2(&server.http, 7).await;
}
