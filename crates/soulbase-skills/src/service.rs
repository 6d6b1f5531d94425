//! The example `search_logs` HTTP service the repository's `skills/search_logs.yaml`
//! points at (seed 001's HTTP provider contract: `POST /execute` with the
//! arguments as JSON, a JSON result back). A deliberately tiny HTTP/1.1 server on
//! Tokio — enough for the example and for tests, with no web framework.
//!
//! Routes: `POST /execute` searches a small built-in log corpus by `namespace`,
//! `pod` and optional `keyword` and answers `{"lines": [...]}`; `POST /text`
//! answers a `text/plain` body (to show the executor refusing non-JSON);
//! `GET /healthz` answers `ok`. It checks `Authorization: Bearer <token>` when
//! started with a token.

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The largest request accepted, in bytes.
const MAX_REQUEST: usize = 64 * 1024;

const LOGS: &[(&str, &str, &str)] = &[
    ("default", "web-0", "GET /index.html 200 3ms"),
    ("default", "web-0", "GET /missing 404 1ms"),
    ("default", "web-0", "ERROR upstream timeout after 30s"),
    ("default", "web-1", "GET /index.html 200 2ms"),
    ("payments", "api-0", "charge ok id=ch_1"),
    ("payments", "api-0", "ERROR card declined id=ch_2"),
];

/// Searches the corpus.
pub fn search(args: &Value) -> Result<Value, String> {
    let field = |k: &str| args.get(k).and_then(Value::as_str);
    let ns = field("namespace").ok_or("namespace is required")?;
    let pod = field("pod").ok_or("pod is required")?;
    let kw = field("keyword").unwrap_or("");
    let lines: Vec<&str> = LOGS
        .iter()
        .filter(|(n, p, l)| *n == ns && *p == pod && l.contains(kw))
        .map(|(_, _, l)| *l)
        .collect();
    Ok(json!({ "lines": lines }))
}

/// Serves connections from `listener` until the task is dropped. `token`, when
/// given, is required as `Authorization: Bearer <token>`.
pub async fn serve(listener: TcpListener, token: Option<String>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        // Answers go out in several writes; without this each may wait for the
        // client's delayed ACK.
        let _ = stream.set_nodelay(true);
        let token = token.clone();
        tokio::spawn(async move {
            let _ = handle(stream, token.as_deref()).await;
        });
    }
}

async fn handle(mut stream: TcpStream, token: Option<&str>) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > MAX_REQUEST {
            return respond(&mut stream, 413, "text/plain", "too large").await;
        }
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or_default().to_owned();
    let mut content_length = 0usize;
    let mut auth = None;
    for l in lines {
        if let Some((k, v)) = l.split_once(':') {
            match k.trim().to_ascii_lowercase().as_str() {
                "content-length" => content_length = v.trim().parse().unwrap_or(0),
                "authorization" => auth = Some(v.trim().to_owned()),
                _ => {}
            }
        }
    }
    if content_length > MAX_REQUEST {
        return respond(&mut stream, 413, "text/plain", "too large").await;
    }
    while buf.len() < header_end + content_length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = &buf[header_end..buf.len().min(header_end + content_length)];
    let mut parts = request_line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if let Some(t) = token
        && auth.as_deref() != Some(&format!("Bearer {t}"))
        && path != "/healthz"
    {
        return respond(
            &mut stream,
            401,
            "application/json",
            r#"{"error":"unauthorized"}"#,
        )
        .await;
    }
    match (method, path) {
        ("GET", "/healthz") => respond(&mut stream, 200, "text/plain", "ok").await,
        ("POST", "/text") => respond(&mut stream, 200, "text/plain", "not json").await,
        ("POST", "/execute") => {
            let args: Value = match serde_json::from_slice(body) {
                Ok(v) => v,
                Err(e) => {
                    let msg = json!({"error": format!("invalid JSON: {e}")}).to_string();
                    return respond(&mut stream, 400, "application/json", &msg).await;
                }
            };
            match search(&args) {
                Ok(v) => respond(&mut stream, 200, "application/json", &v.to_string()).await,
                Err(e) => {
                    let msg = json!({ "error": e }).to_string();
                    respond(&mut stream, 400, "application/json", &msg).await
                }
            }
        }
        _ => respond(&mut stream, 404, "text/plain", "not found").await,
    }
}

async fn respond(
    stream: &mut TcpStream,
    status: u16,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Payload Too Large",
    };
    let msg = format!(
        "HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(msg.as_bytes()).await?;
    stream.shutdown().await
}
