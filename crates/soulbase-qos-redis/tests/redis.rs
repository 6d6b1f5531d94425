#![allow(clippy::unwrap_used, clippy::expect_used)]
//! RedisQuota against real Redis: exact shared limits across instances, budgets,
//! refunds, and behaviour while Redis is down (fail-closed, fail-open, recovery).

use std::net::TcpListener;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use soulbase_config::{BudgetWindow, FailMode, QuotaBudget, QuotaLimit};
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::BudgetUsage;
use soulbase_qos::{QuotaGate, QuotaPlan, QuotaRequest, Reservation};
use soulbase_qos_redis::{RedisQuota, RedisQuotaOptions};
use soulbase_types::{ActorId, Rate, TenantId, ToolId};

fn limit(rate: &str) -> QuotaLimit {
    QuotaLimit {
        tenant: "*".into(),
        tool: "*".into(),
        rate: Rate::parse(rate).unwrap(),
    }
}

fn options(url: &str, prefix: &str) -> RedisQuotaOptions {
    let mut o = RedisQuotaOptions::new(url);
    o.prefix = format!("{prefix}:");
    o
}

async fn reserve(
    q: &dyn QuotaGate,
    tenant: &str,
    actor: &str,
    tool: &str,
) -> Result<Reservation, SoulError> {
    let tenant = TenantId::new(tenant).unwrap();
    let actor = ActorId::new(actor).unwrap();
    let tool = ToolId::new(tool).unwrap();
    q.reserve(QuotaRequest {
        tenant: &tenant,
        actor: &actor,
        tool: &tool,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_instances_share_one_limit_exactly() {
    let url = soulbase_testkit::redis_url();
    let prefix = soulbase_testkit::unique_name("qos_shared");
    let plan = || QuotaPlan::new(&[limit("50/min")], &[]);
    let a = Arc::new(RedisQuota::new(options(&url, &prefix), plan()).unwrap());
    let b = Arc::new(RedisQuota::new(options(&url, &prefix), plan()).unwrap());
    let mut tasks = Vec::new();
    for i in 0..200 {
        let q: Arc<RedisQuota> = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.push(tokio::spawn(async move {
            reserve(q.as_ref(), "acme", "alice", "fs.files.read").await
        }));
    }
    let mut ok = 0;
    let mut limited = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::QuotaRateLimited);
                let hint = e.retry_after_ms().expect("retry hint");
                assert!(hint > 0 && hint <= 60_000, "{hint}");
                assert_eq!(e.field("limit"), Some("50/min"));
                limited += 1;
            }
        }
    }
    assert_eq!((ok, limited), (50, 150));
    // Another tenant has its own bucket.
    assert!(
        reserve(a.as_ref(), "beta", "x", "fs.files.read")
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn updated_limits_apply_to_the_next_decision_and_unchanged_ones_keep_their_count() {
    let url = soulbase_testkit::redis_url();
    let prefix = soulbase_testkit::unique_name("qos_update");
    let q = RedisQuota::new(options(&url, &prefix), QuotaPlan::new(&[], &[])).unwrap();
    for _ in 0..3 {
        assert!(
            reserve(&q, "acme", "a", "skills.p.t").await.is_ok(),
            "no limit yet"
        );
    }
    q.update(&[limit("2/min")]);
    assert!(reserve(&q, "acme", "a", "skills.p.t").await.is_ok());
    // The same rule again (a skills reload that changed nothing) keeps its count.
    q.update(&[limit("2/min")]);
    assert!(reserve(&q, "acme", "a", "skills.p.t").await.is_ok());
    let e = reserve(&q, "acme", "a", "skills.p.t").await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::QuotaRateLimited);
    assert_eq!(e.field("limit"), Some("2/min"));
    q.update(&[]);
    assert!(
        reserve(&q, "acme", "a", "skills.p.t").await.is_ok(),
        "a removed limit no longer applies"
    );
}

