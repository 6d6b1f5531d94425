#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The SQL stores on real Postgres and SQLite: same semantics on both.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use common::{fresh_postgres, fresh_sqlite};
use serde_json::json;
use soulbase_errors::ErrorCode;
use soulbase_observe::{
    BudgetUsage, Denial, EncodedRecord, EndStatus, EvidenceBegin, EvidenceEnd, EvidenceEvent,
    EvidenceQuery, EvidenceRecord, EvidenceStore, ReplayOutcome, replay,
};
use soulbase_store::{Db, RegistryStore, SqlEvidenceStore, SqlIdempotency};
use soulbase_tools::ToolManifest;
use soulbase_tools::pipeline::{
    CallResult, CallStatus, Claim, IdempotencyKey, IdempotencyStore, StoredOutcome,
};
use soulbase_tools::registry::admin::{RegistryAdmin, StateChange};
use soulbase_tools::registry::{RecordKey, Registry, TenantOverride, ToolOwner, ToolState};
use soulbase_types::{ActorId, CallId, Envelope, EnvelopeId, Origin, TenantId, ToolId, UnixMillis};

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).unwrap()
}

/// Who the test's registry changes are made by.
fn by() -> soulbase_types::Subject {
    soulbase_types::Subject::new(
        TenantId::new("acme").unwrap(),
        soulbase_types::ActorId::new("ops").unwrap(),
    )
}

fn begin(t: &str, tool: &str, at: i64) -> EvidenceRecord {
    let mut r = Envelope::new(
        tenant(t),
        ActorId::new("alice").unwrap(),
        Origin::Llm,
        EvidenceEvent::Begin(EvidenceBegin {
            call_id: CallId::generate(),
            tool_id: ToolId::new(tool).unwrap(),
            tool_version: "1.0.0".into(),
            manifest_digest: "m".into(),
            profile_hash: "p".into(),
            policy_hash: "pol".into(),
            config_hash: "c".into(),
            args_digest: "sha256:aa".into(),
            idempotency_key: None,
            calling_skill: Some("weather".into()),
            consent: None,
            conversation: None,
            surface: None,
        }),
    );
    r.at = UnixMillis(at);
    r
}

fn end_of(b: &EvidenceRecord, status: EndStatus) -> EvidenceRecord {
    let EvidenceEvent::Begin(x) = &b.payload else {
        unreachable!()
    };
    let mut r = Envelope::new(
        b.tenant.clone(),
        b.actor.clone(),
        b.origin,
        EvidenceEvent::End(EvidenceEnd {
            call_id: x.call_id.clone(),
            begin_id: b.id.clone(),
            status,
            error_code: (status != EndStatus::Ok).then_some(ErrorCode::ToolExecutionFailed),
            output_digest: Some("sha256:bb".into()),
            side_effects: vec![],
            usage: BudgetUsage {
                calls: 1,
                ..BudgetUsage::default()
            },
            duration_us: 9,
            client_requests: Vec::new(),
        }),
    );
    r.at = UnixMillis(b.at.0 + 3);
    r
}

fn call_of(r: &EvidenceRecord) -> CallId {
    r.payload.call_id().clone()
}

const DAY: i64 = 86_400_000;

