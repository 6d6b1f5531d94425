//! Keyed calls across a crash (issue 27, finding 3): two replicas sharing one
//! Postgres; replica A is killed (`SIGKILL`, by its own fault hook) at a chosen
//! point of a keyed call — after the claim, after the Begin, after the key is
//! marked begun, after the tool ran, after the outcome and End were stored
//! together, after the End was spooled — and the same call is retried on replica
//! B. 100 kills: every retry replays or runs the call once (the test tool appends
//! each execution to a ledger file), waits at most one lease (plus a poll), and the
//! evidence table, once A has been restarted on its data directory (recovery) and
//! both replicas have drained, has exactly one End for every Begin.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod common;

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::{Server, as_dev, code_of};
use soulbase_grpc::proto;
use soulbase_types::CallId;

/// The idempotency lease of both replicas: the longest a retry waits for a key
/// held by a dead replica (plus one poll, ≤ 50 ms).
const LEASE_MS: u64 = 300;
/// Replicas A killed side by side (each on its own data directory).
const LANES: usize = 4;
/// Kills per lane.
const KILLS: usize = 25;
/// Room for the gRPC round trips and a loaded machine in a measured retry.
const SLACK: Duration = Duration::from_millis(1000);

const POINTS: [&str; 6] = [
    "claimed",
    "begun",
    "running",
    "executed",
    "completed",
    "ended",
];

fn config(url: &str) -> String {
    format!(
        r#"
server:
  dev_insecure: true
  shutdown_grace_ms: 5000
policy:
  rules:
    - {{ effect: allow, tenant: acme, tools: ["*"] }}
evidence:
  backend: postgres
  url: {url}
  idempotency_lease_ms: {LEASE_MS}
"#
    )
}

fn request(key: &str, call_id: &CallId) -> tonic::Request<proto::InvokeRequest> {
    as_dev(
        proto::InvokeRequest {
            tool_id: "soulbase.test.ledger".into(),
            arguments_json: format!("{{\"id\": \"{key}\"}}"),
            call_id: call_id.to_string(),
            idempotency_key: key.into(),
            ..Default::default()
        },
        "acme",
        "bob",
    )
}

/// One kill: which point, the key, A's and B's call ids, B's answer, how long
/// B's retry took.
struct Kill {
    point: &'static str,
    key: String,
    a_call: CallId,
    b_call: CallId,
    answer: Result<proto::InvokeResponse, tonic::Status>,
    waited: Duration,
}

/// Polls the evidence table until `calls` have `n` Begins and `n` Ends (the
/// spools have drained them; a stop drains only for its grace period), or fails
/// after 20 s.
async fn wait_stored(url: &str, calls: Vec<String>, n: i64) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (begins, ends): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE kind = 'begin'), count(*) FILTER (WHERE kind = 'end') \
             FROM evidence WHERE call_id = ANY($1)",
        )
        .bind(&calls)
        .fetch_one(&pool)
        .await
        .unwrap();
        if (begins, ends) == (n, n) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the spool did not drain: {begins} Begins, {ends} Ends of {n} calls"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool.close().await;
}

