//! TLS (and mTLS) for both listeners, from the `server.tls` files: the API, MCP,
//! health and metrics over HTTPS, and gRPC.
//!
//! [`server_config`] builds the rustls configuration; [`crate::listener::serve`]
//! runs each TLS handshake in its connection's own task (bounded by
//! [`crate::listener::HANDSHAKE_TIMEOUT`] and `server.header_read_timeout_ms`, and
//! counted against the listener's connection cap from accept), so a slow or
//! silent client never holds up others. ALPN offers HTTP/2 and HTTP/1.1 on the
//! HTTP listener, HTTP/2 only on the gRPC one ([`grpc_server_config`]).

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use soulbase_config::TlsConfig;
use soulbase_errors::{ErrorCode, SoulError};

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

/// [`server_config`] for the gRPC listener: ALPN offers HTTP/2 only.
pub fn grpc_server_config(tls: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, SoulError> {
    let mut config = Arc::unwrap_or_clone(server_config(tls)?);
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}
