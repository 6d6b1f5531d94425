//! Revoked consent tokens and consent requests, kept with the evidence so every
//! replica sharing the database refuses a revoked token from its next call on,
//! and shows approvers the same requests.

use async_trait::async_trait;
use soulbase_auth::{
    ApprovalScope, ConsentDecision, ConsentRequestRecord, ConsentRequestStatus, ConsentRequests,
    ConsentRevocations, NewConsentRequest,
};
use soulbase_errors::SoulError;
use soulbase_types::{ActorId, CallId, TenantId, ToolId, UnixMillis};

use crate::Db;
use crate::db::db_error;

/// [`ConsentRevocations`] in the `consent_revocations` table.
#[derive(Debug, Clone)]
pub struct SqlConsentRevocations {
    db: Db,
}

impl SqlConsentRevocations {
    /// Revocations in `db` (migrated).
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

#[async_trait]
impl ConsentRevocations for SqlConsentRevocations {
    async fn revoke(
        &self,
        id: &str,
        tenant: &TenantId,
        by: &ActorId,
        at: UnixMillis,
    ) -> Result<(), SoulError> {
        let done = match &self.db {
            Db::Postgres(p) => sqlx::query(
                "INSERT INTO consent_revocations (token_id, tenant, revoked_by, revoked_ms) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
            )
            .bind(id)
            .bind(tenant.as_str())
            .bind(by.as_str())
            .bind(at.0)
            .execute(p)
            .await
            .map(drop),
            Db::Sqlite(p) => sqlx::query(
                "INSERT INTO consent_revocations (token_id, tenant, revoked_by, revoked_ms) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            )
            .bind(id)
            .bind(tenant.as_str())
            .bind(by.as_str())
            .bind(at.0)
            .execute(p)
            .await
            .map(drop),
        };
        done.map_err(|e| db_error("revoking a consent token", e))
    }

    async fn is_revoked(&self, id: &str, tenant: &TenantId) -> Result<bool, SoulError> {
        let found: Result<Option<i64>, sqlx::Error> =
            match &self.db {
                Db::Postgres(p) => sqlx::query_scalar(
                    "SELECT 1::BIGINT FROM consent_revocations WHERE token_id = $1 AND tenant = $2",
                )
                .bind(id)
                .bind(tenant.as_str())
                .fetch_optional(p)
                .await,
                Db::Sqlite(p) => {
                    sqlx::query_scalar(
                        "SELECT 1 FROM consent_revocations WHERE token_id = ?1 AND tenant = ?2",
                    )
                    .bind(id)
                    .bind(tenant.as_str())
                    .fetch_optional(p)
                    .await
                }
            };
        found
            .map(|row| row.is_some())
            .map_err(|e| db_error("reading consent revocations", e))
    }
}

/// [`ConsentRequests`] in the `consent_requests` table (migration 0011).
#[derive(Debug, Clone)]
pub struct SqlConsentRequests {
    db: Db,
}

impl SqlConsentRequests {
    /// Requests in `db` (migrated).
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

/// A row as selected ([`COLUMNS`]).
type RequestRow = (
    String,
    String,
    String,
    String,
    String,
    String,
    i64,
    String,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
);

const COLUMNS: &str = "id, tenant, actor, tool, args_digest, call_id, requested_ms, status, \
                       decided_by, decided_ms, scope, reason, token, token_id, token_expires_ms";

fn decode(row: RequestRow) -> Result<ConsentRequestRecord, SoulError> {
    let (
        id,
        tenant,
        actor,
        tool,
        args_digest,
        call_id,
        requested,
        status,
        by,
        at,
        scope,
        reason,
        token,
        token_id,
        expires,
    ) = row;
    let bad = |what: &str| {
        db_error(
            "reading consent requests",
            format!("a row with a bad {what}"),
        )
    };
    Ok(ConsentRequestRecord {
        id,
        tenant: TenantId::new(tenant).map_err(|_| bad("tenant"))?,
        actor: ActorId::new(actor).map_err(|_| bad("actor"))?,
        tool: ToolId::new(tool).map_err(|_| bad("tool"))?,
        args_digest,
        call_id: CallId::new(call_id).map_err(|_| bad("call id"))?,
        requested_at: UnixMillis(requested),
        status: status.parse().map_err(|_| bad("status"))?,
        decided_by: by
            .map(|b| ActorId::new(b).map_err(|_| bad("decider")))
            .transpose()?,
        decided_at: at.map(UnixMillis),
        scope: scope
            .map(|s| s.parse::<ApprovalScope>().map_err(|_| bad("scope")))
            .transpose()?,
        reason,
        token,
        token_id,
        token_expires_at: expires.map(UnixMillis),
    })
}

/// Runs `$body` on either backend, with `$sql` turning the Postgres text of a
/// statement (`$1` placeholders) into the backend's (SQLite: `?1`).
macro_rules! on_db {
    ($db:expr, $pool:ident, $sql:ident, $body:expr) => {
        match $db {
            Db::Postgres($pool) => {
                let $sql = |s: &str| sqlx::AssertSqlSafe(s.to_owned());
                $body
            }
            Db::Sqlite($pool) => {
                let $sql = |s: &str| sqlx::AssertSqlSafe(s.replace('$', "?"));
                $body
            }
        }
    };
}

impl SqlConsentRequests {
    /// The fresh pending request of `new`'s key, if any.
    async fn pending_of(
        &self,
        new: &NewConsentRequest,
        fresh_since: UnixMillis,
    ) -> Result<Option<ConsentRequestRecord>, SoulError> {
        let text = format!(
            "SELECT {COLUMNS} FROM consent_requests WHERE tenant = $1 AND actor = $2 \
             AND tool = $3 AND args_digest = $4 AND status = 'pending' AND requested_ms >= $5"
        );
        let row: Result<Option<RequestRow>, sqlx::Error> = on_db!(&self.db, p, sql, {
            sqlx::query_as(sql(&text))
                .bind(new.tenant.as_str())
                .bind(new.actor.as_str())
                .bind(new.tool.as_str())
                .bind(new.args_digest.as_str())
                .bind(fresh_since.0)
                .fetch_optional(p)
                .await
        });
        row.map_err(|e| db_error("reading consent requests", e))?
            .map(decode)
            .transpose()
    }
}

#[async_trait]
impl ConsentRequests for SqlConsentRequests {
    async fn open(
        &self,
        new: &NewConsentRequest,
        fresh_since: UnixMillis,
        max_pending: u32,
    ) -> Result<Option<ConsentRequestRecord>, SoulError> {
        // A stale pending request of the same call gives way to a new one.
        let expire = "UPDATE consent_requests SET status = 'expired' WHERE tenant = $1 \
                      AND actor = $2 AND tool = $3 AND args_digest = $4 AND status = 'pending' \
                      AND requested_ms < $5";
        let done: Result<(), sqlx::Error> = on_db!(&self.db, p, sql, {
            sqlx::query(sql(expire))
                .bind(new.tenant.as_str())
                .bind(new.actor.as_str())
                .bind(new.tool.as_str())
                .bind(new.args_digest.as_str())
                .bind(fresh_since.0)
                .execute(p)
                .await
                .map(drop)
        });
        done.map_err(|e| db_error("expiring consent requests", e))?;
        if let Some(same) = self.pending_of(new, fresh_since).await? {
            return Ok(Some(same));
        }
        let count = "SELECT COUNT(*) FROM consent_requests WHERE tenant = $1 AND actor = $2 \
                     AND status = 'pending' AND requested_ms >= $3";
        let pending: Result<i64, sqlx::Error> = on_db!(&self.db, p, sql, {
            sqlx::query_scalar(sql(count))
                .bind(new.tenant.as_str())
                .bind(new.actor.as_str())
                .bind(fresh_since.0)
                .fetch_one(p)
                .await
        });
        let pending = pending.map_err(|e| db_error("counting consent requests", e))?;
        if pending >= i64::from(max_pending) {
            return Ok(None);
        }
        let record = ConsentRequestRecord::opened(new);
        // Another replica opening the same request at once: the unique index on
        // pending requests keeps one, which both then read.
        let insert = "INSERT INTO consent_requests (id, tenant, actor, tool, args_digest, \
                      call_id, requested_ms, status) \
                      VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending') ON CONFLICT DO NOTHING";
        let done: Result<(), sqlx::Error> = on_db!(&self.db, p, sql, {
            sqlx::query(sql(insert))
                .bind(record.id.as_str())
                .bind(record.tenant.as_str())
                .bind(record.actor.as_str())
                .bind(record.tool.as_str())
                .bind(record.args_digest.as_str())
                .bind(record.call_id.as_str())
                .bind(record.requested_at.0)
                .execute(p)
                .await
                .map(drop)
        });
        done.map_err(|e| db_error("opening a consent request", e))?;
        self.pending_of(new, fresh_since).await
    }