/// A lane: replica A on its own data directory, killed `KILLS` times, each call
/// retried on B (`b_grpc`).
fn lane(lane: usize, config: &str, url: &str, ledger: &str, b_grpc: &str) -> Vec<Kill> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let b = rt.block_on(async {
        proto::tool_invoker_client::ToolInvokerClient::new(
            tonic::transport::Channel::from_shared(format!("http://{b_grpc}"))
                .unwrap()
                .connect_lazy(),
        )
    });
    let mut kills = Vec::new();
    let mut a: Option<Server> = None;
    for i in 0..KILLS {
        let point = POINTS[(lane + i) % POINTS.len()];
        let envs = [
            ("SOULBASED_TEST_LEDGER", ledger),
            ("SOULBASED_FAULT_POINT", point),
        ];
        // The first start, then restarts on the same data directory (recovery).
        let mut server = match a.take() {
            None => Server::start_env(config, |_| {}, &envs),
            Some(dead) => dead.start_again_env(&envs),
        };
        let key = format!("key-{lane}-{i}");
        let (a_call, b_call) = (CallId::generate(), CallId::generate());
        let died = rt.block_on(async {
            let mut client = server.invoker().await;
            client.invoke(request(&key, &a_call)).await
        });
        assert!(died.is_err(), "{point}: replica A answered {died:?}");
        let (status, _) = server.wait_exit(Duration::from_secs(10));
        assert_eq!(status.signal(), Some(9), "{point}: {status:?}");
        let started = Instant::now();
        let answer = rt.block_on(async {
            let mut b = b.clone();
            b.invoke(request(&key, &b_call))
                .await
                .map(|r| r.into_inner())
        });
        kills.push(Kill {
            point,
            key,
            a_call,
            b_call,
            answer,
            waited: started.elapsed(),
        });
        a = Some(server);
    }
    // A last start without the fault: recovery, the spool drained (every call A
    // began has its Begin and one End in the store), a clean stop.
    let mut last = a
        .unwrap()
        .start_again_env(&[("SOULBASED_TEST_LEDGER", ledger)]);
    let began: Vec<String> = kills
        .iter()
        .filter(|k| k.point != "claimed")
        .map(|k| k.a_call.to_string())
        .collect();
    let n = began.len() as i64;
    rt.block_on(wait_stored(url, began, n));
    last.stop();
    kills
}

