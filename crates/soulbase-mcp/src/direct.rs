//! `tools/call` answered in its HTTP request's own task.
//!
//! rmcp hands each request of a streamable HTTP session to the session's worker
//! task, which passes it to the session's service loop, which spawns a task for
//! the handler; the answer travels back the same way: three task hand-offs, two
//! channels and a spawn a call, about a fifth of a governed call's instructions
//! (`xtask/call_instructions.py --mcp`). [`Direct`] answers a `tools/call` in the
//! request's own response stream instead, through rmcp's own dispatch
//! ([`Service::handle_request`]: the same protocol checks and result shaping) with
//! the session's peer — when nothing in the call needs the worker:
//!
//! - the client declared neither `elicitation` nor `sampling` at `initialize`
//!   (so neither consent nor the tool asks it anything),
//! - the request carries no progress token and no log level, and the session set
//!   no log level (so nothing is sent to the client while the call runs).
//!
//! Every other request takes rmcp's path. A direct stream gives its client
//! what rmcp's path gives it:
//!
//! - a priming event first (event id `0/dN`, with rmcp's retry), so that the
//!   client can resume the stream, then the answer (`2/dN`). The response is
//!   held back until the call answers or [`SETTLE`] has passed
//!   ([`DirectStream::settle`]): a call answered by then goes out in one write —
//!   the response head, the priming event and the answer — where it took two
//!   (the head and priming event at once, the answer after the spool's round
//!   made its evidence durable), each waking the client; a slower call's head
//!   and priming event go out at [`SETTLE`], its answer when it comes (rmcp's
//!   path is held the same way, `polling::settle`);
//! - answers kept for a client that reconnects with `Last-Event-ID`
//!   ([`Direct::resume`]) for rmcp's `completed_cache_ttl`: the answer of a call
//!   whose stream went away before it (the call goes on in a task of its own),
//!   and the last [`DELIVERED_KEPT`] answers a session's streams delivered, in
//!   case one never reached its client (rmcp keeps every answer of that time);
//! - `notifications/cancelled` cancels the call ([`Direct::cancel`]) and its
//!   stream ends without an answer; closing the session, or the server
//!   stopping, does the same to its calls;
//! - polling (SEP-1699, [`Direct::close`]): the stream ends with a priming event
//!   carrying [`POLL_RETRY`] (`1/dN`), the call goes on, and the client
//!   reconnects for the answer.
//!
//! The one difference: rmcp runs a handler inside task-locals that route the
//! server's own requests to the client onto the request's stream; a direct call
//! makes none (its client cannot be asked anything).
//!
//! A session is registered by [`McpServer::initialize`](crate::McpServer) with
//! its handler and peer, when the `initialize` request carries the [`Slot`] the
//! session manager put in it.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt};
use futures_util::task::AtomicWaker;
use futures_util::{Stream, future::BoxFuture};
use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, GetExtensions, GetMeta,
    JsonRpcRequest, RequestId, ServerJsonRpcMessage,
};
use rmcp::service::{RequestContext, Service};
use rmcp::transport::common::server_side_http::{ServerSseMessage, SessionId};
use rmcp::{Peer, RoleServer};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::McpServer;
use crate::polling::{POLL_RETRY, Polled};

/// How long a direct call's response is held back for its answer
/// ([`DirectStream::settle`]). A quick call with `sync` evidence answers once the
/// spool's round has made its Begin and End durable, ~0.2–1 ms on an idle disk and
/// a few under load (p99 ~5 ms saturated, `mcp_load`); every call answered within
/// this goes out in one write, which at saturation took ~10 % off the server's CPU
/// per call and a third off the client's (docs/performance.md). Short against a
/// client's reconnection delay: a client whose connection drops within it has no
/// event id to resume with, as it would have none a moment after the priming
/// event.
pub const SETTLE: Duration = Duration::from_millis(10);

/// Put by the session manager in an `initialize` request's extensions: the
/// session it opens, for the handler to register itself under.
#[derive(Clone, Debug)]
pub(crate) struct Slot(pub(crate) SessionId);

/// The sessions whose `tools/call`s may be answered directly (module docs).
pub(crate) struct Direct {
    sessions: Mutex<HashMap<SessionId, Arc<Session>>>,
    /// Numbers the direct streams (`dN` in their event ids).
    next: AtomicU64,
    /// The retry of a stream's priming event (rmcp's `sse_retry`); none: no
    /// priming event.
    retry: Option<Duration>,
    /// How long an answer nobody received is kept for a reconnecting client
    /// (rmcp's `completed_cache_ttl`).
    keep: Duration,
}

