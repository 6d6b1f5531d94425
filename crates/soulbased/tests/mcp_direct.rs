//! `tools/call`s answered in their HTTP request's own task (`soulbase_mcp`'s
//! `direct` module) against a real `soulbased`, as a client on the wire sees
//! them: a primed stream of their own (event ids `0/dN`, `2/dN`); rmcp's path
//! for a call that needs the session's worker (a progress token, a client that
//! declared sampling); the answer kept for a client that went away mid-call and
//! reconnects with `Last-Event-ID`; `notifications/cancelled` cancelling the
//! call (its End `cancelled`), as closing the session does; polling and a lost
//! answer resumed; and a session busy with nothing but direct calls never closed
//! as idle.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::{Duration, Instant};

use common::Server;
use serde_json::{Value, json};

/// One server-sent event.
#[derive(Debug, Default)]
struct Event {
    id: Option<String>,
    data: String,
    retry: Option<u64>,
}

impl Event {
    /// The JSON-RPC message the event carries.
    fn message(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// A response body read as server-sent events.
struct Sse {
    response: reqwest::Response,
    buf: String,
}

impl Sse {
    fn new(response: reqwest::Response) -> Self {
        assert_eq!(response.status(), 200);
        let kind = response.headers()["content-type"].to_str().unwrap();
        assert!(kind.starts_with("text/event-stream"), "{kind}");
        Self {
            response,
            buf: String::new(),
        }
    }

    /// The next event other than a keep-alive comment; `None` at the end of the
    /// body. At most 20 s.
    async fn next(&mut self) -> Option<Event> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut event = Event::default();
                let mut fields = false;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        event.id = Some(v.trim().to_owned());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        event.data.push_str(v.trim_start());
                    } else if let Some(v) = line.strip_prefix("retry:") {
                        event.retry = Some(v.trim().parse().unwrap());
                    } else {
                        continue;
                    }
                    fields = true;
                }
                if fields {
                    return Some(event);
                }
                continue;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = tokio::time::timeout(left, self.response.chunk())
                .await
                .expect("an event within 20 s")
                .unwrap()?;
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

/// `DEV_CONFIG` with `extra` under `server:`, tenant `acme` also reading its
/// evidence.
fn config(extra: &str) -> String {
    common::config_with(extra).replacen("reload]", "reload, read_evidence]", 1)
}

const ACME: [(&str, &str); 2] = [
    ("x-soulbase-tenant", "acme"),
    ("x-soulbase-actor", "direct"),
];

fn mcp(
    client: &reqwest::Client,
    server: &Server,
    method: reqwest::Method,
) -> reqwest::RequestBuilder {
    let mut req = client
        .request(method, format!("http://{}/mcp", server.http))
        .header("accept", "application/json, text/event-stream");
    for (k, v) in ACME {
        req = req.header(k, v);
    }
    req
}

/// A session whose client declared `capabilities`.
async fn open(client: &reqwest::Client, server: &Server, capabilities: Value) -> String {
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": capabilities,
            "clientInfo": {"name": "direct-test", "version": "1"}
        }
    });
    let r = mcp(client, server, reqwest::Method::POST)
        .header("content-type", "application/json")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_owned();
    let _ = r.text().await.unwrap();
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let r = send(client, server, &session, &initialized).await;
    assert_eq!(r.status(), 202);
    session
}

/// Posts `message` on `session`.
async fn send(
    client: &reqwest::Client,
    server: &Server,
    session: &str,
    message: &Value,
) -> reqwest::Response {
    mcp(client, server, reqwest::Method::POST)
        .header("content-type", "application/json")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .body(message.to_string())
        .send()
        .await
        .unwrap()
}

/// A `tools/call` of `tool` with `arguments` as request `id`, with `meta` as
/// its `_meta`.
fn call(id: u64, tool: &str, arguments: Value, meta: Value) -> Value {
    json!({
        "jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta}
    })
}

/// `INDEX/dN`: the event id of a direct stream's event `INDEX`; `N`.
fn direct_stream(id: &str, index: u8) -> Option<u64> {
    let (i, n) = id.split_once('/')?;
    (i == index.to_string()).then_some(())?;
    n.strip_prefix('d')?.parse().ok()
}