#[tokio::test]
async fn snapshots_refunds_and_dry_runs() {
    let url = soulbase_testkit::redis_url();
    let prefix = soulbase_testkit::unique_name("qos_refund");
    let q = RedisQuota::new(
        options(&url, &prefix),
        QuotaPlan::new(&[limit("3/min")], &[]),
    )
    .unwrap();
    let tenant = TenantId::new("acme").unwrap();
    let actor = ActorId::new("a").unwrap();
    let tool = ToolId::new("a.b.c").unwrap();
    let req = QuotaRequest {
        tenant: &tenant,
        actor: &actor,
        tool: &tool,
    };
    for _ in 0..5 {
        assert_eq!(
            q.check(req).await.unwrap().remaining,
            Some(2),
            "check consumes nothing"
        );
    }
    let mut held = Vec::new();
    for expected in [2, 1, 0] {
        let r = q.reserve(req).await.unwrap();
        assert_eq!(r.snapshot.remaining, Some(expected));
        assert_eq!(r.snapshot.limit.as_deref(), Some("3/min"));
        held.push(r);
    }
    assert!(q.reserve(req).await.is_err());
    q.refund(held.pop().unwrap()).await.unwrap();
    assert!(
        q.reserve(req).await.is_ok(),
        "the refunded call is available again"
    );
    assert!(q.reserve(req).await.is_err());
}

#[tokio::test]
async fn budgets_count_calls_and_settled_bytes_across_instances() {
    let url = soulbase_testkit::redis_url();
    let prefix = soulbase_testkit::unique_name("qos_budget");
    let budgets = [QuotaBudget {
        tenant: "*".into(),
        tool: "fs.*".into(),
        actor: "*".into(),
        per_actor: true,
        window: BudgetWindow::Day,
        calls: Some(3),
        bytes_in: None,
        bytes_out: Some(100),
        cpu_ms: None,
    }];
    let a = RedisQuota::new(options(&url, &prefix), QuotaPlan::new(&[], &budgets)).unwrap();
    let b = RedisQuota::new(options(&url, &prefix), QuotaPlan::new(&[], &budgets)).unwrap();
    let r = reserve(&a, "acme", "alice", "fs.files.read").await.unwrap();
    assert_eq!(r.snapshot.budgets[0].calls, Some(2));
    assert_eq!(r.snapshot.budgets[0].bytes_out, Some(100));
    a.settle(
        r,
        BudgetUsage {
            calls: 1,
            bytes_in: 0,
            bytes_out: 70,
            cpu_ms: 0,
        },
    )
    .await
    .unwrap();
    let r = reserve(&b, "acme", "alice", "fs.files.read").await.unwrap();
    assert_eq!(r.snapshot.budgets[0].calls, Some(1));
    assert_eq!(r.snapshot.budgets[0].bytes_out, Some(30));
    b.settle(
        r,
        BudgetUsage {
            calls: 1,
            bytes_in: 0,
            bytes_out: 30,
            cpu_ms: 0,
        },
    )
    .await
    .unwrap();
    let err = reserve(&a, "acme", "alice", "fs.files.read")
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::QuotaBudgetExceeded);
    assert!(err.retry_after_ms().unwrap() <= 86_400_000);
    assert!(
        reserve(&a, "acme", "bob", "fs.files.read").await.is_ok(),
        "per actor"
    );
    assert!(
        reserve(&a, "acme", "alice", "net.http.get").await.is_ok(),
        "not covered"
    );

    // A calls-only refusal and a refund of a budget call.
    let r1 = reserve(&a, "acme", "carol", "fs.files.read").await.unwrap();
    reserve(&a, "acme", "carol", "fs.files.read").await.unwrap();
    reserve(&a, "acme", "carol", "fs.files.read").await.unwrap();
    assert!(reserve(&a, "acme", "carol", "fs.files.read").await.is_err());
    a.refund(r1).await.unwrap();
    assert!(reserve(&b, "acme", "carol", "fs.files.read").await.is_ok());
}

