//! Load as clients make it, against a real `soulbased` process and a bare floor
//! server measured in the same run (`mcp_load`, `http_load`).
//!
//! The client is a plain HTTP/1.1 one, as hyper, reqwest and curl are on the
//! wire: keep-alive connections, `TCP_NODELAY` on, each request one write, one
//! request in flight per connection. One thread drives every connection (as
//! `wrk -t1`), so the client takes at most one of the machine's cores.
//!
//! Per server and round, after a 1 s warm-up:
//! - saturated: every connection sends its next call as soon as the last one
//!   returned, for `BENCH_SECONDS` (default 3) — calls/s, p50/p99;
//! - the same with the client's Nagle left on and its ACKs delayed (quick ACKs
//!   off before every read), as the plainest socket client does;
//! - paced, open loop: calls offered at fixed rates (`BENCH_RATES`, default
//!   200,1000,5000 calls/s) for `BENCH_PACED_SECONDS` (default 3) each, whatever
//!   the server's pace; each call is timed from when it was due, so a call that
//!   waited for a free connection counts its wait (no coordinated omission) —
//!   p50/p99/max and the rate achieved.
//!
//! Every phase also reports the server's CPU time per 1,000 calls (utime + stime
//! of its process from `/proc/<pid>/stat`, before and after) and the client's.
//! For the governed server "after" is once the phase's evidence is in its store
//! (`soulbase_evidence_queue_depth` 0 on `/metrics`; the time that took is
//! printed): the drain lags behind a saturated phase, and its catching up would
//! otherwise be counted in the next phase's CPU and disturb its latencies. So
//! each phase pays for its own evidence, and each starts on a server with nothing
//! left to do (the warm-up is drained too).
//! Every response is checked; a failed, refused or missing call fails the bench.
//!
//! The floor — the same protocol with nothing behind it — is served by this bench
//! binary itself, re-executed with `BENCH_ROLE` set, so it is a process of its own
//! built with the same profile and allocator. Floor and governed server run
//! alternately in `BENCH_ROUNDS` rounds (default 3; each round starts both afresh,
//! the order alternating), and the summary gives medians and ranges over rounds and
//! the ratios governed/floor of each round.
//!
//! With `BENCH_DURABLE_FLOOR=1` each round also runs a third server: the same
//! floor, but each call answered only once it is on disk (`floor+fsync`: a
//! journal written by one thread, one `pwrite` and `fdatasync` per round of the
//! calls queued meanwhile, the file zero-filled ahead as the spool's segments
//! are). It is what any server that answers only after a durable write pays, and
//! nothing else, so the summary also gives the governed server's ratios to it:
//! how far the governed call is from durability's own price on this disk.
//!
//! `BENCH_CONNECTIONS` (default 32) sets the connections; for MCP they share
//! `BENCH_SESSIONS` (default 8) sessions. The governed server runs the
//! development-like configuration of `mcp_call` (the embedded SQLite store, `sync`
//! evidence in a temporary directory on disk; `BENCH_DURABILITY=async` for the
//! other mode).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs, dead_code)]

#[path = "../../tests/common/mod.rs"]
mod server;

mod journal;

use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The surfaces driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Surface {
    /// MCP `tools/call` over streamable HTTP (`POST /mcp`).
    Mcp,
    /// The HTTP/JSON API's invoke (`POST /api/tools/{id}/invoke`).
    Http,
}

impl Surface {
    fn name(self) -> &'static str {
        match self {
            Surface::Mcp => "mcp tools/call",
            Surface::Http => "http invoke",
        }
    }

    fn role(self) -> &'static str {
        match self {
            Surface::Mcp => "floor-mcp",
            Surface::Http => "floor-http",
        }
    }

    fn from_role(role: &str) -> Option<Surface> {
        [Surface::Mcp, Surface::Http]
            .into_iter()
            .find(|s| s.role() == role)
    }
}

/// The servers a round loads, each a process of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The bare protocol floor.
    Floor,
    /// The floor answering each call once it is on disk (`BENCH_DURABLE_FLOOR`).
    DurableFloor,
    /// `soulbased`.
    Governed,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::Floor => "floor",
            Kind::DurableFloor => "floor+fsync",
            Kind::Governed => "governed",
        }
    }
}

