//! [`IdempotencyStore`] on Postgres and SQLite: a keyed call executes once per
//! (tenant, tool, key), also across replicas sharing one Postgres.
//!
//! The claim is an `INSERT … ON CONFLICT DO NOTHING` on the primary key: exactly one
//! caller inserts and owns the key. The others read the row: a different args digest
//! is `IDEMPOTENCY.CONFLICT`; a finished row answers with its stored result; an
//! in-flight row is polled (a few ms, backing off) until it finishes, is released,
//! or the wait runs out.
//!
//! **Exactly once across a crash.** The owner holds a lease ([`DEFAULT_LEASE`]),
//! renewed by this store's heartbeat ([`SqlIdempotency::spawn_heartbeat`], every
//! quarter lease) while the call is in progress, so only a dead (or cut-off)
//! owner's lease lapses. The owner marks the row begun (`call_id`, `begin_id`) once
//! its Begin is durable in the spool and before the tool runs — in one transaction
//! with that Begin — and completes it in **one transaction with its End** before
//! the End goes to the spool (both records are written into this database's
//! `evidence` table when that is the evidence store,
//! [`SqlIdempotency::with_evidence`]; the spool's copies are skipped there), so a
//! keyed call's evidence does not depend on its replica's spool surviving. Every
//! write is fenced by the owner: a key lost to another caller is neither begun,
//! completed nor released by its old owner (whose call then answers what the key
//! says). A caller
//! finding a lapsed lease takes the key over when it was never begun (nothing ran)
//! and otherwise settles it with [`interrupted_outcome`] (the tool may have run;
//! the owner's spool recovery closes its Begin `aborted`), then replays that. So
//! a retry after a crash at any point replays or runs the call once, and waits at
//! most one lease (plus one poll, ≤ 50 ms, and the replicas' clock skew).
//!
//! **An outcome the database cannot take** (an outage when the call ends) is
//! reported as `EVIDENCE.UNAVAILABLE`; the pipeline tries again until it lands.
//! Meanwhile the key stays held here: its lease is renewed as soon as the database
//! answers again, and a retry through this instance waits for the outcome rather
//! than taking the lapsed lease for a dead owner.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_observe::{EvidenceEvent, EvidenceRecord};
use soulbase_tools::pipeline::{
    Claim, IdempotencyKey, IdempotencyStore, StoredOutcome, interrupted_outcome,
};
use soulbase_types::{CallId, EnvelopeId, UnixMillis};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::db::{Db, db_error};
use crate::evidence::{DbConn, close_begin_in, ensure_partition, insert_in};

/// How long a key stays its owner's without a heartbeat: the longest a retry waits
/// for a dead owner's key.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(4);

/// Idempotency records in a SQL database.
pub struct SqlIdempotency {
    db: Db,
    /// This instance's identity as an owner.
    owner: String,
    /// How long a key stays its owner's without a renewal.
    lease: Duration,
    /// Whether `db` is also the evidence store (Ends are written with outcomes).
    evidence: bool,
    /// Keys this instance owns and is working on, with the time until which the
    /// heartbeat renews each (a call whose future was dropped stops being renewed).
    held: Mutex<HashMap<IdempotencyKey, Instant>>,
    /// Wakes the heartbeat when a first key is held (and when the store is
    /// dropped): with nothing held it sleeps without a timer, so an idle server
    /// does not wake for it.
    woken: Arc<Notify>,
    /// The day (Unix ms / 86 400 000) whose evidence partition is known to exist.
    partition_day: AtomicI64,
}

impl Drop for SqlIdempotency {
    /// Lets a waiting heartbeat see that the store is gone and end.
    fn drop(&mut self) {
        self.woken.notify_one();
    }
}

/// Tries at storing an outcome before giving up (a database blip).
const COMPLETE_TRIES: u32 = 3;

/// A row as read back.
struct Existing {
    args_digest: String,
    state: String,
    result: Option<String>,
    lease_until_ms: i64,
    call_id: Option<String>,
    begin_id: Option<String>,
}

