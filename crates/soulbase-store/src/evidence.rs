//! [`EvidenceStore`] on Postgres (partitioned by day) and SQLite.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use soulbase_errors::SoulError;
use soulbase_observe::{
    CallEvidence, CallPage, DenialPage, EncodedRecord, EndStatus, EvidenceQuery, EvidenceRecord,
    EvidenceStore, PageCursor, RecordHead, store_refusal, summarize, summarize_denial,
};
use soulbase_types::{CallId, TenantId, UnixMillis};
use sqlx::QueryBuilder;

use soulbase_evidence::aborted_end;

use crate::db::{Db, db_error};

/// Milliseconds per day (the Postgres partition width).
const DAY_MS: i64 = 86_400_000;
/// Most rows per SQLite insert statement (9 parameters each, under SQLite's
/// limit); a power of two (see [`sqlite_statements`]).
const SQLITE_CHUNK: usize = 512;
/// Batches of up to this many rows go to SQLite as one statement of exactly their
/// count (see [`sqlite_statements`]).
const SQLITE_EXACT: usize = 32;

/// `rows` cut into the statements that insert them: up to [`SQLITE_EXACT`] rows
/// one statement; more, statements of power-of-two row counts, largest first,
/// until at most [`SQLITE_EXACT`] are left, which go as one. A multi-row
/// `INSERT`'s text depends on its row count, and SQLite parses every text a
/// connection has not prepared before: with a count of its own almost every
/// batch, that was ~24,600 instructions a call, a tenth of it
/// (`xtask/call_instructions.py`). These 36 counts stay in each connection's
/// statement cache (sqlx keeps 100). The small batches of a low rate are one
/// statement, which needs no transaction: one round trip to the connection's
/// thread instead of four (`BEGIN`, two or more statements, `COMMIT`), each
/// two thread wake-ups.
fn sqlite_statements<T>(mut rows: &[T]) -> Vec<&[T]> {
    let mut parts = Vec::new();
    while rows.len() > SQLITE_EXACT {
        let n = (1usize << rows.len().ilog2()).min(SQLITE_CHUNK);
        let (part, rest) = rows.split_at(n);
        parts.push(part);
        rows = rest;
    }
    if !rows.is_empty() {
        parts.push(rows);
    }
    parts
}

/// The text of a multi-row `INSERT … ON CONFLICT DO NOTHING` of `rows` rows into
/// SQLite, `INSERT OR FAIL …` for a statement `in_transaction`. Written once per
/// row count and kind (the counts [`sqlite_statements`] makes) and shared: the
/// statement cache finds it by this text, which is not formatted again for every
/// batch.
///
/// `OR FAIL` inside a transaction: a broken check or `NOT NULL` stops the
/// statement with the same error as the default `ABORT`, but keeps the rows it
/// inserted before. With `ABORT` SQLite must be able to undo one statement inside
/// a transaction, so a multi-row insert in a batch of several statements copied
/// every page it changed to a statement journal first: ~5,500 instructions a call
/// (`xtask/call_instructions.py`), a fifth of the insert's time in a scripted
/// insert of 512-row statements. The batch fails and its transaction is rolled
/// back whole, so a batch is still all or none. A batch of one statement runs
/// without a transaction, where `ABORT` needs no statement journal (the
/// statement's rollback is the transaction's) and keeps it all or none.
fn sqlite_insert_text(rows: usize, in_transaction: bool) -> sqlx::AssertSqlSafe<Arc<str>> {
    /// Row count, and whether in a transaction.
    type Key = (usize, bool);
    /// Texts by row count and kind, made on first use (at most 2 ×
    /// [`SQLITE_EXACT`] + 4).
    static TEXTS: Mutex<Vec<(Key, Arc<str>)>> = Mutex::new(Vec::new());
    let key = (rows, in_transaction);
    let mut texts = TEXTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let text = match texts.iter().find(|(k, _)| *k == key) {
        Some((_, text)) => text.clone(),
        None => {
            const INSERT: &str = "INSERT INTO evidence ";
            const INSERT_OR_FAIL: &str = "INSERT OR FAIL INTO evidence ";
            const COLUMNS: &str =
                "(id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record) VALUES ";
            const ROW: &str = "(?, ?, ?, ?, ?, ?, ?, ?, ?)";
            const CONFLICT: &str = " ON CONFLICT DO NOTHING";
            let insert = if in_transaction {
                INSERT_OR_FAIL
            } else {
                INSERT
            };
            let mut sql = String::with_capacity(
                insert.len() + COLUMNS.len() + rows * (ROW.len() + 2) + CONFLICT.len(),
            );
            sql.push_str(insert);
            sql.push_str(COLUMNS);
            for i in 0..rows {
                if i > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(ROW);
            }
            sql.push_str(CONFLICT);
            let text: Arc<str> = Arc::from(sql);
            texts.push((key, text.clone()));
            text
        }
    };
    sqlx::AssertSqlSafe(text)
}

