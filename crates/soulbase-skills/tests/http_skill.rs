//! An HTTP skill through the real HTTP executor against the example service on
//! loopback (seed 001 §9.1 forwarding, §9.3 non-JSON response).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::*;
use serde_json::json;
use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_observe::MemorySink;
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{DeclaredProfiles, LocalSandbox, ProviderKind};
use soulbase_sandbox_http::{HttpExecutor, HttpOptions};
use soulbase_skills::{CatalogOptions, SkillCatalog};
use soulbase_tools::Registry;
use soulbase_tools::pipeline::{Invoker, InvokerBuilder, MemoryIdempotency, ToolCall};

async fn service(token: &str) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(soulbase_skills::service::serve(
        listener,
        Some(token.to_owned()),
    ));
    addr
}

fn invoker(registry: &Registry, var: &str, value: &str) -> Invoker {
    let http = HttpExecutor::new(HttpOptions {
        env_allow: vec![var.to_owned()],
        env_values: Some([(var.to_owned(), value.to_owned())].into_iter().collect()),
        ..HttpOptions::default()
    });
    let sandbox = LocalSandbox::new(builtins()).with_executor(ProviderKind::Http, Arc::new(http));
    InvokerBuilder::new(
        Arc::new(registry.clone()),
        Arc::new(StaticPolicy::new(&allow_all())),
        Arc::new(LocalQuota::new(&[])),
        Arc::new(HmacConsent::new(
            b"test-key-test-key-test-key-32byt".to_vec(),
        )),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(sandbox),
        Arc::new(MemorySink::new()),
        Arc::new(MemoryIdempotency::new()),
    )
    .build()
}

fn http_descriptor(name: &str, addr: std::net::SocketAddr, path: &str) -> String {
    format!(
        "name: {name}\ndescription: search logs\nprovider: http\nendpoint: http://{addr}{path}\ntimeout: 5\nheaders:\n  Authorization: Bearer ${{SOULBASE_TEST_LOGS_TOKEN}}\nparameters:\n  type: object\n  properties:\n    namespace: {{type: string}}\n    pod: {{type: string}}\n    keyword: {{type: string}}\n  required: [namespace, pod]\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_skill_forwards_to_its_endpoint() {
    let token = "t0ken";
    let addr = service(token).await;
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "search_logs.yaml",
        &http_descriptor("search_logs", addr, "/execute"),
    );
    write(
        dir.path(),
        "plain.yaml",
        &http_descriptor("plain", addr, "/text"),
    );
    let registry = Registry::new();
    let (_catalog, report) =
        SkillCatalog::open(registry.clone(), CatalogOptions::new(dir.path())).unwrap();
    assert_eq!(report.errors().count(), 0, "{:?}", report.problems);
    // The executor expands `${VAR}` at call time (here from fixed values).
    let inv = invoker(&registry, "SOULBASE_TEST_LOGS_TOKEN", token);

    let r = inv
        .invoke(ToolCall::new(
            subject(),
            id("skills.search_logs.search_logs"),
            json!({"namespace": "default", "pod": "web-0", "keyword": "ERROR"}),
        ))
        .await;
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(
        r.output.unwrap(),
        json!({"lines": ["ERROR upstream timeout after 30s"]})
    );

    // A non-JSON response is an error, not a result.
    let r = inv
        .invoke(ToolCall::new(
            subject(),
            id("skills.plain.plain"),
            json!({"namespace": "a", "pod": "b"}),
        ))
        .await;
    assert!(!r.is_ok());
    assert_eq!(
        r.error_code.map(|c| c.as_str()),
        Some("TOOL.EXECUTION_FAILED"),
        "{r:?}"
    );

    // Input schema is enforced before anything is sent.
    let r = inv
        .invoke(ToolCall::new(
            subject(),
            id("skills.search_logs.search_logs"),
            json!({"pod": "b"}),
        ))
        .await;
    assert_eq!(
        r.error_code.map(|c| c.as_str()),
        Some("SCHEMA.VALIDATION_FAILED")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_token_is_a_failed_call() {
    let addr = service("right").await;
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "search_logs.yaml",
        &http_descriptor("search_logs", addr, "/execute"),
    );
    let registry = Registry::new();
    let _c = SkillCatalog::open(registry.clone(), CatalogOptions::new(dir.path())).unwrap();
    let inv = invoker(&registry, "SOULBASE_TEST_LOGS_TOKEN", "wrong");
    let r = inv
        .invoke(ToolCall::new(
            subject(),
            id("skills.search_logs.search_logs"),
            json!({"namespace": "a", "pod": "b"}),
        ))
        .await;
    assert_eq!(
        r.error_code.map(|c| c.as_str()),
        Some("TOOL.EXECUTION_FAILED"),
        "{r:?}"
    );
}

#[test]
fn the_service_searches_its_corpus() {
    let v = soulbase_skills::service::search(&json!({"namespace": "payments", "pod": "api-0"}))
        .unwrap();
    assert_eq!(v["lines"].as_array().unwrap().len(), 2);
    assert!(soulbase_skills::service::search(&json!({"pod": "x"})).is_err());
}
