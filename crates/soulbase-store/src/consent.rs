//! Revoked consent tokens, kept with the evidence so every replica sharing the
//! database refuses a revoked token from its next call on.

use async_trait::async_trait;
use soulbase_auth::ConsentRevocations;
use soulbase_errors::SoulError;
use soulbase_types::{ActorId, TenantId, UnixMillis};

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
