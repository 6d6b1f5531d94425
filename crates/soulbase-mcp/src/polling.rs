//! SSE polling (SEP-1699): a long call's response stream closed by the server
//! mid-call, its answer delivered when the client reconnects (`GET /mcp` with
//! `Last-Event-ID`).
//!
//! rmcp's [`LocalSessionManager`] keeps every event of a request's stream (so a
//! reconnecting client gets what it missed) and can close a stream — by its
//! HTTP-request number, which a handler never sees. [`PollingSessions`] is that
//! session manager, recording for each `tools/call` stream which request it
//! carries, so that the call — when its tool reports [`Report::Poll`] — can have
//! its own stream closed: a priming event tells the client when to come back
//! ([`POLL_RETRY`]), the stream ends, and what the call sends meanwhile waits in
//! the session's cache for the reconnection.
//!
//! rmcp forgets a request's stream once its answer is sent, so an answer sent
//! before the client reconnects would be lost. The call's answer therefore waits
//! until the client has reconnected to the stream ([`Polled::resumed`]) — at most
//! [`POLL_WAIT`]; a client that never comes back loses it, like any client that
//! goes away (its evidence is recorded all the same).
//!
//! [`PollingSessions`] is also where a `tools/call` that sends nothing to its
//! client is taken off rmcp's path and answered in its HTTP request's own task
//! (module `direct`); such a call's stream is closed for polling by that module,
//! its answer kept there for the reconnection. A stream of rmcp's path is handed
//! on once it has given its answer or 10 ms have passed (`settle`), as a direct
//! one is.
//!
//! [`Report::Poll`]: soulbase_tools::pipeline::Report::Poll

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use foldhash::{HashMap, HashMapExt};
use futures_util::future::Either;
use futures_util::{Stream, StreamExt};
use rmcp::model::{ClientJsonRpcMessage, GetExtensions, RequestId, ServerJsonRpcMessage};
use rmcp::transport::WorkerTransport;
use rmcp::transport::common::server_side_http::{ServerSseMessage, SessionId};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionHandle, LocalSessionManager, LocalSessionManagerError, LocalSessionWorker,
};
use rmcp::transport::streamable_http_server::session::{
    EventStore, RestoreOutcome, SessionManager,
};
use tokio::sync::Notify;
use tokio_stream::wrappers::ReceiverStream;

use crate::direct::{Direct, SETTLE, Slot};

/// `stream` (a request's events on rmcp's path) once it has given its answer or
/// [`SETTLE`] has passed, what it gave meanwhile first: as a direct call's
/// ([`DirectStream::settle`](crate::direct)), a quick call's response — its head,
/// the priming event, what the call sent and its answer — goes out in one write,
/// not the head and priming event ahead of the rest. What a call sends its client
/// before answering (progress, a request) waits up to [`SETTLE`].
async fn settle<S>(mut stream: S) -> impl Stream<Item = ServerSseMessage>
where
    S: Stream<Item = ServerSseMessage> + Unpin,
{
    let mut held = Vec::new();
    let answered = async {
        while let Some(event) = stream.next().await {
            let answer = matches!(
                event.message.as_deref(),
                Some(ServerJsonRpcMessage::Response(_) | ServerJsonRpcMessage::Error(_))
            );
            held.push(event);
            if answer {
                break;
            }
        }
    };
    // Not answered by then: the stream goes out with what it gave so far.
    let _ = tokio::time::timeout(SETTLE, answered).await;
    futures_util::stream::iter(held).chain(stream)
}

/// How long a client whose stream was closed for polling waits before it
/// reconnects (the `retry` of the closing priming event).
pub const POLL_RETRY: Duration = Duration::from_millis(500);

/// How long a polled call's answer waits for its client to reconnect.
pub const POLL_WAIT: Duration = Duration::from_secs(30);

/// A stream closed for polling, by session and HTTP-request number.
type PolledKey = (SessionId, u64);

/// A request's stream: its session and JSON-RPC request id (as sent: `1` and
/// `"1"` are two requests). Registered and forgotten on every request, so
/// keyed without formatting the id and hashed with foldhash (the session ids
/// are minted here; a client only looks one up).
type StreamKey = (SessionId, RequestId);

/// rmcp's local session manager, knowing which HTTP request carries each
/// client request's stream (module docs), and answering the `tools/call`s it
/// can in their own request's task (module `direct`).
pub struct PollingSessions {
    inner: Arc<LocalSessionManager>,
    open: Arc<Mutex<HashMap<StreamKey, u64>>>,
    polled: Mutex<HashMap<PolledKey, Arc<Notify>>>,
    direct: Direct,
}

/// A call whose stream was closed for polling.
pub struct Polled {
    resumed: Arc<Notify>,
}

impl Polled {
    /// A call whose client is told back by `resumed`.
    pub(crate) fn new(resumed: Arc<Notify>) -> Self {
        Self { resumed }
    }

    /// Waits until the client has reconnected to the call's stream, at most
    /// [`POLL_WAIT`]; `false` when it did not.
    pub async fn resumed(&self) -> bool {
        tokio::time::timeout(POLL_WAIT, self.resumed.notified())
            .await
            .is_ok()
    }
}