/// Text columns whose few values repeat across a batch (tenant, kind, tool,
/// status): each value's `Arc<str>` is made once per batch and shared by its
/// rows. sqlx's SQLite arguments own their text: a `&str` bound is copied into a
/// `String` put in an `Arc` (two allocations a column), an `Arc<str>` is counted.
#[derive(Default)]
struct Interned(Vec<Arc<str>>);

impl Interned {
    /// Most distinct values kept; others get an `Arc` of their own.
    const MAX: usize = 16;

    fn get(&mut self, s: &str) -> Arc<str> {
        if let Some(v) = self.0.iter().find(|v| &***v == s) {
            return v.clone();
        }
        let v: Arc<str> = Arc::from(s);
        if self.0.len() < Self::MAX {
            self.0.push(v.clone());
        }
        v
    }
}

/// The arguments of [`sqlite_insert_text`]`(rows.len(), _)`: the record's text
/// bound shared (a count), ids as one `Arc<str>` each, the repeating columns
/// [`Interned`].
fn sqlite_arguments(
    rows: &[Headed<'_>],
    interned: &mut Interned,
) -> Result<sqlx::sqlite::SqliteArguments, SoulError> {
    use sqlx::Arguments;
    let mut args = sqlx::sqlite::SqliteArguments::default();
    args.reserve(rows.len() * 9, 0);
    let bad = |e| db_error("binding evidence", e);
    for r in rows {
        let h = &r.head;
        args.add(Arc::<str>::from(&*h.id)).map_err(bad)?;
        args.add(h.at_ms).map_err(bad)?;
        args.add(interned.get(&h.tenant)).map_err(bad)?;
        args.add(interned.get(h.kind)).map_err(bad)?;
        args.add(Arc::<str>::from(&*h.call_id)).map_err(bad)?;
        args.add(h.tool_id.as_deref().map(|t| interned.get(t)))
            .map_err(bad)?;
        args.add(h.begin_id.as_deref().map(Arc::<str>::from))
            .map_err(bad)?;
        args.add(h.status.map(|s| interned.get(s.as_str())))
            .map_err(bad)?;
        args.add(r.record.shared()).map_err(bad)?;
    }
    Ok(args)
}

/// Batches whose `COPY` data is smaller go to Postgres as one `INSERT … UNNEST`.
///
/// sqlx (0.9) neither sets `TCP_NODELAY` on its sockets nor lets a caller set it,
/// and its `COPY` writes the data and then `CopyDone` in two writes before it reads:
/// with Nagle on, `CopyDone` waits for the server's delayed ACK of the data, ~40 ms,
/// unless the data was large enough (two full segments and more) to be ACKed at
/// once. On loopback (64 KiB segments) every batch under ~100 KiB stalled: a
/// one-record batch took 44 ms against 0.5 ms as an `INSERT` (debug build). An
/// `INSERT` is one write per round trip. Above this size `COPY` is the faster
/// (1,000 records: 31 ms against 41 ms) and does not stall.
pub const COPY_MIN_BYTES: usize = 256 * 1024;

/// Evidence in a SQL database. Writes are atomic and idempotent by envelope id.
/// Records are stored as their JSON text ([`EncodedRecord`]); only the indexed
/// columns are read from it, so the drain's text (checked as it left the spool)
/// is stored without being encoded again ([`EvidenceStore::write_encoded`]).
/// Postgres: one binary `COPY` per batch of [`COPY_MIN_BYTES`] or more (no
/// conflict handling, so the fastest ingest); a batch part of which is already
/// stored (re-sent after a crash) makes the COPY fail whole with a unique
/// violation, and is then written with `INSERT … SELECT FROM UNNEST(…) ON
/// CONFLICT DO NOTHING` — as is every smaller batch (see [`COPY_MIN_BYTES`]). SQLite: multi-row
/// `VALUES … ON CONFLICT DO NOTHING`: one autocommitted statement for a batch of
/// up to 32 rows, a larger one as statements of power-of-two row counts (at most
/// 512) in one transaction, each count's text made once (`sqlite_statements`).
pub struct SqlEvidenceStore {
    db: Db,
    /// Days whose Postgres partition is known to exist.
    partitions: Mutex<HashSet<i64>>,
}

/// The columns of one evidence row, the record as its text.
struct Row {
    id: String,
    at_ms: i64,
    tenant: String,
    kind: &'static str,
    call_id: String,
    tool_id: Option<String>,
    begin_id: Option<String>,
    status: Option<&'static str>,
    record: String,
}

/// A record of a batch with its indexed fields, read once per batch.
struct Headed<'a> {
    record: &'a EncodedRecord,
    head: RecordHead<'a>,
}

/// The heads of `records`; text that is not a record refuses the batch (a
/// [`store_refusal`], which the drain isolates and quarantines).
fn headed(records: &[EncodedRecord]) -> Result<Vec<Headed<'_>>, SoulError> {
    records
        .iter()
        .map(|r| {
            Ok(Headed {
                record: r,
                head: r.head()?,
            })
        })
        .collect()
}