    async fn get(
        &self,
        tenant: &TenantId,
        id: &str,
        fresh_since: UnixMillis,
    ) -> Result<Option<ConsentRequestRecord>, SoulError> {
        let text = format!("SELECT {COLUMNS} FROM consent_requests WHERE id = $1 AND tenant = $2");
        let row: Result<Option<RequestRow>, sqlx::Error> = on_db!(&self.db, p, sql, {
            sqlx::query_as(sql(&text))
                .bind(id)
                .bind(tenant.as_str())
                .fetch_optional(p)
                .await
        });
        row.map_err(|e| db_error("reading consent requests", e))?
            .map(|r| decode(r).map(|r| r.as_of(fresh_since)))
            .transpose()
    }

    async fn list(
        &self,
        tenant: &TenantId,
        status: Option<ConsentRequestStatus>,
        fresh_since: UnixMillis,
        limit: u32,
    ) -> Result<Vec<ConsentRequestRecord>, SoulError> {
        // Expired is stored as such or still pending past its time.
        let condition = match status {
            None => "",
            Some(ConsentRequestStatus::Pending) => " AND status = 'pending' AND requested_ms >= $3",
            Some(ConsentRequestStatus::Expired) => {
                " AND (status = 'expired' OR (status = 'pending' AND requested_ms < $3))"
            }
            Some(ConsentRequestStatus::Approved) => " AND status = 'approved'",
            Some(ConsentRequestStatus::Declined) => " AND status = 'declined'",
        };
        let with_fresh = condition.contains("$3");
        let text = format!(
            "SELECT {COLUMNS} FROM consent_requests WHERE tenant = $1{condition} \
             ORDER BY requested_ms DESC, id DESC LIMIT $2"
        );
        let rows: Result<Vec<RequestRow>, sqlx::Error> = on_db!(&self.db, p, sql, {
            let q = sqlx::query_as(sql(&text))
                .bind(tenant.as_str())
                .bind(i64::from(limit));
            let q = if with_fresh { q.bind(fresh_since.0) } else { q };
            q.fetch_all(p).await
        });
        rows.map_err(|e| db_error("reading consent requests", e))?
            .into_iter()
            .map(|r| decode(r).map(|r| r.as_of(fresh_since)))
            .collect()
    }

