//! No Nagle stalls: a client as plain as they come — a blocking socket with Nagle
//! left on (the default) that delays its ACKs (`TCP_QUICKACK` off before every
//! read) — makes calls one at a time to a real `soulbased` on loopback: their
//! median stays under 10 ms and at most two (a loaded machine's scheduling) take as
//! long as a stall. Without `TCP_NODELAY` on the server's accepted socket a
//! response written in several small writes waits for this client's delayed ACK
//! (~40 ms) before its last part goes out. (Measured without it: every MCP call
//! 44–48 ms; an HTTP invoke's response is one write and did not stall.)
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{DEV_CONFIG, Server};

use serde_json::{Value, json};

/// Calls per surface; each must take less than [`BOUND`].
const CALLS: usize = 50;
/// What a call takes without a stall, at the median.
const BOUND: Duration = Duration::from_millis(10);
/// A Nagle / delayed-ACK stall: every exchange then waits ≈ 40 ms. On a shared,
/// loaded machine a few calls can be slow for other reasons (scheduling), so the test
/// allows [`SLOW_ALLOWED`] calls this slow — a stall makes every call this slow.
const STALL: Duration = Duration::from_millis(35);
const SLOW_ALLOWED: usize = 2;

/// One HTTP/1.1 response: status, headers (names lower-cased), body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A keep-alive HTTP/1.1 connection over a plain `std` socket: Nagle on, and
/// delayed ACKs (quick ACKs turned off before each read, as Linux turns them
/// back on by itself).
struct Client {
    sock: TcpStream,
    buf: Vec<u8>,
    host: String,
}

impl Client {
    fn connect(addr: &str) -> Client {
        let sock = TcpStream::connect(addr).unwrap();
        assert!(!sock.nodelay().unwrap(), "the client must leave Nagle on");
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Client {
            sock,
            buf: Vec::new(),
            host: addr.to_owned(),
        }
    }

    /// Sends one request (one write) and reads the whole response.
    fn request(&mut self, path: &str, headers: &[(&str, &str)], body: &Value) -> Response {
        let body = serde_json::to_vec(body).unwrap();
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
            self.host,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(&body);
        self.sock.write_all(&bytes).unwrap();
        self.read_response()
    }

    /// Reads more bytes into the buffer (with quick ACKs off).
    fn fill(&mut self) {
        socket2::SockRef::from(&self.sock)
            .set_tcp_quickack(false)
            .unwrap();
        let mut chunk = [0u8; 16384];
        let n = self.sock.read(&mut chunk).unwrap();
        assert!(n > 0, "the server closed the connection");
        self.buf.extend_from_slice(&chunk[..n]);
    }

    /// Takes one line (without CRLF) from the buffer, reading as needed.
    fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8(self.buf[..i].to_vec()).unwrap();
                self.buf.drain(..i + 2);
                return line;
            }
            self.fill();
        }
    }

    /// Takes `n` bytes from the buffer, reading as needed.
    fn take(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            self.fill();
        }
        self.buf.drain(..n).collect()
    }

    fn read_response(&mut self) -> Response {
        let status_line = self.line();
        let status = status_line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut headers = Vec::new();
        loop {
            let l = self.line();
            if l.is_empty() {
                break;
            }
            let (k, v) = l.split_once(':').unwrap();
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
        }
        let mut resp = Response {
            status,
            headers,
            body: Vec::new(),
        };
        if resp.header("transfer-encoding") == Some("chunked") {
            loop {
                let size = usize::from_str_radix(self.line().trim(), 16).unwrap();
                let chunk = self.take(size);
                assert!(self.line().is_empty());
                if size == 0 {
                    break;
                }
                resp.body.extend_from_slice(&chunk);
            }
        } else {
            let len = resp.header("content-length").unwrap().parse().unwrap();
            resp.body = self.take(len);
        }
        resp
    }
}

