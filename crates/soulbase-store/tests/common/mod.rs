//! Shared helpers: a real pipeline over given evidence and idempotency stores, and
//! fresh databases.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::json;
use soulbase_auth::{HmacConsent, StaticPolicy};
use soulbase_config::{PolicyConfig, PolicyEffect, PolicyRule, QuotaLimit};
use soulbase_observe::{EvidenceEvent, EvidenceSink};
use soulbase_qos::LocalQuota;
use soulbase_sandbox::{BuiltinExecutor, DeclaredProfiles, LocalSandbox, handler_fn};
use soulbase_store::Db;
use soulbase_tools::pipeline::{IdempotencyStore, Invoker, InvokerBuilder, ToolCall};
use soulbase_tools::registry::ToolOwner;
use soulbase_tools::{Registry, ToolManifest};
use soulbase_types::{ActorId, Rate, Subject, TenantId, ToolId};

/// The plain tool.
pub const WORK: &str = "demo.work.run";
/// The keyed (idempotent) tool.
pub const KEYED: &str = "demo.keyed.run";

fn manifest(id: &str, keyed: bool) -> ToolManifest {
    let mut m = json!({
        "id": id,
        "version": "1.0.0",
        "description": "does some work",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
        "output_schema": {"type": "object"},
        "side_effect": "none",
        "limits": {"timeout_ms": 10000}
    });
    if keyed {
        m["idempotency"] = json!("keyed");
    }
    ToolManifest::from_json_str(&m.to_string()).unwrap()
}

/// A pipeline whose tools count their executions in the returned counter and take
/// `work` each (so calls are in flight when a test strikes).
pub fn pipeline(
    sink: Arc<dyn EvidenceSink>,
    idempotency: Arc<dyn IdempotencyStore>,
    work: Duration,
) -> (Invoker, Arc<AtomicUsize>) {
    pipeline_gated(sink, idempotency, work, None)
}

/// [`pipeline`] whose tools, after counting, also wait for a permit of `gate`
/// (when given): a test decides when a call in flight finishes.
pub fn pipeline_gated(
    sink: Arc<dyn EvidenceSink>,
    idempotency: Arc<dyn IdempotencyStore>,
    work: Duration,
    gate: Option<Arc<tokio::sync::Semaphore>>,
) -> (Invoker, Arc<AtomicUsize>) {
    let registry = Registry::new();
    for (id, keyed) in [(WORK, false), (KEYED, true)] {
        registry.register(manifest(id, keyed)).unwrap();
        registry
            .enable(&ToolOwner::Global, &ToolId::new(id).unwrap())
            .unwrap();
    }
    let executed = Arc::new(AtomicUsize::new(0));
    let builtin = BuiltinExecutor::new();
    for id in [WORK, KEYED] {
        let counter = executed.clone();
        let gate = gate.clone();
        builtin.register(
            id,
            handler_fn(move |args| {
                let (counter, gate) = (counter.clone(), gate.clone());
                async move {
                    counter.fetch_add(1, Ordering::SeqCst);
                    if !work.is_zero() {
                        tokio::time::sleep(work).await;
                    }
                    if let Some(g) = gate {
                        g.acquire().await.unwrap().forget();
                    }
                    Ok(json!({"echo": args}))
                }
            }),
        );
    }
    let policy = PolicyConfig {
        rules: vec![PolicyRule {
            effect: PolicyEffect::Allow,
            tenant: "acme".into(),
            actors: vec!["*".into()],
            tools: vec!["demo.*".into()],
            actions: vec!["invoke".into()],
            require_scopes: false,
            obligations: Vec::new(),
        }],
    };
    let quota = LocalQuota::new(&[QuotaLimit {
        tenant: "*".into(),
        tool: "*".into(),
        rate: Rate::new(u64::MAX / 4, Duration::from_secs(1)).unwrap(),
    }]);
    let invoker = InvokerBuilder::new(
        Arc::new(registry),
        Arc::new(StaticPolicy::new(&policy)),
        Arc::new(quota),
        Arc::new(HmacConsent::new(vec![7u8; 32])),
        Arc::new(DeclaredProfiles::new()),
        Arc::new(LocalSandbox::new(builtin)),
        sink,
        idempotency,
    )
    .build();
    (invoker, executed)
}

/// A call of `tool` by acme/alice.
pub fn call(tool: &str, n: i64) -> ToolCall {
    ToolCall::new(
        Subject::new(
            TenantId::new("acme").unwrap(),
            ActorId::new("alice").unwrap(),
        ),
        ToolId::new(tool).unwrap(),
        json!({"n": n}),
    )
}

/// A fresh, migrated database on the Postgres server at `server` (a URL).
pub async fn fresh_postgres_on(server: &str) -> (Db, String) {
    let name = soulbase_testkit::unique_name("sbstore");
    let admin = sqlx::PgPool::connect(server).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let url = soulbase_testkit::with_database(server, &name);
    (Db::connect(&url, true).await.unwrap(), url)
}

/// A fresh, migrated database on the shared test server (`DATABASE_URL`).
pub async fn fresh_postgres() -> Db {
    fresh_postgres_on(&soulbase_testkit::database_url()).await.0
}

/// A fresh, migrated SQLite file in `dir`.
pub async fn fresh_sqlite(dir: &std::path::Path) -> Db {
    let url = format!("sqlite://{}", dir.join("evidence.db").display());
    Db::connect(&url, true).await.unwrap()
}

/// Counts of (Begins, Ends, distinct call ids with a Begin, aborted Ends) in `db`.
pub async fn counts(db: &Db) -> (i64, i64, i64, i64) {
    let q = "SELECT \
        (SELECT count(*) FROM evidence WHERE kind = 'begin'), \
        (SELECT count(*) FROM evidence WHERE kind = 'end'), \
        (SELECT count(DISTINCT call_id) FROM evidence WHERE kind = 'begin'), \
        (SELECT count(*) FROM evidence WHERE kind = 'end' AND status = 'aborted')";
    match db {
        Db::Postgres(p) => sqlx::query_as(q).fetch_one(p).await.unwrap(),
        Db::Sqlite(p) => sqlx::query_as(q).fetch_one(p).await.unwrap(),
    }
}

/// Begins without an End in `db`.
pub async fn open_begins(db: &Db) -> i64 {
    let q = "SELECT count(*) FROM evidence b WHERE b.kind = 'begin' AND NOT EXISTS \
             (SELECT 1 FROM evidence e WHERE e.kind = 'end' AND e.begin_id = b.id)";
    match db {
        Db::Postgres(p) => sqlx::query_scalar(q).fetch_one(p).await.unwrap(),
        Db::Sqlite(p) => sqlx::query_scalar(q).fetch_one(p).await.unwrap(),
    }
}

/// Whether a record is a Begin.
pub fn is_begin(e: &EvidenceEvent) -> bool {
    matches!(e, EvidenceEvent::Begin(_))
}
