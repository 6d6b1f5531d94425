//! SIGTERM during a run of calls: every accepted call completes or is reported,
//! and the evidence spool is drained into the store before exit (checked by
//! reading the SQLite store under the server's data directory afterwards). Calls
//! outliving the grace period are cancelled, each with a `cancelled` End in the
//! store, and the exit status says the shutdown did not drain.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::time::Duration;

use common::{Server, as_dev, code_of, wait_metric};
use soulbase_errors::ErrorCode;
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

/// The exit code of a shutdown that did not drain (`server::EXIT_NOT_DRAINED`).
const EXIT_NOT_DRAINED: i32 = 3;

/// The SQLite store the server under `server` flushed its evidence to.
async fn store_of(server: &Server) -> SqlEvidenceStore {
    let url = format!(
        "sqlite://{}",
        server.dir().join("data/evidence.db").display()
    );
    SqlEvidenceStore::new(Db::connect(&url, false).await.unwrap())
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
    let store = store_of(&server).await;
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
    assert_eq!(status.code(), Some(EXIT_NOT_DRAINED), "{status:?}");
    assert!(stopped_line(&lines).contains("drained: false"));
}

/// SIGTERM with a grace shorter than some calls: the calls that fit finish `ok`,
/// the others are cancelled — each answers `PROVIDER.UNAVAILABLE` and gets a
/// `cancelled` End — and all of it is in the store the server flushed to before it
/// exited: every call with a Begin has exactly one End. The exit status and the
/// stopped line say the shutdown did not drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_cut_off_by_the_grace_get_a_cancelled_end_before_exit() {
    let mut server = Server::start(&CONFIG.replace("GRACE", "1500"));
    let invoker = server.invoker().await;
    const SHORT: usize = 4;
    const LONG: usize = 8;
    let mut short = Vec::new();
    let mut long = Vec::new();
    for i in 0..SHORT + LONG {
        let mut c = invoker.clone();
        let ms = if i < SHORT { 600 } else { 20_000 };
        let call = tokio::spawn(async move { c.invoke(sleep_req(ms)).await });
        if i < SHORT {
            short.push(call);
        } else {
            long.push(call);
        }
    }
    wait_metric(&server.http, "soulbase_calls_in_flight", |v| {
        v >= (SHORT + LONG) as f64
    })
    .await;
    server.sigterm();
    for c in short {
        let out = c
            .await
            .unwrap()
            .expect("a call within the grace must finish");
        assert!(out.into_inner().output_json.contains("slept_ms"));
    }
    for c in long {
        let result = tokio::time::timeout(Duration::from_secs(15), c)
            .await
            .expect("a call hung past shutdown")
            .unwrap();
        let status = result.expect_err("a 20 s call cannot finish in a 1.5 s grace period");
        // The answer the cancelled End records.
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert_eq!(code_of(&status), "PROVIDER.UNAVAILABLE", "{status:?}");
    }
    let (status, lines) = server.wait_exit(Duration::from_secs(30));
    assert_eq!(status.code(), Some(EXIT_NOT_DRAINED), "{status:?}");
    let line = stopped_line(&lines);
    assert!(line.contains("drained: false"), "{line}");
    assert!(line.contains(&format!("abandoned: {LONG},")), "{line}");
    assert!(line.contains("unended: 0,"), "{line}");

    // Reconcile against the store: one Begin and one End per call, nothing open.
    let store = store_of(&server).await;
    let tenant = soulbase_types::TenantId::new("acme").unwrap();
    let page = store
        .list(&EvidenceQuery::tenant(tenant, 100))
        .await
        .unwrap();
    assert_eq!(page.calls.len(), SHORT + LONG, "{page:?}");
    let (mut ok, mut cancelled) = (0, 0);
    for c in &page.calls {
        let evidence = store.call(None, &c.call_id).await.unwrap();
        assert_eq!(evidence.begins().count(), 1, "{evidence:?}");
        assert_eq!(evidence.ends().count(), 1, "{evidence:?}");
        match c.status {
            Some(EndStatus::Ok) => ok += 1,
            Some(EndStatus::Cancelled) => {
                assert_eq!(c.error_code, Some(ErrorCode::ProviderUnavailable), "{c:?}");
                cancelled += 1;
            }
            other => panic!("unexpected End status {other:?}: {c:?}"),
        }
    }
    assert_eq!((ok, cancelled), (SHORT, LONG), "{page:?}");
}