fn row(r: &Headed<'_>) -> Row {
    let h = &r.head;
    Row {
        id: h.id.to_string(),
        at_ms: h.at_ms,
        tenant: h.tenant.to_string(),
        kind: h.kind,
        call_id: h.call_id.to_string(),
        tool_id: h.tool_id.as_deref().map(str::to_owned),
        begin_id: h.begin_id.as_deref().map(str::to_owned),
        status: h.status.map(EndStatus::as_str),
        record: r.record.as_str().to_owned(),
    }
}

/// Postgres refusing the data itself, which no retry changes: a character it
/// cannot store (22021, e.g. a NUL in a text column; 22P05) or a value beyond its
/// limits (54000, e.g. an index row too large). Anything else — including COPY
/// format errors, which would be a bug of ours, not bad data — is retried.
fn refusal(e: &sqlx::Error) -> Option<SoulError> {
    let sqlx::Error::Database(db) = e else {
        return None;
    };
    let code = db.code()?;
    matches!(code.as_ref(), "22021" | "22P05" | "54000")
        .then(|| store_refusal(format!("SQLSTATE {code}: {}", db.message())))
}

fn decode(text: &str) -> Result<EvidenceRecord, SoulError> {
    serde_json::from_str(text).map_err(|e| db_error("decoding a stored evidence record", e))
}

/// The statement of the fast path (binary `COPY`, columns in [`copy_binary`]'s order).
const COPY_EVIDENCE: &str = "COPY evidence (id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record) \
     FROM STDIN (FORMAT binary)";

/// Appends a nullable `text` field in `COPY` binary format.
fn put_text(buf: &mut Vec<u8>, value: Option<&str>) -> Result<(), SoulError> {
    match value {
        Some(v) => {
            let len = i32::try_from(v.len()).map_err(SoulError::internal)?;
            buf.extend_from_slice(&len.to_be_bytes());
            buf.extend_from_slice(v.as_bytes());
        }
        None => buf.extend_from_slice(&(-1i32).to_be_bytes()),
    }
    Ok(())
}

/// `records` as `COPY … (FORMAT binary)` data: the header, one tuple per record
/// (text columns as UTF-8, `at_ms` as a big-endian int8, `record` as the record's
/// text, copied as it is), the trailer. Only the indexed fields are read from each
/// record; no per-row strings, no text-format escaping for the server to undo.
/// Also returns the days (partitions) the records fall in.
fn copy_binary(records: &[Headed<'_>]) -> Result<(Vec<u8>, BTreeSet<i64>), SoulError> {
    let mut days = BTreeSet::new();
    let size: usize = records.iter().map(|r| r.record.as_str().len() + 256).sum();
    let mut buf = Vec::with_capacity(size + 32);
    buf.extend_from_slice(b"PGCOPY\n\xff\r\n\0");
    buf.extend_from_slice(&0i32.to_be_bytes()); // flags
    buf.extend_from_slice(&0i32.to_be_bytes()); // header extension length
    for r in records {
        let h = &r.head;
        days.insert(h.at_ms.div_euclid(DAY_MS));
        buf.extend_from_slice(&9i16.to_be_bytes());
        put_text(&mut buf, Some(h.id.as_ref()))?;
        buf.extend_from_slice(&8i32.to_be_bytes());
        buf.extend_from_slice(&h.at_ms.to_be_bytes());
        put_text(&mut buf, Some(h.tenant.as_ref()))?;
        put_text(&mut buf, Some(h.kind))?;
        put_text(&mut buf, Some(h.call_id.as_ref()))?;
        put_text(&mut buf, h.tool_id.as_deref())?;
        put_text(&mut buf, h.begin_id.as_deref())?;
        put_text(&mut buf, h.status.map(EndStatus::as_str))?;
        put_text(&mut buf, Some(r.record.as_str()))?;
    }
    buf.extend_from_slice(&(-1i16).to_be_bytes());
    Ok((buf, days))
}

/// The fast path: one binary `COPY` straight into `evidence`. Atomic (one
/// statement): a record already stored fails the whole COPY with a unique
/// violation and nothing of the batch is written.
async fn copy_in(pool: &sqlx::PgPool, data: Vec<u8>) -> Result<(), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut copy = conn.copy_in_raw(COPY_EVIDENCE).await?;
    copy.send(data).await?;
    copy.finish().await?;
    Ok(())
}

/// A batch as one array per column (bound to `UNNEST`).
#[derive(Default)]
struct Columns {
    id: Vec<String>,
    at_ms: Vec<i64>,
    tenant: Vec<String>,
    kind: Vec<&'static str>,
    call_id: Vec<String>,
    tool_id: Vec<Option<String>>,
    begin_id: Vec<Option<String>>,
    status: Vec<Option<&'static str>>,
    record: Vec<String>,
}