/// The JSON-RPC message in a response body: plain JSON, or the `data:` lines of
/// an event stream.
fn message(resp: &Response) -> Value {
    let text = String::from_utf8(resp.body.clone()).unwrap();
    if resp
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream"))
    {
        let data = text
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim)
            .find(|d| !d.is_empty())
            .unwrap();
        serde_json::from_str(data).unwrap()
    } else {
        serde_json::from_str(&text).unwrap()
    }
}

/// Untimed calls first: a server's first calls do one-time work (lazy
/// initialization, a first spool segment) that is not what this test is about.
const WARM_UP: usize = 5;

/// Makes [`WARM_UP`] calls of `call`, then times `CALLS` more one after another,
/// and asserts none of them stalled: the median under [`BOUND`], at most
/// [`SLOW_ALLOWED`] as slow as a stall.
fn assert_no_stall(what: &str, mut call: impl FnMut(usize)) {
    (0..WARM_UP).for_each(&mut call);
    let mut took: Vec<Duration> = (WARM_UP..WARM_UP + CALLS)
        .map(|i| {
            let t = Instant::now();
            call(i);
            t.elapsed()
        })
        .collect();
    took.sort_unstable();
    let median = took[took.len() / 2];
    let stalled = took.iter().filter(|d| **d >= STALL).count();
    assert!(
        median < BOUND && stalled <= SLOW_ALLOWED,
        "{what}: median {median:?}, {stalled} of {CALLS} calls ≥ {STALL:?} (slowest {:?})",
        took[took.len() - 1]
    );
}

/// One test at a time (they time calls), each against a server whose data
/// directory is on tmpfs when there is one: what is timed is the network path,
/// not the spool disk's fsyncs, which on a shared machine alone can exceed 10 ms.
fn start() -> (
    std::sync::MutexGuard<'static, ()>,
    Server,
    Option<tempfile::TempDir>,
) {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let data = tempfile::tempdir_in("/dev/shm").ok();
    let config = match &data {
        Some(d) => format!("{DEV_CONFIG}data_dir: {}\n", d.path().display()),
        None => DEV_CONFIG.to_owned(),
    };
    (turn, Server::start(&config), data)
}

const DEV: [(&str, &str); 2] = [("x-soulbase-tenant", "acme"), ("x-soulbase-actor", "agent")];

#[test]
fn mcp_calls_from_a_client_with_nagle_and_delayed_acks_do_not_stall() {
    let (_turn, server, _data) = start();
    let mut c = Client::connect(&server.http);
    let accept = ("accept", "application/json, text/event-stream");
    let mut headers = vec![DEV[0], DEV[1], accept];
    let init = c.request(
        "/mcp",
        &headers,
        &json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "nagle-test", "version": "0"}}}),
    );
    assert_eq!(init.status, 200);
    let session = init.header("mcp-session-id").unwrap().to_owned();
    headers.push(("mcp-session-id", &session));
    let note = c.request(
        "/mcp",
        &headers,
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    assert_eq!(note.status, 202);
    assert_no_stall("MCP tools/call", |i| {
        let resp = c.request(
            "/mcp",
            &headers,
            &json!({"jsonrpc": "2.0", "id": i + 1, "method": "tools/call", "params": {
                "name": "soulbase.builtin.echo", "arguments": {"i": i}}}),
        );
        assert_eq!(resp.status, 200);
        let msg = message(&resp);
        assert_eq!(msg["id"], json!(i + 1), "{msg}");
        assert_eq!(msg["result"]["isError"], json!(false), "{msg}");
    });
}

#[test]
fn http_invokes_from_a_client_with_nagle_and_delayed_acks_do_not_stall() {
    let (_turn, server, _data) = start();
    let mut c = Client::connect(&server.http);
    assert_no_stall("HTTP invoke", |i| {
        let resp = c.request(
            "/api/tools/soulbase.builtin.echo/invoke",
            &DEV,
            &json!({"i": i}),
        );
        assert_eq!(resp.status, 200, "{}", String::from_utf8_lossy(&resp.body));
    });
}