async fn evidence_semantics(db: Db) {
    let store = SqlEvidenceStore::new(db);
    let now = UnixMillis::now().0;
    // Spread over three days (three Postgres partitions).
    let mut begins = Vec::new();
    let mut batch = Vec::new();
    for i in 0..30i64 {
        let tool = if i % 3 == 0 { "demo.a.x" } else { "demo.b.y" };
        let mut b = begin("acme", tool, now - (i % 3) * DAY - i * 10);
        if i % 5 == 0 {
            b.actor = ActorId::new("carol").unwrap();
        }
        if i == 0
            && let EvidenceEvent::Begin(x) = &mut b.payload
        {
            x.surface = Some(soulbase_types::Surface::Mcp);
        }
        let status = if i % 4 == 0 {
            EndStatus::Error
        } else {
            EndStatus::Ok
        };
        batch.push(b.clone());
        if i != 7 {
            batch.push(end_of(&b, status));
        }
        begins.push(b);
    }
    batch.push(begin("other", "demo.a.x", now));
    let denial = Envelope::new(
        tenant("acme"),
        ActorId::new("bob").unwrap(),
        Origin::Api,
        EvidenceEvent::Denied(Denial {
            call_id: CallId::generate(),
            tool: "demo.z.z".into(),
            code: ErrorCode::PolicyDenyTool,
        }),
    );
    batch.push(denial.clone());
    // An older denial by another actor, and one of another tenant.
    let mut older_denial = Envelope::new(
        tenant("acme"),
        ActorId::new("carol").unwrap(),
        Origin::Llm,
        EvidenceEvent::Denied(Denial {
            call_id: CallId::generate(),
            tool: "demo.a.x".into(),
            code: ErrorCode::ConsentRequired,
        }),
    );
    older_denial.at = UnixMillis(denial.at.0 - 5_000);
    batch.push(older_denial.clone());
    batch.push(Envelope::new(
        tenant("other"),
        ActorId::new("bob").unwrap(),
        Origin::Api,
        EvidenceEvent::Denied(Denial {
            call_id: CallId::generate(),
            tool: "demo.z.z".into(),
            code: ErrorCode::PolicyDenyTool,
        }),
    ));
    // An agent-loop conversation's own record, stored under its id (kind
    // `conversation`, migration 0010) and read back through it.
    let conversation = Envelope::new(
        tenant("acme"),
        ActorId::new("bob").unwrap(),
        Origin::Llm,
        EvidenceEvent::Conversation(Box::new(soulbase_observe::ConversationEvent {
            conversation_id: CallId::new("conv_store_test").unwrap(),
            step: soulbase_observe::ConversationStep::End {
                reason: soulbase_observe::ConversationEnd::Answered,
                iterations: 1,
                tool_calls: 0,
                tokens: 0,
                error_code: None,
            },
        })),
    );
    batch.push(conversation.clone());
    store.write_batch(&batch).await.unwrap();
    // Re-sending is harmless.
    store.write_batch(&batch).await.unwrap();
    store.write_batch(&batch[..10]).await.unwrap();

    let own = store
        .call(None, &CallId::new("conv_store_test").unwrap())
        .await
        .unwrap();
    assert_eq!(own.records, vec![conversation]);
    let encoded = [soulbase_observe::EncodedRecord::encode(&own.records[0]).unwrap()];
    store.write_encoded(&encoded).await.unwrap();

    // By call id, with tenant isolation.
    let b0 = &begins[0];
    let ev = store.call(None, &call_of(b0)).await.unwrap();
    assert_eq!(ev.records.len(), 2);
    assert_eq!(ev.records[0], *b0);
    assert!(
        store
            .call(Some(&tenant("other")), &call_of(b0))
            .await
            .unwrap()
            .is_empty()
    );
    let r = replay(&ev).unwrap();
    assert!(r.anomalies.is_empty());
    let ReplayOutcome::Executed(x) = r.outcome else {
        panic!("not executed")
    };
    assert_eq!(x.status, Some(EndStatus::Error));
    assert_eq!(x.calling_skill.as_deref(), Some("weather"));
    let d = store
        .call(Some(&tenant("acme")), &call_of(&denial))
        .await
        .unwrap();
    assert!(matches!(
        replay(&d).unwrap().outcome,
        ReplayOutcome::Denied { .. }
    ));

    // Paginated listing: every acme call once, newest first.
    let mut q = EvidenceQuery::tenant(tenant("acme"), 7);
    let mut seen = Vec::new();
    loop {
        let page = store.list(&q).await.unwrap();
        assert!(page.calls.len() <= 7);
        seen.extend(page.calls.iter().map(|c| (c.began_at, c.begin_id.clone())));
        match page.next {
            Some(n) => q.after = Some(n),
            None => break,
        }
    }
    let mut expected: Vec<_> = begins.iter().map(|b| (b.at, b.id.clone())).collect();
    expected.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, expected);

    // Filters: tool + status + time range; open calls have no status.
    let mut q = EvidenceQuery::tenant(tenant("acme"), 100);
    q.tool = Some(ToolId::new("demo.a.x").unwrap());
    q.status = Some(EndStatus::Error);
    let page = store.list(&q).await.unwrap();
    let want: BTreeSet<_> = (0..30)
        .filter(|i| i % 3 == 0 && i % 4 == 0 && *i != 7)
        .map(|i| begins[i as usize].id.clone())
        .collect();
    assert_eq!(
        page.calls
            .iter()
            .map(|c| c.begin_id.clone())
            .collect::<BTreeSet<_>>(),
        want
    );
    let mut q = EvidenceQuery::tenant(tenant("acme"), 100);
    q.from = Some(UnixMillis(now - DAY / 2));
    let page = store.list(&q).await.unwrap();
    assert_eq!(page.calls.len(), 10);
    let open = store
        .list(&EvidenceQuery::tenant(tenant("acme"), 100))
        .await
        .unwrap()
        .calls
        .into_iter()
        .filter(|c| c.status.is_none())
        .count();
    assert_eq!(open, 1);
    // By actor, by error code, and both; the surface a Begin recorded.
    let ids = |page: soulbase_observe::CallPage| {
        page.calls
            .iter()
            .map(|c| c.begin_id.clone())
            .collect::<BTreeSet<_>>()
    };
    let picked = |f: &dyn Fn(i64) -> bool| {
        (0..30i64)
            .filter(|i| f(*i))
            .map(|i| begins[i as usize].id.clone())
            .collect::<BTreeSet<_>>()
    };
    let mut q = EvidenceQuery::tenant(tenant("acme"), 100);
    q.actor = Some(ActorId::new("carol").unwrap());
    assert_eq!(ids(store.list(&q).await.unwrap()), picked(&|i| i % 5 == 0));
    q.code = Some(ErrorCode::ToolExecutionFailed);
    assert_eq!(ids(store.list(&q).await.unwrap()), picked(&|i| i % 20 == 0));
    q.actor = None;
    assert_eq!(
        ids(store.list(&q).await.unwrap()),
        picked(&|i| i % 4 == 0 && i != 7)
    );
    q.code = Some(ErrorCode::PolicyDenyTool);
    assert!(store.list(&q).await.unwrap().calls.is_empty());
    let all = store
        .list(&EvidenceQuery::tenant(tenant("acme"), 100))
        .await
        .unwrap();
    let surfaced: Vec<_> = all.calls.iter().filter(|c| c.surface.is_some()).collect();
    assert_eq!(surfaced.len(), 1);
    assert_eq!(surfaced[0].begin_id, begins[0].id);
    assert_eq!(surfaced[0].surface, Some(soulbase_types::Surface::Mcp));

    // Denials: the tenant's own, newest first, filtered and paginated.
    let denials = |q: EvidenceQuery| {
        let store = &store;
        async move {
            store
                .list_denials(&q)
                .await
                .unwrap()
                .denials
                .into_iter()
                .map(|d| d.call_id)
                .collect::<Vec<_>>()
        }
    };
    let acme = || EvidenceQuery::tenant(tenant("acme"), 100);
    assert_eq!(
        denials(acme()).await,
        vec![call_of(&denial), call_of(&older_denial)]
    );
    let mut q = acme();
    q.code = Some(ErrorCode::ConsentRequired);
    assert_eq!(denials(q).await, vec![call_of(&older_denial)]);
    let mut q = acme();
    q.actor = Some(ActorId::new("bob").unwrap());
    assert_eq!(denials(q).await, vec![call_of(&denial)]);
    let mut q = acme();
    q.tool = Some(ToolId::new("demo.a.x").unwrap());
    assert_eq!(denials(q).await, vec![call_of(&older_denial)]);
    let mut q = acme();
    q.to = Some(UnixMillis(denial.at.0));
    assert_eq!(denials(q).await, vec![call_of(&older_denial)]);
    let mut q = EvidenceQuery::tenant(tenant("acme"), 1);
    let first = store.list_denials(&q).await.unwrap();
    assert_eq!(first.denials.len(), 1);
    assert_eq!(first.denials[0].code, ErrorCode::PolicyDenyTool);
    assert_eq!(first.denials[0].tool, "demo.z.z");
    assert_eq!(first.denials[0].actor.as_str(), "bob");
    q.after = first.next;
    let second = store.list_denials(&q).await.unwrap();
    assert_eq!(
        second
            .denials
            .iter()
            .map(|d| d.call_id.clone())
            .collect::<Vec<_>>(),
        vec![call_of(&older_denial)]
    );
    assert!(second.next.is_none());
    let mut q = acme();
    q.status = Some(EndStatus::Ok);
    assert_eq!(
        store.list_denials(&q).await.unwrap_err().field("field"),
        Some("status")
    );

    let bad = EvidenceQuery::tenant(tenant("acme"), 5000);
    assert_eq!(
        store.list(&bad).await.unwrap_err().field("field"),
        Some("limit")
    );

    // Retention drops the older days (whole partitions on Postgres).
    let purged = store
        .purge_before(UnixMillis(now - DAY / 2 - 1_000))
        .await
        .unwrap();
    // 20 Begins on the older days and their 19 Ends (call 7 never ended).
    assert_eq!(purged, 39);
    let left = store
        .list(&EvidenceQuery::tenant(tenant("acme"), 100))
        .await
        .unwrap();
    assert_eq!(left.calls.len(), 10);
    // Writing into a day whose partition was dropped recreates it.
    store
        .write_batch(&[begin("acme", "demo.a.x", now - 2 * DAY)])
        .await
        .unwrap();
}