/// A session whose calls may be answered directly.
pub(crate) struct Session {
    server: McpServer,
    peer: Peer<RoleServer>,
    /// Cancelled when the session ends (closed, or the server stopping).
    ended: CancellationToken,
    /// Calls running, or finished and kept, by stream number.
    calls: Mutex<Calls>,
}

/// A session's direct calls.
#[derive(Default)]
struct Calls {
    /// Running, or finished after their stream went away (kept until resumed,
    /// or for the session's `keep`).
    open: HashMap<u64, Arc<Call>>,
    /// The last [`DELIVERED_KEPT`] calls whose stream delivered their answer.
    delivered: std::collections::VecDeque<(u64, Arc<Call>)>,
}

impl Calls {
    fn get(&self, n: u64) -> Option<Arc<Call>> {
        self.open.get(&n).cloned().or_else(|| {
            self.delivered
                .iter()
                .find(|(m, _)| *m == n)
                .map(|(_, c)| c.clone())
        })
    }
}

/// How many delivered answers a session keeps for a client whose connection
/// died as they were sent.
pub(crate) const DELIVERED_KEPT: usize = 32;

/// How a direct call ended, when it has.
enum Outcome {
    /// Answered (delivered or kept), at that instant.
    Answer(Arc<ServerJsonRpcMessage>, Instant),
    /// Cancelled, or failed in its task: no answer, and nothing to resume.
    Nothing(Instant),
}

impl Outcome {
    fn at(&self) -> Instant {
        match self {
            Self::Answer(_, at) | Self::Nothing(at) => *at,
        }
    }
}

/// One direct call.
struct Call {
    request: RequestId,
    /// The call's cancellation (`notifications/cancelled`; a child of the
    /// session's).
    ct: CancellationToken,
    /// Its stream is still there (not dropped): it can be closed for polling.
    streaming: AtomicBool,
    /// Set to end the call's stream for polling; the stream's waker is told.
    close: AtomicBool,
    waker: AtomicWaker,
    /// Told when the client reconnects to a stream closed for polling.
    resumed: Mutex<Option<Arc<Notify>>>,
    /// How it ended; told by `ended`.
    outcome: Mutex<Option<Outcome>>,
    ended: Notify,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The event id of event `index` of direct stream `n`: `INDEX/dN` (rmcp's are
/// `INDEX/N`, so the two never meet). Index 0 is the priming event, 1 the one
/// closing the stream for polling, 2 the answer.
fn event_id(index: u8, n: u64) -> String {
    format!("{index}/d{n}")
}

/// The index and stream number of a direct stream's event id.
fn parse_event_id(id: &str) -> Option<(u8, u64)> {
    let (index, n) = id.split_once('/')?;
    Some((index.parse().ok()?, n.strip_prefix('d')?.parse().ok()?))
}

impl Direct {
    /// No sessions yet; priming events with `retry`, answers kept for `keep`.
    pub(crate) fn new(retry: Option<Duration>, keep: Duration) -> Self {
        Self {
            sessions: Mutex::new(HashMap::new()),
            next: AtomicU64::new(0),
            retry,
            keep,
        }
    }

    /// Registers session `slot` with its handler and peer (at `initialize`).
    pub(crate) fn register(&self, slot: &Slot, server: McpServer, peer: Peer<RoleServer>) {
        let ended = server.stop.child_token();
        let session = Arc::new(Session {
            server,
            peer,
            ended,
            calls: Mutex::new(Calls::default()),
        });
        if let Some(old) = lock(&self.sessions).insert(slot.0.clone(), session) {
            old.ended.cancel();
        }
    }

    /// Forgets session `id`, cancelling its calls.
    pub(crate) fn end(&self, id: &SessionId) {
        if let Some(s) = lock(&self.sessions).remove(id) {
            s.ended.cancel();
        }
    }

    /// Forgets every session `live` does not hold (closed by the idle sweeper
    /// or rmcp), cancelling their calls.
    pub(crate) fn retain(&self, live: impl Fn(&SessionId) -> bool) {
        lock(&self.sessions).retain(|id, s| {
            let keep = live(id);
            if !keep {
                s.ended.cancel();
            }
            keep
        });
    }

    /// The session of `message`, when `message` in session `id` is answered
    /// directly (module docs).
    pub(crate) fn takes(
        &self,
        id: &SessionId,
        message: &ClientJsonRpcMessage,
    ) -> Option<Arc<Session>> {
        let ClientJsonRpcMessage::Request(r) = message else {
            return None;
        };
        if !matches!(r.request, ClientRequest::CallToolRequest(_)) {
            return None;
        }
        let session = lock(&self.sessions).get(id).cloned()?;
        let meta = r.request.get_meta();
        let asks_client = session.peer.peer_info().is_some_and(|i| {
            i.capabilities.elicitation.is_some() || i.capabilities.sampling.is_some()
        });
        let direct = !asks_client
            && meta.get_progress_token().is_none()
            && meta.log_level().is_none()
            && session.server.session_level().is_none();
        direct.then_some(session)
    }

    /// The direct stream answering request `r` of `session` (which
    /// [`Direct::takes`]).
    pub(crate) fn start(
        &self,
        session: Arc<Session>,
        r: JsonRpcRequest<ClientRequest>,
    ) -> DirectStream {
        let (id, mut request) = (r.id, r.request);
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let call = Arc::new(Call {
            request: id.clone(),
            ct: session.ended.child_token(),
            streaming: AtomicBool::new(true),
            close: AtomicBool::new(false),
            waker: AtomicWaker::new(),
            resumed: Mutex::new(None),
            outcome: Mutex::new(None),
            ended: Notify::new(),
        });
        lock(&session.calls).open.insert(n, call.clone());
        // As rmcp's service loop does: the request's `_meta` and extensions
        // (the HTTP request's parts) go to the context.
        let mut context = RequestContext::new(id.clone(), session.peer.clone());
        context.ct = call.ct.clone();
        context.meta = std::mem::take(request.get_meta_mut());
        context.extensions = std::mem::take(request.extensions_mut());
        let handler = session.clone();
        let answer: BoxFuture<'static, ServerJsonRpcMessage> = Box::pin(async move {
            match Service::<RoleServer>::handle_request(&handler.server, request, context).await {
                Ok(result) => ServerJsonRpcMessage::response(result, id),
                Err(error) => ServerJsonRpcMessage::error(error, Some(id)),
            }
        });
        DirectStream {
            session,
            call,
            n,
            retry: self.retry,
            keep: self.keep,
            state: State::Priming,
            running: Mutex::new(Some(answer)),
            last: None,
        }
    }