/// The tool called and its arguments (the builtin echo).
const TOOL: &str = "soulbase.builtin.echo";
const ARGS: &str = r#"{"text":"hello","n":1}"#;
/// The MCP protocol version the client speaks (sessions, as most clients today).
const MCP_VERSION: &str = "2025-06-18";
/// How long one call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Unmeasured load before the measured phases.
const WARM_UP: Duration = Duration::from_secs(1);
/// Longest the governed server may take to drain a phase's evidence into its store.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// The governed server's configuration: as `mcp_call`'s (development headers, one
/// rule letting tenant `acme` call every tool).
const GOVERNED_CONFIG: &str = r#"
server:
  dev_insecure: true
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"] }
"#;

/// A numeric knob from the environment (unset or not a number: the default).
fn env_num(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------
// Servers

/// A server under load: its address and process.
enum Target {
    Governed(server::Server),
    Floor { child: Child, addr: String },
}

impl Target {
    fn start(kind: Kind, surface: Surface) -> Target {
        if kind != Kind::Governed {
            Self::start_floor(surface, kind == Kind::DurableFloor)
        } else {
            let mut config = GOVERNED_CONFIG.to_owned();
            if let Ok(d) = std::env::var("BENCH_DURABILITY") {
                config.push_str(&format!("evidence:\n  durability: {d}\n"));
            }
            Target::Governed(server::Server::start(&config))
        }
    }

    /// Re-executes this bench binary as the floor server; its first line on stdout
    /// is its address. It exits when its stdin closes (this process gone).
    /// `durable`: each call is answered once it is on disk.
    fn start_floor(surface: Surface, durable: bool) -> Target {
        let mut command = Command::new(std::env::current_exe().unwrap());
        // Set or taken away: the bare floor stays bare whatever this process's
        // environment holds.
        if durable {
            command.env(journal::ENV, "1");
        } else {
            command.env_remove(journal::ENV);
        }
        let mut child = command
            .env("BENCH_ROLE", surface.role())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("floor listening on ")
            .unwrap_or_else(|| panic!("the floor server did not start: {line:?}"))
            .to_owned();
        Target::Floor { child, addr }
    }

    fn addr(&self) -> &str {
        match self {
            Target::Governed(s) => &s.http,
            Target::Floor { addr, .. } => addr,
        }
    }

    fn pid(&self) -> u32 {
        match self {
            Target::Governed(s) => s.pid(),
            Target::Floor { child, .. } => child.id(),
        }
    }
}

/// Waits until every evidence record the governed server accepted is in its store
/// (`soulbase_evidence_queue_depth` 0 on `/metrics`) and returns how long that
/// took; `None` for the floor, which keeps no evidence.
async fn drained(target: &Target) -> Option<Duration> {
    let Target::Governed(governed) = target else {
        return None;
    };
    let started = Instant::now();
    loop {
        let depth = server::metric(&governed.http, "soulbase_evidence_queue_depth").await;
        if depth.is_some_and(|d| d < 0.5) {
            return Some(started.elapsed());
        }
        assert!(
            started.elapsed() < DRAIN_TIMEOUT,
            "the governed server's evidence queue is at {depth:?} after {DRAIN_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Target::Floor { child, .. } = self {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs the floor server named by `role` until its stdin closes.
fn serve_floor(role: &str) {
    let surface = Surface::from_role(role).unwrap_or_else(|| panic!("unknown BENCH_ROLE {role}"));
    if std::env::var_os(journal::ENV).is_some() {
        // The governed server's data directory is a temporary one too.
        journal::open(&std::env::temp_dir());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("floor listening on {}", listener.local_addr().unwrap());
        let stop = tokio_util::sync::CancellationToken::new();
        let router = match surface {
            Surface::Mcp => floor::mcp_router(stop.clone()),
            Surface::Http => floor::http_router(),
        };
        // Nagle off on accepted sockets, as soulbased's listener does.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let stopped = stop.clone();
        tokio::spawn(async move {
            // Stdin closes when the bench process is gone.
            let mut sink = Vec::new();
            let _ = tokio::io::stdin().read_to_end(&mut sink).await;
            stopped.cancel();
        });
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await
            .unwrap();
    });
}

/// The floors: the protocol and nothing behind it.
mod floor {
    use std::sync::Arc;

    use axum::body::Bytes;
    use axum::response::{IntoResponse, Response};
    use rmcp::model::{
        CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ServerCapabilities,
        ServerConfig,
    };
    use rmcp::service::RequestContext;
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };
    use rmcp::{ErrorData, RoleServer, ServerHandler};
    use serde_json::{Value, json};
    use tokio_util::sync::CancellationToken;

    use super::journal;

    /// A bare rmcp server whose one tool echoes its arguments, answered as
    /// Soulbase answers (text and structured content).
    #[derive(Clone)]
    struct Echo;

    impl ServerHandler for Echo {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }

        async fn call_tool(
            &self,
            request: CallToolRequestParams,
            _context: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, ErrorData> {
            let out = json!({ "echo": request.arguments.map_or(Value::Null, Value::Object) });
            let text = out.to_string();
            journal::record(text.as_bytes()).await;
            let mut r = CallToolResult::success(vec![ContentBlock::text(text)]);
            r.structured_content = Some(out);
            Ok(r.into())
        }
    }

    /// `/mcp` served by rmcp's streamable HTTP service with the settings
    /// soulbased uses (stateful sessions, a local session manager).
    pub fn mcp_router(stop: CancellationToken) -> axum::Router {
        let config = StreamableHttpServerConfig::default().with_cancellation_token(stop);
        let service = StreamableHttpService::new(
            || Ok(Echo),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        axum::Router::new().route_service("/mcp", service)
    }

    /// An axum handler answering the invoke route with the shape of a call result.
    pub fn http_router() -> axum::Router {
        async fn invoke(
            axum::extract::Path(id): axum::extract::Path<String>,
            body: Bytes,
        ) -> Response {
            let args: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let result = json!({
                "call_id": "floor", "status": "ok", "tool": id,
                "output": { "echo": args }, "replayed": false,
            });
            let body = serde_json::to_vec(&result).unwrap();
            journal::record(&body).await;
            ([(http::header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        axum::Router::new().route("/api/tools/{id}/invoke", axum::routing::post(invoke))
    }
}

// ---------------------------------------------------------------------------
// CPU time from /proc

/// Clock ticks per second of `/proc/<pid>/stat` times.
fn ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// User + system CPU time of process `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is field 3,
    // utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// CPU time of the server and of this (client) process over a phase.
struct Cpu {
    server: u32,
    hz: f64,
    at: (u64, u64),
}

impl Cpu {
    fn start(server: u32, hz: f64) -> Cpu {
        Cpu {
            server,
            hz,
            at: (cpu_ticks(server), cpu_ticks(std::process::id())),
        }
    }

    /// (server, client) CPU milliseconds since `start`.
    fn ms(&self) -> (f64, f64) {
        let ms = |t: u64| t as f64 * 1000.0 / self.hz;
        (
            ms(cpu_ticks(self.server) - self.at.0),
            ms(cpu_ticks(std::process::id()) - self.at.1),
        )
    }
}

// ---------------------------------------------------------------------------
// The client

/// One HTTP/1.1 response: the parts the checks read.
struct Response {
    status: u16,
    event_stream: bool,
    session: Option<String>,
    body: Vec<u8>,
}

fn io_err(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A keep-alive HTTP/1.1 connection.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Where the unread bytes of `buf` start.
    start: usize,
    /// Nagle on and quick ACKs off (a plain socket client).
    plain: bool,
}

impl Conn {
    async fn connect(addr: &str) -> std::io::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: Vec::with_capacity(16 * 1024),
            start: 0,
            plain: false,
        })
    }

    /// Leaves Nagle on and delays ACKs (`plain`), or sets `TCP_NODELAY`.
    fn set_plain(&mut self, plain: bool) -> std::io::Result<()> {
        self.stream.set_nodelay(!plain)?;
        self.plain = plain;
        Ok(())
    }

    /// Reads more bytes into the buffer.
    async fn fill(&mut self) -> std::io::Result<()> {
        if self.plain {
            // Linux turns quick ACKs back on by itself: off again before each read.
            socket2::SockRef::from(&self.stream).set_tcp_quickack(false)?;
        }
        if self.start == self.buf.len() {
            self.buf.clear();
            self.start = 0;
        } else if self.start > 8 * 1024 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        self.buf.reserve(16 * 1024);
        if self.stream.read_buf(&mut self.buf).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(())
    }

    /// The index just past the next CRLF-terminated line, reading as needed.
    async fn line_end(&mut self) -> std::io::Result<usize> {
        loop {
            if let Some(i) = find(&self.buf[self.start..], b"\r\n") {
                return Ok(self.start + i);
            }
            self.fill().await?;
        }
    }

    /// Sends `request` (one write) and reads the whole response.
    async fn exchange(&mut self, request: &[u8]) -> std::io::Result<Response> {
        self.stream.write_all(request).await?;
        let head_end = loop {
            if let Some(i) = find(&self.buf[self.start..], b"\r\n\r\n") {
                break self.start + i;
            }
            self.fill().await?;
        };
        let head = std::str::from_utf8(&self.buf[self.start..head_end])
            .map_err(|e| io_err(e.to_string()))?;
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io_err("no status line"))?;
        let (mut length, mut chunked, mut event_stream, mut session) = (0, false, false, None);
        for l in lines {
            let Some((k, v)) = l.split_once(':') else {
                continue;
            };
            let v = v.trim();
            if k.eq_ignore_ascii_case("content-length") {
                length = v.parse().map_err(|_| io_err("bad content-length"))?;
            } else if k.eq_ignore_ascii_case("transfer-encoding") {
                chunked = v.eq_ignore_ascii_case("chunked");
            } else if k.eq_ignore_ascii_case("content-type") {
                event_stream = v.starts_with("text/event-stream");
            } else if k.eq_ignore_ascii_case("mcp-session-id") {
                session = Some(v.to_owned());
            }
        }
        self.start = head_end + 4;
        let mut body = Vec::new();
        if chunked {
            loop {
                let end = self.line_end().await?;
                let size_text = std::str::from_utf8(&self.buf[self.start..end])
                    .map_err(|e| io_err(e.to_string()))?;
                let size_text = size_text.split(';').next().unwrap_or("").trim();
                let size =
                    usize::from_str_radix(size_text, 16).map_err(|_| io_err("bad chunk size"))?;
                self.start = end + 2;
                // The chunk and its CRLF (for the last, empty chunk: the final CRLF).
                while self.buf.len() - self.start < size + 2 {
                    self.fill().await?;
                }
                body.extend_from_slice(&self.buf[self.start..self.start + size]);
                self.start += size + 2;
                if size == 0 {
                    break;
                }
            }
        } else {
            while self.buf.len() - self.start < length {
                self.fill().await?;
            }
            body.extend_from_slice(&self.buf[self.start..self.start + length]);
            self.start += length;
        }
        Ok(Response {
            status,
            event_stream,
            session,
            body,
        })
    }
}

/// The JSON-RPC message with `id` in an MCP response: the body, or one of the
/// `data:` lines of an event stream.
fn rpc_message(resp: &Response, id: u64) -> Result<Value, String> {
    let text = std::str::from_utf8(&resp.body).map_err(|e| e.to_string())?;
    let candidates: Vec<&str> = if resp.event_stream {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .filter(|d| !d.is_empty())
            .collect()
    } else {
        vec![text]
    };
    candidates
        .into_iter()
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|m| m["id"] == json!(id))
        .ok_or_else(|| format!("no JSON-RPC message with id {id} in {text:?}"))
}

/// A client connection with the request head it sends (MCP: its session).
struct Client {
    conn: Conn,
    /// The request line and headers, up to (not including) `content-length`.
    head: String,
    surface: Surface,
    broken: bool,
}

impl Client {
    fn head(surface: Surface, addr: &str, session: Option<&str>) -> String {
        let mut head = match surface {
            Surface::Mcp => "POST /mcp HTTP/1.1\r\n".to_owned(),
            Surface::Http => format!("POST /api/tools/{TOOL}/invoke HTTP/1.1\r\n"),
        };
        head.push_str(&format!(
            "host: {addr}\r\ncontent-type: application/json\r\nx-soulbase-tenant: acme\r\nx-soulbase-actor: bench\r\n"
        ));
        if surface == Surface::Mcp {
            head.push_str("accept: application/json, text/event-stream\r\n");
            if let Some(s) = session {
                head.push_str(&format!(
                    "mcp-session-id: {s}\r\nmcp-protocol-version: {MCP_VERSION}\r\n"
                ));
            }
        }
        head
    }

    fn request(&self, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::with_capacity(self.head.len() + body.len() + 32);
        r.extend_from_slice(self.head.as_bytes());
        r.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
        r.extend_from_slice(body);
        r
    }

    /// A new connection; for MCP, on `session` or (`None`) a new session
    /// initialized on it. Returns the client and its session.
    async fn connect(surface: Surface, addr: &str, session: Option<String>) -> (Client, String) {
        let conn = Conn::connect(addr).await.unwrap();
        let mut c = Client {
            conn,
            head: Client::head(surface, addr, session.as_deref()),
            surface,
            broken: false,
        };
        if surface == Surface::Http {
            return (c, String::new());
        }
        if let Some(s) = session {
            return (c, s);
        }
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": MCP_VERSION, "capabilities": {},
            "clientInfo": {"name": "soulbase-bench", "version": "0"}}});
        let req = c.request(init.to_string().as_bytes());
        let resp = c.conn.exchange(&req).await.unwrap();
        assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
        let msg = rpc_message(&resp, 0).unwrap();
        assert!(msg.get("result").is_some(), "initialize: {msg}");
        let session = resp.session.expect("no mcp-session-id");
        c.head = Client::head(surface, addr, Some(&session));
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let req = c.request(note.to_string().as_bytes());
        let resp = c.conn.exchange(&req).await.unwrap();
        assert_eq!(resp.status, 202, "{}", String::from_utf8_lossy(&resp.body));
        (c, session)
    }

    /// One call, its response checked.
    async fn call(&mut self, id: u64) -> Result<(), String> {
        let body = match self.surface {
            Surface::Mcp => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{TOOL}","arguments":{ARGS}}}}}"#
            ),
            Surface::Http => ARGS.to_owned(),
        };
        let req = self.request(body.as_bytes());
        let resp = tokio::time::timeout(CALL_TIMEOUT, self.conn.exchange(&req))
            .await
            .map_err(|_| format!("no answer within {CALL_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        let text = || String::from_utf8_lossy(&resp.body).into_owned();
        if resp.status != 200 {
            return Err(format!("status {}: {}", resp.status, text()));
        }
        match self.surface {
            Surface::Mcp => {
                let msg = rpc_message(&resp, id)?;
                if msg.get("error").is_some() {
                    return Err(format!("JSON-RPC error: {msg}"));
                }
                let result = msg
                    .get("result")
                    .ok_or_else(|| format!("no result: {msg}"))?;
                if result["isError"] != json!(false) {
                    return Err(format!("tool error: {msg}"));
                }
            }
            Surface::Http => {
                let v: Value = serde_json::from_slice(&resp.body).map_err(|e| e.to_string())?;
                if v["status"] != json!("ok") || v.get("output").is_none() {
                    return Err(format!("not ok: {v}"));
                }
            }
        }
        Ok(())
    }
}