#[tokio::test]
async fn cpu_budgets_are_charged_at_settlement_across_instances() {
    let url = soulbase_testkit::redis_url();
    let prefix = soulbase_testkit::unique_name("qos_cpu");
    let budgets = [QuotaBudget {
        tenant: "acme".into(),
        tool: "*".into(),
        actor: "*".into(),
        per_actor: false,
        window: BudgetWindow::Hour,
        calls: None,
        bytes_in: None,
        bytes_out: None,
        cpu_ms: Some(50),
    }];
    let a = RedisQuota::new(options(&url, &prefix), QuotaPlan::new(&[], &budgets)).unwrap();
    let b = RedisQuota::new(options(&url, &prefix), QuotaPlan::new(&[], &budgets)).unwrap();
    let used = |cpu_ms| BudgetUsage {
        calls: 1,
        bytes_in: 0,
        bytes_out: 0,
        cpu_ms,
    };
    let r = reserve(&a, "acme", "alice", "x.y.z").await.unwrap();
    assert_eq!(r.snapshot.budgets[0].cpu_ms, Some(50));
    a.settle(r, used(30)).await.unwrap();
    // The other instance sees what was charged, and admits while some is left.
    let r = reserve(&b, "acme", "bob", "x.y.z").await.unwrap();
    assert_eq!(r.snapshot.budgets[0].cpu_ms, Some(20));
    b.settle(r, used(25)).await.unwrap();
    let err = reserve(&a, "acme", "alice", "x.y.z").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::QuotaBudgetExceeded);
    assert!(err.field("budget").is_some());
    assert!(
        reserve(&a, "globex", "alice", "x.y.z").await.is_ok(),
        "not covered"
    );
}