    /// Cancels the direct call a `notifications/cancelled` names, if any
    /// (rmcp's own path ignores a request it does not know).
    pub(crate) fn cancel(&self, id: &SessionId, message: &ClientJsonRpcMessage) {
        let ClientJsonRpcMessage::Notification(n) = message else {
            return;
        };
        let ClientNotification::CancelledNotification(c) = &n.notification else {
            return;
        };
        let Some(request) = &c.params.request_id else {
            return;
        };
        if let Some(call) = self.find(id, request) {
            call.ct.cancel();
        }
    }

    /// The direct call of `request` in session `id` that has not ended.
    fn find(&self, id: &SessionId, request: &RequestId) -> Option<Arc<Call>> {
        let session = lock(&self.sessions).get(id).cloned()?;
        let calls = lock(&session.calls);
        calls
            .open
            .values()
            .find(|c| c.request == *request && lock(&c.outcome).is_none())
            .cloned()
    }

    /// Closes the stream of direct call `request` in session `id` for polling
    /// (module docs); `None` when it is not a running direct call whose stream
    /// is still there.
    pub(crate) fn close(&self, id: &SessionId, request: &RequestId) -> Option<Polled> {
        let call = self.find(id, request)?;
        if !call.streaming.load(Ordering::Acquire) {
            return None;
        }
        let resumed = Arc::new(Notify::new());
        *lock(&call.resumed) = Some(resumed.clone());
        call.close.store(true, Ordering::Release);
        call.waker.wake();
        Some(Polled::new(resumed))
    }

