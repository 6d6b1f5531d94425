//! TLS (and mTLS) for the HTTP listener: the API, MCP, health and metrics served
//! over HTTPS from the same `server.tls` files as the gRPC listener.
//!
//! [`TlsListener`] is an `axum::serve` listener. A background task accepts TCP
//! connections and runs each TLS handshake in its own task (bounded by
//! [`HANDSHAKE_TIMEOUT`]), so a slow or silent client never holds up others; only
//! completed handshakes are handed to the server. ALPN offers HTTP/2 and HTTP/1.1.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use soulbase_config::TlsConfig;
use soulbase_errors::{ErrorCode, SoulError};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// How long a client may take to complete its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections handshaken and not yet taken by the server.
const BACKLOG: usize = 256;

fn invalid(field: &str, what: &str, cause: impl std::fmt::Display) -> SoulError {
    SoulError::new(ErrorCode::ConfigInvalid, what.to_owned())
        .with_field("field", format!("server.tls.{field}"))
        .with_note(cause.to_string())
}

fn certificates(field: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, SoulError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid(field, &format!("cannot read server.tls.{field}"), e))?;
    if certs.is_empty() {
        return Err(invalid(
            field,
            &format!("server.tls.{field} holds no certificate"),
            path.display(),
        ));
    }
    Ok(certs)
}

/// The rustls server configuration of `tls`: its certificate chain and key, and
/// with `client_ca_file` a required client certificate signed by that CA.
pub fn server_config(tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, SoulError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = certificates("cert_file", &tls.cert_file)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key_file)
        .map_err(|e| invalid("key_file", "cannot read server.tls.key_file", e))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("cert_file", "server.tls is not usable", e))?;
    let builder = match &tls.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates("client_ca_file", ca)? {
                roots.add(cert).map_err(|e| {
                    invalid(
                        "client_ca_file",
                        "server.tls.client_ca_file is not usable",
                        e,
                    )
                })?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| {
                        invalid(
                            "client_ca_file",
                            "server.tls.client_ca_file is not usable",
                            e,
                        )
                    })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_single_cert(chain, key).map_err(|e| {
        invalid(
            "key_file",
            "server.tls.key_file does not match the certificate",
            e,
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// An HTTPS listener for `axum::serve`: yields only connections whose handshake
/// completed. Dropping it stops accepting.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    /// Starts accepting on `listener` with `config`.
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(BACKLOG);
        let tls = TlsAcceptor::from(config);
        let acceptor = tokio::spawn(async move {
            loop {
                // TCP_NODELAY set, accept errors retried (crate::listener).
                let (tcp, peer) = crate::listener::accept(&listener).await;
                let tls = tls.clone();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            ready,
            local,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The acceptor task is gone (aborted on drop): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
