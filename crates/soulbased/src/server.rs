//! Listeners, serving and graceful shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use soulbase_config::{Role, TlsConfig};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_grpc::{InvokerService, RegistryService, proto};
use soulbase_mcp::McpServer;
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
use crate::listener::{Connections, Limits};

/// What happened during shutdown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Whether every listener drained within the grace period.
    pub drained: bool,
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

#[cfg(feature = "tls")]
fn tls(
    builder: tonic::transport::Server,
    tls: &TlsConfig,
) -> Result<tonic::transport::Server, SoulError> {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    // Use ring whatever else the build enables (several rustls providers may be
    // compiled in; rustls then refuses to guess). An already installed provider stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |field: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            SoulError::new(
                ErrorCode::ConfigInvalid,
                format!("cannot read server.tls.{field}"),
            )
            .with_field("field", format!("server.tls.{field}"))
            .with_note(e.to_string())
        })
    };
    let cert = read("cert_file", &tls.cert_file)?;
    let key = read("key_file", &tls.key_file)?;
    let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
    if let Some(ca) = &tls.client_ca_file {
        config = config.client_ca_root(Certificate::from_pem(read("client_ca_file", ca)?));
    }
    builder.tls_config(config).map_err(|e| {
        SoulError::new(ErrorCode::ConfigInvalid, "server.tls is not usable")
            .with_field("field", "server.tls")
            .with_note(e.to_string())
    })
}

/// The TLS acceptor of the HTTP listener, from `server.tls` (the files the gRPC
/// listener uses).
#[cfg(feature = "tls")]
fn https_acceptor(tls: &TlsConfig) -> Result<crate::listener::Tls, SoulError> {
    Ok(tokio_rustls::TlsAcceptor::from(
        crate::https::server_config(tls)?,
    ))
}

#[cfg(not(feature = "tls"))]
fn https_acceptor(_tls: &TlsConfig) -> Result<crate::listener::Tls, SoulError> {
    Err(SoulError::new(
        ErrorCode::ConfigInvalid,
        "server.tls is set but soulbased was built without the tls feature",
    )
    .with_field("field", "server.tls"))
}

#[cfg(not(feature = "tls"))]
fn tls(
    _builder: tonic::transport::Server,
    _tls: &TlsConfig,
) -> Result<tonic::transport::Server, SoulError> {
    Err(SoulError::new(
        ErrorCode::ConfigInvalid,
        "server.tls is set but soulbased was built without the tls feature",
    )
    .with_field("field", "server.tls"))
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The streamable HTTP MCP service for `app`, stopped by `stop`, with its sessions
/// bounded by `server.mcp_max_sessions`, `server.mcp_max_sessions_per_tenant` and
/// `server.mcp_session_idle_ms` (idle ones closed by a sweeper until `stop`).
pub fn mcp_service(app: &Arc<App>, stop: CancellationToken, loopback: bool) -> http_api::Mcp {
    let mut server =
        McpServer::for_http(app.registry.clone(), app.invoker.clone(), app.auth.clone())
            .with_observer(app.metrics.clone())
            .with_call_span(Arc::new(crate::telemetry::execute_tool_span))
            .with_shutdown(stop.clone());
    if let Some(s) = &app.skills {
        server = server.with_skills(s.gateway.clone(), app.dev_insecure);
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
    // rmcp's own idle limit only backs ours up (ours counts a streaming answer as use).
    manager.session_config.keep_alive = Some(limits.idle.saturating_mul(2));
    let manager = Arc::new(manager);
    let sessions = McpSessions::new(manager.clone(), limits);
    sessions.spawn_sweeper(stop);
    app.metrics.watch_mcp_sessions(sessions.clone());
    http_api::Mcp {
        service: StreamableHttpService::new(move || Ok(server.clone()), manager, config),
        sessions,
    }
}

/// Serves every configured role until `shutdown` resolves, then drains within
/// `server.shutdown_grace_ms` and flushes evidence. Prints the bound addresses on
/// stdout (`soulbased: grpc listening on ADDR`, `… http listening on ADDR`,
/// `soulbased: ready`).
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
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(soulbase_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| SoulError::internal(e).with_note("building the reflection service"))?;
    // HTTP/2 pings find dead peers; the stream cap bounds one connection's work.
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(cfg.http2_max_concurrent_streams)
        .http2_keepalive_interval(Some(limits.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(limits.http2_keepalive_timeout));
    if let Some(t) = &cfg.tls {
        builder = tls(builder, t)?;
    }
    let mut routes = builder.add_service(health_service).add_service(reflection);
    let tools = cfg.roles.contains(&Role::Tools);
    if tools {
        let registry = RegistryService::new(
            app.registry.clone(),
            app.authorizer.clone(),
            app.auth.clone(),
        )
        .with_shutdown(stop_rx.clone());
        let invoker = InvokerService::new(app.invoker.clone(), app.auth.clone())
            .with_runner(app.call_runner())
            .with_observer(app.metrics.clone());
        routes = routes
            .add_service(registry.into_server())
            .add_service(invoker.into_server());
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
    // The HTTP listener's TLS is set up before anything is served, so a bad
    // `server.tls` fails start-up without leaving the gRPC listener running.
    let https = cfg.tls.as_ref().map(https_acceptor).transpose()?;
    // Every accepted socket gets TCP_NODELAY (a response is several small writes;
    // with Nagle each waits for the peer's delayed ACK, ~40 ms) and TCP keep-alive.
    let grpc = tokio::spawn(routes.serve_with_incoming_shutdown(
        crate::listener::incoming(grpc_listener, limits.tcp_keepalive),
        stopped(stop_rx.clone()),
    ));

    // HTTP (API, health, metrics, MCP).
    let mcp = mcp_service(&app, mcp_stop.clone(), http_addr.ip().is_loopback());
    let router = http_api::router(app.clone(), mcp);
    let connections = Connections::new(limits.max_connections);
    app.metrics.watch_connections(connections.clone());
    let http = tokio::spawn(crate::listener::serve_http(
        http_listener,
        https,
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
    let drained = tokio::time::timeout(grace, async {
        let (g, h) = tokio::join!(grpc, http);
        if let Ok(Err(e)) = g {
            tracing::warn!(error = %e, "gRPC server ended with an error");
        }
        if let Err(e) = h {
            tracing::warn!(error = %e, "HTTP server ended with an error");
        }
    })
    .await
    .is_ok();
    if !drained {
        tracing::warn!(
            grace_ms = cfg.shutdown_grace_ms,
            "grace period expired: closing remaining connections"
        );
        grpc_abort.abort();
        http_abort.abort();
    }
    let drain_ms = began.elapsed().as_millis() as u64;
    let evidence_written = flush.flush(grace.max(Duration::from_secs(1))).await;
    println!(
        "soulbased: stopped (drained: {drained}, drain_ms: {drain_ms}, evidence_written: {evidence_written})"
    );
    Ok(ShutdownReport {
        drained,
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
            while hup.recv().await.is_some() {
                let status = app.reload();
                tracing::info!(status = ?status, "SIGHUP: configuration reloaded");
                if let Some(Ok(report)) = app.reload_skills().await {
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

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