    /// The rest of direct stream `last_event_id` of session `id`, for a client
    /// reconnecting: its answer once there is one (nothing when the client had
    /// it, or the call ended without one). `None` when the id is not a direct
    /// stream's, or its call is forgotten.
    pub(crate) fn resume(&self, id: &SessionId, last_event_id: &str) -> Option<ResumedStream> {
        let (index, n) = parse_event_id(last_event_id)?;
        let session = lock(&self.sessions).get(id).cloned()?;
        let call = lock(&session.calls).get(n)?;
        if let Some(resumed) = lock(&call.resumed).take() {
            resumed.notify_one();
        }
        let wait: BoxFuture<'static, Option<ServerSseMessage>> = Box::pin(async move {
            if index >= 2 {
                return None;
            }
            loop {
                let ended = call.ended.notified();
                match lock(&call.outcome).as_ref() {
                    Some(Outcome::Answer(answer, _)) => {
                        return Some(event(event_id(2, n), answer.clone()));
                    }
                    Some(Outcome::Nothing(_)) => return None,
                    None => {}
                }
                ended.await;
            }
        });
        Some(ResumedStream(Mutex::new(Some(wait))))
    }
}

/// An event carrying `message`, with event id `id`.
fn event(id: String, message: Arc<ServerJsonRpcMessage>) -> ServerSseMessage {
    let mut e = ServerSseMessage::retry(Duration::ZERO);
    e.retry = None;
    e.event_id = Some(id);
    e.message = Some(message);
    e
}

impl Call {
    /// Records how the call ended and tells a resumed stream; `answer` is `None`
    /// for a call cancelled or failed.
    fn end(&self, answer: Option<Arc<ServerJsonRpcMessage>>) {
        let now = Instant::now();
        *lock(&self.outcome) = Some(match answer {
            Some(a) => Outcome::Answer(a, now),
            None => Outcome::Nothing(now),
        });
        self.ended.notify_waiters();
    }
}

impl Session {
    /// Call `n`'s stream delivered its answer: it joins the delivered ones.
    fn delivered(&self, n: u64) {
        let mut calls = lock(&self.calls);
        if let Some(call) = calls.open.remove(&n) {
            if calls.delivered.len() == DELIVERED_KEPT {
                calls.delivered.pop_front();
            }
            calls.delivered.push_back((n, call));
        }
    }

    /// Forgets call `n`, and the answers kept longer than `keep`.
    fn forget(&self, n: Option<u64>, keep: Duration) {
        let now = Instant::now();
        let fresh = |c: &Call| {
            lock(&c.outcome)
                .as_ref()
                .is_none_or(|o| now.duration_since(o.at()) < keep)
        };
        let mut calls = lock(&self.calls);
        if let Some(n) = n {
            calls.open.remove(&n);
        }
        calls.open.retain(|_, c| fresh(c));
        calls.delivered.retain(|(_, c)| fresh(c));
    }
}

/// Where a direct stream is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing sent yet, the call running.
    Priming,
    /// The priming event sent (or none is sent), the call running.
    Running,
    /// The call ended before its response went out ([`DirectStream::settle`]):
    /// the priming event, then `last`.
    Settled,
    /// The priming event of a settled stream sent: `last` next.
    Last,
    Closed,
}

/// The response stream of a direct call: a priming event, then the answer (or
/// a priming event carrying [`POLL_RETRY`] when closed for polling; nothing
/// more when cancelled).
pub(crate) struct DirectStream {
    session: Arc<Session>,
    call: Arc<Call>,
    n: u64,
    retry: Option<Duration>,
    keep: Duration,
    state: State,
    /// The call until it answers; reached only through `&mut` (`get_mut`), the
    /// mutex makes the stream `Sync` as rmcp asks.
    running: Mutex<Option<BoxFuture<'static, ServerJsonRpcMessage>>>,
    /// What a settled stream sends after its priming event: the answer, the
    /// priming event of a close for polling, or nothing (cancelled).
    last: Option<ServerSseMessage>,
}

impl Stream for DirectStream {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.state {
            State::Priming | State::Settled => {
                this.state = match this.state {
                    State::Settled => State::Last,
                    _ => State::Running,
                };
                if let Some(retry) = this.retry {
                    return Poll::Ready(Some(ServerSseMessage::priming(
                        event_id(0, this.n),
                        retry,
                    )));
                }
            }
            State::Running | State::Last | State::Closed => {}
        }
        match this.state {
            State::Last => {
                this.state = State::Closed;
                Poll::Ready(this.last.take())
            }
            State::Closed => Poll::Ready(None),
            _ => this.poll_call(cx),
        }
    }
}

