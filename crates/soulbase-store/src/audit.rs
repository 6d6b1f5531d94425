//! The audit of changes, kept with the evidence so every replica sharing the
//! database writes to and reads one log (`audit_log`, migration 0009).

use async_trait::async_trait;
use soulbase_errors::SoulError;
use soulbase_observe::{AuditFilter, AuditKind, AuditLog, AuditRecord};
use soulbase_types::{ActorId, EnvelopeId, TenantId, UnixMillis};
use sqlx::QueryBuilder;

use crate::Db;
use crate::db::db_error;

/// [`AuditLog`] in the `audit_log` table.
#[derive(Debug, Clone)]
pub struct SqlAuditLog {
    db: Db,
}

impl SqlAuditLog {
    /// The audit log in `db` (migrated).
    pub fn new(db: Db) -> Self {
        Self { db }
    }
}

/// A row as selected: id, at, tenant, actor, actor tenant, kind, target, before,
/// after, detail.
type Row = (
    String,
    i64,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
);

const COLUMNS: &str =
    "id, at_ms, tenant, actor, actor_tenant, kind, target, before_hash, after_hash, detail";

fn decode(row: Row) -> Result<AuditRecord, SoulError> {
    let (id, at, tenant, actor, actor_tenant, kind, target, before, after, detail) = row;
    let bad = |what: &str| db_error("reading the audit log", format!("a row with a bad {what}"));
    Ok(AuditRecord {
        id: EnvelopeId::new(id).map_err(|_| bad("id"))?,
        at: UnixMillis(at),
        tenant: TenantId::new(tenant).map_err(|_| bad("tenant"))?,
        actor: ActorId::new(actor).map_err(|_| bad("actor"))?,
        actor_tenant: TenantId::new(actor_tenant).map_err(|_| bad("actor tenant"))?,
        kind: kind.parse::<AuditKind>().map_err(|_| bad("kind"))?,
        target,
        before_hash: before,
        after_hash: after,
        detail,
    })
}

/// `SELECT … WHERE <filter> ORDER BY at_ms DESC, seq DESC LIMIT n` (newest
/// first; within one millisecond, the last written first) for either database
/// (the builder writes each one's placeholders).
macro_rules! select {
    ($db:ty, $f:expr) => {{
        let f: &AuditFilter = $f;
        let mut qb =
            QueryBuilder::<$db>::new(format!("SELECT {COLUMNS} FROM audit_log WHERE 1 = 1"));
        if let Some(t) = &f.tenant {
            qb.push(" AND tenant = ").push_bind(t.as_str().to_owned());
        }
        if let Some(k) = f.kind {
            qb.push(" AND kind = ").push_bind(k.as_str().to_owned());
        }
        if let Some(t) = &f.target {
            qb.push(" AND target = ").push_bind(t.clone());
        }
        if let Some(s) = f.since {
            qb.push(" AND at_ms >= ").push_bind(s.0);
        }
        if let Some(u) = f.until {
            qb.push(" AND at_ms < ").push_bind(u.0);
        }
        qb.push(" ORDER BY at_ms DESC, seq DESC LIMIT ")
            .push_bind(i64::from(f.limit));
        qb
    }};
}

#[async_trait]
impl AuditLog for SqlAuditLog {
    async fn append(&self, r: &AuditRecord) -> Result<(), SoulError> {
        let done = match &self.db {
            Db::Postgres(p) => sqlx::query(
                "INSERT INTO audit_log (id, at_ms, tenant, actor, actor_tenant, kind, target, \
                 before_hash, after_hash, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) ON CONFLICT (id) DO NOTHING",
            )
            .bind(r.id.as_str())
            .bind(r.at.0)
            .bind(r.tenant.as_str())
            .bind(r.actor.as_str())
            .bind(r.actor_tenant.as_str())
            .bind(r.kind.as_str())
            .bind(r.target.as_str())
            .bind(r.before_hash.as_deref())
            .bind(r.after_hash.as_deref())
            .bind(r.detail.as_str())
            .execute(p)
            .await
            .map(drop),
            Db::Sqlite(p) => sqlx::query(
                "INSERT INTO audit_log (id, at_ms, tenant, actor, actor_tenant, kind, target, \
                 before_hash, after_hash, detail) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) ON CONFLICT (id) DO NOTHING",
            )
            .bind(r.id.as_str())
            .bind(r.at.0)
            .bind(r.tenant.as_str())
            .bind(r.actor.as_str())
            .bind(r.actor_tenant.as_str())
            .bind(r.kind.as_str())
            .bind(r.target.as_str())
            .bind(r.before_hash.as_deref())
            .bind(r.after_hash.as_deref())
            .bind(r.detail.as_str())
            .execute(p)
            .await
            .map(drop),
        };
        done.map_err(|e| db_error("writing an audit record", e))
    }

    async fn list(&self, filter: &AuditFilter) -> Result<Vec<AuditRecord>, SoulError> {
        filter.validate()?;
        let rows: Result<Vec<Row>, sqlx::Error> = match &self.db {
            Db::Postgres(p) => {
                let mut qb = select!(sqlx::Postgres, filter);
                qb.build_query_as().fetch_all(p).await
            }
            Db::Sqlite(p) => {
                let mut qb = select!(sqlx::Sqlite, filter);
                qb.build_query_as().fetch_all(p).await
            }
        };
        rows.map_err(|e| db_error("reading the audit log", e))?
            .into_iter()
            .map(decode)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use soulbase_types::Subject;

    fn subject(t: &str, a: &str) -> Subject {
        Subject::new(TenantId::new(t).unwrap(), ActorId::new(a).unwrap())
    }

    #[tokio::test]
    async fn records_are_appended_once_and_listed_by_filter_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite:{}", dir.path().join("e.db").display());
        let db = Db::connect(&url, true).await.unwrap();
        let a = SqlAuditLog::new(db.clone());
        let b = SqlAuditLog::new(db);
        let alice = subject("acme", "alice");
        let acme = TenantId::new("acme").unwrap();
        let mut one = AuditRecord::new(acme.clone(), &alice, AuditKind::RegistryRegister, "a.b.c")
            .hashes(None, Some("h1".into()))
            .detail("version 1.0.0");
        one.at = UnixMillis(10);
        let mut two = AuditRecord::new(
            TenantId::global(),
            &soulbase_observe::system_subject(),
            AuditKind::ConfigReload,
            "config.yaml",
        )
        .hashes(Some("h0".into()), Some("h1".into()));
        two.at = UnixMillis(20);
        a.append(&one).await.unwrap();
        a.append(&one).await.unwrap();
        a.append(&two).await.unwrap();
        assert_eq!(
            b.list(&AuditFilter::newest(10)).await.unwrap(),
            vec![two.clone(), one.clone()]
        );
        let acme_only = AuditFilter {
            tenant: Some(acme),
            ..AuditFilter::newest(10)
        };
        assert_eq!(b.list(&acme_only).await.unwrap(), vec![one.clone()]);
        let by_kind = AuditFilter {
            kind: Some(AuditKind::ConfigReload),
            target: Some("config.yaml".into()),
            since: Some(UnixMillis(20)),
            until: Some(UnixMillis(21)),
            ..AuditFilter::newest(10)
        };
        assert_eq!(b.list(&by_kind).await.unwrap(), vec![two.clone()]);
        assert_eq!(b.list(&AuditFilter::newest(1)).await.unwrap(), vec![two]);
        assert!(b.list(&AuditFilter::newest(0)).await.is_err());
    }
}