/// The idempotent path, for a batch part of which is already stored: one
/// `INSERT … SELECT FROM UNNEST(…) ON CONFLICT DO NOTHING`.
async fn insert_skipping_stored(pool: &sqlx::PgPool, rows: Vec<Row>) -> Result<(), sqlx::Error> {
    let mut cols = Columns::default();
    for r in rows {
        cols.id.push(r.id);
        cols.at_ms.push(r.at_ms);
        cols.tenant.push(r.tenant);
        cols.kind.push(r.kind);
        cols.call_id.push(r.call_id);
        cols.tool_id.push(r.tool_id);
        cols.begin_id.push(r.begin_id);
        cols.status.push(r.status);
        cols.record.push(r.record);
    }
    sqlx::query(
        "INSERT INTO evidence (id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record) \
         SELECT id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record \
         FROM UNNEST($1::text[], $2::int8[], $3::text[], $4::text[], $5::text[], \
                     $6::text[], $7::text[], $8::text[], $9::text[]) \
              AS t(id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record) \
         ON CONFLICT DO NOTHING",
    )
    .bind(cols.id)
    .bind(cols.at_ms)
    .bind(cols.tenant)
    .bind(cols.kind)
    .bind(cols.call_id)
    .bind(cols.tool_id)
    .bind(cols.begin_id)
    .bind(cols.status)
    .bind(cols.record)
    .execute(pool)
    .await?;
    Ok(())
}

/// Makes the Postgres partition holding `at_ms` (in a statement of its own: two
/// transactions creating the same partition would collide, and one of them fails
/// with "already exists" — then the partition is there, so a second try succeeds).
pub(crate) async fn ensure_partition(pool: &sqlx::PgPool, at_ms: i64) -> Result<(), SoulError> {
    let day_ms = at_ms.div_euclid(DAY_MS) * DAY_MS;
    let ensure = || {
        sqlx::query("SELECT soulbase_evidence_ensure_partition($1)")
            .bind(day_ms)
            .execute(pool)
    };
    if ensure().await.is_err() {
        ensure()
            .await
            .map_err(|e| db_error("creating an evidence partition", e))?;
    }
    Ok(())
}

/// Writes `record` inside the caller's transaction (the idempotency store's, which
/// stores a keyed call's End with its outcome), skipping it when already stored.
/// On Postgres its day's partition must exist ([`ensure_partition`]).
pub(crate) async fn insert_in(conn: DbConn<'_>, record: &EvidenceRecord) -> Result<(), SoulError> {
    let encoded = EncodedRecord::encode(record)?;
    let r = row(&Headed {
        record: &encoded,
        head: encoded.head()?,
    });
    let written = match conn {
        DbConn::Postgres(c) => {
            sqlx::query(
                "INSERT INTO evidence (id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
            )
            .bind(r.id)
            .bind(r.at_ms)
            .bind(r.tenant)
            .bind(r.kind)
            .bind(r.call_id)
            .bind(r.tool_id)
            .bind(r.begin_id)
            .bind(r.status)
            .bind(r.record)
            .execute(&mut *c)
            .await
            .map(|_| ())
        }
        DbConn::Sqlite(c) => {
            sqlx::query(
                "INSERT INTO evidence (id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT DO NOTHING",
            )
            .bind(r.id)
            .bind(r.at_ms)
            .bind(r.tenant)
            .bind(r.kind)
            .bind(r.call_id)
            .bind(r.tool_id)
            .bind(r.begin_id)
            .bind(r.status)
            .bind(r.record)
            .execute(&mut *c)
            .await
            .map(|_| ())
        }
    };
    written.map_err(|e| db_error("writing evidence", e))
}

/// Closes the stored Begin `begin_id` of `call_id` with an `aborted` End (as the
/// spool's recovery would), inside the caller's transaction, unless the call has
/// an End already or its Begin is not stored here; returns the End written. The
/// End recovery writes later for the same Begin is then left out by the store.
/// On Postgres the partition of the present day must exist.
pub(crate) async fn close_begin_in(
    conn: DbConn<'_>,
    call_id: &str,
    begin_id: &str,
) -> Result<Option<EvidenceRecord>, SoulError> {
    let failed = |e| db_error("closing an interrupted call's Begin", e);
    match conn {
        DbConn::Postgres(c) => {
            let text: Option<(String,)> = sqlx::query_as(
                "SELECT b.record FROM evidence b WHERE b.call_id = $1 AND b.id = $2 AND b.kind = 'begin' \
                 AND NOT EXISTS (SELECT 1 FROM evidence e WHERE e.call_id = $1 AND e.kind = 'end')",
            )
                .bind(call_id)
                .bind(begin_id)
                .fetch_optional(&mut *c)
                .await
                .map_err(failed)?;
            let Some(end) = text
                .map(|(t,)| decode(&t))
                .transpose()?
                .as_ref()
                .and_then(aborted_end)
            else {
                return Ok(None);
            };
            insert_in(DbConn::Postgres(c), &end).await?;
            Ok(Some(end))
        }
        DbConn::Sqlite(c) => {
            let text: Option<(String,)> = sqlx::query_as(
                "SELECT b.record FROM evidence b WHERE b.call_id = ?1 AND b.id = ?2 AND b.kind = 'begin' \
                 AND NOT EXISTS (SELECT 1 FROM evidence e WHERE e.call_id = ?1 AND e.kind = 'end')",
            )
                .bind(call_id)
                .bind(begin_id)
                .fetch_optional(&mut *c)
                .await
                .map_err(failed)?;
            let Some(end) = text
                .map(|(t,)| decode(&t))
                .transpose()?
                .as_ref()
                .and_then(aborted_end)
            else {
                return Ok(None);
            };
            insert_in(DbConn::Sqlite(c), &end).await?;
            Ok(Some(end))
        }
    }
}