/// An End in its Begin's millisecond whose id sorts first (ids are time-ordered
/// only to the millisecond) still reads after the Begin.
async fn a_call_reads_begin_before_end(db: Db) {
    let store = SqlEvidenceStore::new(db);
    let now = UnixMillis::now().0;
    let mut b = begin("acme", "demo.a.x", now);
    b.id = EnvelopeId::new("ffffffff-ffff-7fff-bfff-ffffffffffff").unwrap();
    let mut e = end_of(&b, EndStatus::Ok);
    e.at = b.at;
    e.id = EnvelopeId::new("00000000-0000-7000-8000-000000000000").unwrap();
    store.write_batch(&[e.clone(), b.clone()]).await.unwrap();
    let ev = store.call(None, &call_of(&b)).await.unwrap();
    assert_eq!(ev.records, vec![b, e]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_reads_begin_before_end_on_postgres() {
    a_call_reads_begin_before_end(fresh_postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_reads_begin_before_end_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_call_reads_begin_before_end(fresh_sqlite(dir.path()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_on_postgres() {
    evidence_semantics(fresh_postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evidence_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    evidence_semantics(fresh_sqlite(dir.path()).await).await;
}

/// The SQLite the workspace builds (`LIBSQLITE3_FLAGS` in `.cargo/config.toml`)
/// keeps no memory statistics and no page cache shared between connections:
/// neither takes a global mutex on each allocation and page fetch of the drain's
/// inserts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_is_built_without_global_memory_mutexes() {
    let dir = tempfile::tempdir().unwrap();
    let Db::Sqlite(pool) = fresh_sqlite(dir.path()).await else {
        panic!("a SQLite URL opens SQLite");
    };
    let options: Vec<(String,)> = sqlx::query_as("PRAGMA compile_options")
        .fetch_all(&pool)
        .await
        .unwrap();
    let options: Vec<String> = options.into_iter().map(|(o,)| o).collect();
    assert!(
        options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
        "{options:?}"
    );
    assert!(
        !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
        "{options:?}"
    );
}

/// A SQLite database created by `Db::connect` has 16 KiB pages; one made before
/// (4 KiB, SQLite's default) keeps its page size, is migrated and takes evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_sqlite_databases_get_large_pages_and_old_ones_keep_theirs() {
    async fn page_size(pool: &sqlx::SqlitePool) -> u32 {
        let (size,): (i64,) = sqlx::query_as("PRAGMA page_size")
            .fetch_one(pool)
            .await
            .unwrap();
        u32::try_from(size).unwrap()
    }
    let dir = tempfile::tempdir().unwrap();
    let Db::Sqlite(pool) = fresh_sqlite(dir.path()).await else {
        panic!("a SQLite URL opens SQLite");
    };
    assert_eq!(page_size(&pool).await, soulbase_store::SQLITE_PAGE_SIZE);

    let old = dir.path().join("old.db");
    {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode};
        let opts = SqliteConnectOptions::new()
            .filename(&old)
            .create_if_missing(true)
            .page_size(4096)
            .journal_mode(SqliteJournalMode::Wal);
        let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
        sqlx::query("CREATE TABLE before_us (x INTEGER)")
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
    let db = Db::connect(&format!("sqlite://{}", old.display()), true)
        .await
        .unwrap();
    let Db::Sqlite(pool) = &db else {
        panic!("a SQLite URL opens SQLite");
    };
    assert_eq!(page_size(pool).await, 4096);
    let store = SqlEvidenceStore::new(db.clone());
    let b = begin("acme", "demo.a.x", UnixMillis::now().0);
    let e = end_of(&b, EndStatus::Ok);
    store.write_batch(&[b, e]).await.unwrap();
    assert_eq!(common::counts(&db).await, (1, 1, 1, 0));
}

/// Whether `conn`'s plan for inserting an evidence row builds an ephemeral index
/// (what SQLite does for a check's `IN` list, for every row). Prepared afresh each
/// time: an `EXPLAIN` kept in the statement cache would show the plan of the schema
/// it was prepared under (an `INSERT` kept there is prepared again when it runs).
async fn inserts_build_an_index(conn: &mut sqlx::SqliteConnection) -> bool {
    use sqlx::Row;
    sqlx::query(
        "EXPLAIN INSERT INTO evidence (id, at_ms, tenant, kind, call_id, record) \
         VALUES ('x', 1, 't', 'end', 'c', '{}')",
    )
    .persistent(false)
    .fetch_all(conn)
    .await
    .unwrap()
    .iter()
    .any(|op| op.get::<String, _>(1) == "OpenEphemeral")
}

/// Inserts a minimal evidence row of `kind` with envelope id `id` through `conn`
/// (the check on `kind` refuses any but the four it allows).
async fn insert_kind<'c>(
    conn: impl sqlx::Executor<'c, Database = sqlx::Sqlite>,
    id: &str,
    kind: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO evidence (id, at_ms, tenant, kind, call_id, record) \
         VALUES (?1, 1, 't', ?2, 'c', '{}')",
    )
    .bind(id)
    .bind(kind)
    .execute(conn)
    .await
    .map(drop)
}

/// Migration 13 on a database made before it (through migration 12), with a second
/// connection open meanwhile: `evidence.kind` is checked by comparisons, not by an
/// index of the allowed kinds built for every row, on the migrating connection and
/// on the other one alike; other kinds are still refused; the file stays sound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_checks_an_evidence_kind_without_an_index_per_row() {
    use sqlx::migrate::Migrator;
    let dir = tempfile::tempdir().unwrap();
    let opts = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.path().join("e.db"))
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
    let pool = sqlx::SqlitePool::connect_with(opts).await.unwrap();
    let all = soulbase_store::migrations::sqlite();
    let before =
        Migrator::with_migrations(all.iter().filter(|m| m.version <= 12).cloned().collect());
    let mut migrating = pool.acquire().await.unwrap();
    let mut other = pool.acquire().await.unwrap();
    before.run(&mut *migrating).await.unwrap();
    assert!(
        inserts_build_an_index(&mut other).await,
        "the check before: an IN list"
    );

    all.run(&mut *migrating).await.unwrap();
    // Executed on `other` first: a statement that runs (not an `EXPLAIN`) is what
    // makes a connection see the changed schema and read it again.
    let (sql,): (String,) =
        sqlx::query_as("SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'evidence'")
            .fetch_one(&mut *other)
            .await
            .unwrap();
    assert!(
        sql.contains(
            "CHECK (kind = 'begin' OR kind = 'end' OR kind = 'denied' OR kind = 'conversation')"
        ),
        "{sql}"
    );
    assert!(!inserts_build_an_index(&mut migrating).await);
    assert!(!inserts_build_an_index(&mut other).await);
    for conn in [&mut migrating, &mut other] {
        let refused = insert_kind(&mut **conn, "y", "started").await.unwrap_err();
        assert!(
            refused.to_string().contains("CHECK constraint failed"),
            "{refused}"
        );
    }
    insert_kind(&mut *other, "z", "conversation").await.unwrap();
    let (check,): (String,) = sqlx::query_as("PRAGMA integrity_check")
        .fetch_one(&mut *migrating)
        .await
        .unwrap();
    assert_eq!(check, "ok");
    drop((migrating, other));
    pool.close().await;
}

/// A batch SQLite rolls back whole by itself — here the file reaching its
/// `max_page_count` in the middle of a multi-row insert (`SQLITE_FULL`; the inserts
/// keep no statement journal) — leaves no pooled connection that still counts a
/// transaction as open: after a later transaction on the pool is rolled back, a
/// single-statement batch is committed, as another connection sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_sqlite_rolled_back_by_itself_leaves_no_transaction_open() {
    let dir = tempfile::tempdir().unwrap();
    let (pool, file) = one_connection_sqlite(dir.path(), Some(6)).await;
    let store = SqlEvidenceStore::new(Db::Sqlite(pool.clone()));
    let now = UnixMillis::now().0;
    let big: Vec<EvidenceRecord> = (0..300)
        .map(|i| begin("acme", "demo.a.x", now - i))
        .collect();
    store.write_batch(&big).await.unwrap_err();

    let mut tx = pool.begin().await.unwrap();
    let refused = insert_kind(&mut *tx, "y", "started").await.unwrap_err();
    assert!(
        refused.to_string().contains("CHECK constraint failed"),
        "{refused}"
    );
    drop(tx);

    let one = begin("acme", "demo.a.x", now);
    store.write_batch(std::slice::from_ref(&one)).await.unwrap();
    assert_eq!(
        committed_ids(&file).await,
        [one.id.to_string()],
        "the single-statement batch is committed"
    );
    pool.close().await;
}