/// A direct call of the builtin sleep for `ms` as request `request`, evidence
/// call id `call_id`, on `session`: its stream, past the priming event, and that
/// event's id (checked to be a direct stream's).
async fn slow_call(
    client: &reqwest::Client,
    server: &Server,
    session: &str,
    request: u64,
    ms: u64,
    call_id: &str,
) -> (Sse, String) {
    let slow = call(
        request,
        "soulbase.builtin.sleep",
        json!({"ms": ms}),
        json!({"soulbase/callId": call_id}),
    );
    let mut sse = Sse::new(send(client, server, session, &slow).await);
    let priming = sse.next().await.unwrap().id.unwrap();
    assert!(direct_stream(&priming, 0).is_some(), "{priming}");
    (sse, priming)
}

/// The End record of call `call_id`, once it is in the store (at most 20 s).
async fn end_of(server: &Server, call_id: &str) -> Value {
    let path = format!("/api/evidence/{call_id}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, body) = common::http(&server.http, "GET", &path, &ACME, "").await;
        if status == 200 {
            let evidence: Value = serde_json::from_str(&body).unwrap();
            if let Some(e) = evidence["records"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["payload"]["event"] == "end")
            {
                return e["payload"].clone();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no End of {call_id}: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A plain call is answered on a stream of its own: a priming event (`0/dN`, a
/// retry, no data), then the answer (`2/dN`). A call with a progress token, and
/// any call of a client that declared sampling, take rmcp's path (its event
/// ids, the progress notifications).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_call_is_answered_on_a_primed_stream_of_its_own() {
    let server = Server::start(&config("  mcp_conformance_tools: true\n"));
    let client = reqwest::Client::new();
    let session = open(&client, &server, json!({})).await;

    let echo = call(7, "soulbase.builtin.echo", json!({"say": "hi"}), json!({}));
    let mut sse = Sse::new(send(&client, &server, &session, &echo).await);
    let priming = sse.next().await.unwrap();
    let n = direct_stream(priming.id.as_deref().unwrap(), 0).expect("a direct stream");
    assert_eq!(priming.data, "");
    assert!(priming.retry.is_some(), "{priming:?}");
    let answer = sse.next().await.unwrap();
    assert_eq!(direct_stream(answer.id.as_deref().unwrap(), 2), Some(n));
    let m = answer.message();
    assert_eq!(m["id"], 7, "{m}");
    assert_eq!(m["result"]["structuredContent"]["echo"]["say"], "hi", "{m}");
    assert!(m["result"].get("resultType").is_none(), "legacy shape: {m}");
    assert!(
        sse.next().await.is_none(),
        "the stream ends with its answer"
    );

    // A progress token: rmcp's path, with the progress on the call's stream.
    let progress = call(
        8,
        "test_tool_with_progress",
        json!({}),
        json!({"progressToken": "p"}),
    );
    let mut sse = Sse::new(send(&client, &server, &session, &progress).await);
    let mut notes = 0;
    let answer = loop {
        let e = sse.next().await.expect("an answer");
        assert!(
            direct_stream(e.id.as_deref().unwrap_or("0/0"), 0).is_none(),
            "{e:?}"
        );
        if e.data.is_empty() {
            continue;
        }
        let m = e.message();
        if m["method"] == "notifications/progress" {
            notes += 1;
        } else {
            break m;
        }
    };
    assert!(notes >= 3, "{notes} progress notifications");
    assert_eq!(answer["id"], 8, "{answer}");
    assert_eq!(answer["result"]["isError"], false, "{answer}");

    // A client that can be asked things: rmcp's path for every call.
    let asking = open(&client, &server, json!({"sampling": {}})).await;
    let mut sse = Sse::new(send(&client, &server, &asking, &echo).await);
    let mut last = None;
    while let Some(e) = sse.next().await {
        let id = e.id.clone().unwrap_or_default();
        assert!(
            direct_stream(&id, 0).is_none() && direct_stream(&id, 1).is_none(),
            "{e:?}"
        );
        if !e.data.is_empty() {
            last = Some(e.message());
            break;
        }
    }
    assert_eq!(
        last.unwrap()["result"]["structuredContent"]["echo"]["say"],
        "hi"
    );
}

/// A quick call's response goes out whole, in one write: the head, the priming
/// event and the answer arrive in the client's first read (held back for the
/// answer, `direct::SETTLE`), where the head and priming event went ahead of an
/// answer that was not ready at once — on a direct stream and on rmcp's path
/// alike (a client that declared sampling). The call sleeps 2 ms, so its answer
/// is never ready at once; `async` evidence keeps the disk's `fdatasync` out of
/// it, so that a slow disk does not push calls past the hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_call_is_sent_whole() {
    let server = Server::start(&format!("{}evidence:\n  durability: async\n", config("")));
    let client = reqwest::Client::new();
    for capabilities in [json!({}), json!({"sampling": {}})] {
        let session = open(&client, &server, capabilities.clone()).await;
        let split = quick_calls_split(&server, &session).await;
        assert!(
            split.is_empty(),
            "{capabilities}: quick calls whose head went out ahead of the answer: {split:?}"
        );
    }
}

/// Up to 40 calls of a 2 ms sleep on `session`, one after another on one
/// connection, until 10 were answered within 8 ms on the client's clock (well
/// inside the 10 ms hold: a slower one's head goes out alone, as it should); of
/// those, the ones whose first read held less than the answer, and when.
async fn quick_calls_split(server: &Server, session: &str) -> Vec<(u64, Duration)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(&server.http).await.unwrap();
    conn.set_nodelay(true).unwrap();
    let (mut quick, mut split) = (0, Vec::new());
    for id in 0..40 {
        let body = call(id, "soulbase.builtin.sleep", json!({"ms": 2}), json!({}));
        let body = body.to_string();
        let request = format!(
            "POST /mcp HTTP/1.1\r\nhost: {}\r\naccept: application/json, text/event-stream\r\n\
             content-type: application/json\r\nmcp-session-id: {session}\r\n\
             mcp-protocol-version: 2025-11-25\r\nx-soulbase-tenant: acme\r\n\
             x-soulbase-actor: direct\r\ncontent-length: {}\r\n\r\n{body}",
            server.http,
            body.len()
        );
        let sent = Instant::now();
        conn.write_all(request.as_bytes()).await.unwrap();
        let mut buf = vec![0; 64 * 1024];
        let n = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf))
            .await
            .expect("a response within 20 s")
            .unwrap();
        let elapsed = sent.elapsed();
        let mut first = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(first.starts_with("HTTP/1.1 200"), "{first}");
        let whole = first.contains("\"result\"");
        // The rest of this response (to its last chunk), so the next starts clean.
        while !first.ends_with("0\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(20), conn.read(&mut buf))
                .await
                .expect("the rest within 20 s")
                .unwrap();
            assert!(n > 0, "the connection closed mid-response: {first}");
            first.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        assert!(first.contains("\"isError\":false"), "{first}");
        if elapsed < Duration::from_millis(8) {
            quick += 1;
            if !whole {
                split.push((id, elapsed));
            }
        }
        if quick == 10 {
            break;
        }
    }
    assert!(quick >= 3, "only {quick} of 40 calls answered within 8 ms");
    split
}

/// A client that goes away after the priming event reconnects with it as
/// `Last-Event-ID` and gets the answer, made meanwhile by the call that went on;
/// its End is `ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_call_resumes_for_its_answer() {
    let server = Server::start(&config(""));
    let client = reqwest::Client::new();
    let session = open(&client, &server, json!({})).await;
    let call_id = "direct_call_resumed";
    let (sse, last) = slow_call(&client, &server, &session, 3, 300, call_id).await;
    drop(sse);

    let mut sse = resume(&client, &server, &session, &last).await;
    let answer = sse.next().await.expect("the answer on the resumed stream");
    assert_eq!(
        direct_stream(answer.id.as_deref().unwrap(), 2),
        direct_stream(&last, 0)
    );
    let m = answer.message();
    assert_eq!(m["id"], 3, "{m}");
    assert_eq!(m["result"]["isError"], false, "{m}");
    assert_eq!(end_of(&server, call_id).await["status"], "ok");
}