/// A connection of either backend, inside a transaction.
pub(crate) enum DbConn<'a> {
    Postgres(&'a mut sqlx::PgConnection),
    Sqlite(&'a mut sqlx::SqliteConnection),
}

impl SqlEvidenceStore {
    /// A store on `db` (migrated).
    pub fn new(db: Db) -> Self {
        Self {
            db,
            partitions: Mutex::new(HashSet::new()),
        }
    }

    /// The database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    async fn ensure_partitions(
        &self,
        pool: &sqlx::PgPool,
        days: BTreeSet<i64>,
    ) -> Result<(), SoulError> {
        let missing: Vec<i64> = {
            let known = self.partitions.lock().unwrap_or_else(|p| p.into_inner());
            days.into_iter().filter(|d| !known.contains(d)).collect()
        };
        for day in missing {
            sqlx::query("SELECT soulbase_evidence_ensure_partition($1)")
                .bind(day * DAY_MS)
                .execute(pool)
                .await
                .map_err(|e| db_error("creating an evidence partition", e))?;
            self.partitions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(day);
        }
        Ok(())
    }

    /// Which of `calls` already have an End stored.
    async fn ended_calls(&self, calls: &[String]) -> Result<HashSet<String>, SoulError> {
        let rows: Vec<(String,)> = match &self.db {
            Db::Postgres(pool) => sqlx::query_as(
                "SELECT DISTINCT call_id FROM evidence WHERE kind = 'end' AND call_id = ANY($1)",
            )
            .bind(calls)
            .fetch_all(pool)
            .await,
            Db::Sqlite(pool) => {
                let mut found = Vec::new();
                for chunk in calls.chunks(SQLITE_CHUNK) {
                    let mut qb = QueryBuilder::new(
                        "SELECT DISTINCT call_id FROM evidence WHERE kind = 'end' AND call_id IN (",
                    );
                    let mut list = qb.separated(", ");
                    for c in chunk {
                        list.push_bind(c.clone());
                    }
                    qb.push(")");
                    match qb.build_query_as().fetch_all(pool).await {
                        Ok(rows) => found.extend(rows),
                        Err(e) => return Err(db_error("reading evidence", e)),
                    }
                }
                Ok(found)
            }
        }
        .map_err(|e| db_error("reading evidence", e))?;
        Ok(rows.into_iter().map(|(c,)| c).collect())
    }

    fn forget_partitions(&self) {
        self.partitions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

#[async_trait]
impl EvidenceStore for SqlEvidenceStore {
    async fn write_batch(&self, records: &[EvidenceRecord]) -> Result<(), SoulError> {
        self.write_encoded(&EncodedRecord::encode_all(records)?)
            .await
    }

    async fn write_encoded(&self, records: &[EncodedRecord]) -> Result<(), SoulError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut batch = headed(records)?;
        // An `aborted` End (spool recovery) for a call that already has an End is
        // left out: a keyed call's End is stored with its idempotent outcome before
        // it reaches the spool, so a crash in between leaves its Begin open there.
        let aborted = |r: &Headed<'_>| r.head.status == Some(EndStatus::Aborted);
        let calls: Vec<String> = batch
            .iter()
            .filter(|r| aborted(r))
            .map(|r| r.head.call_id.to_string())
            .collect();
        if !calls.is_empty() {
            let ended = self.ended_calls(&calls).await?;
            batch.retain(|r| !aborted(r) || !ended.contains(r.head.call_id.as_ref()));
            if batch.is_empty() {
                return Ok(());
            }
        }
        let records = &batch[..];
        match &self.db {
            Db::Postgres(pool) => {
                let (data, days) = copy_binary(records)?;
                self.ensure_partitions(pool, days).await?;
                let rows = || records.iter().map(row).collect::<Vec<_>>();
                let written = if data.len() < COPY_MIN_BYTES {
                    // One write per round trip: no Nagle stall (see COPY_MIN_BYTES).
                    insert_skipping_stored(pool, rows()).await
                } else {
                    match copy_in(pool, data).await {
                        Ok(()) => Ok(()),
                        // Some of the batch is already stored (a batch re-sent after
                        // a crash or a lost acknowledgement): the COPY wrote nothing,
                        // so write the batch again, skipping what is there.
                        Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                            insert_skipping_stored(pool, rows()).await
                        }
                        Err(e) => Err(e),
                    }
                };
                if let Err(e) = written {
                    if let Some(refused) = refusal(&e) {
                        return Err(refused);
                    }
                    // A partition may have been dropped by retention meanwhile.
                    self.forget_partitions();
                    return Err(db_error("writing evidence", e));
                }
                Ok(())
            }
            Db::Sqlite(pool) => {
                let statements = sqlite_statements(records);
                let mut interned = Interned::default();
                let in_transaction = statements.len() > 1;
                let mut insert = |rows: &[Headed<'_>]| {
                    let args = sqlite_arguments(rows, &mut interned)?;
                    let text = sqlite_insert_text(rows.len(), in_transaction);
                    Ok::<_, SoulError>(sqlx::query_with(text, args))
                };
                // One statement is atomic by itself (it `ABORT`s): no BEGIN and
                // COMMIT round trips to the connection's thread for a batch
                // written in one.
                if let [only] = statements[..] {
                    return insert(only)?
                        .execute(pool)
                        .await
                        .map(drop)
                        .map_err(|e| db_error("writing evidence", e));
                }
                // A transaction SQLite rolled back by itself (a full disk or an
                // I/O error in the middle of a statement that keeps no statement
                // journal, see `sqlite_insert_text`) leaves sqlx counting it open:
                // the pool closes such a connection (`sqlite_pool_options`).
                let mut tx = pool
                    .begin()
                    .await
                    .map_err(|e| db_error("writing evidence", e))?;
                for chunk in statements {
                    insert(chunk)?
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| db_error("writing evidence", e))?;
                }
                tx.commit()
                    .await
                    .map_err(|e| db_error("committing evidence", e))
            }
        }
    }

    async fn call(
        &self,
        tenant: Option<&TenantId>,
        call_id: &CallId,
    ) -> Result<CallEvidence, SoulError> {
        let tenant = tenant.map(|t| t.to_string());
        let texts: Vec<(String,)> = match &self.db {
            Db::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT record::text FROM evidence \
                 WHERE call_id = $1 AND ($2::text IS NULL OR tenant = $2) ORDER BY at_ms, kind = 'end', id",
                )
                .bind(call_id.as_str())
                .bind(tenant)
                .fetch_all(pool)
                .await
            }
            Db::Sqlite(pool) => {
                sqlx::query_as(
                    "SELECT record FROM evidence \
                 WHERE call_id = ?1 AND (?2 IS NULL OR tenant = ?2) ORDER BY at_ms, kind = 'end', id",
                )
                .bind(call_id.as_str())
                .bind(tenant)
                .fetch_all(pool)
                .await
            }
        }
        .map_err(|e| db_error("reading evidence", e))?;
        let records = texts
            .iter()
            .map(|(t,)| decode(t))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CallEvidence { records })
    }

    async fn list(&self, q: &EvidenceQuery) -> Result<CallPage, SoulError> {
        q.validate()?;
        let limit = i64::from(q.limit) + 1;
        let tool = q.tool.as_ref().map(|t| t.to_string());
        let status = q.status.map(EndStatus::as_str);
        let actor = q.actor.as_ref().map(|a| a.as_str());
        let code = q.code_text();
        let (after_at, after_id) = match &q.after {
            Some(c) => (Some(c.at.0), Some(c.id.to_string())),
            None => (None, None),
        };
        let rows: Vec<(String, Option<String>)> = match &self.db {
            Db::Postgres(pool) => sqlx::query_as(
                "SELECT b.record::text, e.record::text FROM evidence b \
                 LEFT JOIN LATERAL (SELECT x.record, x.status FROM evidence x \
                     WHERE x.call_id = b.call_id AND x.kind = 'end' AND x.begin_id = b.id ORDER BY x.at_ms LIMIT 1) e ON true \
                 WHERE b.kind = 'begin' AND b.tenant = $1 \
                   AND ($2::int8 IS NULL OR b.at_ms >= $2) AND ($3::int8 IS NULL OR b.at_ms < $3) \
                   AND ($4::text IS NULL OR b.tool_id = $4) AND ($5::text IS NULL OR e.status = $5) \
                   AND ($6::int8 IS NULL OR (b.at_ms, b.id) < ($6, $7::text)) \
                   AND ($9::text IS NULL OR (b.record::jsonb ->> 'actor') = $9) \
                   AND ($10::text IS NULL OR (e.record::jsonb -> 'payload' ->> 'error_code') = $10) \
                 ORDER BY b.at_ms DESC, b.id DESC LIMIT $8",
            )
            .bind(q.tenant.as_str())
            .bind(q.from.map(|t| t.0))
            .bind(q.to.map(|t| t.0))
            .bind(tool)
            .bind(status)
            .bind(after_at)
            .bind(after_id)
            .bind(limit)
            .bind(actor)
            .bind(code)
            .fetch_all(pool)
            .await,
            Db::Sqlite(pool) => sqlx::query_as(
                "SELECT b.record, (SELECT x.record FROM evidence x \
                     WHERE x.call_id = b.call_id AND x.kind = 'end' AND x.begin_id = b.id ORDER BY x.at_ms LIMIT 1) \
                 FROM evidence b \
                 WHERE b.kind = 'begin' AND b.tenant = ?1 \
                   AND (?2 IS NULL OR b.at_ms >= ?2) AND (?3 IS NULL OR b.at_ms < ?3) \
                   AND (?4 IS NULL OR b.tool_id = ?4) \
                   AND (?5 IS NULL OR (SELECT x.status FROM evidence x \
                        WHERE x.call_id = b.call_id AND x.kind = 'end' AND x.begin_id = b.id ORDER BY x.at_ms LIMIT 1) = ?5) \
                   AND (?6 IS NULL OR b.at_ms < ?6 OR (b.at_ms = ?6 AND b.id < ?7)) \
                   AND (?9 IS NULL OR json_extract(b.record, '$.actor') = ?9) \
                   AND (?10 IS NULL OR (SELECT json_extract(x.record, '$.payload.error_code') FROM evidence x \
                        WHERE x.call_id = b.call_id AND x.kind = 'end' AND x.begin_id = b.id ORDER BY x.at_ms LIMIT 1) = ?10) \
                 ORDER BY b.at_ms DESC, b.id DESC LIMIT ?8",
            )
            .bind(q.tenant.as_str())
            .bind(q.from.map(|t| t.0))
            .bind(q.to.map(|t| t.0))
            .bind(tool)
            .bind(status)
            .bind(after_at)
            .bind(after_id)
            .bind(limit)
            .bind(actor)
            .bind(code)
            .fetch_all(pool)
            .await,
        }
        .map_err(|e| db_error("listing evidence", e))?;
        let more = rows.len() > q.limit as usize;
        let mut calls = Vec::with_capacity(rows.len());
        for (begin, end) in rows.iter().take(q.limit as usize) {
            let begin = decode(begin)?;
            let end = end.as_deref().map(decode).transpose()?;
            if let Some(s) = summarize(&begin, end.as_ref()) {
                calls.push(s);
            }
        }
        let next = if more {
            calls.last().map(|c| PageCursor {
                at: c.began_at,
                id: c.begin_id.clone(),
            })
        } else {
            None
        };
        Ok(CallPage { calls, next })
    }

    async fn list_denials(&self, q: &EvidenceQuery) -> Result<DenialPage, SoulError> {
        q.validate_denials()?;
        let limit = i64::from(q.limit) + 1;
        let tool = q.tool.as_ref().map(|t| t.to_string());
        let actor = q.actor.as_ref().map(|a| a.as_str());
        let code = q.code_text();
        let (after_at, after_id) = match &q.after {
            Some(c) => (Some(c.at.0), Some(c.id.to_string())),
            None => (None, None),
        };
        let rows: Vec<(String,)> = match &self.db {
            Db::Postgres(pool) => {
                sqlx::query_as(
                    "SELECT d.record::text FROM evidence d \
                 WHERE d.kind = 'denied' AND d.tenant = $1 \
                   AND ($2::int8 IS NULL OR d.at_ms >= $2) AND ($3::int8 IS NULL OR d.at_ms < $3) \
                   AND ($4::text IS NULL OR d.tool_id = $4) \
                   AND ($5::text IS NULL OR (d.record::jsonb ->> 'actor') = $5) \
                   AND ($6::text IS NULL OR (d.record::jsonb -> 'payload' ->> 'code') = $6) \
                   AND ($7::int8 IS NULL OR (d.at_ms, d.id) < ($7, $8::text)) \
                 ORDER BY d.at_ms DESC, d.id DESC LIMIT $9",
                )
                .bind(q.tenant.as_str())
                .bind(q.from.map(|t| t.0))
                .bind(q.to.map(|t| t.0))
                .bind(tool)
                .bind(actor)
                .bind(code)
                .bind(after_at)
                .bind(after_id)
                .bind(limit)
                .fetch_all(pool)
                .await
            }
            Db::Sqlite(pool) => {
                sqlx::query_as(
                    "SELECT d.record FROM evidence d \
                 WHERE d.kind = 'denied' AND d.tenant = ?1 \
                   AND (?2 IS NULL OR d.at_ms >= ?2) AND (?3 IS NULL OR d.at_ms < ?3) \
                   AND (?4 IS NULL OR d.tool_id = ?4) \
                   AND (?5 IS NULL OR json_extract(d.record, '$.actor') = ?5) \
                   AND (?6 IS NULL OR json_extract(d.record, '$.payload.code') = ?6) \
                   AND (?7 IS NULL OR d.at_ms < ?7 OR (d.at_ms = ?7 AND d.id < ?8)) \
                 ORDER BY d.at_ms DESC, d.id DESC LIMIT ?9",
                )
                .bind(q.tenant.as_str())
                .bind(q.from.map(|t| t.0))
                .bind(q.to.map(|t| t.0))
                .bind(tool)
                .bind(actor)
                .bind(code)
                .bind(after_at)
                .bind(after_id)
                .bind(limit)
                .fetch_all(pool)
                .await
            }
        }
        .map_err(|e| db_error("listing denials", e))?;
        let mut denials = Vec::with_capacity(rows.len());
        for (text,) in &rows {
            if let Some(d) = summarize_denial(&decode(text)?) {
                denials.push(d);
            }
        }
        Ok(DenialPage::of(denials, q.limit))
    }

    async fn purge_before(&self, cutoff: UnixMillis) -> Result<u64, SoulError> {
        match &self.db {
            Db::Postgres(pool) => {
                let before: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM evidence WHERE at_ms < $1")
                        .bind(cutoff.0)
                        .fetch_one(pool)
                        .await
                        .map_err(|e| db_error("counting expired evidence", e))?;
                sqlx::query("SELECT soulbase_evidence_drop_before($1)")
                    .bind(cutoff.0)
                    .execute(pool)
                    .await
                    .map_err(|e| db_error("dropping expired evidence", e))?;
                self.forget_partitions();
                Ok(u64::try_from(before).unwrap_or(0))
            }
            Db::Sqlite(pool) => {
                let done = sqlx::query("DELETE FROM evidence WHERE at_ms < ?1")
                    .bind(cutoff.0)
                    .execute(pool)
                    .await
                    .map_err(|e| db_error("deleting expired evidence", e))?;
                Ok(done.rows_affected())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(n: usize) -> Vec<usize> {
        let rows = vec![(); n];
        sqlite_statements(&rows).iter().map(|s| s.len()).collect()
    }

    #[test]
    fn small_batches_are_one_statement_and_large_ones_use_few_texts() {
        assert_eq!(counts(0), Vec::<usize>::new());
        assert_eq!(counts(1), [1]);
        assert_eq!(counts(10), [10]);
        assert_eq!(counts(SQLITE_EXACT), [SQLITE_EXACT]);
        assert_eq!(counts(33), [32, 1]);
        assert_eq!(counts(100), [64, 32, 4]);
        assert_eq!(counts(1_300), [512, 512, 256, 20]);
        // Every row once, in order, and only the texts the cache is sized for.
        let mut texts = std::collections::BTreeSet::new();
        for n in 0..3_000 {
            let c = counts(n);
            assert_eq!(c.iter().sum::<usize>(), n);
            texts.extend(c);
        }
        assert_eq!(texts.len(), SQLITE_EXACT + 4);
    }

    #[test]
    fn an_insert_text_has_nine_parameters_a_row_and_is_made_once_per_count() {
        for rows in [1, 7, SQLITE_EXACT, SQLITE_CHUNK] {
            for (in_transaction, start) in [(false, "INSERT INTO"), (true, "INSERT OR FAIL INTO")] {
                let sqlx::AssertSqlSafe(text) = sqlite_insert_text(rows, in_transaction);
                assert_eq!(text.matches('?').count(), rows * 9, "{rows} rows");
                assert!(text.starts_with(start), "{text}");
                assert!(text.ends_with(") ON CONFLICT DO NOTHING"));
                let sqlx::AssertSqlSafe(again) = sqlite_insert_text(rows, in_transaction);
                assert!(Arc::ptr_eq(&text, &again), "{rows} rows: made again");
            }
        }
    }

    /// The inserts of a batch's transaction stop on a broken constraint with
    /// `FAIL` (`Halt`'s P2 = 3), never `ABORT` (2), which would make SQLite keep a
    /// statement journal for each of them; a batch's only statement, run without
    /// a transaction, with `ABORT`, which undoes the whole statement.
    #[tokio::test]
    async fn inserts_in_a_transaction_fail_and_alone_abort_on_a_broken_constraint() {
        use sqlx::Row;
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("e.db").display());
        let Db::Sqlite(pool) = Db::connect(&url, true).await.unwrap() else {
            unreachable!("a SQLite URL")
        };
        for (rows, in_transaction) in [1, 2, SQLITE_EXACT, SQLITE_CHUNK]
            .into_iter()
            .flat_map(|rows| [(rows, true), (rows, false)])
        {
            let sqlx::AssertSqlSafe(text) = sqlite_insert_text(rows, in_transaction);
            let mut explain = sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN {text}")));
            for _ in 0..rows * 9 {
                explain = explain.bind(None::<String>);
            }
            let plan = explain.fetch_all(&pool).await.unwrap();
            let halts: Vec<i64> = plan
                .iter()
                .filter(|op| matches!(op.get::<String, _>(1).as_str(), "Halt" | "HaltIfNull"))
                .filter(|op| op.get::<i64, _>(2) != 0)
                .map(|op| op.get::<i64, _>(3))
                .collect();
            // NOT NULL on id, at_ms, tenant, kind, call_id, record; the kind check
            // (coded once: the rows of a multi-row insert go through one loop).
            assert_eq!(halts.len(), 7, "{rows} rows: {halts:?}");
            let on_error = if in_transaction { 3 } else { 2 };
            assert!(
                halts.iter().all(|&p2| p2 == on_error),
                "{rows} rows: {halts:?}"
            );
        }
    }

    #[test]
    fn repeating_columns_share_one_text_per_value() {
        let mut interned = Interned::default();
        let a = interned.get("begin");
        let b = interned.get("end");
        assert!(Arc::ptr_eq(&a, &interned.get("begin")));
        assert!(Arc::ptr_eq(&b, &interned.get("end")));
        assert_eq!(&*a, "begin");
        // Beyond the cap values are still right, only not shared.
        for i in 0..Interned::MAX {
            interned.get(&format!("tenant-{i}"));
        }
        let late = interned.get("late");
        assert_eq!(&*late, "late");
        assert!(!Arc::ptr_eq(&late, &interned.get("late")));
    }
}
