//! The gRPC and HTTP listeners with TLS (rustls, ring) from `server.tls`.
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

    // The HTTP listener serves HTTPS with the same certificate ...
    let http_port = server.http.rsplit(':').next().unwrap().to_owned();
    let client = https_client(&cert_pem, None);
    let res = client
        .get(format!("https://localhost:{http_port}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let res = client
        .post(format!(
            "https://localhost:{http_port}/api/tools/soulbase.builtin.echo/invoke"
        ))
        .header("x-soulbase-tenant", "acme")
        .header("x-soulbase-actor", "bob")
        .body(r#"{"over":"https"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(
        body["output"],
        serde_json::json!({"echo": {"over": "https"}})
    );
    // ... and answers no plaintext HTTP.
    assert!(!plaintext_gets_http(&server.http).await);
}

/// An HTTPS client trusting `ca_pem`, presenting `identity` (PEM cert + key) if given.
fn https_client(ca_pem: &str, identity: Option<String>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()]);
    if let Some(pem) = identity {
        b = b.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    b.build().unwrap()
}

/// Whether a plaintext HTTP/1.1 request to `addr` gets an HTTP response.
async fn plaintext_gets_http(addr: &str) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    out.starts_with(b"HTTP/")
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

    // The HTTP listener requires the client certificate too.
    let http_port = server.http.rsplit(':').next().unwrap().to_owned();
    let url = format!("https://localhost:{http_port}/healthz");
    let anonymous = https_client(&server_key.cert.pem(), None);
    assert!(anonymous.get(&url).send().await.is_err());
    let identity = format!(
        "{}{}",
        client_key.cert.pem(),
        client_key.signing_key.serialize_pem()
    );
    let authed = https_client(&server_key.cert.pem(), Some(identity));
    assert_eq!(authed.get(&url).send().await.unwrap().status(), 200);
}