    async fn decide(
        &self,
        tenant: &TenantId,
        id: &str,
        by: &ActorId,
        at: UnixMillis,
        decision: &ConsentDecision,
        fresh_since: UnixMillis,
    ) -> Result<bool, SoulError> {
        let (status, scope, reason, token, token_id, expires) = match decision {
            ConsentDecision::Approve {
                scope,
                token,
                token_id,
                expires_at,
            } => (
                "approved",
                Some(scope.as_str()),
                None,
                Some(token.as_str()),
                token_id.as_deref(),
                Some(expires_at.0),
            ),
            ConsentDecision::Decline { reason } => {
                ("declined", None, reason.as_deref(), None, None, None)
            }
        };
        let update = "UPDATE consent_requests SET status = $1, decided_by = $2, decided_ms = $3, \
                      scope = $4, reason = $5, token = $6, token_id = $7, token_expires_ms = $8 \
                      WHERE id = $9 AND tenant = $10 AND status = 'pending' AND requested_ms >= $11";
        let changed: Result<u64, sqlx::Error> = on_db!(&self.db, p, sql, {
            sqlx::query(sql(update))
                .bind(status)
                .bind(by.as_str())
                .bind(at.0)
                .bind(scope)
                .bind(reason)
                .bind(token)
                .bind(token_id)
                .bind(expires)
                .bind(id)
                .bind(tenant.as_str())
                .bind(fresh_since.0)
                .execute(p)
                .await
                .map(|r| r.rows_affected())
        });
        changed
            .map(|n| n == 1)
            .map_err(|e| db_error("deciding a consent request", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant_of(t: &str) -> TenantId {
        TenantId::new(t).unwrap()
    }

    #[tokio::test]
    async fn a_revocation_is_seen_by_every_handle_on_the_database() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("e.db").display());
        let db = Db::connect(&url, true).await.unwrap();
        let a = SqlConsentRevocations::new(db.clone());
        let b = SqlConsentRevocations::new(db);
        assert!(!b.is_revoked("t1", &tenant_of("acme")).await.unwrap());
        let tenant = TenantId::new("acme").unwrap();
        let by = ActorId::new("approver").unwrap();
        a.revoke("t1", &tenant, &by, UnixMillis(5)).await.unwrap();
        a.revoke("t1", &tenant, &by, UnixMillis(6)).await.unwrap();
        assert!(b.is_revoked("t1", &tenant).await.unwrap());
        assert!(!b.is_revoked("t2", &tenant).await.unwrap());
        assert!(
            !b.is_revoked("t1", &tenant_of("globex")).await.unwrap(),
            "only the token's own tenant revokes it"
        );
    }
}