/// A throwaway `redis-server` on a free port in a temp dir, so it can be stopped
/// without harming the shared one.
struct OwnRedis {
    child: Option<tokio::process::Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl OwnRedis {
    async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut r = OwnRedis {
            child: None,
            port,
            dir: tempfile::tempdir().unwrap(),
        };
        r.spawn().await;
        r
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let child = tokio::process::Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server must be installed for this test");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().await.unwrap();
            c.wait().await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fails_closed_by_default_open_when_configured_and_recovers() {
    let mut server = OwnRedis::start().await;
    let plan = || QuotaPlan::new(&[limit("1000/min")], &[]);
    let closed = RedisQuota::new(options(&server.url(), "down"), plan()).unwrap();
    let mut open_opts = options(&server.url(), "down");
    open_opts.fail_mode = FailMode::Open;
    let open = RedisQuota::new(open_opts, plan()).unwrap();

    assert!(reserve(&closed, "t", "a", "a.b.c").await.is_ok());
    assert!(reserve(&open, "t", "a", "a.b.c").await.is_ok());

    server.stop().await;
    let err = reserve(&closed, "t", "a", "a.b.c").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::QuotaUnavailable);
    assert_eq!(err.retry_after_ms(), Some(1_000));
    assert_eq!(err.field("backend"), Some("redis"));
    let tenant = TenantId::new("t").unwrap();
    let actor = ActorId::new("a").unwrap();
    let tool = ToolId::new("a.b.c").unwrap();
    let req = QuotaRequest {
        tenant: &tenant,
        actor: &actor,
        tool: &tool,
    };
    assert_eq!(
        closed.check(req).await.unwrap_err().code(),
        ErrorCode::QuotaUnavailable
    );
    let allowed = reserve(&open, "t", "a", "a.b.c").await.unwrap();
    assert!(allowed.keys.is_empty(), "fail-open charges nothing");
    open.refund(allowed).await.unwrap();

    server.spawn().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match reserve(&closed, "t", "a", "a.b.c").await {
            Ok(r) => {
                assert_eq!(r.keys.len(), 1);
                break;
            }
            Err(e) => {
                assert_eq!(e.code(), ErrorCode::QuotaUnavailable);
                assert!(Instant::now() < deadline, "did not recover: {e:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn unreachable_from_the_start_is_refused_and_bad_urls_are_config_errors() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let q = RedisQuota::new(
        options(&format!("redis://127.0.0.1:{port}"), "none"),
        QuotaPlan::new(&[limit("5/sec")], &[]),
    )
    .unwrap();
    assert_eq!(
        reserve(&q, "t", "a", "a.b.c").await.unwrap_err().code(),
        ErrorCode::QuotaUnavailable
    );
    let err = RedisQuota::new(options("http://nope", "x"), QuotaPlan::new(&[], &[]))
        .err()
        .unwrap();
    assert_eq!(err.code(), ErrorCode::ConfigInvalid);
    assert_eq!(err.field("field"), Some("quota.redis_url"));
    // With no applicable limit, no round trip is needed at all.
    let free = RedisQuota::new(
        options(&format!("redis://127.0.0.1:{port}"), "none"),
        QuotaPlan::new(&[], &[]),
    )
    .unwrap();
    assert!(reserve(&free, "t", "a", "a.b.c").await.is_ok());
}

/// A listener that takes connections and never answers: a Redis that hangs (or a
/// network that drops its packets). Connections are held until the test ends.
async fn hanging_redis() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("redis://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    (url, task)
}

fn causes(err: &SoulError) -> String {
    err.audit().causes.join("; ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_found_down_is_not_waited_for_again_until_the_retry_hint_by_any_sharer() {
    let (url, hang) = hanging_redis().await;
    let hanging = |mode: FailMode| {
        let mut o = options(&url, "hang");
        o.op_timeout = Duration::from_millis(200);
        o.retry_hint = Duration::from_secs(600);
        o.fail_mode = mode;
        o
    };
    let tools = RedisQuota::new(
        hanging(FailMode::Closed),
        QuotaPlan::new(&[limit("5/sec")], &[]),
    )
    .unwrap();
    let skills = tools.sharing("hang:skills:", QuotaPlan::new(&[], &[]));
    assert_eq!(skills.prefix(), "hang:skills:");
    skills.update(&[limit("5/sec")]);

    // Two decisions in a row wait out the timeout (one slow answer alone does not
    // hold Redis down), one on each backend: they share what they learn.
    for q in [&tools, &skills] {
        let err = reserve(q, "t", "a", "a.b.c").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::QuotaUnavailable);
        assert!(!causes(&err).contains("marked down"), "{err:?}");
    }
    // Then neither tries Redis until the hint has passed, and each refusal says
    // how long is left of it (less and less, never more than the hint).
    let mut left = 600_000;
    for q in [&skills, &tools, &skills] {
        let err = reserve(q, "t", "a", "a.b.c").await.unwrap_err();
        assert_eq!(err.code(), ErrorCode::QuotaUnavailable);
        let hint = err.retry_after_ms().unwrap();
        assert!((590_000..=left).contains(&hint), "{hint} ms left of 600 s");
        left = hint;
        assert!(causes(&err).contains("marked down"), "{err:?}");
    }
    // A backend of its own is not held down by another's failures.
    let own = RedisQuota::new(
        hanging(FailMode::Closed),
        QuotaPlan::new(&[limit("5/sec")], &[]),
    )
    .unwrap();
    let err = reserve(&own, "t", "a", "a.b.c").await.unwrap_err();
    assert!(!causes(&err).contains("marked down"), "{err:?}");
    // Fail-open still lets the call through, charging nothing.
    let open = RedisQuota::new(
        hanging(FailMode::Open),
        QuotaPlan::new(&[limit("5/sec")], &[]),
    )
    .unwrap();
    assert!(
        reserve(&open, "t", "a", "a.b.c")
            .await
            .unwrap()
            .keys
            .is_empty()
    );
    hang.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharers_keep_their_own_limits_and_keys_on_one_connection() {
    let url = soulbase_testkit::redis_url();
    let prefix = soulbase_testkit::unique_name("share");
    let a = RedisQuota::new(
        options(&url, &prefix),
        QuotaPlan::new(&[limit("2/min")], &[]),
    )
    .unwrap();
    let b = a.sharing(format!("{prefix}:b:"), QuotaPlan::new(&[], &[]));
    // No limit of its own yet: `b` decides without counting.
    assert!(
        reserve(&b, "t", "a", "a.b.c")
            .await
            .unwrap()
            .keys
            .is_empty()
    );
    b.update(&[limit("1/min")]);
    assert!(reserve(&a, "t", "a", "a.b.c").await.is_ok());
    assert!(reserve(&a, "t", "a", "a.b.c").await.is_ok());
    assert_eq!(
        reserve(&a, "t", "a", "a.b.c")
            .await
            .unwrap_err()
            .field("limit"),
        Some("2/min")
    );
    // `a`'s count is not `b`'s: its own 1/min still has room once.
    assert!(reserve(&b, "t", "a", "a.b.c").await.is_ok());
    assert_eq!(
        reserve(&b, "t", "a", "a.b.c")
            .await
            .unwrap_err()
            .field("limit"),
        Some("1/min")
    );
}
