//! SIGTERM during a run of calls: every accepted call completes or is reported,
//! and the evidence spool is drained into the store before exit (checked by
//! reading the SQLite store under the server's data directory afterwards).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{Server, as_dev, wait_metric};
use soulbase_grpc::proto;
use soulbase_observe::{EndStatus, EvidenceQuery, EvidenceStore};
use soulbase_store::{Db, SqlEvidenceStore};

const CONFIG: &str = r#"
server:
  dev_insecure: true
  shutdown_grace_ms: GRACE
policy:
  rules:
    - { effect: allow, tenant: acme, tools: ["*"] }
"#;

fn sleep_req(ms: u64) -> tonic::Request<proto::InvokeRequest> {
    as_dev(
        proto::InvokeRequest {
            tool_id: "soulbase.builtin.sleep".into(),
            arguments_json: format!("{{\"ms\": {ms}}}"),
            ..Default::default()
        },
        "acme",
        "bob",
    )
}

fn stopped_line(lines: &[String]) -> String {
    lines
        .iter()
        .find(|l| l.starts_with("soulbased: stopped"))
        .cloned()
        .unwrap_or_else(|| panic!("no stopped line in {lines:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_accepted_calls_finish_and_flushes_evidence() {
    let mut server = Server::start(&CONFIG.replace("GRACE", "20000"));
    let invoker = server.invoker().await;
    const N: usize = 16;
    let mut calls = Vec::new();
    for _ in 0..N {
        let mut c = invoker.clone();
        calls.push(tokio::spawn(async move { c.invoke(sleep_req(400)).await }));
    }
    // All calls are inside the pipeline before the signal.
    wait_metric(&server.http, "soulbase_calls_in_flight", |v| v >= N as f64).await;
    server.sigterm();
    for c in calls {
        let out = c
            .await
            .unwrap()
            .expect("an accepted call was not completed");
        assert!(out.into_inner().output_json.contains("slept_ms"));
    }
    let (status, lines) = server.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    let line = stopped_line(&lines);
    assert!(line.contains("drained: true"), "{line}");
    // A Begin and an End per call, all written before exit.
    let written: u64 = line
        .rsplit("evidence_written: ")
        .next()
        .and_then(|s| s.trim_end_matches(')').parse().ok())
        .unwrap();
    assert!(written >= 2 * N as u64, "{line}");
    // The store itself holds every call, each with its Begin joined to an ok End.
    let url = format!(
        "sqlite://{}",
        server.dir().join("data/evidence.db").display()
    );
    let store = SqlEvidenceStore::new(Db::connect(&url, false).await.unwrap());
    let tenant = soulbase_types::TenantId::new("acme").unwrap();
    let page = store
        .list(&EvidenceQuery::tenant(tenant, 100))
        .await
        .unwrap();
    assert_eq!(page.calls.len(), N, "{page:?}");
    for c in &page.calls {
        assert_eq!(c.tool_id.as_str(), "soulbase.builtin.sleep");
        assert_eq!(c.status, Some(EndStatus::Ok), "{c:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_outliving_the_grace_period_are_reported_not_lost() {
    let mut server = Server::start(&CONFIG.replace("GRACE", "300"));
    let invoker = server.invoker().await;
    let mut calls = Vec::new();
    for _ in 0..4 {
        let mut c = invoker.clone();
        calls.push(tokio::spawn(
            async move { c.invoke(sleep_req(20_000)).await },
        ));
    }
    wait_metric(&server.http, "soulbase_calls_in_flight", |v| v >= 4.0).await;
    server.sigterm();
    for c in calls {
        // Each call ends (no hang) with an error status the client can see.
        let result = tokio::time::timeout(Duration::from_secs(15), c)
            .await
            .expect("a call hung past shutdown")
            .unwrap();
        let status = result.expect_err("a 20 s call cannot finish in a 300 ms grace period");
        assert!(
            matches!(
                status.code(),
                tonic::Code::Unavailable
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
                    | tonic::Code::Internal
            ),
            "{status:?}"
        );
    }
    let (status, lines) = server.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "{status:?}");
    assert!(stopped_line(&lines).contains("drained: false"));
}
