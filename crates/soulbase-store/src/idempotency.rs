//! [`IdempotencyStore`] on Postgres and SQLite: a keyed call executes once per
//! (tenant, tool, key), also across replicas sharing one Postgres.
//!
//! The claim is an `INSERT … ON CONFLICT DO NOTHING` on the primary key: exactly one
//! caller inserts and owns the key. The others read the row: a different args digest
//! is `IDEMPOTENCY.CONFLICT`; a finished row answers with its stored result; an
//! in-flight row is polled (a few ms, backing off) until it finishes, is released,
//! or the wait runs out. An owner that died holds a lease; once it expires another
//! caller takes the key over.

use std::time::Duration;

use async_trait::async_trait;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_tools::pipeline::{Claim, IdempotencyKey, IdempotencyStore, StoredOutcome};
use soulbase_types::{EnvelopeId, UnixMillis};

use crate::db::{Db, db_error};

/// Idempotency records in a SQL database.
pub struct SqlIdempotency {
    db: Db,
    /// This instance's identity as an owner.
    owner: String,
    /// Shortest lease an owner gets (the claim's wait is used when longer).
    min_lease: Duration,
}

/// A row as read back.
struct Existing {
    args_digest: String,
    state: String,
    result: Option<String>,
    lease_until_ms: i64,
}

fn conflict(message: &'static str) -> SoulError {
    SoulError::new(ErrorCode::IdempotencyConflict, message).with_field("field", "idempotency_key")
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl SqlIdempotency {
    /// A store on `db` (migrated). Owners hold a key for at least 30 s before another
    /// caller may take it over.
    pub fn new(db: Db) -> Self {
        Self {
            db,
            owner: EnvelopeId::generate().to_string(),
            min_lease: Duration::from_secs(30),
        }
    }

    /// Sets the shortest lease (how long a dead owner blocks its key).
    pub fn with_min_lease(mut self, lease: Duration) -> Self {
        self.min_lease = lease;
        self
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
        let row: Option<(String, String, Option<String>, i64)> = match &self.db {
            Db::Postgres(p) => {
                sqlx::query_as(
                    "SELECT args_digest, state, result, lease_until_ms FROM idempotency \
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
                    "SELECT args_digest, state, result, lease_until_ms FROM idempotency \
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
        Ok(
            row.map(|(args_digest, state, result, lease_until_ms)| Existing {
                args_digest,
                state,
                result,
                lease_until_ms,
            }),
        )
    }

    /// Takes over an in-flight key whose lease has expired; true when this caller won.
    async fn take_over(&self, k: &IdempotencyKey, lease: i64) -> Result<bool, SoulError> {
        let now = UnixMillis::now().0;
        let r = match &self.db {
            Db::Postgres(p) => sqlx::query(
                "UPDATE idempotency SET owner = $4, lease_until_ms = $5, updated_ms = $6 \
                 WHERE tenant = $1 AND tool = $2 AND key = $3 AND state = 'in_flight' AND lease_until_ms < $6",
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
                 WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND state = 'in_flight' AND lease_until_ms < ?6",
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
}

#[async_trait]
impl IdempotencyStore for SqlIdempotency {
    async fn claim(
        &self,
        key: &IdempotencyKey,
        args_digest: &str,
        wait: Duration,
    ) -> Result<Claim, SoulError> {
        let lease = ms(wait.max(self.min_lease));
        let deadline = tokio::time::Instant::now() + wait;
        let mut poll = Duration::from_millis(2);
        loop {
            if self.insert(key, args_digest, lease).await? {
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
            if row.lease_until_ms < UnixMillis::now().0 && self.take_over(key, lease).await? {
                tracing::warn!(tool = %key.tool, "took over an idempotency key whose owner's lease expired");
                return Ok(Claim::Owner);
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

    async fn complete(
        &self,
        key: &IdempotencyKey,
        outcome: StoredOutcome,
    ) -> Result<(), SoulError> {
        let result = serde_json::to_string(&outcome.result).map_err(SoulError::internal)?;
        let now = UnixMillis::now().0;
        match &self.db {
            Db::Postgres(p) => sqlx::query(
                "UPDATE idempotency SET state = 'done', result = $4, updated_ms = $5 \
                 WHERE tenant = $1 AND tool = $2 AND key = $3",
            )
            .bind(key.tenant.as_str())
            .bind(key.tool.as_str())
            .bind(&key.key)
            .bind(result)
            .bind(now)
            .execute(p)
            .await
            .map(|_| ()),
            Db::Sqlite(p) => sqlx::query(
                "UPDATE idempotency SET state = 'done', result = ?4, updated_ms = ?5 \
                 WHERE tenant = ?1 AND tool = ?2 AND key = ?3",
            )
            .bind(key.tenant.as_str())
            .bind(key.tool.as_str())
            .bind(&key.key)
            .bind(result)
            .bind(now)
            .execute(p)
            .await
            .map(|_| ()),
        }
        .map_err(|e| db_error("storing an idempotent result", e))
    }

    async fn release(&self, key: &IdempotencyKey) -> Result<(), SoulError> {
        match &self.db {
            Db::Postgres(p) => sqlx::query(
                "DELETE FROM idempotency WHERE tenant = $1 AND tool = $2 AND key = $3 AND state = 'in_flight'",
            )
            .bind(key.tenant.as_str())
            .bind(key.tool.as_str())
            .bind(&key.key)
            .execute(p)
            .await
            .map(|_| ()),
            Db::Sqlite(p) => sqlx::query(
                "DELETE FROM idempotency WHERE tenant = ?1 AND tool = ?2 AND key = ?3 AND state = 'in_flight'",
            )
            .bind(key.tenant.as_str())
            .bind(key.tool.as_str())
            .bind(&key.key)
            .execute(p)
            .await
            .map(|_| ()),
        }
        .map_err(|e| db_error("releasing an idempotency key", e))
    }
}
