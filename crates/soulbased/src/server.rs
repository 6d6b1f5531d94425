//! Listeners, serving and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::middleware::{self, Next};
use soulbase_config::{Role, TlsConfig};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::{ConsentGrpcService, InvokerService, RegistryService, proto};
use soulbase_mcp::McpServer;
use soulbase_mcp::polling::PollingSessions;
use soulbase_mcp::sessions::{McpSessions, SessionLimits};
use soulbase_mcp::transport::{
    LocalSessionManager, StreamableHttpServerConfig, StreamableHttpService,
};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::app::App;
use crate::evidence::EvidenceFlush;
use crate::http_api;
use crate::listener::{Connections, Limits, Protocol};

/// The exit status of `soulbased` when its shutdown did not drain: the grace
/// period (`server.shutdown_grace_ms`) expired with calls or connections still
/// open. The calls still running were cancelled, each with a `cancelled` End
/// recorded before the evidence was flushed (see [`run`]).
pub const EXIT_NOT_DRAINED: u8 = 3;

/// How long, once the grace period has expired, the calls cut off get to record
/// their `cancelled` End (a spool write) and their connections to close.
const ABANDON_WAIT: Duration = Duration::from_secs(3);

/// What happened during shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Whether every listener drained within the grace period.
    pub drained: bool,
    /// Calls still running when the grace period expired: cancelled, each with a
    /// `cancelled` End.
    pub abandoned: u64,
    /// Calls whose End could not be recorded before exit even so (their Begins
    /// are closed `aborted` when the spool is recovered on the next start).
    pub unended: u64,
    /// How long draining took.
    pub drain_ms: u64,
    /// Evidence records this process wrote to the store.
    pub evidence_written: u64,
}

fn io_error(what: &str, addr: SocketAddr, e: std::io::Error) -> SoulError {
    SoulError::new(ErrorCode::ConfigInvalid, format!("cannot {what} {addr}"))
        .with_field("address", addr.to_string())
        .with_note(e.to_string())
}

/// The TLS acceptor of a `protocol` listener, from `server.tls` (one set of files
/// for both listeners; ALPN per protocol).
#[cfg(feature = "tls")]
fn tls_acceptor(tls: &TlsConfig, protocol: Protocol) -> Result<crate::listener::Tls, SoulError> {
    // Make ring the process default too, whatever else the build enables (several
    // rustls providers may be compiled in; rustls then refuses to guess). An
    // already installed provider stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = match protocol {
        Protocol::Http => crate::https::server_config(tls)?,
        Protocol::Grpc => crate::https::grpc_server_config(tls)?,
    };
    Ok(tokio_rustls::TlsAcceptor::from(config))
}

#[cfg(not(feature = "tls"))]
fn tls_acceptor(_tls: &TlsConfig, _protocol: Protocol) -> Result<crate::listener::Tls, SoulError> {
    Err(SoulError::new(
        ErrorCode::ConfigInvalid,
        "server.tls is set but soulbased was built without the tls feature",
    )
    .with_field("field", "server.tls"))
}

