//! Registry state on Postgres and SQLite, one versioned record per tool, tenant
//! override and allow-list: the [`RegistryLedger`] that replicas share.
//!
//! - [`RegistryStore::commit`] writes a change's records in one transaction, each
//!   only if it is still at the revision the change was computed from (else
//!   `REGISTRY.CONFLICT`, nothing written); on Postgres the same transaction
//!   announces each key on channel `soulbase_registry` (delivered at commit).
//! - [`RegistryStore::follow`] applies what other replicas (and the CLI's local
//!   mode) commit to Postgres: it `LISTEN`s, and every time the listening
//!   connection is (re)established it reads every record back and applies the
//!   newer ones, so a notification lost while the connection was down is never a
//!   change lost; a quiet connection is asked every few seconds whether it is
//!   alive, and everything is read back every minute or so. On SQLite (one
//!   process) there is nothing to follow: a change the CLI commits to the file
//!   of a running server reaches it at its next start (or refuses that server's
//!   next change of the same record as stale).
//! - Removed records stay as tombstones (`removed`), so their revision keeps
//!   growing and a replica that was away learns of the removal.

use std::collections::BTreeSet;
use std::time::Duration;

use async_trait::async_trait;
use soulbase_errors::{SoulError, SoulResult};
use soulbase_tools::ToolManifest;
use soulbase_tools::registry::admin::{
    Committed, RecordChange, RegistryAdmin, RegistryLedger, stale,
};
use soulbase_tools::registry::{ExportedOverride, ExportedTool, Record, RecordKey, ToolOwner};
use soulbase_types::{TenantId, ToolId, UnixMillis};
use sqlx::Row;
use sqlx::postgres::PgListener;

use crate::db::{Db, db_error};

/// The Postgres channel registry changes are announced on (payload: the
/// [`RecordKey`] as JSON).
pub const CHANNEL: &str = "soulbase_registry";

/// How long [`RegistryStore::follow`] waits before listening again after the
/// database could not be reached.
const RELISTEN: Duration = Duration::from_millis(250);
/// How long the follower's connection may stay quiet before it is asked whether
/// it is alive (and how long it has to answer).
const HEARTBEAT: Duration = Duration::from_secs(5);
/// Every this many quiet heartbeats, the follower reads everything back.
const READ_BACK_EVERY: u32 = 12;

/// One of the three registry tables.
struct Shape {
    table: &'static str,
    /// Primary-key columns, in [`key_values`] order.
    pk: &'static [&'static str],
    /// Value columns, in [`record_values`] order; `true`: JSON (`jsonb` on Postgres).
    cols: &'static [(&'static str, bool)],
}

const TOOLS: Shape = Shape {
    table: "registry_tools",
    pk: &["owner", "tool_id"],
    cols: &[("manifest", true), ("state", false), ("digest", false)],
};
const OVERRIDES: Shape = Shape {
    table: "registry_overrides",
    pk: &["tenant", "tool_id"],
    cols: &[("value", false)],
};
const ALLOW_LISTS: Shape = Shape {
    table: "registry_allow_lists",
    pk: &["tenant"],
    cols: &[("tools", true)],
};

fn shape(key: &RecordKey) -> &'static Shape {
    match key {
        RecordKey::Tool { .. } => &TOOLS,
        RecordKey::Override { .. } => &OVERRIDES,
        RecordKey::AllowList { .. } => &ALLOW_LISTS,
    }
}

fn owner_key(o: &ToolOwner) -> String {
    match o {
        ToolOwner::Global => String::new(),
        ToolOwner::Tenant(t) => t.to_string(),
    }
}

/// The primary-key values of `key`.
fn key_values(key: &RecordKey) -> Vec<String> {
    match key {
        RecordKey::Tool { owner, id } => vec![owner_key(owner), id.to_string()],
        RecordKey::Override { tenant, id } => vec![tenant.to_string(), id.to_string()],
        RecordKey::AllowList { tenant } => vec![tenant.to_string()],
    }
}

/// The value columns of `record`; for a tombstone (`None`), placeholders that
/// satisfy the table's constraints.
fn record_values(key: &RecordKey, record: Option<&Record>) -> SoulResult<Vec<String>> {
    Ok(match (key, record) {
        (_, Some(Record::Tool(t))) => vec![
            json(&t.manifest)?,
            t.state.as_str().to_owned(),
            t.digest.clone(),
        ],
        (_, Some(Record::Override(o))) => {
            vec![json(&o.value)?.trim_matches('"').to_owned()]
        }
        (_, Some(Record::AllowList { tools, .. })) => vec![json(tools)?],
        (RecordKey::Tool { .. }, None) => {
            vec!["{}".into(), "registered".into(), String::new()]
        }
        (RecordKey::Override { .. }, None) => vec!["paused".into()],
        (RecordKey::AllowList { .. }, None) => vec!["[]".into()],
    })
}