/// Opens `n` connections to `addr`; for MCP, `sessions` sessions shared round-robin.
async fn connect_all(surface: Surface, addr: &str, n: usize, sessions: usize) -> Vec<Client> {
    let mut clients: Vec<Client> = Vec::with_capacity(n);
    let mut ids: Vec<String> = Vec::new();
    for i in 0..n {
        let existing = ids.get(i % sessions.max(1)).cloned();
        let (c, s) = Client::connect(surface, addr, existing).await;
        if ids.len() < sessions {
            ids.push(s);
        }
        clients.push(c);
    }
    clients
}

// ---------------------------------------------------------------------------
// Phases

/// What one phase measured.
struct Phase {
    calls: usize,
    failures: usize,
    elapsed: Duration,
    latency: soulbase_testkit::Percentiles,
    /// Server and client CPU milliseconds per 1,000 calls.
    server_cpu: f64,
    client_cpu: f64,
}

impl Phase {
    fn rate(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64()
    }

    fn new(
        name: &str,
        samples: Vec<Duration>,
        failures: usize,
        elapsed: Duration,
        cpu: &Cpu,
        drain: Option<Duration>,
    ) -> Phase {
        let (server, client) = cpu.ms();
        let calls = samples.len();
        let latency = soulbase_testkit::report(name, samples);
        let per_k = |ms: f64| ms * 1000.0 / calls.max(1) as f64;
        let p = Phase {
            calls,
            failures,
            elapsed,
            latency,
            server_cpu: per_k(server),
            client_cpu: per_k(client),
        };
        let drain = drain.map_or(String::new(), |d| {
            format!(
                "; evidence in the store {:.0} ms after the last call",
                ms(d)
            )
        });
        println!(
            "{:<40} {:.0} calls/s ({calls} calls in {elapsed:.2?}, {failures} failed); CPU per 1,000 calls: server {:.1} ms, client {:.1} ms{drain}",
            "",
            p.rate(),
            p.server_cpu,
            p.client_cpu,
        );
        p
    }
}