/// The `grpc-timeout` of a request (gRPC over HTTP/2: at most 8 digits and a unit,
/// `H` `M` `S` `m` `u` `n`); `None` when absent or malformed.
fn grpc_timeout(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    let unit = value.chars().last()?;
    let digits = value.get(..value.len() - unit.len_utf8())?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Client deadlines on the gRPC listener, as tonic's own server keeps them: a call
/// still running when its `grpc-timeout` passes is dropped and answered
/// `CANCELLED`.
async fn grpc_deadline(request: axum::extract::Request, next: Next) -> axum::response::Response {
    match grpc_timeout(request.headers()) {
        None => next.run(request).await,
        Some(deadline) => tokio::time::timeout(deadline, next.run(request))
            .await
            .unwrap_or_else(|_| tonic::Status::cancelled("Timeout expired").into_http()),
    }
}

/// The streamable HTTP MCP service for `app`, stopped by `stop`, with its sessions
/// bounded by `server.mcp_max_sessions`, `server.mcp_max_sessions_per_tenant` and
/// `server.mcp_session_idle_ms` (idle ones closed by a sweeper until `stop`).
pub fn mcp_service(app: &Arc<App>, stop: CancellationToken, loopback: bool) -> http_api::Mcp {
    let mut server = McpServer::for_http(app.registry.clone(), app.stack.clone(), app.auth.clone())
        .with_shutdown(stop.clone())
        .with_consent(app.consent_desk.clone())
        .with_fixtures(app.config.current().config().server.mcp_conformance_tools);
    if let Some(s) = &app.skills {
        server = server.with_skills(s.terms.clone());
    }
    let mut config = StreamableHttpServerConfig::default().with_cancellation_token(stop.clone());
    if !loopback {
        // Every MCP request is authenticated (and Origin-checked) before rmcp sees
        // it, so the DNS-rebinding Host check only matters on loopback.
        config = config.disable_allowed_hosts();
    }
    let snap = app.config.current();
    let cfg = &snap.config().server;
    let limits = SessionLimits {
        max_total: cfg.mcp_max_sessions,
        max_per_tenant: cfg.mcp_max_sessions_per_tenant,
        idle: Duration::from_millis(cfg.mcp_session_idle_ms),
    };
    let mut manager = LocalSessionManager::default();
    // Ours is the idle limit (it counts every request, and a streaming answer, as
    // use). rmcp's counts only what reaches a session's worker, which a
    // `tools/call` answered directly never does (`soulbase_mcp::polling`): it
    // would close a session busy with nothing but calls.
    manager.session_config.keep_alive = None;
    let manager = Arc::new(manager);
    let sessions = McpSessions::new(manager.clone(), limits);
    sessions.spawn_sweeper(stop);
    app.metrics.watch_mcp_sessions(sessions.clone());
    // A call whose tool lets the client poll has its stream closed (SEP-1699).
    let polling = PollingSessions::new(manager);
    let server = server.with_polling(polling.clone());
    http_api::Mcp {
        service: StreamableHttpService::new(move || Ok(server.for_session()), polling, config),
        sessions,
    }
}

/// Serves every configured role until `shutdown` resolves, then drains within
/// `server.shutdown_grace_ms` and flushes evidence. Prints the bound addresses on
/// stdout (`soulbased: grpc listening on ADDR`, `… http listening on ADDR`,
/// `soulbased: ready`).
///
/// When the grace period expires first, the calls still running are cancelled
/// ([`soulbase_tools::pipeline::Invoker::abandon_running`]): each records a `cancelled` End
/// and answers `PROVIDER.UNAVAILABLE`; they get 3 s to do so before
/// the remaining connections are closed and the spool is drained into the store.
/// The report then says `drained: false` with the number of calls abandoned
/// (`soulbased: stopped (drained: false, abandoned: N, …)` on stdout), and the
/// binary exits with [`EXIT_NOT_DRAINED`].
pub async fn run(
    app: Arc<App>,
    flush: EvidenceFlush,
    shutdown: impl Future<Output = ()>,
) -> Result<ShutdownReport, SoulError> {
    let snap = app.config.current();
    let cfg = snap.config().server.clone();
    // Connections, not the open-file limit, bound what clients can hold.
    let nofile = crate::listener::raise_nofile_limit();
    let limits = Limits::from_config(&cfg).clamped_to(nofile);
    let grpc_listener = TcpListener::bind(cfg.grpc_addr)
        .await
        .map_err(|e| io_error("listen on", cfg.grpc_addr, e))?;
    let http_listener = TcpListener::bind(cfg.http_addr)
        .await
        .map_err(|e| io_error("listen on", cfg.http_addr, e))?;
    let grpc_addr = grpc_listener
        .local_addr()
        .map_err(|e| io_error("read the address of", cfg.grpc_addr, e))?;
    let http_addr = http_listener
        .local_addr()
        .map_err(|e| io_error("read the address of", cfg.http_addr, e))?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mcp_stop = CancellationToken::new();

    // gRPC.
    let (health, health_service) = tonic_health::server::health_reporter();
    // Reflection in both versions clients speak: `v1`, and the `v1alpha` that
    // grpcio-reflection, grpcurl's older releases and many tools still use.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(soulbase_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_error = |e: tonic_reflection::server::Error| {
        SoulError::internal(e).with_note("building the reflection service")
    };
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;
    // Served through the listener's own loop (connection cap, timeouts, pings,
    // stream cap), like HTTP.
    let mut routes = tonic::service::Routes::new(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha);
    let tools = cfg.roles.contains(&Role::Tools);
    if tools {
        let registry = RegistryService::new(
            app.admin.clone(),
            app.stack.clone(),
            app.authorizer.clone(),
            app.auth.clone(),
        )
        .with_shutdown(stop_rx.clone());
        let invoker = InvokerService::new(app.stack.clone(), app.auth.clone());
        let consent = ConsentGrpcService::new(
            app.consent_desk.clone(),
            app.auth.clone(),
            app.stack.observer().clone(),
        );
        routes = routes
            .add_service(registry.into_server())
            .add_service(invoker.into_server())
            .add_service(consent.into_server());
        health
            .set_serving::<proto::tool_registry_server::ToolRegistryServer<RegistryService>>()
            .await;
        health
            .set_serving::<proto::tool_invoker_server::ToolInvokerServer<InvokerService>>()
            .await;
    }
    if let Some(auth) = app.auth_role.clone() {
        routes = routes.add_service(auth.into_server());
        health
            .set_serving::<soulbase_grpc::roles::auth_proto::auth_server::AuthServer<
                soulbase_grpc::AuthRoleService,
            >>()
            .await;
    }
    if let Some(qos) = app.qos_role.clone() {
        routes = routes.add_service(qos.into_server());
        health
            .set_serving::<soulbase_grpc::roles::qos_proto::quota_server::QuotaServer<
                soulbase_grpc::QosRoleService,
            >>()
            .await;
    }
    if let Some(sandbox) = app.sandbox_role.clone() {
        routes = routes.add_service(sandbox.into_server());
        health
            .set_serving::<soulbase_grpc::sandbox_proto::sandbox_server::SandboxServer<
                soulbase_grpc::SandboxRoleService,
            >>()
            .await;
    }
    if let Some(evidence) = app.evidence_role.clone() {
        routes = routes.add_service(evidence.into_server());
        health
            .set_serving::<soulbase_grpc::evidence_proto::evidence_server::EvidenceServer<
                soulbase_grpc::EvidenceRoleService,
            >>()
            .await;
    }
    health
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // Both listeners' TLS is set up before anything is served, so a bad
    // `server.tls` fails start-up without leaving a listener running.
    let (grpc_tls, https) = match &cfg.tls {
        Some(t) => (
            Some(tls_acceptor(t, Protocol::Grpc)?),
            Some(tls_acceptor(t, Protocol::Http)?),
        ),
        None => (None, None),
    };
    let grpc_router = routes
        .prepare()
        .into_axum_router()
        .layer(middleware::from_fn(grpc_deadline));
    let grpc_connections = Connections::new(limits.grpc_max_connections);
    app.metrics.watch_grpc_connections(grpc_connections.clone());
    let grpc = tokio::spawn(crate::listener::serve(
        grpc_listener,
        grpc_tls,
        Protocol::Grpc,
        grpc_router,
        limits.clone(),
        grpc_connections,
        stop_rx.clone(),
    ));

    // HTTP (API, health, metrics, MCP).
    let mcp = mcp_service(&app, mcp_stop.clone(), http_addr.ip().is_loopback());
    let router = http_api::router(app.clone(), mcp);
    let connections = Connections::new(limits.max_connections);
    app.metrics.watch_connections(connections.clone());
    let http = tokio::spawn(crate::listener::serve(
        http_listener,
        https,
        Protocol::Http,
        router,
        limits.clone(),
        connections,
        stop_rx.clone(),
    ));

    let hup = reload_on_sighup(app.clone());
    app.set_ready(true);
    println!("soulbased: grpc listening on {grpc_addr}");
    println!("soulbased: http listening on {http_addr}");
    println!("soulbased: ready");
    if let Some(banner) = dev_banner(&app.config.current().config().server, http_addr) {
        tracing::warn!("development mode: identity headers are trusted; never expose this server");
        println!("{banner}");
    }
    tracing::info!(%grpc_addr, %http_addr, "soulbased ready");

    shutdown.await;
    let began = Instant::now();
    tracing::info!("shutting down: draining in-flight calls");
    app.set_ready(false);
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let _ = stop_tx.send(true);
    mcp_stop.cancel();
    if let Some(h) = hup {
        h.abort();
    }
    let grace = Duration::from_millis(cfg.shutdown_grace_ms);
    let grpc_abort = grpc.abort_handle();
    let http_abort = http.abort_handle();
    let listeners = async {
        let (g, h) = tokio::join!(grpc, http);
        if let Err(e) = g {
            tracing::warn!(error = %e, "gRPC server ended with an error");
        }
        if let Err(e) = h {
            tracing::warn!(error = %e, "HTTP server ended with an error");
        }
    };
    tokio::pin!(listeners);
    let drained = tokio::time::timeout(grace, &mut listeners).await.is_ok();
    let drain_ms = began.elapsed().as_millis() as u64;
    let (mut abandoned, mut unended) = (0, 0);
    if !drained {
        // Cut the calls off: each records its `cancelled` End and answers its
        // caller, then the connections can close.
        abandoned = app.invoker.abandon_running() as u64;
        tracing::warn!(
            grace_ms = cfg.shutdown_grace_ms,
            abandoned,
            "grace period expired: cancelling the calls still running"
        );
        if tokio::time::timeout(ABANDON_WAIT, app.invoker.all_ended())
            .await
            .is_err()
        {
            unended = app.invoker.open_calls() as u64;
            tracing::error!(
                unended,
                "cancelled calls did not record their End in time; the next start on this data_dir closes them as aborted"
            );
        }
        if tokio::time::timeout(ABANDON_WAIT, &mut listeners)
            .await
            .is_err()
        {
            tracing::warn!("closing the remaining connections");
            grpc_abort.abort();
            http_abort.abort();
        }
    }
    let evidence_written = flush.flush(grace.max(Duration::from_secs(1))).await;
    if !drained {
        tracing::warn!(
            abandoned,
            exit_code = EXIT_NOT_DRAINED,
            "shutdown did not drain: calls were cancelled at the end of the grace period"
        );
    }
    println!(
        "soulbased: stopped (drained: {drained}, abandoned: {abandoned}, unended: {unended}, drain_ms: {drain_ms}, evidence_written: {evidence_written})"
    );
    Ok(ShutdownReport {
        drained,
        abandoned,
        unended,
        drain_ms,
        evidence_written,
    })
}