impl DirectStream {
    /// Runs the call until it ends or [`SETTLE`] has passed, before the response
    /// is handed to the HTTP server: the response's head goes out with its first
    /// event, so a call that ends meanwhile is sent whole in one write. Called in
    /// the request's own task (`PollingSessions::create_stream`); dropped
    /// meanwhile (the client went away), the stream leaves the call running, as
    /// it does later.
    pub(crate) async fn settle(&mut self) {
        let ended = std::future::poll_fn(|cx| {
            self.poll_call(cx).map(|last| {
                self.last = last;
                self.state = State::Settled;
            })
        });
        // Not ended by then: the stream goes out as it is, the call running.
        let _ = tokio::time::timeout(SETTLE, ended).await;
    }

    /// Polls the call (registering for a close for polling): its answer, the
    /// priming event that closes the stream for polling, or nothing (cancelled);
    /// the stream is `Closed` once this is ready.
    fn poll_call(&mut self, cx: &mut Context<'_>) -> Poll<Option<ServerSseMessage>> {
        let this = self;
        this.call.waker.register(cx.waker());
        let running = this
            .running
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if !this.call.close.load(Ordering::Acquire)
            && let Some(answer) = running.as_mut()
        {
            if let Poll::Ready(message) = answer.as_mut().poll(cx) {
                *running = None;
                this.state = State::Closed;
                this.call.streaming.store(false, Ordering::Release);
                if this.call.ct.is_cancelled() {
                    // As rmcp's path: a cancelled request is not answered.
                    this.call.end(None);
                    this.session.forget(Some(this.n), this.keep);
                    return Poll::Ready(None);
                }
                let message = Arc::new(message);
                this.call.end(Some(message.clone()));
                this.session.delivered(this.n);
                return Poll::Ready(Some(event(event_id(2, this.n), message)));
            }
            if !this.call.close.load(Ordering::Acquire) {
                return Poll::Pending;
            }
        }
        // Closed for polling: the call goes on without this stream (`Drop`).
        this.state = State::Closed;
        Poll::Ready(Some(ServerSseMessage::priming(
            event_id(1, this.n),
            POLL_RETRY,
        )))
    }
}

impl Drop for DirectStream {
    /// A stream dropped before its answer (the client went away, or it was
    /// closed for polling) leaves its call running; the answer is kept for the
    /// client to resume. Without a runtime the call is dropped, as cancelled.
    fn drop(&mut self) {
        self.call.streaming.store(false, Ordering::Release);
        let running = self
            .running
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(answer) = running else { return };
        let pending = Pending {
            session: self.session.clone(),
            call: self.call.clone(),
            n: self.n,
            keep: self.keep,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // `pending` ends the call with nothing
        };
        runtime.spawn(async move {
            let message = answer.await;
            pending.answered(message);
        });
    }
}

/// A direct call going on without its stream. Dropped unanswered (its task
/// panicked, or the runtime is shutting down), it ends the call with nothing.
struct Pending {
    session: Arc<Session>,
    call: Arc<Call>,
    n: u64,
    keep: Duration,
}

impl Pending {
    /// Keeps the answer for the client to resume (none for a cancelled call).
    fn answered(self, message: ServerJsonRpcMessage) {
        let answer = (!self.call.ct.is_cancelled()).then(|| Arc::new(message));
        self.call.end(answer);
        // Only the answers kept too long go: this one stays for `keep`.
        self.session.forget(None, self.keep);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if lock(&self.call.outcome).is_none() {
            self.call.end(None);
            self.session.forget(Some(self.n), self.keep);
        }
    }
}

/// A resumed direct stream: the answer, once there is one.
pub(crate) struct ResumedStream(Mutex<Option<BoxFuture<'static, Option<ServerSseMessage>>>>);

impl Stream for ResumedStream {
    type Item = ServerSseMessage;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let slot = self.0.get_mut().unwrap_or_else(PoisonError::into_inner);
        let Some(wait) = slot.as_mut() else {
            return Poll::Ready(None);
        };
        match wait.as_mut().poll(cx) {
            Poll::Ready(event) => {
                *slot = None;
                Poll::Ready(event)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_event_ids_are_told_from_rmcps() {
        assert_eq!(event_id(0, 17), "0/d17");
        assert_eq!(parse_event_id("1/d17"), Some((1, 17)));
        assert_eq!(parse_event_id("0/17"), None, "rmcp's");
        assert_eq!(parse_event_id("x/d1"), None);
        assert_eq!(parse_event_id("0/d"), None);
    }
}