/// Next JSON-RPC id (the client is single-threaded).
fn next_id(ids: &Cell<u64>) -> u64 {
    let id = ids.get();
    ids.set(id + 1);
    id
}

/// Every usable connection sends its next call as soon as the last returned,
/// until `window` has passed.
async fn saturated(
    clients: &mut [Client],
    ids: &Cell<u64>,
    window: Duration,
) -> (Vec<Duration>, usize, Duration) {
    let started = Instant::now();
    let deadline = started + window;
    let per_conn = join_all(
        clients
            .iter_mut()
            .filter(|c| !c.broken)
            .map(|c| async move {
                let mut samples = Vec::new();
                let mut failures = 0;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match c.call(next_id(ids)).await {
                        Ok(()) => samples.push(t.elapsed()),
                        Err(e) => {
                            eprintln!("call failed: {e}");
                            failures += 1;
                            c.broken = true;
                            break;
                        }
                    }
                }
                (samples, failures)
            }),
    )
    .await;
    let elapsed = started.elapsed();
    let mut all = Vec::new();
    let mut failures = 0;
    for (s, f) in per_conn {
        all.extend(s);
        failures += f;
    }
    (all, failures, elapsed)
}

/// Open loop: `rate` calls/s offered for `secs`, each due at its scheduled time
/// (a pacer thread releases them) and timed from then; any free connection takes
/// the next call due.
async fn paced(
    clients: &mut [Client],
    ids: &Cell<u64>,
    rate: u64,
    secs: u64,
) -> (Vec<Duration>, usize, Duration) {
    let n = rate * secs;
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let started = Instant::now() + Duration::from_millis(5);
    let pacer = std::thread::spawn(move || {
        for i in 0..n {
            let due = started + period.mul_f64(i as f64);
            let now = Instant::now();
            if due > now {
                std::thread::sleep(due - now);
            }
            if tx.send(due).is_err() {
                break;
            }
        }
    });
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let per_conn = join_all(clients.iter_mut().filter(|c| !c.broken).map(|c| {
        let rx = rx.clone();
        async move {
            let mut samples = Vec::new();
            let mut failures = 0;
            loop {
                let due = rx.lock().await.recv().await;
                let Some(due) = due else { break };
                match c.call(next_id(ids)).await {
                    Ok(()) => samples.push(due.elapsed()),
                    Err(e) => {
                        eprintln!("call failed: {e}");
                        failures += 1;
                        c.broken = true;
                        break;
                    }
                }
            }
            (samples, failures)
        }
    }))
    .await;
    let elapsed = started.elapsed();
    pacer.join().unwrap();
    let mut all = Vec::new();
    let mut failures = 0;
    for (s, f) in per_conn {
        all.extend(s);
        failures += f;
    }
    // Calls never made (every connection broken) fail too.
    failures += (n as usize).saturating_sub(all.len() + failures);
    (all, failures, elapsed)
}