/// Reloads the configuration and the skills directory on every SIGHUP (Unix).
fn reload_on_sighup(app: Arc<App>) -> Option<tokio::task::JoinHandle<()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hup = signal(SignalKind::hangup())
            .map_err(|e| tracing::warn!(error = %e, "cannot install the SIGHUP handler"))
            .ok()?;
        Some(tokio::spawn(async move {
            // No caller: a signal's changes are audited as the system's.
            let by = soulbase_observe::system_subject();
            while hup.recv().await.is_some() {
                let status = app.reload(&by).await;
                tracing::info!(status = ?status, "SIGHUP: configuration reloaded");
                if let Some(Ok(report)) = app.reload_skills(&by).await {
                    tracing::info!(
                        generation = report.generation,
                        changed = report.changed(),
                        "SIGHUP: skills reloaded"
                    );
                }
            }
        }))
    }
    #[cfg(not(unix))]
    {
        let _ = app;
        None
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is
/// called, not when the future is first polled: a SIGTERM that comes as soon as
/// the server says it is ready must shut it down cleanly, not kill it.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        // A handler that cannot be installed is logged; SIGINT then falls back
        // to `ctrl_c` (which tries again when polled), so the server always has
        // a way to be stopped cleanly.
        let installed = |kind: SignalKind, name: &str| match signal(kind) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot install the {name} handler");
                None
            }
        };
        let term = installed(SignalKind::terminate(), "SIGTERM");
        let int = installed(SignalKind::interrupt(), "SIGINT");
        async move {
            let term = async move {
                match term {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            let int = async move {
                match int {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            };
            tokio::select! {
                () = term => {}
                () = int => {}
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// What a development server (`server.dev_insecure`) prints once it is ready: a loud
/// warning and, when `server.dev_identity` lets stock clients in without headers, a
/// first call and an MCP client configuration ready to paste. `None` otherwise.
fn dev_banner(server: &soulbase_config::ServerConfig, http_addr: SocketAddr) -> Option<String> {
    if !server.dev_insecure {
        return None;
    }
    let mut out = String::from(
        "soulbased: DEVELOPMENT MODE: x-soulbase-tenant / x-soulbase-actor headers are \
         trusted as the caller's identity. Never expose this server.",
    );
    let Some(who) = &server.dev_identity else {
        return Some(out);
    };
    // A wildcard listen address is reached on the loopback.
    let host = match http_addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => {
            SocketAddr::from(([127, 0, 0, 1], http_addr.port()))
        }
        ip if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, http_addr.port()))
        }
        _ => http_addr,
    };
    out.push_str(&format!(
        "\nsoulbased: a request naming no one acts as tenant {:?}, actor {:?}. Try:\n  \
         curl -s -X POST -d '{{\"hello\": \"world\"}}' http://{host}/api/tools/soulbase.builtin.echo/invoke\n\
         soulbased: MCP clients (streamable HTTP): \
         {{\"mcpServers\": {{\"soulbase\": {{\"type\": \"http\", \"url\": \"http://{host}/mcp\"}}}}}}",
        who.tenant, who.actor
    ));
    Some(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn timeout_of(v: &str) -> Option<Duration> {
        let mut h = http::HeaderMap::new();
        h.insert("grpc-timeout", v.parse().unwrap());
        grpc_timeout(&h)
    }

    /// `grpc-timeout` is read as the gRPC over HTTP/2 spec writes it.
    #[test]
    fn grpc_timeouts_are_parsed() {
        assert_eq!(timeout_of("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(timeout_of("3M"), Some(Duration::from_secs(180)));
        assert_eq!(timeout_of("5S"), Some(Duration::from_secs(5)));
        assert_eq!(timeout_of("250m"), Some(Duration::from_millis(250)));
        assert_eq!(timeout_of("7u"), Some(Duration::from_micros(7)));
        assert_eq!(
            timeout_of("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "S", "123456789S", "5s", "-5S", "5 S", "1.5S"] {
            assert_eq!(timeout_of(bad), None, "{bad:?}");
        }
        assert_eq!(grpc_timeout(&http::HeaderMap::new()), None);
    }

    /// The development banner shows a call and an MCP configuration that reach the
    /// server: a wildcard listen address becomes the loopback.
    #[test]
    fn the_dev_banner_points_at_a_reachable_address() {
        let mut server = soulbase_config::ServerConfig::default();
        assert_eq!(dev_banner(&server, "127.0.0.1:8080".parse().unwrap()), None);
        server.dev_insecure = true;
        let plain = dev_banner(&server, "127.0.0.1:8080".parse().unwrap()).unwrap();
        assert!(
            plain.contains("DEVELOPMENT MODE") && !plain.contains("curl"),
            "{plain}"
        );
        server.dev_identity = Some(soulbase_config::DevIdentity {
            tenant: "dev".into(),
            actor: "dev".into(),
        });
        let banner = dev_banner(&server, "0.0.0.0:9000".parse().unwrap()).unwrap();
        assert!(
            banner.contains("http://127.0.0.1:9000/api/tools/soulbase.builtin.echo/invoke"),
            "{banner}"
        );
        assert!(
            banner.contains(r#""url": "http://127.0.0.1:9000/mcp""#),
            "{banner}"
        );
    }
}