/// Resumes session `session`'s stream after event `last`.
async fn resume(client: &reqwest::Client, server: &Server, session: &str, last: &str) -> Sse {
    let r = mcp(client, server, reqwest::Method::GET)
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-11-25")
        .header("last-event-id", last)
        .send()
        .await
        .unwrap();
    Sse::new(r)
}

/// A tool that lets its client poll (SEP-1699): its stream ends after a
/// priming event carrying the poll's retry (`1/dN`); the client reconnects with
/// it and gets the answer. A client whose connection died as an answer was
/// sent resumes after the first priming event and gets the answer again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_and_a_lost_answer_resume_on_a_direct_stream() {
    let server = Server::start(&config("  mcp_conformance_tools: true\n"));
    let client = reqwest::Client::new();
    let session = open(&client, &server, json!({})).await;
    let poll = call(4, "test_reconnection", json!({}), json!({}));
    let mut sse = Sse::new(send(&client, &server, &session, &poll).await);
    let first = sse.next().await.unwrap();
    let n = direct_stream(first.id.as_deref().unwrap(), 0).expect("a direct stream");
    let closing = sse.next().await.unwrap();
    assert_eq!(direct_stream(closing.id.as_deref().unwrap(), 1), Some(n));
    assert_eq!(closing.retry, Some(500), "{closing:?}");
    assert!(closing.data.is_empty(), "{closing:?}");
    assert!(sse.next().await.is_none(), "closed for polling");
    let mut back = resume(&client, &server, &session, closing.id.as_deref().unwrap()).await;
    let answer = back.next().await.expect("the answer after the poll");
    assert_eq!(direct_stream(answer.id.as_deref().unwrap(), 2), Some(n));
    let m = answer.message();
    assert_eq!(m["id"], 4, "{m}");
    assert_eq!(m["result"]["isError"], false, "{m}");

    // An answer delivered, then asked for again after the priming event.
    let echo = call(
        5,
        "soulbase.builtin.echo",
        json!({"again": true}),
        json!({}),
    );
    let mut sse = Sse::new(send(&client, &server, &session, &echo).await);
    let priming = sse.next().await.unwrap();
    let delivered = sse.next().await.unwrap().message();
    let mut again = resume(&client, &server, &session, priming.id.as_deref().unwrap()).await;
    assert_eq!(again.next().await.unwrap().message(), delivered);
}