fn json<T: serde::Serialize>(v: &T) -> SoulResult<String> {
    serde_json::to_string(v).map_err(SoulError::internal)
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, SoulError> {
    serde_json::from_str(text).map_err(|e| db_error(what, e))
}

fn quoted(s: &str) -> String {
    format!("\"{s}\"")
}

/// A stored row back to a [`Committed`]: `pk` and `cols` as strings, in shape order.
fn committed(
    shape: &Shape,
    pk: &[String],
    cols: &[String],
    revision: i64,
    removed: bool,
) -> SoulResult<Committed> {
    let tenant = |s: &str| parse::<TenantId>("a stored tenant", &quoted(s));
    let tool_id = |s: &str| parse::<ToolId>("a stored tool id", &quoted(s));
    let key = match shape.table {
        "registry_tools" => RecordKey::Tool {
            owner: if pk[0].is_empty() {
                ToolOwner::Global
            } else {
                ToolOwner::Tenant(tenant(&pk[0])?)
            },
            id: tool_id(&pk[1])?,
        },
        "registry_overrides" => RecordKey::Override {
            tenant: tenant(&pk[0])?,
            id: tool_id(&pk[1])?,
        },
        _ => RecordKey::AllowList {
            tenant: tenant(&pk[0])?,
        },
    };
    let record = if removed {
        None
    } else {
        Some(match &key {
            RecordKey::Tool { owner, .. } => Record::Tool(Box::new(ExportedTool {
                owner: owner.clone(),
                manifest: parse::<ToolManifest>("a stored manifest", &cols[0])?,
                state: parse("a stored state", &quoted(&cols[1]))?,
                digest: cols[2].clone(),
            })),
            RecordKey::Override { tenant, id } => Record::Override(ExportedOverride {
                tenant: tenant.clone(),
                id: id.clone(),
                value: parse("a stored override", &quoted(&cols[0]))?,
            }),
            RecordKey::AllowList { tenant } => Record::AllowList {
                tenant: tenant.clone(),
                tools: parse::<BTreeSet<ToolId>>("a stored allow-list", &cols[0])?,
            },
        })
    };
    Ok(Committed {
        key,
        record,
        revision: u64::try_from(revision).unwrap_or(0),
    })
}

/// The SQL of one shape for one backend.
struct Sql {
    insert: String,
    update: String,
    select_one: String,
    select_all: String,
}

fn sql(shape: &Shape, postgres: bool) -> Sql {
    let p = if postgres { "$" } else { "?" };
    let cast = |json: bool| if postgres && json { "::jsonb" } else { "" };
    let out = |json: bool| if postgres && json { "::text" } else { "" };
    let n_pk = shape.pk.len();
    let n_cols = shape.cols.len();
    // Parameters: pk…, cols…, removed, updated_ms, revision (new), expected.
    let mut names: Vec<String> = shape.pk.iter().map(|c| (*c).to_owned()).collect();
    names.extend(shape.cols.iter().map(|(c, _)| (*c).to_owned()));
    let mut values: Vec<String> = (1..=n_pk).map(|i| format!("{p}{i}")).collect();
    values.extend(
        shape
            .cols
            .iter()
            .enumerate()
            .map(|(i, (_, json))| format!("{p}{}{}", n_pk + 1 + i, cast(*json))),
    );
    let (removed, updated, revision, expected) = (
        n_pk + n_cols + 1,
        n_pk + n_cols + 2,
        n_pk + n_cols + 3,
        n_pk + n_cols + 4,
    );
    let insert = format!(
        "INSERT INTO {t} ({names}, removed, updated_ms, revision) VALUES ({values}, {p}{removed}, {p}{updated}, {p}{revision}) ON CONFLICT DO NOTHING",
        t = shape.table,
        names = names.join(", "),
        values = values.join(", "),
    );
    let sets: Vec<String> = shape
        .cols
        .iter()
        .enumerate()
        .map(|(i, (c, json))| format!("{c} = {p}{}{}", n_pk + 1 + i, cast(*json)))
        .collect();
    let wheres: Vec<String> = shape
        .pk
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{c} = {p}{}", i + 1))
        .collect();
    let update = format!(
        "UPDATE {t} SET {sets}, removed = {p}{removed}, updated_ms = {p}{updated}, revision = {p}{revision} WHERE {wheres} AND revision = {p}{expected}",
        t = shape.table,
        sets = sets.join(", "),
        wheres = wheres.join(" AND "),
    );
    let mut read: Vec<String> = shape.pk.iter().map(|c| (*c).to_owned()).collect();
    read.extend(
        shape
            .cols
            .iter()
            .map(|(c, json)| format!("{c}{}", out(*json))),
    );
    let read = format!("{}, revision, removed", read.join(", "));
    let select_one = format!(
        "SELECT {read} FROM {t} WHERE {wheres}",
        t = shape.table,
        wheres = wheres.join(" AND ")
    );
    let select_all = format!("SELECT {read} FROM {t}", t = shape.table);
    Sql {
        insert,
        update,
        select_one,
        select_all,
    }
}

/// Persisted registry state, shared by every process on the same database.
#[derive(Clone, Debug)]
pub struct RegistryStore {
    db: Db,
}

/// Commits `changes` in one transaction on `$pool` (see [`RegistryStore::commit`]).
macro_rules! commit_with {
    ($pool:expr, $postgres:expr, $changes:expr) => {{
        let err = |e| db_error("saving a registry change", e);
        let now = UnixMillis::now().0;
        let mut tx = $pool.begin().await.map_err(err)?;
        let mut out = Vec::with_capacity($changes.len());
        for c in $changes {
            let shape = shape(&c.key);
            let sql = sql(shape, $postgres);
            let text = sql_text(&c.key, c.record.as_ref())?;
            let revision = c.expected + 1;
            let statement = if c.expected == 0 {
                &sql.insert
            } else {
                &sql.update
            };
            // Built from the constant shapes above only: no input reaches the text.
            let mut q = sqlx::query(sqlx::AssertSqlSafe(statement.clone()));
            for v in &text {
                q = q.bind(v.as_str());
            }
            let q = q
                .bind(c.record.is_none())
                .bind(now)
                .bind(i64::try_from(revision).map_err(SoulError::internal)?)
                .bind(i64::try_from(c.expected).map_err(SoulError::internal)?);
            let done = q.execute(&mut *tx).await.map_err(err)?;
            if done.rows_affected() != 1 {
                return Err(stale(&c.key));
            }
            if $postgres {
                let payload = serde_json::to_string(&c.key).map_err(SoulError::internal)?;
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(CHANNEL)
                    .bind(payload)
                    .execute(&mut *tx)
                    .await
                    .map_err(err)?;
            }
            out.push(Committed {
                key: c.key.clone(),
                record: c.record.clone(),
                revision,
            });
        }
        tx.commit().await.map_err(err)?;
        Ok(out)
    }};
}

/// Reads rows of `$shape` with `$statement` (binding `$binds`) on `$pool`.
macro_rules! read_with {
    ($pool:expr, $shape:expr, $statement:expr, $binds:expr) => {{
        // Built from the constant shapes only: no input reaches the text.
        let mut q = sqlx::query(sqlx::AssertSqlSafe($statement.to_owned()));
        for v in $binds {
            q = q.bind(v.as_str());
        }
        let rows = q
            .fetch_all($pool)
            .await
            .map_err(|e| db_error("loading the registry", e))?;
        let mut out = Vec::with_capacity(rows.len());
        let (n_pk, n_cols) = ($shape.pk.len(), $shape.cols.len());
        for row in rows {
            let get = |i: usize| -> SoulResult<String> {
                row.try_get::<String, _>(i)
                    .map_err(|e| db_error("reading a registry row", e))
            };
            let pk = (0..n_pk).map(get).collect::<SoulResult<Vec<_>>>()?;
            let cols = (n_pk..n_pk + n_cols)
                .map(get)
                .collect::<SoulResult<Vec<_>>>()?;
            let revision: i64 = row
                .try_get(n_pk + n_cols)
                .map_err(|e| db_error("reading a registry row", e))?;
            let removed: bool = row
                .try_get(n_pk + n_cols + 1)
                .map_err(|e| db_error("reading a registry row", e))?;
            // One row this build cannot read (a manifest a newer one stored,
            // during a rolling upgrade) must not stop the rest: it is left out,
            // so its key stays at the revision this process last placed.
            match committed($shape, &pk, &cols, revision, removed) {
                Ok(c) => out.push(c),
                Err(e) => tracing::warn!(
                    table = $shape.table,
                    key = ?pk,
                    error = %e,
                    "a registry row this build cannot read is left out"
                ),
            }
        }
        Ok::<_, SoulError>(out)
    }};
}

/// Every text parameter of a change: the key's, then the record's.
fn sql_text(key: &RecordKey, record: Option<&Record>) -> SoulResult<Vec<String>> {
    let mut v = key_values(key);
    v.extend(record_values(key, record)?);
    Ok(v)
}

impl RegistryStore {
    /// A store on `db` (migrated).
    pub fn new(db: Db) -> Self {
        Self { db }
    }

    /// Every record as committed now, tombstones included.
    pub async fn load_all(&self) -> SoulResult<Vec<Committed>> {
        let mut out = Vec::new();
        for shape in [&TOOLS, &OVERRIDES, &ALLOW_LISTS] {
            let none: [String; 0] = [];
            out.extend(match &self.db {
                Db::Postgres(p) => {
                    read_with!(p, shape, sql(shape, true).select_all.as_str(), none)?
                }
                Db::Sqlite(p) => read_with!(p, shape, sql(shape, false).select_all.as_str(), none)?,
            });
        }
        Ok(out)
    }

    /// Loads every stored record into `admin` (see
    /// [`RegistryAdmin::apply_stored`]); returns how many were placed.
    pub async fn restore_into(&self, admin: &RegistryAdmin) -> SoulResult<usize> {
        let records = self.load_all().await?;
        let report = admin.apply_stored(records);
        Ok(report.placed.len())
    }

    /// Applies, for as long as the returned task runs, every record other
    /// processes commit to this Postgres database (see the module doc): within a
    /// notification's round trip while connected; after an outage, by reading
    /// every record back once listening again. On SQLite (one process) it does
    /// nothing.
    pub fn follow(&self, admin: RegistryAdmin) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        tokio::spawn(async move {
            let Db::Postgres(pool) = &store.db else {
                return;
            };
            loop {
                let mut listener = match PgListener::connect_with(pool).await {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::debug!(error = %e, "registry follower cannot connect; retrying");
                        tokio::time::sleep(RELISTEN).await;
                        continue;
                    }
                };
                if let Err(e) = listener.listen(CHANNEL).await {
                    tracing::debug!(error = %e, "registry follower cannot listen; retrying");
                    tokio::time::sleep(RELISTEN).await;
                    continue;
                }
                // Listening: whatever was committed before now is read back here,
                // whatever is committed from now on is announced.
                match store.load_all().await {
                    Ok(all) => {
                        admin.apply_stored(all);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "registry follower cannot read the registry; retrying");
                        tokio::time::sleep(RELISTEN).await;
                        continue;
                    }
                }
                // A lost connection (`Ok(None)`) or an error: listen again, and
                // read everything back. A connection can also die without a word
                // (a half-open socket): when nothing arrives for a while it is
                // asked a question, and everything is read back now and then.
                let mut quiet = 0u32;
                loop {
                    match tokio::time::timeout(HEARTBEAT, listener.try_recv()).await {
                        Ok(Ok(Some(n))) => {
                            let Ok(key) = serde_json::from_str::<RecordKey>(n.payload()) else {
                                tracing::warn!(
                                    payload = n.payload(),
                                    "unreadable registry announcement"
                                );
                                continue;
                            };
                            match store.fetch(std::slice::from_ref(&key)).await {
                                Ok(found) => {
                                    admin.apply_stored(found);
                                }
                                Err(_) => break,
                            }
                        }
                        Ok(Ok(None) | Err(_)) => break,
                        Err(_) => {
                            let alive = tokio::time::timeout(
                                HEARTBEAT,
                                sqlx::query("SELECT 1").execute(&mut listener),
                            )
                            .await;
                            if !matches!(alive, Ok(Ok(_))) {
                                break;
                            }
                            quiet += 1;
                            if quiet.is_multiple_of(READ_BACK_EVERY) {
                                match store.load_all().await {
                                    Ok(all) => {
                                        admin.apply_stored(all);
                                    }
                                    Err(_) => break,
                                }
                            }
                        }
                    }
                }
                tracing::info!("registry follower lost its connection; listening again");
                tokio::time::sleep(RELISTEN).await;
            }
        })
    }
}

#[async_trait]
impl RegistryLedger for RegistryStore {
    async fn commit(&self, changes: &[RecordChange]) -> SoulResult<Vec<Committed>> {
        match &self.db {
            Db::Postgres(p) => commit_with!(p, true, changes),
            Db::Sqlite(p) => commit_with!(p, false, changes),
        }
    }

    async fn fetch(&self, keys: &[RecordKey]) -> SoulResult<Vec<Committed>> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let shape = shape(key);
            let binds = key_values(key);
            out.extend(match &self.db {
                Db::Postgres(p) => {
                    read_with!(p, shape, sql(shape, true).select_one.as_str(), &binds)?
                }
                Db::Sqlite(p) => {
                    read_with!(p, shape, sql(shape, false).select_one.as_str(), &binds)?
                }
            });
        }
        Ok(out)
    }
}