fn conflict(message: &'static str) -> SoulError {
    SoulError::new(ErrorCode::IdempotencyConflict, message).with_field("field", "idempotency_key")
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl SqlIdempotency {
    /// A store on `db` (migrated) with the [`DEFAULT_LEASE`]; its `evidence` table
    /// is not written (see [`with_evidence`](Self::with_evidence)). Start its
    /// heartbeat with [`spawn_heartbeat`](Self::spawn_heartbeat).
    pub fn new(db: Db) -> Self {
        Self {
            db,
            owner: EnvelopeId::generate().to_string(),
            lease: DEFAULT_LEASE,
            evidence: false,
            held: Mutex::new(HashMap::new()),
            woken: Arc::new(Notify::new()),
            partition_day: AtomicI64::new(i64::MIN),
        }
    }

    /// Sets the lease: how long a dead owner blocks its key (at least 100 ms).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease.max(Duration::from_millis(100));
        self
    }

    /// Whether `db` is the evidence store too: then a keyed call's End is written
    /// into its `evidence` table in the transaction completing the key.
    pub fn with_evidence(mut self, evidence: bool) -> Self {
        self.evidence = evidence;
        self
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Renews the leases of the keys in progress here every quarter lease, until
    /// the store is dropped. While no key is held it waits for one, on no timer.
    pub fn spawn_heartbeat(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Self> = Arc::downgrade(self);
        let woken = self.woken.clone();
        let every = self.lease / 4;
        tokio::spawn(async move {
            loop {
                let idle = match weak.upgrade() {
                    Some(this) => this
                        .held
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_empty(),
                    None => return,
                };
                if idle {
                    // A key held meanwhile left a permit: this returns at once.
                    woken.notified().await;
                    continue;
                }
                tokio::time::sleep(every).await;
                let Some(this) = weak.upgrade() else { return };
                if let Err(e) = this.renew().await {
                    tracing::warn!(error = ?e, "could not renew idempotency leases");
                }
            }
        })
    }

    fn hold(&self, key: &IdempotencyKey, wait: Duration) {
        // A call in progress ends within its timeout (`wait` is a little longer)
        // after its claim, twice that for the queue before it; renewals stop after
        // that, so a call whose future was dropped does not hold its key forever.
        let until = Instant::now() + wait.saturating_mul(2) + self.lease;
        let first = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            held.insert(key.clone(), until);
            held.len() == 1
        };
        if first {
            self.woken.notify_one();
        }
    }

    /// Whether this instance owns `key` and is still working on it.
    fn holds(&self, key: &IdempotencyKey) -> bool {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(key)
    }

    fn unhold(&self, key: &IdempotencyKey) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }

    /// Extends the lease of every key held here (one statement on Postgres).
    async fn renew(&self) -> Result<(), SoulError> {
        let keys: Vec<IdempotencyKey> = {
            let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            held.retain(|_, until| *until > now);
            held.keys().cloned().collect()
        };
        if keys.is_empty() {
            return Ok(());
        }
        let until = UnixMillis::now().0.saturating_add(ms(self.lease));
        match &self.db {
            Db::Postgres(p) => {
                let tenants: Vec<&str> = keys.iter().map(|k| k.tenant.as_str()).collect();
                let tools: Vec<&str> = keys.iter().map(|k| k.tool.as_str()).collect();
                let names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
                sqlx::query(
                    "UPDATE idempotency i SET lease_until_ms = $2 \
                     FROM UNNEST($3::text[], $4::text[], $5::text[]) AS h(tenant, tool, key) \
                     WHERE i.tenant = h.tenant AND i.tool = h.tool AND i.key = h.key \
                       AND i.owner = $1 AND i.state = 'in_flight'",
                )
                .bind(&self.owner)
                .bind(until)
                .bind(tenants)
                .bind(tools)
                .bind(names)
                .execute(p)
                .await
                .map(|_| ())
            }
            Db::Sqlite(p) => {
                let mut r = Ok(());
                for k in &keys {
                    r = sqlx::query(
                        "UPDATE idempotency SET lease_until_ms = ?5 \
                         WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND owner = ?4 AND state = 'in_flight'",
                    )
                    .bind(k.tenant.as_str())
                    .bind(k.tool.as_str())
                    .bind(&k.key)
                    .bind(&self.owner)
                    .bind(until)
                    .execute(p)
                    .await
                    .map(|_| ());
                    if r.is_err() {
                        break;
                    }
                }
                r
            }
        }
        .map_err(|e| db_error("renewing idempotency leases", e))
    }

    /// Deletes records last touched before `cutoff`; returns how many.
    pub async fn purge_before(&self, cutoff: UnixMillis) -> Result<u64, SoulError> {
        let done = match &self.db {
            Db::Postgres(p) => {
                sqlx::query("DELETE FROM idempotency WHERE updated_ms < $1 AND state = 'done'")
                    .bind(cutoff.0)
                    .execute(p)
                    .await
                    .map(|r| r.rows_affected())
            }
            Db::Sqlite(p) => {
                sqlx::query("DELETE FROM idempotency WHERE updated_ms < ?1 AND state = 'done'")
                    .bind(cutoff.0)
                    .execute(p)
                    .await
                    .map(|r| r.rows_affected())
            }
        };
        done.map_err(|e| db_error("purging idempotency records", e))
    }

    async fn insert(
        &self,
        k: &IdempotencyKey,
        digest: &str,
        lease: i64,
    ) -> Result<bool, SoulError> {
        let now = UnixMillis::now().0;
        let r = match &self.db {
            Db::Postgres(p) => sqlx::query(
                "INSERT INTO idempotency (tenant, tool, key, args_digest, state, result, owner, lease_until_ms, created_ms, updated_ms) \
                 VALUES ($1, $2, $3, $4, 'in_flight', NULL, $5, $6, $7, $7) ON CONFLICT DO NOTHING",
            )
            .bind(k.tenant.as_str())
            .bind(k.tool.as_str())
            .bind(&k.key)
            .bind(digest)
            .bind(&self.owner)
            .bind(now.saturating_add(lease))
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected()),
            Db::Sqlite(p) => sqlx::query(
                "INSERT INTO idempotency (tenant, tool, key, args_digest, state, result, owner, lease_until_ms, created_ms, updated_ms) \
                 VALUES (?1, ?2, ?3, ?4, 'in_flight', NULL, ?5, ?6, ?7, ?7) ON CONFLICT DO NOTHING",
            )
            .bind(k.tenant.as_str())
            .bind(k.tool.as_str())
            .bind(&k.key)
            .bind(digest)
            .bind(&self.owner)
            .bind(now.saturating_add(lease))
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected()),
        };
        r.map(|n| n == 1)
            .map_err(|e| db_error("claiming an idempotency key", e))
    }

    async fn read(&self, k: &IdempotencyKey) -> Result<Option<Existing>, SoulError> {
        type Fields = (
            String,
            String,
            Option<String>,
            i64,
            Option<String>,
            Option<String>,
        );
        let row: Option<Fields> = match &self.db {
            Db::Postgres(p) => {
                sqlx::query_as(
                    "SELECT args_digest, state, result, lease_until_ms, call_id, begin_id FROM idempotency \
                 WHERE tenant = $1 AND tool = $2 AND key = $3",
                )
                .bind(k.tenant.as_str())
                .bind(k.tool.as_str())
                .bind(&k.key)
                .fetch_optional(p)
                .await
            }
            Db::Sqlite(p) => {
                sqlx::query_as(
                    "SELECT args_digest, state, result, lease_until_ms, call_id, begin_id FROM idempotency \
                 WHERE tenant = ?1 AND tool = ?2 AND key = ?3",
                )
                .bind(k.tenant.as_str())
                .bind(k.tool.as_str())
                .bind(&k.key)
                .fetch_optional(p)
                .await
            }
        }
        .map_err(|e| db_error("reading an idempotency key", e))?;
        Ok(row.map(
            |(args_digest, state, result, lease_until_ms, call_id, begin_id)| Existing {
                args_digest,
                state,
                result,
                lease_until_ms,
                call_id,
                begin_id,
            },
        ))
    }

    /// Takes over an in-flight key whose lease has expired; true when this caller won.
    async fn take_over(&self, k: &IdempotencyKey, lease: i64) -> Result<bool, SoulError> {
        let now = UnixMillis::now().0;
        let r = match &self.db {
            Db::Postgres(p) => sqlx::query(
                "UPDATE idempotency SET owner = $4, lease_until_ms = $5, updated_ms = $6 \
                 WHERE tenant = $1 AND tool = $2 AND key = $3 AND state = 'in_flight' AND begin_id IS NULL AND lease_until_ms < $6",
            )
            .bind(k.tenant.as_str())
            .bind(k.tool.as_str())
            .bind(&k.key)
            .bind(&self.owner)
            .bind(now.saturating_add(lease))
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected()),
            Db::Sqlite(p) => sqlx::query(
                "UPDATE idempotency SET owner = ?4, lease_until_ms = ?5, updated_ms = ?6 \
                 WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND state = 'in_flight' AND begin_id IS NULL AND lease_until_ms < ?6",
            )
            .bind(k.tenant.as_str())
            .bind(k.tool.as_str())
            .bind(&k.key)
            .bind(&self.owner)
            .bind(now.saturating_add(lease))
            .bind(now)
            .execute(p)
            .await
            .map(|r| r.rows_affected()),
        };
        r.map(|n| n == 1)
            .map_err(|e| db_error("taking over an idempotency key", e))
    }

    /// Settles a begun key whose owner's lease lapsed (`begin_id` as read) with the
    /// interrupted outcome; true when this caller settled it.
    async fn settle_interrupted(
        &self,
        k: &IdempotencyKey,
        row: &Existing,
        begin_id: &str,
    ) -> Result<bool, SoulError> {
        let call_id = row
            .call_id
            .as_deref()
            .and_then(|c| CallId::new(c).ok())
            .unwrap_or_else(CallId::generate);
        let begin = EnvelopeId::new(begin_id).ok();
        let outcome = interrupted_outcome(&row.args_digest, call_id, begin);
        let result = serde_json::to_string(&outcome.result).map_err(SoulError::internal)?;
        let now = UnixMillis::now().0;
        let call_id = outcome.result.call_id.as_str();
        let failed = |e| db_error("settling an interrupted idempotency key", e);
        // One transaction: the interrupted outcome and, when the Begin is stored
        // here, its aborted End (the owner's spool may never come back).
        let settled = match &self.db {
            Db::Postgres(p) => {
                if self.evidence {
                    self.ensure_partition(p, now).await?;
                }
                let mut tx = p.begin().await.map_err(failed)?;
                let n = sqlx::query(
                    "UPDATE idempotency SET state = 'done', result = $5, updated_ms = $6 \
                     WHERE tenant = $1 AND tool = $2 AND key = $3 AND state = 'in_flight' AND begin_id = $4 AND lease_until_ms < $6",
                )
                .bind(k.tenant.as_str())
                .bind(k.tool.as_str())
                .bind(&k.key)
                .bind(begin_id)
                .bind(result)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(failed)?
                .rows_affected();
                if n == 1 {
                    if self.evidence {
                        close_begin_in(DbConn::Postgres(&mut tx), call_id, begin_id).await?;
                    }
                    tx.commit().await.map_err(failed)?;
                }
                n
            }
            Db::Sqlite(p) => {
                let mut tx = p.begin().await.map_err(failed)?;
                let n = sqlx::query(
                    "UPDATE idempotency SET state = 'done', result = ?5, updated_ms = ?6 \
                     WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND state = 'in_flight' AND begin_id = ?4 AND lease_until_ms < ?6",
                )
                .bind(k.tenant.as_str())
                .bind(k.tool.as_str())
                .bind(&k.key)
                .bind(begin_id)
                .bind(result)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(failed)?
                .rows_affected();
                if n == 1 {
                    if self.evidence {
                        close_begin_in(DbConn::Sqlite(&mut tx), call_id, begin_id).await?;
                    }
                    tx.commit().await.map_err(failed)?;
                }
                n
            }
        };
        Ok(settled == 1)
    }

    /// Makes the evidence partition of `at_ms`'s day unless known to exist.
    async fn ensure_partition(&self, pool: &sqlx::PgPool, at_ms: i64) -> Result<(), SoulError> {
        let day = at_ms.div_euclid(86_400_000);
        if self.partition_day.load(Ordering::Relaxed) != day {
            ensure_partition(pool, at_ms).await?;
            self.partition_day.store(day, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stores `result` (fenced by the owner) and `end` in one transaction.
    async fn complete_once(
        &self,
        key: &IdempotencyKey,
        result: &str,
        end: Option<&EvidenceRecord>,
    ) -> Result<(), SoulError> {
        let now = UnixMillis::now().0;
        let failed = |e| db_error("storing an idempotent result", e);
        // One transaction: the outcome (fenced by the owner) and the End.
        let updated = match &self.db {
            Db::Postgres(p) => {
                if let Some(end) = end {
                    self.ensure_partition(p, end.at.0).await?;
                }
                let mut tx = p.begin().await.map_err(failed)?;
                let n = sqlx::query(
                    "UPDATE idempotency SET state = 'done', result = $5, updated_ms = $6 \
                     WHERE tenant = $1 AND tool = $2 AND key = $3 AND owner = $4 AND state = 'in_flight'",
                )
                .bind(key.tenant.as_str())
                .bind(key.tool.as_str())
                .bind(&key.key)
                .bind(&self.owner)
                .bind(result)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(failed)?
                .rows_affected();
                if n == 1 {
                    if let Some(end) = end {
                        insert_in(DbConn::Postgres(&mut tx), end).await?;
                    }
                    tx.commit().await.map_err(failed)?;
                }
                n
            }
            Db::Sqlite(p) => {
                let mut tx = p.begin().await.map_err(failed)?;
                let n = sqlx::query(
                    "UPDATE idempotency SET state = 'done', result = ?5, updated_ms = ?6 \
                     WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND owner = ?4 AND state = 'in_flight'",
                )
                .bind(key.tenant.as_str())
                .bind(key.tool.as_str())
                .bind(&key.key)
                .bind(&self.owner)
                .bind(result)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(failed)?
                .rows_affected();
                if n == 1 {
                    if let Some(end) = end {
                        insert_in(DbConn::Sqlite(&mut tx), end).await?;
                    }
                    tx.commit().await.map_err(failed)?;
                }
                n
            }
        };
        if updated == 1 {
            Ok(())
        } else {
            Err(conflict(
                "this call's idempotency key was settled by another caller after its lease lapsed; its outcome was not stored",
            ))
        }
    }
}

fn lost() -> SoulError {
    conflict(
        "this call's idempotency key was taken over after its lease lapsed; the call was not executed",
    )
}

#[async_trait]
impl IdempotencyStore for SqlIdempotency {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        args_digest: &str,
        wait: Duration,
    ) -> Result<Claim, SoulError> {
        let lease = ms(self.lease);
        let deadline = tokio::time::Instant::now() + wait;
        let mut poll = Duration::from_millis(2);
        loop {
            if self.insert(key, args_digest, lease).await? {
                self.hold(key, wait);
                return Ok(Claim::Owner);
            }
            let Some(row) = self.read(key).await? else {
                // Released between our insert and read: try again at once.
                continue;
            };
            if row.args_digest != args_digest {
                return Err(conflict(
                    "this idempotency key was used with different arguments",
                ));
            }
            if row.state == "done" {
                let text = row.result.unwrap_or_default();
                let result = serde_json::from_str(&text)
                    .map_err(|e| db_error("decoding a stored idempotent result", e))?;
                return Ok(Claim::Completed(Box::new(StoredOutcome {
                    args_digest: row.args_digest,
                    result,
                })));
            }
            // A lapsed lease means a dead owner — unless the owner is this
            // instance, still storing the call's outcome through a database outage
            // (it renews the lease once the database is back): wait for it.
            if row.lease_until_ms < UnixMillis::now().0 && !self.holds(key) {
                match &row.begin_id {
                    // Never begun: nothing ran, the key is free to run once.
                    None => {
                        if self.take_over(key, lease).await? {
                            tracing::warn!(tool = %key.tool, "took over an idempotency key whose owner's lease lapsed");
                            self.hold(key, wait);
                            return Ok(Claim::Owner);
                        }
                    }
                    // Begun: the tool may have run; settle it, then replay that.
                    Some(begin_id) => {
                        if self.settle_interrupted(key, &row, begin_id).await? {
                            tracing::warn!(tool = %key.tool, begin_id = %begin_id, "settled an idempotency key whose owner stopped after its Begin as interrupted");
                        }
                        continue;
                    }
                }
                continue;
            }
            if tokio::time::Instant::now() + poll > deadline {
                return Err(
                    conflict("a call with this idempotency key is still in progress")
                        .retry_after(Duration::from_millis(500)),
                );
            }
            tokio::time::sleep(poll).await;
            poll = (poll * 2).min(Duration::from_millis(50));
        }
    }

    async fn begin(&self, key: &IdempotencyKey, begin: &EvidenceRecord) -> Result<(), SoulError> {
        let EvidenceEvent::Begin(b) = &begin.payload else {
            return Err(SoulError::of(ErrorCode::UnknownInternal)
                .with_note("an idempotency key was marked begun without a Begin record"));
        };
        let (call_id, begin_id) = (b.call_id.as_str(), begin.id.as_str());
        let now = UnixMillis::now().0;
        let until = now.saturating_add(ms(self.lease));
        let record = Some(begin).filter(|_| self.evidence);
        let failed = |e| db_error("marking an idempotency key begun", e);
        // One transaction: the mark (fenced by the owner) and the Begin.
        let updated = match &self.db {
            Db::Postgres(p) => {
                if let Some(r) = record {
                    self.ensure_partition(p, r.at.0).await?;
                }
                let mut tx = p.begin().await.map_err(failed)?;
                let n = sqlx::query(
                    "UPDATE idempotency SET call_id = $5, begin_id = $6, lease_until_ms = $7, updated_ms = $8 \
                     WHERE tenant = $1 AND tool = $2 AND key = $3 AND owner = $4 AND state = 'in_flight' AND begin_id IS NULL",
                )
                .bind(key.tenant.as_str())
                .bind(key.tool.as_str())
                .bind(&key.key)
                .bind(&self.owner)
                .bind(call_id)
                .bind(begin_id)
                .bind(until)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(failed)?
                .rows_affected();
                if n == 1 {
                    if let Some(r) = record {
                        insert_in(DbConn::Postgres(&mut tx), r).await?;
                    }
                    tx.commit().await.map_err(failed)?;
                }
                n
            }
            Db::Sqlite(p) => {
                let mut tx = p.begin().await.map_err(failed)?;
                let n = sqlx::query(
                    "UPDATE idempotency SET call_id = ?5, begin_id = ?6, lease_until_ms = ?7, updated_ms = ?8 \
                     WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND owner = ?4 AND state = 'in_flight' AND begin_id IS NULL",
                )
                .bind(key.tenant.as_str())
                .bind(key.tool.as_str())
                .bind(&key.key)
                .bind(&self.owner)
                .bind(call_id)
                .bind(begin_id)
                .bind(until)
                .bind(now)
                .execute(&mut *tx)
                .await
                .map_err(failed)?
                .rows_affected();
                if n == 1 {
                    if let Some(r) = record {
                        insert_in(DbConn::Sqlite(&mut tx), r).await?;
                    }
                    tx.commit().await.map_err(failed)?;
                }
                n
            }
        };
        if updated == 1 {
            Ok(())
        } else {
            self.unhold(key);
            Err(lost())
        }
    }

    async fn complete(
        &self,
        key: &IdempotencyKey,
        outcome: StoredOutcome,
        end: Option<&EvidenceRecord>,
    ) -> Result<(), SoulError> {
        let result = serde_json::to_string(&outcome.result).map_err(SoulError::internal)?;
        let end = end.filter(|_| self.evidence);
        // The key stays held (renewed) while the outcome is being stored.
        let mut tries = 0;
        let stored = loop {
            tries += 1;
            match self.complete_once(key, &result, end).await {
                Err(e) if e.code() == ErrorCode::EvidenceUnavailable && tries < COMPLETE_TRIES => {
                    tracing::warn!(error = ?e, "storing an idempotent result failed; trying again");
                    self.partition_day.store(i64::MIN, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(25 * u64::from(tries))).await;
                }
                done => break done,
            }
        };
        match &stored {
            // Still this call's: the pipeline tries again later (the key stays
            // held, so its lease is renewed once the database is back, and a
            // retry here waits for the outcome instead of settling it).
            Err(e) if e.code() == ErrorCode::EvidenceUnavailable => {
                self.hold(key, Duration::ZERO);
            }
            _ => self.unhold(key),
        }
        stored
    }

    async fn release(&self, key: &IdempotencyKey) -> Result<(), SoulError> {
        self.unhold(key);
        match &self.db {
            Db::Postgres(p) => sqlx::query(
                "DELETE FROM idempotency WHERE tenant = $1 AND tool = $2 AND key = $3 AND owner = $4 AND state = 'in_flight' AND begin_id IS NULL",
            )
            .bind(key.tenant.as_str())
            .bind(key.tool.as_str())
            .bind(&key.key)
            .bind(&self.owner)
            .execute(p)
            .await
            .map(|_| ()),
            Db::Sqlite(p) => sqlx::query(
                "DELETE FROM idempotency WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND owner = ?4 AND state = 'in_flight' AND begin_id IS NULL",
            )
            .bind(key.tenant.as_str())
            .bind(key.tool.as_str())
            .bind(&key.key)
            .bind(&self.owner)
            .execute(p)
            .await
            .map(|_| ()),
        }
        .map_err(|e| db_error("releasing an idempotency key", e))
    }
}