/// `notifications/cancelled` naming a direct call cancels it: its stream ends
/// without an answer (as rmcp's), its End is `cancelled`, and the session goes
/// on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_cancelled_cancels_a_direct_call() {
    let server = Server::start(&config(""));
    let client = reqwest::Client::new();
    let session = open(&client, &server, json!({})).await;
    let call_id = "direct_call_cancelled";
    let (mut sse, _) = slow_call(&client, &server, &session, 9, 20_000, call_id).await;
    let cancel = json!({
        "jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 9, "reason": "changed my mind"}
    });
    assert_eq!(
        send(&client, &server, &session, &cancel).await.status(),
        202
    );
    ends_cancelled(
        &mut sse,
        &server,
        call_id,
        "a cancelled request is not answered",
    )
    .await;

    let echo = call(10, "soulbase.builtin.echo", json!({"n": 1}), json!({}));
    let mut sse = Sse::new(send(&client, &server, &session, &echo).await);
    sse.next().await.unwrap();
    assert_eq!(
        sse.next().await.unwrap().message()["result"]["structuredContent"]["echo"]["n"],
        1
    );
}

/// `sse`, the stream of call `call_id`, ends without an answer (`why`), and
/// the call's End is `cancelled`.
async fn ends_cancelled(sse: &mut Sse, server: &Server, call_id: &str, why: &str) {
    let after = sse.next().await;
    assert!(after.is_none(), "{why}: {after:?}");
    assert_eq!(end_of(server, call_id).await["status"], "cancelled");
}

/// Closing a session (`DELETE /mcp`) cancels its direct calls: the call's stream
/// ends without an answer and its End is `cancelled`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_session_cancels_its_direct_calls() {
    let server = Server::start(&config(""));
    let client = reqwest::Client::new();
    let session = open(&client, &server, json!({})).await;
    let call_id = "direct_call_of_a_closed_session";
    let (mut sse, _) = slow_call(&client, &server, &session, 11, 20_000, call_id).await;
    let closed = mcp(&client, &server, reqwest::Method::DELETE)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert!(closed.status().is_success(), "{}", closed.status());
    ends_cancelled(
        &mut sse,
        &server,
        call_id,
        "no answer once the session is closed",
    )
    .await;
}

/// `server.mcp_session_idle_ms`: a session making direct calls back to back for
/// three times that long is never closed as idle (rmcp's own idle limit, which
/// such calls never reach, is off).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_busy_with_direct_calls_is_not_idle() {
    let idle = Duration::from_millis(300);
    let server = Server::start(&config(&format!(
        "  mcp_session_idle_ms: {}\n",
        idle.as_millis()
    )));
    let client = reqwest::Client::new();
    let session = open(&client, &server, json!({})).await;
    let started = Instant::now();
    let mut calls = 0u64;
    while started.elapsed() < idle * 3 && calls < 100_000 {
        calls += 1;
        let echo = call(
            100 + calls,
            "soulbase.builtin.echo",
            json!({"n": calls}),
            json!({}),
        );
        let r = send(&client, &server, &session, &echo).await;
        assert_eq!(
            r.status(),
            200,
            "call {calls} after {:?}",
            started.elapsed()
        );
        let mut sse = Sse::new(r);
        sse.next().await.unwrap();
        let m = sse.next().await.unwrap().message();
        assert_eq!(m["result"]["structuredContent"]["echo"]["n"], calls, "{m}");
    }
    assert!(calls > 1);
}
