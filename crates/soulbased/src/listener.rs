//! Accepting and serving connections, with the limits that keep the server
//! answering under a flood of idle or half-open connections.
//!
//! Both listeners, gRPC and HTTP, are served by one loop ([`serve`], hyper-util;
//! the gRPC services are tonic's routes as an axum router, HTTP/2 only), so they
//! get the same protection:
//!
//! - Every accepted socket (plain and TLS) goes through [`accept`]: `TCP_NODELAY`
//!   (a response is several small writes; with Nagle each waits for the peer's
//!   delayed ACK, ~40 ms per call on a busy MCP connection) and TCP keep-alive
//!   (`server.tcp_keepalive_ms`).
//! - Each listener holds at most its cap of connections (`server.max_connections`
//!   for HTTP, `server.grpc_max_connections` for gRPC, one [`Connections`] table
//!   each, so a flood on one port cannot shed the other's). At the cap the oldest
//!   connection that has not yet sent a complete request (for HTTP/2: the preface
//!   and a request's HEADERS) is closed for the new one, else the oldest idle one;
//!   when every connection has a request in progress the new one is closed. So
//!   connections that never complete a request cannot starve those that do.
//! - A connection's first request must arrive within
//!   `server.header_read_timeout_ms` of accept (TLS handshake and HTTP/2 preface
//!   included), a later HTTP/1 request's line and headers within it of the
//!   previous response; a connection with no request in progress for
//!   `server.idle_timeout_ms` is closed; HTTP/2 connections are pinged
//!   (`server.http2_keepalive_*`) and carry at most
//!   `server.http2_max_concurrent_streams` streams. (Request bodies are bounded in
//!   time by `server.body_read_timeout_ms` in [`crate::http_api`].)
//! - At start-up the open-file limit's soft value is raised to its hard one
//!   ([`raise_nofile_limit`]), and the connection caps are clamped to what it leaves
//!   room for.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use soulbase_config::ServerConfig;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// File descriptors kept free of connections when the connection caps are
/// clamped to the open-file limit (database, spool, role channels, logs).
pub const FD_RESERVE: u64 = 256;

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection limits of the listeners, from `server.*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most HTTP connections held at once.
    pub max_connections: usize,
    /// Most gRPC connections held at once.
    pub grpc_max_connections: usize,
    /// A connection's first request (and a later HTTP/1 request's line and
    /// headers) must arrive within this.
    pub header_read_timeout: Duration,
    /// A connection with no request in progress is closed after this.
    pub idle_timeout: Duration,
    /// Most concurrent HTTP/2 streams per connection.
    pub http2_max_concurrent_streams: u32,
    /// HTTP/2 ping interval.
    pub http2_keepalive_interval: Duration,
    /// HTTP/2 ping answer timeout.
    pub http2_keepalive_timeout: Duration,
    /// TCP keep-alive idle time of accepted sockets (`None`: off).
    pub tcp_keepalive: Option<Duration>,
}

impl Limits {
    /// The limits `server` configures.
    pub fn from_config(server: &ServerConfig) -> Self {
        Self {
            max_connections: server.max_connections,
            grpc_max_connections: server.grpc_max_connections,
            header_read_timeout: Duration::from_millis(server.header_read_timeout_ms),
            idle_timeout: Duration::from_millis(server.idle_timeout_ms),
            http2_max_concurrent_streams: server.http2_max_concurrent_streams,
            http2_keepalive_interval: Duration::from_millis(server.http2_keepalive_interval_ms),
            http2_keepalive_timeout: Duration::from_millis(server.http2_keepalive_timeout_ms),
            tcp_keepalive: (server.tcp_keepalive_ms > 0)
                .then(|| Duration::from_millis(server.tcp_keepalive_ms)),
        }
    }

    /// These limits with the connection caps clamped to what an open-file limit of
    /// `nofile` leaves room for, when their sum is higher: the room is shared in
    /// proportion to the caps, each at least 16.
    pub fn clamped_to(mut self, nofile: Option<u64>) -> Self {
        let Some(n) = nofile else { return self };
        let room = usize::try_from(n.saturating_sub(FD_RESERVE)).unwrap_or(usize::MAX);
        let total = self
            .max_connections
            .saturating_add(self.grpc_max_connections);
        if total <= room {
            return self;
        }
        let share = |cap: usize| {
            let scaled = (cap as u128 * room as u128 / total.max(1) as u128) as usize;
            scaled.clamp(16.min(cap), cap)
        };
        let (http, grpc) = (
            share(self.max_connections),
            share(self.grpc_max_connections),
        );
        tracing::warn!(
            max_connections = self.max_connections,
            grpc_max_connections = self.grpc_max_connections,
            clamped_http = http,
            clamped_grpc = grpc,
            open_file_limit = n,
            "server.max_connections + server.grpc_max_connections exceed what the open-file limit leaves room for"
        );
        self.max_connections = http;
        self.grpc_max_connections = grpc;
        self
    }
}

/// Raises this process's open-file soft limit to its hard limit; returns the
/// soft limit in force afterwards (`None` when it cannot be read, or is unlimited).
pub fn raise_nofile_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        if let Err(e) = setrlimit(Resource::Nofile, limit) {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// Sets `TCP_NODELAY` and, with `keepalive`, TCP keep-alive (idle time
/// `keepalive`) on an accepted socket.
pub fn tune(tcp: &TcpStream, keepalive: Option<Duration>) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    if let Some(idle) = keepalive {
        let ka = socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(idle.min(Duration::from_secs(10)));
        socket2::SockRef::from(tcp).set_tcp_keepalive(&ka)?;
    }
    Ok(())
}

/// Accepts one connection from `listener` and [`tune`]s it. Accept errors (out of
/// file descriptors and the like) are logged; `on_error` may free descriptors
/// (it returns whether it did, for an immediate retry), else the next try waits
/// briefly. Only returns a connection.
pub async fn accept(
    listener: &TcpListener,
    keepalive: Option<Duration>,
    mut on_error: impl FnMut() -> bool,
) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                if let Err(e) = tune(&tcp, keepalive) {
                    tracing::debug!(%peer, error = %e, "cannot tune an accepted socket");
                }
                return (tcp, peer);
            }
            Err(e) => {
                tracing::warn!(error = %e, "accepting a connection failed");
                if !on_error() {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// One connection's state, shared by its task, its requests and the table.
#[derive(Debug)]
pub struct Conn {
    /// Set once a complete request has been received.
    served: AtomicBool,
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
    shed: CancellationToken,
    started: Instant,
}

impl Conn {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            served: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            shed: CancellationToken::new(),
        }
    }

    /// Marks a request in progress until the returned guard is dropped.
    ///
    /// Neither this nor the guard's drop wakes anything: the request runs inside
    /// the connection's own task, which [`idle_expired`](Self::idle_expired) is
    /// part of, and a task woken while it is being polled is polled again and
    /// wakes a parked runtime worker besides (twice a request, most of them for
    /// nothing).
    pub fn begin_request(self: &Arc<Self>) -> RequestGuard {
        self.served.store(true, Ordering::Release);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        RequestGuard(self.clone())
    }

    /// Whether a complete request has been received on this connection.
    pub fn served(&self) -> bool {
        self.served.load(Ordering::Acquire)
    }

    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) == 0
    }

    /// Whether this connection was chosen to be closed for a newer one.
    pub fn is_shed(&self) -> bool {
        self.shed.is_cancelled()
    }

    /// Resolves when the connection has not completed its first request within
    /// `within` of its start; never once it has.
    async fn first_request_expired(&self, within: Duration) {
        tokio::time::sleep_until(self.started + within).await;
        if self.served() {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the connection has had no request in progress for `idle`
    /// (at most [`busy_check`] of it later).
    ///
    /// It looks on a timer only, so requests wake nothing: idle, it sleeps until
    /// `idle` after the last request ended and looks again; with a request in
    /// progress, it looks again [`busy_check`] later.
    async fn idle_expired(&self, idle: Duration) {
        loop {
            if !self.idle() {
                tokio::time::sleep(busy_check(idle)).await;
                continue;
            }
            let since = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
            tokio::time::sleep_until(since + idle).await;
            let now_since = *self.idle_since.lock().unwrap_or_else(|p| p.into_inner());
            if self.idle() && now_since == since {
                return;
            }
        }
    }
}

/// How often a connection with a request in progress looks again whether it has
/// become idle: an eighth of the idle timeout (15 s by default), so a connection
/// is closed at most that much after `idle` has passed since its last request,
/// and one that is busy for good (an MCP event stream) wakes 8 times per timeout.
/// Never under a millisecond: a zero `idle` in [`Limits`] built by hand (the
/// configuration refuses under 10 ms) must not make a busy connection's task spin.
fn busy_check(idle: Duration) -> Duration {
    (idle / 8).max(Duration::from_millis(1))
}

/// A request in progress on a [`Conn`].
#[derive(Debug)]
pub struct RequestGuard(Arc<Conn>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        // The time first: a watcher that sees no request in progress reads it.
        let mut since = self.0.idle_since.lock().unwrap_or_else(|p| p.into_inner());
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            *since = Instant::now();
        }
    }
}

impl soulbase_app::metrics::Held for Connections {
    fn held(&self) -> usize {
        self.len()
    }
}

/// The live connections of a listener, at most `cap` of them.
#[derive(Debug)]
pub struct Connections {
    cap: usize,
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    next: u64,
    live: BTreeMap<u64, Arc<Conn>>,
}

/// A connection's place in [`Connections`], released on drop.
#[derive(Debug)]
pub struct ConnGuard {
    id: u64,
    conn: Arc<Conn>,
    table: Arc<Connections>,
}

impl ConnGuard {
    /// The connection's shared state.
    pub fn conn(&self) -> &Arc<Conn> {
        &self.conn
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.table.lock().live.remove(&self.id);
    }
}

impl Connections {
    /// A table holding at most `cap` connections.
    pub fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            cap: cap.max(1),
            table: Mutex::new(Table::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Live connections.
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    /// Whether no connection is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Admits a new connection. At the cap, first closes the oldest connection
    /// that has not completed a request, else the oldest idle one; `None` (refuse
    /// the new one) when every connection has a request in progress.
    pub fn admit(self: &Arc<Self>) -> Option<ConnGuard> {
        let mut t = self.lock();
        if t.live.len() >= self.cap && !Self::shed_locked(&mut t) {
            return None;
        }
        let id = t.next;
        t.next += 1;
        let conn = Arc::new(Conn::new());
        t.live.insert(id, conn.clone());
        Some(ConnGuard {
            id,
            conn,
            table: self.clone(),
        })
    }

    /// Closes one connection as [`admit`](Self::admit) would at the cap (to free a
    /// file descriptor); returns whether one was closed.
    pub fn shed_one(&self) -> bool {
        Self::shed_locked(&mut self.lock())
    }

    fn shed_locked(t: &mut Table) -> bool {
        let victim = t
            .live
            .iter()
            .find(|(_, c)| !c.served())
            .or_else(|| t.live.iter().find(|(_, c)| c.idle()))
            .map(|(id, _)| *id);
        match victim.and_then(|id| t.live.remove(&id)) {
            Some(conn) => {
                conn.shed.cancel();
                true
            }
            None => false,
        }
    }
}

/// `body` holding `hold` (a guard) until it is finished or dropped.
pub fn holding<G: Send + Sync + Unpin + 'static>(body: Body, hold: G) -> Body {
    Body::new(Holding {
        inner: body,
        _hold: hold,
    })
}

/// A response body holding a guard until it is finished or dropped.
struct Holding<G> {
    inner: Body,
    _hold: G,
}

impl<G: Unpin> http_body::Body for Holding<G> {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The router for one connection: each request holds the connection busy until
/// its response body is done.
#[derive(Clone)]
struct Tracked {
    router: Router,
    conn: Arc<Conn>,
}

impl<B> tower::Service<http::Request<B>> for Tracked
where
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let guard = self.conn.begin_request();
        let router = self.router.clone();
        let req: Request = req.map(Body::new);
        Box::pin(async move {
            let response = router.oneshot(req).await?;
            Ok(response.map(|inner| holding(inner, guard)))
        })
    }
}

/// What a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 and HTTP/2 (h2c, or ALPN over TLS): the API, MCP, health, metrics.
    Http,
    /// HTTP/2 only: gRPC.
    Grpc,
}

/// The connection builder of a `protocol` listener under `limits`.
fn builder(protocol: Protocol, limits: &Limits) -> Builder<TokioExecutor> {
    let mut b = Builder::new(TokioExecutor::new());
    if protocol == Protocol::Grpc {
        b = b.http2_only();
    }
    b.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    b.http2()
        .timer(TokioTimer::new())
        // CONNECT protocol for HTTP/2 websockets, as axum::serve does.
        .enable_connect_protocol()
        .max_concurrent_streams(limits.http2_max_concurrent_streams)
        .keep_alive_interval(limits.http2_keepalive_interval)
        .keep_alive_timeout(limits.http2_keepalive_timeout);
    b
}

/// How TLS is terminated on a listener.
#[cfg(feature = "tls")]
pub type Tls = tokio_rustls::TlsAcceptor;
/// How TLS is terminated on a listener (this build has no TLS).
#[cfg(not(feature = "tls"))]
pub type Tls = Infallible;

/// Serves `router` on `listener` (over TLS with `tls`), speaking `protocol`, under
/// `limits` until `stop` turns true; then stops accepting, lets every connection
/// finish its requests (HTTP/1 keep-alive ends, HTTP/2 sends GOAWAY) and returns
/// once all are closed. `connections` is the listener's table (see
/// [`Connections`]), which holds the listener's cap.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Tls>,
    protocol: Protocol,
    router: Router,
    limits: Limits,
    connections: Arc<Connections>,
    mut stop: watch::Receiver<bool>,
) {
    let builder = Arc::new(builder(protocol, &limits));
    let mut tasks = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            c = accept(&listener, limits.tcp_keepalive, || connections.shed_one()) => c,
            _ = stop.wait_for(|s| *s) => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (tcp, peer) = accepted;
        let Some(guard) = connections.admit() else {
            tracing::debug!(%peer, "connection refused: every connection is busy");
            continue;
        };
        tasks.spawn(connection(
            tcp,
            tls.clone(),
            router.clone(),
            builder.clone(),
            guard,
            (limits.header_read_timeout, limits.idle_timeout),
            stop.clone(),
        ));
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
}

/// Serves one connection until it ends, is shed, does not complete its first
/// request within `first` of accept, or stays idle for `idle`.
async fn connection(
    tcp: TcpStream,
    tls: Option<Tls>,
    router: Router,
    builder: Arc<Builder<TokioExecutor>>,
    guard: ConnGuard,
    (first, idle): (Duration, Duration),
    stop: watch::Receiver<bool>,
) {
    let conn = guard.conn().clone();
    let service = Tracked {
        router,
        conn: conn.clone(),
    };
    let serve = async {
        match tls {
            None => serve_io(tcp, service, &builder, stop).await,
            #[cfg(feature = "tls")]
            Some(acceptor) => {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => serve_io(stream, service, &builder, stop).await,
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            }
            #[cfg(not(feature = "tls"))]
            Some(never) => match never {},
        }
    };
    tokio::select! {
        () = serve => {}
        () = conn.shed.cancelled() => tracing::debug!("connection shed for a newer one"),
        () = conn.first_request_expired(first) => {
            tracing::debug!("connection closed: no request within the header-read timeout");
        }
        () = conn.idle_expired(idle) => tracing::debug!("idle connection closed"),
    }
    drop(guard);
}

async fn serve_io<I>(
    io: I,
    service: Tracked,
    builder: &Builder<TokioExecutor>,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = TowerToHyperService::new(service);
    let mut conn = pin!(builder.serve_connection_with_upgrades(TokioIo::new(io), service));
    let mut stopping = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::trace!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The socket the server serves on has TCP_NODELAY and the configured TCP
    /// keep-alive set, whatever the defaults.
    #[tokio::test]
    async fn accepted_sockets_are_tuned() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cfg = ServerConfig {
            tcp_keepalive_ms: 7_000,
            ..ServerConfig::default()
        };
        let limits = Limits::from_config(&cfg);
        let client = TcpStream::connect(addr).await.unwrap();
        // The kernel default is Nagle on, keep-alive off.
        assert!(!client.nodelay().unwrap());
        assert!(!socket2::SockRef::from(&client).keepalive().unwrap());
        let (server, peer) = accept(&listener, limits.tcp_keepalive, || false).await;
        assert_eq!(peer, client.local_addr().unwrap());
        assert!(server.nodelay().unwrap(), "TCP_NODELAY must be set");
        let sock = socket2::SockRef::from(&server);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), Duration::from_secs(7));

        // tcp_keepalive_ms: 0 leaves keep-alive off (nodelay still on).
        let off = Limits::from_config(&ServerConfig {
            tcp_keepalive_ms: 0,
            ..ServerConfig::default()
        });
        let _client = TcpStream::connect(addr).await.unwrap();
        let (server, _) = accept(&listener, off.tcp_keepalive, || false).await;
        assert!(server.nodelay().unwrap());
        assert!(!socket2::SockRef::from(&server).keepalive().unwrap());
    }

    /// At the cap the oldest connection without a complete request goes first,
    /// then the oldest idle one; with every connection busy the new one is refused.
    #[test]
    fn admission_sheds_unserved_then_idle_then_refuses() {
        let table = Connections::new(3);
        let a = table.admit().unwrap();
        let b = table.admit().unwrap();
        let c = table.admit().unwrap();
        let _busy_a = a.conn().begin_request();
        // b has completed a request and is idle again.
        drop(b.conn().begin_request());
        // c never sent a complete request: it is shed first, though b is older.
        let d = table.admit().unwrap();
        assert!(c.conn().is_shed());
        assert!(!b.conn().is_shed() && !a.conn().is_shed());
        assert_eq!(table.len(), 3);
        let _busy_d = d.conn().begin_request();
        // Now only b is idle.
        let e = table.admit().unwrap();
        assert!(b.conn().is_shed());
        let _busy_e = e.conn().begin_request();
        // Every connection busy: the new one is refused.
        assert!(table.admit().is_none());
        assert_eq!(table.len(), 3);
        // A closed connection frees its place.
        drop(a);
        assert_eq!(table.len(), 2);
        assert!(table.admit().is_some());
    }

    /// The caps share what the open-file limit leaves room for, in proportion.
    #[test]
    fn caps_are_clamped_to_the_open_file_limit() {
        let limits = Limits::from_config(&ServerConfig::default());
        assert_eq!(
            (limits.max_connections, limits.grpc_max_connections),
            (1024, 1024)
        );
        let caps = |l: Limits| (l.max_connections, l.grpc_max_connections);
        // 1024 - 256 = 768 left, shared 1:1.
        assert_eq!(caps(limits.clone().clamped_to(Some(1024))), (384, 384));
        assert_eq!(caps(limits.clone().clamped_to(Some(100))), (16, 16));
        assert_eq!(caps(limits.clone().clamped_to(Some(1 << 20))), (1024, 1024));
        // Exactly enough room: unchanged.
        assert_eq!(
            caps(limits.clone().clamped_to(Some(2048 + FD_RESERVE))),
            (1024, 1024)
        );
        assert_eq!(caps(limits.clone().clamped_to(None)), (1024, 1024));
        // In proportion to the caps: 3:1.
        let uneven = Limits {
            max_connections: 3000,
            grpc_max_connections: 1000,
            ..limits
        };
        assert_eq!(caps(uneven.clamped_to(Some(2256))), (1500, 500));
    }

    /// A connection that has not completed a request expires `within` after its
    /// start; one that has, never.
    #[tokio::test(start_paused = true)]
    async fn the_first_request_must_come_in_time() {
        let within = Duration::from_secs(2);
        let silent = Arc::new(Conn::new());
        let started = Instant::now();
        silent.first_request_expired(within).await;
        assert!(Instant::now() >= started + within);

        let served = Arc::new(Conn::new());
        drop(served.begin_request());
        assert!(
            tokio::time::timeout(
                Duration::from_secs(60),
                served.first_request_expired(within)
            )
            .await
            .is_err()
        );
    }

    /// An idle connection expires `idle` after its last request ended, not while
    /// one is in progress.
    #[tokio::test(start_paused = true)]
    async fn idle_expiry_waits_for_requests_to_end() {
        let conn = Arc::new(Conn::new());
        let busy = conn.begin_request();
        let idle = Duration::from_secs(5);
        let expired = conn.idle_expired(idle);
        tokio::pin!(expired);
        // Busy for a minute of (paused) time: no expiry.
        assert!(
            tokio::time::timeout(Duration::from_secs(60), expired.as_mut())
                .await
                .is_err()
        );
        drop(busy);
        let ended = Instant::now();
        expired.await;
        assert!(Instant::now() >= ended + idle);
        assert!(Instant::now() <= ended + idle + busy_check(idle));
    }

    /// A busy connection looks again an eighth of the idle timeout later, and never
    /// in a loop that does not sleep.
    #[test]
    fn busy_check_is_an_eighth_of_idle_and_never_zero() {
        assert_eq!(
            busy_check(Duration::from_secs(120)),
            Duration::from_secs(15)
        );
        assert_eq!(busy_check(Duration::ZERO), Duration::from_millis(1));
    }
}
