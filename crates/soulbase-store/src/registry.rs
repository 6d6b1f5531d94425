//! Registry state on Postgres and SQLite: saved as a whole snapshot whenever the
//! registry changes, loaded at start-up to restore it.

use std::collections::BTreeSet;
use std::time::Duration;

use soulbase_errors::SoulError;
use soulbase_tools::ToolManifest;
use soulbase_tools::registry::{
    ExportedOverride, ExportedTool, Registry, RegistryExport, RestoreReport, TenantOverride,
    ToolOwner, ToolState,
};
use soulbase_types::{TenantId, ToolId, UnixMillis};
use tokio::sync::broadcast::error::RecvError;

use crate::db::{Db, db_error};

/// A stored tool: owner, manifest JSON, state, digest.
type ToolRow = (String, String, String, String);
/// A stored override: tenant, tool id, value.
type OverrideRow = (String, String, String);
/// A stored allow-list: tenant, JSON array of tool ids.
type AllowRow = (String, String);

/// Persisted registry state.
#[derive(Clone, Debug)]
pub struct RegistryStore {
    db: Db,
}

fn owner_key(o: &ToolOwner) -> String {
    match o {
        ToolOwner::Global => String::new(),
        ToolOwner::Tenant(t) => t.to_string(),
    }
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, SoulError> {
    serde_json::from_str(text).map_err(|e| db_error(what, e))
}

fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

impl RegistryStore {
    /// A store on `db` (migrated).
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Replaces the stored state with `export`, atomically.
    pub async fn save(&self, export: &RegistryExport) -> Result<(), SoulError> {
        let now = UnixMillis::now().0;
        let mut tools = Vec::with_capacity(export.tools.len());
        for t in &export.tools {
            tools.push((
                owner_key(&t.owner),
                t.manifest.id.to_string(),
                serde_json::to_string(&t.manifest).map_err(SoulError::internal)?,
                t.state.as_str(),
                t.digest.clone(),
            ));
        }
        let overrides: Vec<(String, String, String)> = export
            .overrides
            .iter()
            .map(|o| {
                let v = serde_json::to_string(&o.value).unwrap_or_default();
                (
                    o.tenant.to_string(),
                    o.id.to_string(),
                    v.trim_matches('"').to_owned(),
                )
            })
            .collect();
        let allows: Vec<(String, String)> = export
            .allow_lists
            .iter()
            .map(|(t, ids)| {
                (
                    t.to_string(),
                    serde_json::to_string(ids).unwrap_or_default(),
                )
            })
            .collect();
        let err = |e| db_error("saving the registry", e);
        macro_rules! save_with {
            ($pool:expr, $p:literal, $cast:literal) => {{
                let mut tx = $pool.begin().await.map_err(err)?;
                for table in ["registry_tools", "registry_overrides", "registry_allow_lists"] {
                    let sql = match table {
                        "registry_tools" => "DELETE FROM registry_tools",
                        "registry_overrides" => "DELETE FROM registry_overrides",
                        _ => "DELETE FROM registry_allow_lists",
                    };
                    sqlx::query(sql).execute(&mut *tx).await.map_err(err)?;
                }
                for (owner, id, manifest, state, digest) in &tools {
                    sqlx::query(concat!(
                        "INSERT INTO registry_tools (owner, tool_id, manifest, state, digest, updated_ms) VALUES (",
                        $p, "1, ", $p, "2, ", $p, "3", $cast, ", ", $p, "4, ", $p, "5, ", $p, "6)"
                    ))
                    .bind(owner)
                    .bind(id)
                    .bind(manifest)
                    .bind(*state)
                    .bind(digest)
                    .bind(now)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
                }
                for (tenant, id, value) in &overrides {
                    sqlx::query(concat!(
                        "INSERT INTO registry_overrides (tenant, tool_id, value) VALUES (",
                        $p, "1, ", $p, "2, ", $p, "3)"
                    ))
                    .bind(tenant)
                    .bind(id)
                    .bind(value)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
                }
                for (tenant, ids) in &allows {
                    sqlx::query(concat!(
                        "INSERT INTO registry_allow_lists (tenant, tools) VALUES (",
                        $p, "1, ", $p, "2", $cast, ")"
                    ))
                    .bind(tenant)
                    .bind(ids)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
                }
                tx.commit().await.map_err(err)
            }};
        }
        match &self.db {
            Db::Postgres(p) => save_with!(p, "$", "::jsonb"),
            Db::Sqlite(p) => save_with!(p, "?", ""),
        }
    }

    /// The stored state (empty when nothing was saved).
    pub async fn load(&self) -> Result<RegistryExport, SoulError> {
        let err = |e| db_error("loading the registry", e);
        let (tools, overrides, allows): (Vec<ToolRow>, Vec<OverrideRow>, Vec<AllowRow>) = match &self.db {
            Db::Postgres(p) => (
                sqlx::query_as("SELECT owner, manifest::text, state, digest FROM registry_tools ORDER BY owner, tool_id")
                    .fetch_all(p).await.map_err(err)?,
                sqlx::query_as("SELECT tenant, tool_id, value FROM registry_overrides ORDER BY tenant, tool_id")
                    .fetch_all(p).await.map_err(err)?,
                sqlx::query_as("SELECT tenant, tools::text FROM registry_allow_lists ORDER BY tenant")
                    .fetch_all(p).await.map_err(err)?,
            ),
            Db::Sqlite(p) => (
                sqlx::query_as("SELECT owner, manifest, state, digest FROM registry_tools ORDER BY owner, tool_id")
                    .fetch_all(p).await.map_err(err)?,
                sqlx::query_as("SELECT tenant, tool_id, value FROM registry_overrides ORDER BY tenant, tool_id")
                    .fetch_all(p).await.map_err(err)?,
                sqlx::query_as("SELECT tenant, tools FROM registry_allow_lists ORDER BY tenant")
                    .fetch_all(p).await.map_err(err)?,
            ),
        };
        let mut out = RegistryExport::default();
        for (owner, manifest, state, digest) in tools {
            let owner = if owner.is_empty() {
                ToolOwner::Global
            } else {
                ToolOwner::Tenant(parse::<TenantId>("a stored tenant", &quoted(&owner))?)
            };
            out.tools.push(ExportedTool {
                owner,
                manifest: parse::<ToolManifest>("a stored manifest", &manifest)?,
                state: parse::<ToolState>("a stored state", &quoted(&state))?,
                digest,
            });
        }
        for (tenant, id, value) in overrides {
            out.overrides.push(ExportedOverride {
                tenant: parse("a stored tenant", &quoted(&tenant))?,
                id: parse("a stored tool id", &quoted(&id))?,
                value: parse::<TenantOverride>("a stored override", &quoted(&value))?,
            });
        }
        for (tenant, ids) in allows {
            out.allow_lists.push((
                parse("a stored tenant", &quoted(&tenant))?,
                parse::<BTreeSet<ToolId>>("a stored allow-list", &ids)?,
            ));
        }
        Ok(out)
    }

    /// Loads the stored state into `registry` (see [`Registry::restore`]).
    pub async fn restore_into(&self, registry: &Registry) -> Result<RestoreReport, SoulError> {
        let export = self.load().await?;
        let report = registry.restore(export);
        for (what, e) in &report.failed {
            tracing::warn!(what, error = %e, "could not restore part of the registry");
        }
        Ok(report)
    }

    /// Saves `registry` now, then after every change it publishes (changes that
    /// arrive together are saved once). A failed save (database down) is retried
    /// every second until it lands. Runs until the returned task is aborted.
    pub fn persist(&self, registry: &Registry) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        let mut events = registry.subscribe();
        let registry = registry.clone();
        tokio::spawn(async move {
            loop {
                let saved = store.save(&registry.export()).await;
                if let Err(e) = &saved {
                    tracing::error!(error = %e, "could not persist the registry; retrying");
                }
                let next = if saved.is_ok() {
                    Some(events.recv().await)
                } else {
                    tokio::time::timeout(Duration::from_secs(1), events.recv())
                        .await
                        .ok()
                };
                match next {
                    Some(Ok(_) | Err(RecvError::Lagged(_))) | None => {
                        while events.try_recv().is_ok() {}
                    }
                    Some(Err(RecvError::Closed)) => return,
                }
            }
        })
    }
}
