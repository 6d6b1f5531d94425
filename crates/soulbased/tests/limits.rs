//! The server's own limits (issue 26): connection cap, header-read and idle
//! timeouts, body limit, HTTP/2 stream cap and pings — against a real `soulbased`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{DEV_CONFIG, Server, http};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// `DEV_CONFIG` with `extra` (lines indented for `server:`) under `server:`.
fn config(extra: &str) -> String {
    DEV_CONFIG.replacen("server:\n", &format!("server:\n{extra}"), 1)
}

/// Reads one HTTP/1.1 response with a `content-length` body from `c`; returns
/// (status, body).
async fn read_response(c: &mut TcpStream) -> (u16, String) {
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

/// Whether the server closes `c` within `bound` (EOF or reset).
async fn closed_within(c: &mut TcpStream, bound: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(bound, async {
        loop {
            match c.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
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
/// is closed (the header-read timeout, 60 s here, is not what closes it).
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

/// The frames of an HTTP/2 connection, read raw.
struct H2(TcpStream);

impl H2 {
    /// Connects with the client preface and an empty SETTINGS frame.
    async fn connect(addr: &str) -> H2 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        c.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0]).await.unwrap();
        H2(c)
    }

    /// The next frame: (type, flags, payload); `None` at EOF.
    async fn frame(&mut self) -> Option<(u8, u8, Vec<u8>)> {
        let mut head = [0u8; 9];
        if self.0.read_exact(&mut head).await.is_err() {
            return None;
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        self.0.read_exact(&mut payload).await.ok()?;
        Some((head[3], head[4], payload))
    }
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