/// A migrated SQLite database in `dir` opened again on the store's pool settings
/// with one connection (a connection left half open would be the one used next),
/// its file allowed `pages_over` more pages than migrating made (`None`: no cap);
/// and the file's options, for another connection.
async fn one_connection_sqlite(
    dir: &std::path::Path,
    pages_over: Option<i64>,
) -> (sqlx::SqlitePool, sqlx::sqlite::SqliteConnectOptions) {
    let Db::Sqlite(migrated) = fresh_sqlite(dir).await else {
        unreachable!("a SQLite database")
    };
    let (pages,): (i64,) = sqlx::query_as("PRAGMA page_count")
        .fetch_one(&migrated)
        .await
        .unwrap();
    migrated.close().await;
    let file = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(dir.join("evidence.db"))
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal);
    let opened = match pages_over {
        Some(over) => file
            .clone()
            .pragma("max_page_count", (pages + over).to_string()),
        None => file.clone(),
    };
    let pool = soulbase_store::sqlite_pool_options()
        .max_connections(1)
        .connect_with(opened)
        .await
        .unwrap();
    (pool, file)
}

/// The evidence ids committed in the database at `file`, in order, as a
/// connection of its own sees them.
async fn committed_ids(file: &sqlx::sqlite::SqliteConnectOptions) -> Vec<String> {
    use sqlx::Connection as _;
    let mut other = sqlx::SqliteConnection::connect_with(file).await.unwrap();
    sqlx::query_scalar("SELECT id FROM evidence ORDER BY id")
        .fetch_all(&mut other)
        .await
        .unwrap()
}

/// Any transaction of the store's SQLite pool that SQLite ended by itself while
/// sqlx still counts it open (reproduced here with a `ROLLBACK` sqlx does not see,
/// so its own then fails, as after a full disk in an idempotency or registry
/// transaction) is not handed out again: the next transaction on the pool is a
/// real one, and a write after its rollback is committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_connection_sqlx_counts_in_a_transaction_is_not_used_again() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let (pool, file) = one_connection_sqlite(dir.path(), None).await;

    let mut tx = pool.begin().await.unwrap();
    sqlx::query("ROLLBACK").execute(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap_err();

    let mut conn = pool.acquire().await.unwrap();
    assert!(
        !conn.is_in_transaction(),
        "a connection counted in a transaction"
    );
    let mut tx = conn.begin().await.unwrap();
    insert_kind(&mut *tx, "rolled-back", "begin").await.unwrap();
    tx.rollback().await.unwrap();
    insert_kind(&mut *conn, "kept", "begin").await.unwrap();
    drop(conn);

    assert_eq!(
        committed_ids(&file).await,
        ["kept"],
        "the write after the rollback is committed"
    );
    pool.close().await;
}