/// The figures of one server in one round.
struct Round {
    saturated: Phase,
    plain: Phase,
    paced: Vec<(u64, Phase)>,
}

impl Round {
    fn failures(&self) -> usize {
        self.saturated.failures
            + self.plain.failures
            + self.paced.iter().map(|(_, p)| p.failures).sum::<usize>()
    }
}

struct Settings {
    connections: usize,
    sessions: usize,
    window: Duration,
    rates: Vec<u64>,
    paced_secs: u64,
    hz: f64,
}

/// Starts a server, loads it through every phase, stops it.
async fn one_round(surface: Surface, kind: Kind, s: &Settings) -> Round {
    let target = Target::start(kind, surface);
    let who = kind.label();
    let addr = target.addr().to_owned();
    let pid = target.pid();
    let mut clients = connect_all(surface, &addr, s.connections, s.sessions).await;
    let ids = Cell::new(1);
    let (_, warm_failures, _) = saturated(&mut clients, &ids, WARM_UP).await;
    assert_eq!(warm_failures, 0, "{who}: calls failed while warming up");
    drained(&target).await;

    let name = |what: &str| format!("{} {who}, {what}", surface.name());
    let cpu = Cpu::start(pid, s.hz);
    let (samples, failures, elapsed) = saturated(&mut clients, &ids, s.window).await;
    let drain = drained(&target).await;
    let sat = Phase::new(
        &name(&format!("{} conns saturated", s.connections)),
        samples,
        failures,
        elapsed,
        &cpu,
        drain,
    );

    for c in &mut clients {
        c.conn.set_plain(true).unwrap();
    }
    let cpu = Cpu::start(pid, s.hz);
    let (samples, failures, elapsed) = saturated(&mut clients, &ids, s.window).await;
    let drain = drained(&target).await;
    let plain = Phase::new(
        &name("saturated, client Nagle on"),
        samples,
        failures,
        elapsed,
        &cpu,
        drain,
    );
    for c in &mut clients {
        c.conn.set_plain(false).unwrap();
    }

    let mut paced_phases = Vec::new();
    for &rate in &s.rates {
        let cpu = Cpu::start(pid, s.hz);
        let (samples, failures, elapsed) = paced(&mut clients, &ids, rate, s.paced_secs).await;
        let drain = drained(&target).await;
        paced_phases.push((
            rate,
            Phase::new(
                &name(&format!("paced {rate}/s")),
                samples,
                failures,
                elapsed,
                &cpu,
                drain,
            ),
        ));
    }
    drop(clients);
    drop(target);
    Round {
        saturated: sat,
        plain,
        paced: paced_phases,
    }
}

