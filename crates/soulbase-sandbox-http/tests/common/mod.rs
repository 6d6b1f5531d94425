//! A tiny HTTP/1.1 test server on loopback (keep-alive, Content-Length bodies only).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

/// Starts the server; returns its address. Routes:
/// `/execute` echo JSON · `/html` text/html · `/slow` waits 2 s · `/big` 64 KiB JSON ·
/// `/fail` 500 · `/busy` 503 · `/headers` echoes `x-token` · `/redirect-private`
/// 307 → 10.0.0.1 · `/redirect-localhost` 307 → localhost · `/redirect-home` 307 →
/// `/execute` · `/nolength` JSON without Content-Length.
pub async fn serve() -> SocketAddr {
    serve_on("127.0.0.1").await
}

/// [`serve`] on another loopback address (e.g. `127.0.0.2`).
pub async fn serve_on(ip: &str) -> SocketAddr {
    let listener = TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(conn(stream, addr));
        }
    });
    addr
}

async fn conn(stream: TcpStream, addr: SocketAddr) {
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let mut len = 0usize;
        let mut token = String::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).await.unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("x-token:") {
                token = h[8..].trim().to_owned();
            }
        }
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).await.is_err() {
            return;
        }
        let body = String::from_utf8_lossy(&body).into_owned();
        let port = addr.port();
        let (status, ctype, payload, extra) = match path.as_str() {
            "/execute" => (
                "200 OK",
                "application/json",
                format!("{{\"echo\":{body}}}"),
                String::new(),
            ),
            "/html" => ("200 OK", "text/html", "<html></html>".into(), String::new()),
            "/slow" => {
                tokio::time::sleep(Duration::from_secs(2)).await;
                ("200 OK", "application/json", "{}".into(), String::new())
            }
            "/big" => (
                "200 OK",
                "application/json",
                format!("\"{}\"", "x".repeat(64 * 1024)),
                String::new(),
            ),
            "/fail" => (
                "500 Internal Server Error",
                "application/json",
                "{}".into(),
                String::new(),
            ),
            "/busy" => (
                "503 Service Unavailable",
                "application/json",
                "{}".into(),
                String::new(),
            ),
            "/headers" => (
                "200 OK",
                "application/json",
                format!("{{\"token\":\"{token}\"}}"),
                String::new(),
            ),
            "/redirect-private" => (
                "307 Temporary Redirect",
                "text/plain",
                String::new(),
                "Location: http://10.0.0.1/execute\r\n".into(),
            ),
            "/redirect-localhost" => (
                "307 Temporary Redirect",
                "text/plain",
                String::new(),
                format!("Location: http://localhost:{port}/execute\r\n"),
            ),
            "/redirect-home" => (
                "307 Temporary Redirect",
                "text/plain",
                String::new(),
                "Location: /execute\r\n".into(),
            ),
            "/nolength" => {
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n";
                let mut s = reader.into_inner();
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s
                    .write_all(format!("\"{}\"", "y".repeat(64 * 1024)).as_bytes())
                    .await;
                return;
            }
            _ => (
                "404 Not Found",
                "application/json",
                "{}".into(),
                String::new(),
            ),
        };
        let resp = format!(
            "HTTP/1.1 {status}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n{extra}\r\n{payload}",
            payload.len()
        );
        if reader.get_mut().write_all(resp.as_bytes()).await.is_err() {
            return;
        }
    }
}
