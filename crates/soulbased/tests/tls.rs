//! The gRPC listener with TLS (rustls, ring) from `server.tls`.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use common::{Server, as_dev};
use soulbase_grpc::proto::InvokeRequest;
use soulbase_grpc::proto::tool_invoker_client::ToolInvokerClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_serves_over_tls_and_refuses_plaintext() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_pem = key.cert.pem();
    let cert = dir.path().join("server.pem");
    let private = dir.path().join("server.key");
    std::fs::write(&cert, &cert_pem).unwrap();
    std::fs::write(&private, key.signing_key.serialize_pem()).unwrap();
    let config = format!(
        r#"
server:
  dev_insecure: true
  tls: {{ cert_file: "{}", key_file: "{}" }}
policy:
  rules:
    - {{ effect: allow, tenant: acme, tools: ["*"] }}
"#,
        cert.display(),
        private.display()
    );
    let server = Server::start(&config);
    let port = server.grpc.rsplit(':').next().unwrap().to_owned();
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&cert_pem))
                .domain_name("localhost"),
        )
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = ToolInvokerClient::new(channel);
    let req = InvokeRequest {
        tool_id: "soulbase.builtin.echo".into(),
        arguments_json: "{}".into(),
        ..Default::default()
    };
    let out = client
        .invoke(as_dev(req.clone(), "acme", "bob"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(out.output_json, r#"{"echo":{}}"#);

    // A plaintext client gets no answer from the TLS listener.
    let mut plain = server.invoker().await;
    assert!(plain.invoke(as_dev(req, "acme", "bob")).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_requires_a_client_certificate_from_the_configured_ca() {
    let dir = tempfile::tempdir().unwrap();
    let server_key = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let client_key = rcgen::generate_simple_self_signed(vec!["client".to_owned()]).unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cert = write("server.pem", server_key.cert.pem());
    let key = write("server.key", server_key.signing_key.serialize_pem());
    let client_ca = write("client-ca.pem", client_key.cert.pem());
    let config = format!(
        r#"
server:
  dev_insecure: true
  tls: {{ cert_file: "{}", key_file: "{}", client_ca_file: "{}" }}
policy:
  rules:
    - {{ effect: allow, tenant: acme, tools: ["*"] }}
"#,
        cert.display(),
        key.display(),
        client_ca.display()
    );
    let server = Server::start(&config);
    let port = server.grpc.rsplit(':').next().unwrap().to_owned();
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(server_key.cert.pem()))
        .domain_name("localhost");
    let req = || {
        as_dev(
            InvokeRequest {
                tool_id: "soulbase.builtin.echo".into(),
                arguments_json: "{}".into(),
                ..Default::default()
            },
            "acme",
            "bob",
        )
    };
    let endpoint = Channel::from_shared(format!("https://localhost:{port}")).unwrap();
    // No client certificate: refused.
    let anonymous = endpoint
        .clone()
        .tls_config(tls.clone())
        .unwrap()
        .connect_lazy();
    assert!(
        ToolInvokerClient::new(anonymous)
            .invoke(req())
            .await
            .is_err()
    );
    // With a certificate the configured CA signed: served.
    let identity = tonic::transport::Identity::from_pem(
        client_key.cert.pem(),
        client_key.signing_key.serialize_pem(),
    );
    let authed = endpoint
        .tls_config(tls.identity(identity))
        .unwrap()
        .connect()
        .await
        .unwrap();
    ToolInvokerClient::new(authed).invoke(req()).await.unwrap();
}