/// Median and range of `v`, formatted with `f`.
fn spread(mut v: Vec<f64>, f: impl Fn(f64) -> String) -> String {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return "-".into();
    }
    format!("{} ({}–{})", f(v[v.len() / 2]), f(v[0]), f(v[v.len() - 1]))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The rounds of one kind of server.
fn of(runs: &[(Kind, Vec<Round>)], kind: Kind) -> Option<&[Round]> {
    runs.iter()
        .find(|(k, _)| *k == kind)
        .map(|(_, r)| r.as_slice())
}

fn summary(surface: Surface, s: &Settings, runs: &[(Kind, Vec<Round>)]) {
    let n = runs.first().map_or(0, |(_, r)| r.len());
    println!();
    println!(
        "{} — summary over {n} rounds: median (range)",
        surface.name()
    );
    let int = |x: f64| format!("{x:.0}");
    let one = |x: f64| format!("{x:.1}");
    let two = |x: f64| format!("{x:.2}");
    for (kind, rounds) in runs {
        let who = kind.label();
        let col = |f: &dyn Fn(&Round) -> f64| rounds.iter().map(f).collect::<Vec<_>>();
        println!(
            "  {who:<11} saturated ({} conns): {} calls/s, p50 {} ms, p99 {} ms, server CPU {} ms per 1,000 calls",
            s.connections,
            spread(col(&|r| r.saturated.rate()), int),
            spread(col(&|r| ms(r.saturated.latency.p50)), two),
            spread(col(&|r| ms(r.saturated.latency.p99)), two),
            spread(col(&|r| r.saturated.server_cpu), one),
        );
        println!(
            "  {who:<11} saturated, client Nagle on: {} calls/s, p50 {} ms, p99 {} ms",
            spread(col(&|r| r.plain.rate()), int),
            spread(col(&|r| ms(r.plain.latency.p50)), two),
            spread(col(&|r| ms(r.plain.latency.p99)), two),
        );
        for (i, rate) in s.rates.iter().enumerate() {
            println!(
                "  {who:<11} paced {rate}/s: achieved {}/s, p50 {} ms, p99 {} ms, max {} ms, server CPU {} ms per 1,000 calls",
                spread(col(&|r| r.paced[i].1.rate()), int),
                spread(col(&|r| ms(r.paced[i].1.latency.p50)), two),
                spread(col(&|r| ms(r.paced[i].1.latency.p99)), two),
                spread(col(&|r| ms(r.paced[i].1.latency.max)), two),
                spread(col(&|r| r.paced[i].1.server_cpu), one),
            );
        }
    }
    // Each pair's ratios, round by round: the governed server against each floor,
    // and what durability alone costs the floor.
    let pairs = [
        (Kind::Governed, Kind::Floor),
        (Kind::Governed, Kind::DurableFloor),
        (Kind::DurableFloor, Kind::Floor),
    ];
    for (over, under) in pairs {
        let (Some(top), Some(base)) = (of(runs, over), of(runs, under)) else {
            continue;
        };
        let ratio = |f: &dyn Fn(&Round) -> f64| {
            base.iter()
                .zip(top)
                .map(|(b, t)| f(t) / f(b))
                .collect::<Vec<_>>()
        };
        let name = format!("{}/{}", over.label(), under.label());
        println!(
            "  ratio {name}, same round: saturated calls/s {}; server CPU per call {}; client Nagle on calls/s {}",
            spread(ratio(&|r| r.saturated.rate()), two),
            spread(ratio(&|r| r.saturated.server_cpu), two),
            spread(ratio(&|r| r.plain.rate()), two),
        );
        for (i, rate) in s.rates.iter().enumerate() {
            println!(
                "  ratio {name}, paced {rate}/s: server CPU per call {}",
                spread(ratio(&|r| r.paced[i].1.server_cpu), two),
            );
        }
    }
}