/// A batch part of which is already stored (re-sent after a crash, overlapping a
/// new tail): the new records land, the stored ones are not doubled, and the
/// whole-COPY fast path is taken again afterwards.
async fn overlapping_batches(db: Db) {
    let store = SqlEvidenceStore::new(db);
    let now = UnixMillis::now().0;
    let first: Vec<EvidenceRecord> = (0..20)
        .flat_map(|i| {
            let b = begin("acme", "demo.a.x", now - i);
            let e = end_of(&b, EndStatus::Ok);
            [b, e]
        })
        .collect();
    store.write_batch(&first[..24]).await.unwrap();
    store.write_batch(&first[10..]).await.unwrap();
    let fresh = begin("acme", "demo.a.x", now);
    store
        .write_batch(std::slice::from_ref(&fresh))
        .await
        .unwrap();
    for r in first.iter().step_by(2).chain([&fresh]) {
        let ev = store.call(None, &call_of(r)).await.unwrap();
        let ids: std::collections::BTreeSet<_> = ev.records.iter().map(|x| x.id.clone()).collect();
        assert_eq!(ids.len(), ev.records.len(), "no duplicates");
    }
    let page = store
        .list(&EvidenceQuery::tenant(tenant("acme"), 100))
        .await
        .unwrap();
    assert_eq!(page.calls.len(), 21);
    assert_eq!(
        page.calls
            .iter()
            .filter(|c| c.status == Some(EndStatus::Ok))
            .count(),
        20,
        "every End found for its Begin"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_on_postgres() {
    overlapping_batches(fresh_postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_refusing_data_is_not_an_outage() {
    let db = fresh_postgres().await;
    // A row an older binary would COPY (jsonb's version byte before the JSON) is
    // refused rather than stored garbled (it stays in that process's spool).
    let Db::Postgres(pool) = &db else {
        unreachable!()
    };
    sqlx::query("SELECT soulbase_evidence_ensure_partition(1700000000000)")
        .execute(pool)
        .await
        .unwrap();
    let garbled = sqlx::query(
        "INSERT INTO evidence (id, at_ms, tenant, kind, call_id, record) \
         VALUES ('x', 1700000000000, 'acme', 'begin', 'c', E'\\x01{}')",
    )
    .execute(pool)
    .await;
    let garbled = garbled.unwrap_err().to_string();
    assert!(
        garbled.contains("evidence_record_is_json_text"),
        "{garbled}"
    );
    let store = SqlEvidenceStore::new(db);
    // A NUL in a text column: Postgres refuses it (SQLSTATE 22021) however often
    // the batch is sent, so the store says so rather than "unavailable".
    let bad = Envelope::new(
        tenant("acme"),
        ActorId::new("bob").unwrap(),
        Origin::Api,
        EvidenceEvent::Denied(Denial {
            call_id: CallId::generate(),
            tool: "demo\u{0}z".into(),
            code: ErrorCode::PolicyDenyTool,
        }),
    );
    let good = begin("acme", "demo.a.x", 1_700_000_000_000);
    let e = store
        .write_batch(&[good.clone(), bad.clone()])
        .await
        .unwrap_err();
    assert!(soulbase_observe::is_store_refusal(&e), "{e:?}");
    // A record holding the escape \u0000 is stored as it is (text, not jsonb).
    let mut escaped = begin("acme", "demo.a.x", 1_700_000_000_001);
    if let EvidenceEvent::Begin(b) = &mut escaped.payload {
        b.idempotency_key = Some("k\u{0}".into());
    }
    store
        .write_batch(&[good.clone(), escaped.clone()])
        .await
        .unwrap();
    let kept = store.call(None, &call_of(&escaped)).await.unwrap();
    assert_eq!(kept.records, vec![escaped]);
    // Text from a spool: kept as it is when it is a record; text whose indexed
    // fields read but that is not a record is refused, with nothing of its batch
    // stored (it could not be read back).
    let later = begin("acme", "demo.a.x", 1_700_000_000_002);
    let text = serde_json::to_string(&later).unwrap();
    let not_a_record = EncodedRecord::from_json(
        r#"{"id":"y","tenant":"acme","at":1700000000003,"payload":{"event":"denied","call_id":"c","tool":"t"}}"#.into(),
    );
    let e = store
        .write_encoded(&[EncodedRecord::from_json(text.clone()), not_a_record])
        .await
        .unwrap_err();
    assert!(soulbase_observe::is_store_refusal(&e), "{e:?}");
    assert!(
        store
            .call(None, &call_of(&later))
            .await
            .unwrap()
            .records
            .is_empty()
    );
    store
        .write_encoded(&[EncodedRecord::from_json(text.clone())])
        .await
        .unwrap();
    let Db::Postgres(pg) = store.db() else {
        unreachable!()
    };
    let stored: (String,) = sqlx::query_as("SELECT record FROM evidence WHERE id = $1")
        .bind(later.id.as_str())
        .fetch_one(pg)
        .await
        .unwrap();
    assert_eq!(stored.0, text, "the text is stored as it came");
    let kept = store.call(None, &call_of(&later)).await.unwrap();
    assert_eq!(kept.records, vec![later]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_batches_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    overlapping_batches(fresh_sqlite(dir.path()).await).await;
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey {
        tenant: tenant("acme"),
        tool: ToolId::new("demo.keyed.run").unwrap(),
        key: k.into(),
    }
}

fn outcome(digest: &str) -> StoredOutcome {
    StoredOutcome {
        args_digest: digest.into(),
        result: CallResult {
            call_id: CallId::generate(),
            status: CallStatus::Ok,
            error_code: None,
            error: None,
            output: Some(json!({"v": 1})),
            evidence_ref: None,
            replayed: false,
            warnings: Vec::new(),
            usage: None,
        },
    }
}

async fn idempotency_semantics(db: Db) {
    let a = SqlIdempotency::new(db.clone());
    let b = SqlIdempotency::new(db.clone());
    let wait = Duration::from_millis(200);
    assert_eq!(a.claim(&key("k1"), "d1", wait).await.unwrap(), Claim::Owner);
    // Another instance waits, then times out while the owner is in flight.
    let err = b.claim(&key("k1"), "d1", wait).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyConflict);
    assert!(err.retry_after_ms().is_some());
    // Different arguments: conflict at once.
    let err = b.claim(&key("k1"), "d2", wait).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyConflict);
    assert_eq!(err.field("field"), Some("idempotency_key"));
    // Completed: everyone gets the stored result.
    let stored = outcome("d1");
    a.complete(&key("k1"), stored.clone(), None).await.unwrap();
    match b.claim(&key("k1"), "d1", wait).await.unwrap() {
        Claim::Completed(s) => assert_eq!(*s, stored),
        other => panic!("{other:?}"),
    }
    // Any output a tool may return is stored, a NUL escape included (jsonb refuses it).
    assert_eq!(a.claim(&key("k4"), "d", wait).await.unwrap(), Claim::Owner);
    let mut nul = outcome("d");
    nul.result.output = Some(json!({"text": "a\u{0}b"}));
    a.complete(&key("k4"), nul.clone(), None).await.unwrap();
    match b.claim(&key("k4"), "d", wait).await.unwrap() {
        Claim::Completed(s) => assert_eq!(*s, nul),
        other => panic!("{other:?}"),
    }
    // Released: the next caller owns it.
    assert_eq!(a.claim(&key("k2"), "d", wait).await.unwrap(), Claim::Owner);
    a.release(&key("k2")).await.unwrap();
    assert_eq!(b.claim(&key("k2"), "d", wait).await.unwrap(), Claim::Owner);
    // A dead owner's key (no heartbeat) is taken over once its lease expires.
    let short = SqlIdempotency::new(db.clone()).with_lease(Duration::from_millis(100));
    assert_eq!(
        short
            .claim(&key("k3"), "d", Duration::from_millis(1))
            .await
            .unwrap(),
        Claim::Owner
    );
    assert_eq!(
        b.claim(&key("k3"), "d", Duration::from_secs(5))
            .await
            .unwrap(),
        Claim::Owner
    );
    // Finished records age out.
    let n = a
        .purge_before(UnixMillis(UnixMillis::now().0 + 1_000))
        .await
        .unwrap();
    assert_eq!(n, 2);
}

/// What a retry finds after the owner of a key stopped at each point, and the
/// owner's fencing once its lease lapsed: a key never begun is taken over; a key
/// begun is settled as interrupted and replayed, never run again; the old owner can
/// neither begin, complete nor release a key it lost; a live owner's heartbeat keeps
/// its key; an outcome is stored with its End, and the End the spool's recovery
/// writes for that call (`aborted`) is left out by the store.
async fn idempotency_across_a_crash(db: Db) {
    let lease = Duration::from_millis(200);
    let dead = SqlIdempotency::new(db.clone()).with_lease(lease);
    let retry = SqlIdempotency::new(db.clone()).with_lease(lease);
    let wait = Duration::from_secs(5);
    // Claimed, never begun: taken over within the lease (plus a poll).
    assert_eq!(
        dead.claim(&key("c1"), "d", wait).await.unwrap(),
        Claim::Owner
    );
    let t = std::time::Instant::now();
    assert_eq!(
        retry.claim(&key("c1"), "d", wait).await.unwrap(),
        Claim::Owner
    );
    assert!(
        t.elapsed() < lease + Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    // The old owner lost it: it may not begin (run) it, nor release it.
    let b1 = begin("acme", "demo.keyed.run", UnixMillis::now().0);
    let err = dead.begin(&key("c1"), &b1).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyConflict);
    dead.release(&key("c1")).await.unwrap();
    retry.begin(&key("c1"), &b1).await.unwrap();

    // Begun, then the owner died: settled as interrupted, replayed, not run again.
    assert_eq!(
        dead.claim(&key("c2"), "d", wait).await.unwrap(),
        Claim::Owner
    );
    let b2 = begin("acme", "demo.keyed.run", UnixMillis::now().0);
    dead.begin(&key("c2"), &b2).await.unwrap();
    let t = std::time::Instant::now();
    let Claim::Completed(settled) = retry.claim(&key("c2"), "d", wait).await.unwrap() else {
        panic!("a begun key must not be run again");
    };
    assert!(
        t.elapsed() < lease + Duration::from_millis(300),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(settled.result.call_id, call_of(&b2));
    assert_eq!(settled.result.evidence_ref, Some(b2.id.clone()));
    assert_eq!(settled.result.status, CallStatus::Error);
    assert_eq!(
        settled.result.error_code,
        Some(ErrorCode::ProviderUnavailable)
    );
    let public = settled.result.error.clone().unwrap();
    assert_eq!(
        public.fields.get("outcome").map(String::as_str),
        Some("unknown")
    );
    // The dead owner's late completion does not overwrite it.
    let err = dead
        .complete(&key("c2"), outcome("d"), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyConflict);
    let Claim::Completed(again) = retry.claim(&key("c2"), "d", wait).await.unwrap() else {
        panic!("settled");
    };
    assert_eq!(again, settled);

    // A live owner's heartbeat keeps its key past many leases. (A longer lease
    // here: a renewal is one write every quarter lease, and on a machine busy
    // enough a 50 ms beat on SQLite can come late.)
    let live_lease = lease * 5;
    let live = Arc::new(SqlIdempotency::new(db.clone()).with_lease(live_lease));
    let beat = live.spawn_heartbeat();
    assert_eq!(
        live.claim(&key("c3"), "d", wait).await.unwrap(),
        Claim::Owner
    );
    let err = retry
        .claim(&key("c3"), "d", live_lease * 3)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::IdempotencyConflict, "{err:?}");
    // A heartbeat ends with its store, busy or idle (waiting on no timer).
    drop(live);
    tokio::time::timeout(live_lease * 2, beat)
        .await
        .expect("a busy heartbeat ends with its store")
        .unwrap();
    let idle = Arc::new(SqlIdempotency::new(db.clone()));
    let beat = idle.spawn_heartbeat();
    tokio::task::yield_now().await;
    drop(idle);
    tokio::time::timeout(Duration::from_secs(5), beat)
        .await
        .expect("an idle heartbeat ends with its store")
        .unwrap();

    // Completed with its End in one step: the End is in the evidence table, and
    // the aborted End recovery writes for the same call is left out.
    let store = SqlEvidenceStore::new(db.clone());
    let owner = SqlIdempotency::new(db.clone()).with_evidence(true);
    assert_eq!(
        owner.claim(&key("c4"), "d", wait).await.unwrap(),
        Claim::Owner
    );
    let b = begin("acme", "demo.keyed.run", UnixMillis::now().0);
    owner.begin(&key("c4"), &b).await.unwrap();
    let ok_end = end_of(&b, EndStatus::Ok);
    owner
        .complete(&key("c4"), outcome("d"), Some(&ok_end))
        .await
        .unwrap();
    // Both are stored by the idempotency store alone (a spool lost with its
    // replica loses nothing of the call).
    let evidence = store.call(None, &call_of(&b)).await.unwrap();
    assert_eq!(
        (evidence.begins().count(), evidence.ends().count()),
        (1, 1),
        "{evidence:?}"
    );
    let aborted = end_of(&b, EndStatus::Aborted);
    store
        .write_batch(&[b.clone(), ok_end.clone(), aborted])
        .await
        .unwrap();
    let evidence = store.call(None, &call_of(&b)).await.unwrap();
    assert_eq!(evidence.begins().count(), 1, "{evidence:?}");
    let ends: Vec<_> = evidence.ends().collect();
    assert_eq!(ends.len(), 1, "{evidence:?}");
    assert!(
        matches!(&ends[0].payload, EvidenceEvent::End(e) if e.status == EndStatus::Ok),
        "{evidence:?}"
    );
    // Begun with its Begin stored, then the owner died for good (its spool lost):
    // the caller settling the key closes that Begin `aborted` too, and the End the
    // owner's recovery might write later is left out.
    let gone = SqlIdempotency::new(db.clone())
        .with_lease(lease)
        .with_evidence(true);
    let settler = SqlIdempotency::new(db.clone()).with_evidence(true);
    assert_eq!(
        gone.claim(&key("c5"), "d", wait).await.unwrap(),
        Claim::Owner
    );
    let b5 = begin("acme", "demo.keyed.run", UnixMillis::now().0);
    gone.begin(&key("c5"), &b5).await.unwrap();
    let Claim::Completed(_) = settler.claim(&key("c5"), "d", wait).await.unwrap() else {
        panic!("a begun key must not be run again");
    };
    store
        .write_batch(&[b5.clone(), end_of(&b5, EndStatus::Aborted)])
        .await
        .unwrap();
    let evidence = store.call(None, &call_of(&b5)).await.unwrap();
    assert_eq!(evidence.begins().count(), 1, "{evidence:?}");
    let ends: Vec<_> = evidence.ends().collect();
    assert_eq!(ends.len(), 1, "{evidence:?}");
    assert!(
        matches!(&ends[0].payload, EvidenceEvent::End(e) if e.status == EndStatus::Aborted && e.begin_id == b5.id),
        "{evidence:?}"
    );

    // An aborted End of a call without one is stored as before.
    let lone = begin("acme", "demo.keyed.run", UnixMillis::now().0);
    store
        .write_batch(&[lone.clone(), end_of(&lone, EndStatus::Aborted)])
        .await
        .unwrap();
    assert_eq!(
        store
            .call(None, &call_of(&lone))
            .await
            .unwrap()
            .ends()
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_across_a_crash_on_postgres() {
    idempotency_across_a_crash(fresh_postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_across_a_crash_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    idempotency_across_a_crash(fresh_sqlite(dir.path()).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_on_postgres() {
    idempotency_semantics(fresh_postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    idempotency_semantics(fresh_sqlite(dir.path()).await).await;
}

fn manifest(id: &str, version: &str) -> ToolManifest {
    ToolManifest::from_json_str(
        &json!({
            "id": id,
            "version": version,
            "description": "a tool",
            "input_schema": {"type": "object"},
            "output_schema": {"type": "object"},
            "side_effect": "none"
        })
        .to_string(),
    )
    .unwrap()
}

async fn registry_semantics(db: Db) {
    let store = RegistryStore::new(db.clone());
    let registry = Registry::new();
    let admin = RegistryAdmin::new(registry.clone(), Arc::new(store.clone()));
    let g = ToolOwner::Global;
    let acme = ToolOwner::Tenant(tenant("acme"));
    let id = |s: &str| ToolId::new(s).unwrap();
    admin
        .register(&by(), &g, manifest("demo.a.enabled", "1.0.0"), true)
        .await
        .unwrap();
    admin
        .register(&by(), &g, manifest("demo.a.paused", "2.1.0"), true)
        .await
        .unwrap();
    admin
        .set_state(&by(), &g, &id("demo.a.paused"), StateChange::Pause)
        .await
        .unwrap();
    admin
        .register(&by(), &g, manifest("demo.a.old", "1.0.0"), false)
        .await
        .unwrap();
    admin
        .set_state(&by(), &g, &id("demo.a.old"), StateChange::Deprecate)
        .await
        .unwrap();
    admin
        .register(&by(), &g, manifest("demo.a.new", "0.1.0"), false)
        .await
        .unwrap();
    admin
        .register(&by(), &acme, manifest("demo.t.own", "1.0.0"), true)
        .await
        .unwrap();
    admin
        .set_tenant_override(
            &by(),
            &tenant("beta"),
            &id("demo.a.new"),
            Some(TenantOverride::Enabled),
        )
        .await
        .unwrap();
    admin
        .set_allow_list(
            &by(),
            &tenant("gamma"),
            Some([id("demo.a.enabled")].into_iter().collect()),
        )
        .await
        .unwrap();
    // Removed records stay as tombstones and are removed on restore.
    admin
        .register(&by(), &g, manifest("demo.a.gone", "1.0.0"), true)
        .await
        .unwrap();
    admin
        .unregister(&by(), &g, &id("demo.a.gone"))
        .await
        .unwrap();
    let want = registry.export();
    let key = |s: &str| RecordKey::Tool {
        owner: ToolOwner::Global,
        id: id(s),
    };
    // Each change to a record raised its revision by one.
    assert_eq!(admin.revision(&key("demo.a.paused")), 2);
    assert_eq!(admin.revision(&key("demo.a.gone")), 2);
    let all = store.load_all().await.unwrap();
    let gone = all.iter().find(|c| c.key == key("demo.a.gone")).unwrap();
    assert_eq!((gone.record.is_none(), gone.revision), (true, 2));

    // "Restart": a new registry restored from the store is the same registry.
    let restored = Registry::new();
    restored.register(manifest("demo.a.gone", "1.0.0")).unwrap();
    let again = RegistryAdmin::new(restored.clone(), Arc::new(store.clone()));
    let placed = store.restore_into(&again).await.unwrap();
    // Six tool records (one a tombstone), an override and an allow-list.
    assert_eq!(placed, 8);
    assert_eq!(restored.export(), want);
    let states: Vec<(String, ToolState)> = restored
        .list_owned(&g, &Default::default())
        .into_iter()
        .map(|r| (r.tool.manifest.id.to_string(), r.state))
        .collect();
    assert!(states.contains(&("demo.a.paused".into(), ToolState::Paused)));
    assert!(states.contains(&("demo.a.old".into(), ToolState::Deprecated)));
    assert!(restored.resolve(&tenant("beta"), &id("demo.a.new")).is_ok());
    assert!(
        restored
            .resolve(&tenant("gamma"), &id("demo.a.paused"))
            .is_err()
    );
    // Restoring twice changes nothing.
    assert_eq!(store.restore_into(&again).await.unwrap(), 0);
    assert_eq!(restored.export(), want);

    // A row this build cannot read (say, a manifest a newer build stored) is
    // left out; the rest still loads.
    let corrupt = "UPDATE registry_tools SET manifest = '{\"unknown_field\": 1}' WHERE tool_id = 'demo.a.new'";
    match &db {
        Db::Postgres(p) => sqlx::query(corrupt).execute(p).await.map(|_| ()),
        Db::Sqlite(p) => sqlx::query(corrupt).execute(p).await.map(|_| ()),
    }
    .unwrap();
    let all = store.load_all().await.unwrap();
    assert_eq!(all.len(), 7, "{all:?}");
    assert!(!all.iter().any(|c| c.key == key("demo.a.new")));

    // The restored process continues from the stored revisions; the first one,
    // still at the old revisions for a record changed since, is refused.
    again
        .set_state(&by(), &g, &id("demo.a.enabled"), StateChange::Pause)
        .await
        .unwrap();
    let err = admin
        .set_state(&by(), &g, &id("demo.a.enabled"), StateChange::Deprecate)
        .await
        .unwrap_err();
    assert_eq!(err.code(), ErrorCode::RegistryConflict);
    assert_eq!(err.field("tool_id"), Some("demo.a.enabled"));
    // …and has taken the newer record, so a retry starts from it.
    assert_eq!(
        registry.list_owned(&g, &Default::default())[0].state,
        ToolState::Paused
    );
    admin
        .set_state(&by(), &g, &id("demo.a.enabled"), StateChange::Deprecate)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_on_postgres() {
    registry_semantics(fresh_postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    registry_semantics(fresh_sqlite(dir.path()).await).await;
}

/// The audit log: appended once by id, listed newest first by tenant, kind,
/// target and time range, on either database.
async fn audit_semantics(db: Db) {
    use soulbase_observe::{AuditFilter, AuditKind, AuditLog, AuditRecord, system_subject};
    let log = soulbase_store::SqlAuditLog::new(db.clone());
    let other_handle = soulbase_store::SqlAuditLog::new(db);
    let ops = soulbase_types::Subject::new(tenant("acme"), ActorId::new("ops").unwrap());
    let mut written = Vec::new();
    for i in 0..12i64 {
        let (t, kind, target) = match i % 3 {
            0 => ("acme", AuditKind::RegistryState, "demo.a.x"),
            1 => ("globex", AuditKind::RegistryRegister, "demo.b.y"),
            _ => ("global", AuditKind::ConfigReload, "config.yaml"),
        };
        let by = if i % 3 == 2 {
            system_subject()
        } else {
            ops.clone()
        };
        let mut r = AuditRecord::new(tenant(t), &by, kind, target)
            .hashes(
                (i > 0).then(|| format!("{:064x}", i - 1)),
                Some(format!("{i:064x}")),
            )
            .detail(format!("change {i}"));
        r.at = UnixMillis(1_000 + i * 10);
        log.append(&r).await.unwrap();
        written.push(r);
    }
    // Appending a record again is harmless.
    log.append(&written[0]).await.unwrap();
    let all = other_handle.list(&AuditFilter::newest(100)).await.unwrap();
    let mut newest_first = written.clone();
    newest_first.reverse();
    assert_eq!(all, newest_first);
    let acme = AuditFilter {
        tenant: Some(tenant("acme")),
        ..AuditFilter::newest(2)
    };
    assert_eq!(
        other_handle.list(&acme).await.unwrap(),
        vec![written[9].clone(), written[6].clone()]
    );
    let config = AuditFilter {
        kind: Some(AuditKind::ConfigReload),
        target: Some("config.yaml".into()),
        since: Some(UnixMillis(1_050)),
        until: Some(UnixMillis(1_110)),
        ..AuditFilter::newest(100)
    };
    let found = other_handle.list(&config).await.unwrap();
    assert_eq!(found, vec![written[8].clone(), written[5].clone()]);
    assert_eq!(found[0].actor.as_str(), "system");
    assert_eq!(
        found[0].before_hash.as_deref(),
        Some(&*format!("{:064x}", 7))
    );
    let none = AuditFilter {
        target: Some("no.such.tool".into()),
        ..AuditFilter::newest(100)
    };
    assert!(other_handle.list(&none).await.unwrap().is_empty());
    // Within one millisecond, the last written comes first, whatever the ids.
    let same: Vec<AuditRecord> = (0..20)
        .map(|i| {
            let mut r = AuditRecord::new(tenant("acme"), &ops, AuditKind::RegistryState, "same")
                .detail(format!("same {i}"));
            r.at = UnixMillis(5_000);
            r
        })
        .collect();
    for r in &same {
        log.append(r).await.unwrap();
    }
    let same_target = AuditFilter {
        target: Some("same".into()),
        ..AuditFilter::newest(100)
    };
    assert_eq!(
        other_handle.list(&same_target).await.unwrap(),
        same.into_iter().rev().collect::<Vec<_>>()
    );
    let bad = other_handle
        .list(&AuditFilter::newest(0))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), ErrorCode::SchemaValidationFailed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_on_postgres() {
    audit_semantics(fresh_postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    audit_semantics(fresh_sqlite(dir.path()).await).await;
}

/// Consent requests: a refused call's request is reused while pending, capped
/// per actor, decided once (two handles on one database, as two replicas), and
/// expires; another tenant never sees it.
async fn consent_request_semantics(db: Db) {
    use soulbase_auth::{
        ApprovalScope, ConsentDecision, ConsentRequestStatus, ConsentRequests, NewConsentRequest,
    };
    use soulbase_store::SqlConsentRequests;
    let a = SqlConsentRequests::new(db.clone());
    let b = SqlConsentRequests::new(db);
    let acme = tenant("acme");
    let new = |digest: &str, at: i64| NewConsentRequest {
        tenant: acme.clone(),
        actor: ActorId::new("bob").unwrap(),
        tool: ToolId::new("fs.files.delete").unwrap(),
        args_digest: digest.into(),
        call_id: CallId::generate(),
        at: UnixMillis(at),
    };
    let since = UnixMillis(0);
    let first = a
        .open(&new("sha256:a", 10), since, 10)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.status, ConsentRequestStatus::Pending);
    let again = b
        .open(&new("sha256:a", 20), since, 10)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(again, first, "a retry reuses the pending request");
    let second = b
        .open(&new("sha256:b", 30), since, 10)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(second.id, first.id);
    assert_eq!(
        a.open(&new("sha256:c", 40), since, 2).await.unwrap(),
        None,
        "at most max_pending per actor"
    );
    let pending = b
        .list(&acme, Some(ConsentRequestStatus::Pending), since, 10)
        .await
        .unwrap();
    assert_eq!(
        pending.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        [second.id.as_str(), first.id.as_str()],
        "newest first"
    );
    assert!(
        b.list(&tenant("globex"), None, since, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        b.get(&tenant("globex"), &first.id, since).await.unwrap(),
        None
    );

    let ann = ActorId::new("ann").unwrap();
    let approve = ConsentDecision::Approve {
        scope: ApprovalScope::Call,
        token: "e1.token".into(),
        token_id: Some("t1".into()),
        expires_at: UnixMillis(1_000),
    };
    assert!(
        a.decide(&acme, &first.id, &ann, UnixMillis(50), &approve, since)
            .await
            .unwrap()
    );
    let decline = ConsentDecision::Decline {
        reason: Some("not today".into()),
    };
    assert!(
        !b.decide(&acme, &first.id, &ann, UnixMillis(51), &decline, since)
            .await
            .unwrap(),
        "decided once"
    );
    let got = b.get(&acme, &first.id, since).await.unwrap().unwrap();
    assert_eq!(got.status, ConsentRequestStatus::Approved);
    assert_eq!(got.scope, Some(ApprovalScope::Call));
    assert_eq!(got.token.as_deref(), Some("e1.token"));
    assert_eq!(got.token_id.as_deref(), Some("t1"));
    assert_eq!(got.token_expires_at, Some(UnixMillis(1_000)));
    assert_eq!(got.decided_by, Some(ann.clone()));
    assert!(
        b.decide(&acme, &second.id, &ann, UnixMillis(52), &decline, since)
            .await
            .unwrap()
    );
    let declined = a
        .list(&acme, Some(ConsentRequestStatus::Declined), since, 10)
        .await
        .unwrap();
    assert_eq!(declined.len(), 1);
    assert_eq!(declined[0].reason.as_deref(), Some("not today"));

    // A request not decided in time: expired, not decidable, and the same call
    // refused again opens a new one.
    let stale = a
        .open(&new("sha256:d", 60), since, 10)
        .await
        .unwrap()
        .unwrap();
    let late = UnixMillis(61);
    assert_eq!(
        a.get(&acme, &stale.id, late).await.unwrap().unwrap().status,
        ConsentRequestStatus::Expired
    );
    assert!(
        !a.decide(&acme, &stale.id, &ann, UnixMillis(70), &decline, late)
            .await
            .unwrap()
    );
    let fresh = b
        .open(&new("sha256:d", 80), late, 10)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(fresh.id, stale.id);
    let expired = a
        .list(&acme, Some(ConsentRequestStatus::Expired), late, 10)
        .await
        .unwrap();
    assert_eq!(
        expired.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        [stale.id.as_str()]
    );
    assert_eq!(
        a.list(&acme, None, late, 2).await.unwrap().len(),
        2,
        "limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_requests_on_postgres() {
    consent_request_semantics(fresh_postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_requests_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    consent_request_semantics(fresh_sqlite(dir.path()).await).await;
}

/// The embedded migrations are exactly the files in `migrations/` (what
/// `cargo xtask migrate` applies), with the same checksums.
#[tokio::test]
async fn embedded_migrations_match_the_directory() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../migrations");
    for (dir, embedded) in [
        ("postgres", soulbase_store::migrations::postgres()),
        ("sqlite", soulbase_store::migrations::sqlite()),
    ] {
        let from_dir = sqlx::migrate::Migrator::new(root.join(dir)).await.unwrap();
        let a: Vec<_> = from_dir
            .iter()
            .map(|m| (m.version, m.description.to_string(), m.checksum.to_vec()))
            .collect();
        let b: Vec<_> = embedded
            .iter()
            .map(|m| (m.version, m.description.to_string(), m.checksum.to_vec()))
            .collect();
        assert_eq!(a, b, "migrations/{dir} and the embedded list differ");
    }
}

#[tokio::test]
async fn bad_urls_are_config_errors() {
    let err = Db::connect("mysql://x", false).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::ConfigInvalid);
    assert_eq!(err.field("field"), Some("evidence.url"));
    let _ = Arc::new(());
}

/// Every SQLite connection keeps its temporary tables and statement journals in
/// memory (no file created and deleted in the temp directory per drain commit),
/// and commits durably in WAL mode.
#[tokio::test]
async fn sqlite_connections_keep_temporaries_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let db = fresh_sqlite(dir.path()).await;
    let Db::Sqlite(pool) = &db else {
        panic!("a sqlite: URL opens SQLite");
    };
    {
        let mut conn = pool.acquire().await.unwrap();
        let (temp_store,): (i64,) = sqlx::query_as("PRAGMA temp_store")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(temp_store, 2, "temp_store = MEMORY");
        let (synchronous,): (i64,) = sqlx::query_as("PRAGMA synchronous")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(synchronous, 2, "synchronous = FULL");
        let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
        assert_eq!(mode, "wal");
    }
}

/// The zero-infrastructure default: SQLite and the spool under `data_dir`, from the
/// configuration alone; evidence recorded before a restart is there after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistence_opens_from_config_with_the_embedded_default() {
    use soulbase_observe::EvidenceSink;
    let dir = tempfile::tempdir().unwrap();
    let mut config = soulbase_config::Config {
        data_dir: dir.path().join("data"),
        ..Default::default()
    };
    config.evidence.migrate_on_start = true;
    assert!(soulbase_store::database_url(&config).starts_with("sqlite://"));
    let b = begin("acme", "demo.a.x", UnixMillis::now().0);
    {
        let p = soulbase_store::Persistence::open(&config).await.unwrap();
        p.sink.record(b.clone()).await.unwrap();
        p.sink.record(end_of(&b, EndStatus::Ok)).await.unwrap();
        p.sink.shutdown(Duration::from_secs(20)).await;
        p.db.close().await;
    }
    let p = soulbase_store::Persistence::open(&config).await.unwrap();
    assert!(p.recovery.aborted.is_empty());
    let ev = p.evidence.call(None, &call_of(&b)).await.unwrap();
    assert_eq!(ev.records.len(), 2);
    assert!(dir.path().join("data/spool").is_dir());
    assert!(dir.path().join("data/evidence.db").is_file());
    // Retention keeps what is recent.
    assert_eq!(p.apply_retention(30).await.unwrap(), 0);
}

/// A batch too small for `COPY` (which sqlx sends in two writes, so that with
/// Nagle on each small batch waited ~40 ms for Postgres's delayed ACK) goes as
/// one `INSERT`: one-record batches take well under 10 ms (the median of 15;
/// with the stall every one took 44 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_batches_reach_postgres_without_a_nagle_stall() {
    let store = SqlEvidenceStore::new(fresh_postgres().await);
    let now = UnixMillis::now().0;
    let mut took: Vec<Duration> = Vec::new();
    for i in 0..15 {
        let b = begin("acme", "demo.a.x", now - i);
        let t = std::time::Instant::now();
        store.write_batch(&[b]).await.unwrap();
        took.push(t.elapsed());
    }
    took.sort();
    assert!(took[7] < Duration::from_millis(10), "{took:?}");
}

/// A batch large enough for `COPY` (1,200 records, more than
/// `soulbase_store::COPY_MIN_BYTES`) part of which is stored: the COPY fails
/// whole and the batch is written again skipping what is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_overlapping_batch_on_postgres_lands_once() {
    let db = fresh_postgres().await;
    let store = SqlEvidenceStore::new(db.clone());
    let now = UnixMillis::now().0;
    let all: Vec<EvidenceRecord> = (0..600)
        .flat_map(|i| {
            let b = begin("acme", "demo.a.x", now - i);
            let e = end_of(&b, EndStatus::Ok);
            [b, e]
        })
        .collect();
    let bytes: usize = all
        .iter()
        .map(|r| serde_json::to_vec(r).unwrap().len())
        .sum();
    assert!(bytes * 3 / 4 >= soulbase_store::COPY_MIN_BYTES, "{bytes}");
    store.write_batch(&all[..300]).await.unwrap();
    store.write_batch(&all[..]).await.unwrap();
    assert_eq!(common::counts(&db).await, (600, 600, 600, 0));
}