#[test]
fn a_keyed_call_runs_once_whichever_point_its_replica_is_killed_at() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server_url = soulbase_testkit::database_url();
    let name = soulbase_testkit::unique_name("sbd_once");
    rt.block_on(async {
        let admin = sqlx::PgPool::connect(&server_url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
    });
    let url = soulbase_testkit::with_database(&server_url, &name);
    let config = config(&url);
    let dir = tempfile::tempdir().unwrap();
    let ledger = dir.path().join("ledger");
    let ledger = ledger.to_str().unwrap().to_owned();
    let mut b = Server::start_env(&config, |_| {}, &[("SOULBASED_TEST_LEDGER", &ledger)]);

    let began = Instant::now();
    let kills: Vec<Kill> = std::thread::scope(|s| {
        let lanes: Vec<_> = (0..LANES)
            .map(|l| {
                let (config, url, ledger, b_grpc) = (&config, &url, &ledger, &b.grpc);
                s.spawn(move || lane(l, config, url, ledger, b_grpc))
            })
            .collect();
        lanes.into_iter().flat_map(|l| l.join().unwrap()).collect()
    });
    // B's own runs (the keys A never began) drained too.
    let ran: Vec<String> = kills
        .iter()
        .filter(|k| matches!(k.point, "claimed" | "begun"))
        .map(|k| k.b_call.to_string())
        .collect();
    let n = ran.len() as i64;
    rt.block_on(wait_stored(&url, ran, n));
    b.stop();
    let took = began.elapsed();
    assert_eq!(kills.len(), LANES * KILLS);

    // Executions per key, from the ledger.
    let mut executed: HashMap<String, usize> = HashMap::new();
    for line in std::fs::read_to_string(&ledger).unwrap().lines() {
        *executed.entry(line.to_owned()).or_default() += 1;
    }
    // Every record, per call id: (Begins, End statuses).
    let rows: Vec<(String, String, Option<String>)> = rt.block_on(async {
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let rows = sqlx::query_as("SELECT call_id, kind, status FROM evidence")
            .fetch_all(&pool)
            .await
            .unwrap();
        let open: i64 =
            sqlx::query_scalar("SELECT count(*) FROM idempotency WHERE state <> 'done'")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(open, 0, "every key is done");
        pool.close().await;
        rows
    });
    let mut calls: HashMap<String, (usize, Vec<String>)> = HashMap::new();
    for (call, kind, status) in rows {
        let c = calls.entry(call).or_default();
        match kind.as_str() {
            "begin" => c.0 += 1,
            "end" => c.1.push(status.unwrap_or_default()),
            other => panic!("unexpected {other} record"),
        }
    }
    // Every Begin has exactly one End, and no End is without its Begin.
    let whose = |call: &str| {
        kills
            .iter()
            .find_map(|k| {
                (k.a_call.as_str() == call)
                    .then(|| format!("A's call, {} {}", k.point, k.key))
                    .or_else(|| {
                        (k.b_call.as_str() == call)
                            .then(|| format!("B's call, {} {}", k.point, k.key))
                    })
            })
            .unwrap_or_else(|| "an unknown call".into())
    };
    for (call, (begins, ends)) in &calls {
        assert_eq!(
            (*begins, ends.len()),
            (1, 1),
            "{} {call}: {ends:?}",
            whose(call)
        );
    }
    let evidence_of = |c: &CallId| calls.get(c.as_str()).map(|(_, ends)| ends[0].as_str());

    let mut max_wait = Duration::ZERO;
    for k in &kills {
        let runs = executed.get(&k.key).copied().unwrap_or(0);
        let what = format!("{} {}: {:?}, ran {runs}×", k.point, k.key, k.answer);
        match k.point {
            // Nothing ran on A (it never marked the key begun): B took the key
            // over once A's lease lapsed and ran the call once.
            "claimed" | "begun" => {
                let r = k.answer.as_ref().expect(&what);
                assert!(!r.replayed, "{what}");
                assert_eq!(runs, 1, "{what}");
                assert_eq!(evidence_of(&k.b_call), Some("ok"), "{what}");
                let a = if k.point == "begun" {
                    Some("aborted")
                } else {
                    None
                };
                assert_eq!(evidence_of(&k.a_call), a, "{what}");
            }
            // A marked the key begun: the tool may have run (it did after
            // `executed`, not yet at `running`), so it is never run again; B
            // answers the interrupted outcome, as A's evidence says (aborted).
            "running" | "executed" => {
                let status = k.answer.as_ref().expect_err(&what);
                assert_eq!(code_of(status), "PROVIDER.UNAVAILABLE", "{what}");
                let err = soulbase_errors::SoulError::from_status(status);
                assert_eq!(err.field("outcome"), Some("unknown"), "{what}");
                assert_eq!(runs, usize::from(k.point == "executed"), "{what}");
                assert_eq!(evidence_of(&k.a_call), Some("aborted"), "{what}");
                assert_eq!(evidence_of(&k.b_call), None, "{what}");
            }
            // A stored the outcome with its End: B replays it at once, and A's
            // evidence is that End (recovery's aborted End is left out).
            "completed" | "ended" => {
                let r = k.answer.as_ref().expect(&what);
                assert!(r.replayed, "{what}");
                assert!(r.output_json.contains(&k.key), "{what}");
                // The answer is A's: its call id, whose evidence is A's Begin.
                assert_eq!(r.call_id, k.a_call.to_string(), "{what}");
                assert_eq!(runs, 1, "{what}");
                assert_eq!(evidence_of(&k.a_call), Some("ok"), "{what}");
                assert_eq!(evidence_of(&k.b_call), None, "{what}");
            }
            other => unreachable!("{other}"),
        }
        max_wait = max_wait.max(k.waited);
        assert!(
            k.waited <= Duration::from_millis(LEASE_MS + 50) + SLACK,
            "{what}: the retry waited {:?}",
            k.waited
        );
    }
    eprintln!(
        "{} kills in {took:?}; longest retry {max_wait:?} (lease {LEASE_MS} ms)",
        kills.len()
    );

    rt.block_on(async {
        let admin = sqlx::PgPool::connect(&server_url).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE {name} WITH (FORCE)"
        )))
        .execute(&admin)
        .await
        .unwrap();
    });
}