/// Forgets a stream's request once its stream is dropped.
struct Registered {
    open: Arc<Mutex<HashMap<StreamKey, u64>>>,
    key: StreamKey,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.key);
    }
}

fn key_of(session: &SessionId, request: &RequestId) -> StreamKey {
    (session.clone(), request.clone())
}

impl PollingSessions {
    /// Polling over `inner` (which still holds the sessions; the session limits
    /// of [`crate::sessions::McpSessions`] act on it).
    pub fn new(inner: Arc<LocalSessionManager>) -> Arc<Self> {
        let direct = Direct::new(
            inner.session_config.sse_retry,
            inner.session_config.completed_cache_ttl,
        );
        Arc::new(Self {
            inner,
            open: Arc::new(Mutex::new(HashMap::new())),
            polled: Mutex::new(HashMap::new()),
            direct,
        })
    }

    /// The sessions whose `tools/call`s may be answered directly.
    pub(crate) fn direct(&self) -> &Direct {
        &self.direct
    }

    async fn handle(&self, id: &SessionId) -> Result<LocalSessionHandle, LocalSessionManagerError> {
        self.inner
            .sessions
            .read()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| LocalSessionManagerError::SessionNotFound(id.clone()))
    }

    /// Closes the response stream of `request` in `session` with a priming event
    /// carrying [`POLL_RETRY`]; the client reconnects for the rest. `None` when
    /// there is no such open stream (already answered, or not over HTTP).
    pub async fn close_stream(&self, session: &str, request: &RequestId) -> Option<Polled> {
        let session: SessionId = Arc::from(session);
        if let Some(polled) = self.direct.close(&session, request) {
            return Some(polled);
        }
        let http_request = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key_of(&session, request))
            .copied()?;
        let handle = self.handle(&session).await.ok()?;
        let resumed = Arc::new(Notify::new());
        self.polled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert((session.clone(), http_request), resumed.clone());
        if handle
            .close_sse_stream(http_request, Some(POLL_RETRY))
            .await
            .is_err()
        {
            self.polled
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&(session, http_request));
            return None;
        }
        Some(Polled { resumed })
    }
}

impl SessionManager for PollingSessions {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    /// What [`LocalSessionManager`] does; sessions it no longer holds (closed
    /// by the idle sweeper, or by rmcp) are forgotten for direct calls.
    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        {
            let live = self.inner.sessions.read().await;
            self.direct.retain(|id| live.contains_key(id));
        }
        self.inner.create_session().await
    }

    /// What [`LocalSessionManager`] does, with the session's `Slot` in the
    /// `initialize` request for its handler to register the session for direct
    /// calls.
    async fn initialize_session(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<rmcp::model::ServerJsonRpcMessage, Self::Error> {
        if let ClientJsonRpcMessage::Request(r) = &mut message {
            r.request.extensions_mut().insert(Slot(id.clone()));
        }
        self.inner.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.inner.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        self.direct.end(id);
        self.inner.close_session(id).await
    }

    /// A `tools/call` answered directly (module `direct`); otherwise what
    /// [`LocalSessionManager`] does, recording the stream's HTTP request.
    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let message = match (self.direct.takes(id, &message), message) {
            (Some(session), ClientJsonRpcMessage::Request(r)) => {
                let mut stream = self.direct.start(session, r);
                stream.settle().await;
                return Ok(Either::Left(stream));
            }
            (_, message) => message,
        };
        let handle = self.handle(id).await?;
        let request = match &message {
            ClientJsonRpcMessage::Request(r) => Some(key_of(id, &r.id)),
            _ => None,
        };
        let receiver = handle.establish_request_wise_channel().await?;
        let http_request = receiver.http_request_id;
        let registered = match (request, http_request) {
            (Some(key), Some(number)) => {
                self.open
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(key.clone(), number);
                Some(Registered {
                    open: self.open.clone(),
                    key,
                })
            }
            _ => None,
        };
        handle.push_message(message, http_request).await?;
        let stream = ReceiverStream::new(receiver.inner).map(move |event| {
            // Held by the stream: dropped (and forgotten) with it.
            let _ = &registered;
            event
        });
        Ok(Either::Right(settle(stream).await))
    }

    /// What [`LocalSessionManager`] does; a `notifications/cancelled` of a
    /// direct call cancels it.
    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.direct.cancel(id, &message);
        self.inner.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        self.inner.create_standalone_stream(id).await
    }

    /// What [`LocalSessionManager`] does; a stream closed for polling is told,
    /// once the client is back on it, that its answer may go.
    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        if let Some(direct) = self.direct.resume(id, &last_event_id) {
            return Ok(Either::Left(direct));
        }
        // `INDEX/HTTP_REQUEST` (rmcp's event ids for a request's stream).
        let http_request = last_event_id
            .split_once('/')
            .and_then(|(_, n)| n.parse::<u64>().ok());
        let stream = Either::Right(self.inner.resume(id, last_event_id).await?);
        if let Some(n) = http_request
            && let Some(resumed) = self
                .polled
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&(id.clone(), n))
        {
            resumed.notify_one();
        }
        Ok(stream)
    }

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        self.inner.restore_session(id).await
    }

    fn event_store(&self) -> Option<Arc<dyn EventStore>> {
        self.inner.event_store()
    }
}