/// The bench's `main`: the floor server when re-executed as one, else the rounds.
pub fn main(surface: Surface) {
    if let Ok(role) = std::env::var("BENCH_ROLE") {
        serve_floor(&role);
        return;
    }
    let rates = std::env::var("BENCH_RATES")
        .ok()
        .map(|v| v.split(',').filter_map(|r| r.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![200, 1000, 5000]);
    let s = Settings {
        connections: env_num("BENCH_CONNECTIONS", 32).max(1) as usize,
        sessions: env_num("BENCH_SESSIONS", 8).max(1) as usize,
        window: Duration::from_secs(env_num("BENCH_SECONDS", 3).max(1)),
        rates,
        paced_secs: env_num("BENCH_PACED_SECONDS", 3).max(1),
        hz: ticks_per_second(),
    };
    let rounds = env_num("BENCH_ROUNDS", 3).max(1);
    let mut kinds = vec![Kind::Floor, Kind::Governed];
    if env_num("BENCH_DURABLE_FLOOR", 0) != 0 {
        kinds.insert(1, Kind::DurableFloor);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut runs: Vec<(Kind, Vec<Round>)> = kinds.iter().map(|&k| (k, Vec::new())).collect();
    rt.block_on(async {
        for round in 0..rounds {
            println!("round {}/{rounds}", round + 1);
            // Alternate the order, so a drift in the machine's speed favours none.
            let mut order = kinds.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for kind in order {
                let r = one_round(surface, kind, &s).await;
                if let Some((_, rounds)) = runs.iter_mut().find(|(k, _)| *k == kind) {
                    rounds.push(r);
                }
            }
        }
    });
    summary(surface, &s, &runs);
    let failures: usize = runs.iter().flat_map(|(_, r)| r).map(Round::failures).sum();
    assert_eq!(failures, 0, "{failures} calls failed or were never made");
}
