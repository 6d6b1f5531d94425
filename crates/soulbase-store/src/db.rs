//! Connecting to the two backends, with the settings evidence needs.

use std::str::FromStr;
use std::time::Duration;

use soulbase_errors::{ErrorCode, SoulError};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};

use crate::migrations;

/// A connection pool on one of the supported backends.
#[derive(Clone, Debug)]
pub enum Db {
    /// PostgreSQL (production; shared by replicas).
    Postgres(PgPool),
    /// SQLite (the embedded default; one process).
    Sqlite(SqlitePool),
}

/// The page size of a SQLite database this module creates (see [`Db::connect`]).
pub const SQLITE_PAGE_SIZE: u32 = 16 * 1024;

/// A database failure as `EVIDENCE.UNAVAILABLE` with the cause in the audit view.
pub fn db_error(what: &str, e: impl std::fmt::Display) -> SoulError {
    SoulError::new(
        ErrorCode::EvidenceUnavailable,
        "the database is unavailable",
    )
    .with_note(format!("{what}: {e}"))
}

/// The pool settings of every SQLite database the store opens: four connections,
/// no ping before each use (a file connection does not go stale, and the ping is a
/// round trip to the connection's thread, two thread wakeups, before every query),
/// and no connection handed out that sqlx still counts in a transaction.
///
/// That count goes wrong when SQLite rolls a transaction back by itself — a full
/// disk or an I/O error in the middle of a statement, or at `COMMIT` — for any of
/// the store's transactions (evidence batches, idempotency, the registry): sqlx-sqlite
/// 0.9 then sends its own `ROLLBACK`, which fails ("no transaction is active"), and
/// keeps the transaction counted (its depth only drops when the `ROLLBACK`
/// succeeds). The connection's next transaction would be a `SAVEPOINT`, whose
/// rollback (`ROLLBACK TO`) leaves a real transaction open: every later write on
/// that connection would answer Ok and never be committed, while holding SQLite's
/// write lock. Such a connection is closed when it is next taken from the pool
/// instead. (A transaction dropped without a commit is rolled back by the
/// connection's thread after the drop; the pool pings the connection as it comes
/// back, so that rollback is done, and its count right, before this check.)
pub fn sqlite_pool_options() -> SqlitePoolOptions {
    SqlitePoolOptions::new()
        .max_connections(4)
        .test_before_acquire(false)
        .before_acquire(|conn, _| {
            Box::pin(async move {
                use sqlx::Connection as _;
                if conn.is_in_transaction() {
                    // Not counted right yet only if the pool stops pinging on release.
                    conn.ping().await?;
                }
                Ok(!conn.is_in_transaction())
            })
        })
}

fn bad_url(message: &'static str) -> SoulError {
    SoulError::new(ErrorCode::ConfigInvalid, message).with_field("field", "evidence.url")
}

impl Db {
    /// Connects to `url` (`postgres://…`, `postgresql://…` or `sqlite:…`); with
    /// `migrate`, creates the SQLite file if needed and applies pending migrations.
    ///
    /// Postgres connects lazily: a server that is down now is retried by each use, so
    /// a process can start during an outage (the spool holds evidence meanwhile).
    ///
    /// sqlx 0.9 leaves Nagle on for Postgres over TCP (no `TCP_NODELAY`, and no
    /// option or hook to set it). Its queries cost nothing for it — each round trip
    /// is one buffered write, then a read — but its `COPY` is two writes before a
    /// read, which is why small evidence batches are not `COPY`ed
    /// ([`COPY_MIN_BYTES`](crate::COPY_MIN_BYTES)). Postgres sets it on its side.
    pub async fn connect(url: &str, migrate: bool) -> Result<Db, SoulError> {
        let db = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // The spool checkpoint advances once a batch is committed: the commit
            // must be durable even on a server that defaults to asynchronous commit.
            let opts = PgConnectOptions::from_str(url)
                .map_err(|_| bad_url("not a valid postgres:// URL"))?
                .options([("synchronous_commit", "on")]);
            let pool = PgPoolOptions::new()
                .max_connections(16)
                .acquire_timeout(Duration::from_secs(3))
                .connect_lazy_with(opts);
            Db::Postgres(pool)
        } else if url.starts_with("sqlite:") {
            // The file is created if missing, so its directory must exist too.
            if let Some(dir) = url
                .strip_prefix("sqlite://")
                .or_else(|| url.strip_prefix("sqlite:"))
                .map(|p| p.split('?').next().unwrap_or(p))
                .and_then(|p| std::path::Path::new(p).parent())
                .filter(|p| !p.as_os_str().is_empty())
            {
                std::fs::create_dir_all(dir)
                    .map_err(|e| db_error("creating the SQLite directory", e))?;
            }
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(|_| bad_url("not a valid sqlite: URL"))?
                .create_if_missing(true)
                // A database created here gets 16 KiB pages: evidence rows are
                // ~0.4-0.7 KB, and larger pages take the drain's inserts with
                // fewer B-tree splits and a quarter of the WAL frames (two
                // writes each), ~15 % less CPU per row than 4 KiB pages. A
                // database made before keeps its page size (WAL mode cannot
                // change it).
                .page_size(SQLITE_PAGE_SIZE)
                .journal_mode(SqliteJournalMode::Wal)
                // The spool checkpoint advances after a commit: the commit must be durable.
                .synchronous(SqliteSynchronous::Full)
                // Temporary tables, sorts and statement journals in memory, not in
                // files created, written and deleted in the system's temp directory
                // (the drain's inserts keep no statement journal, see
                // `sqlite_insert_text`).
                .pragma("temp_store", "memory")
                .busy_timeout(Duration::from_secs(10));
            let pool = sqlite_pool_options()
                .connect_with(opts)
                .await
                .map_err(|e| db_error("opening SQLite", e))?;
            Db::Sqlite(pool)
        } else {
            return Err(bad_url(
                "the database URL must start with postgres://, postgresql:// or sqlite:",
            ));
        };
        if migrate {
            db.migrate().await?;
        }
        Ok(db)
    }

    /// Applies every pending migration of this backend. After an error the pool
    /// is best dropped, as [`connect`](Self::connect) does: a failed migration may
    /// leave connection state its transaction does not undo (SQLite's migration 13
    /// turns `writable_schema` on for its edit).
    pub async fn migrate(&self) -> Result<(), SoulError> {
        match self {
            Db::Postgres(pool) => migrations::postgres().run(pool).await,
            Db::Sqlite(pool) => migrations::sqlite().run(pool).await,
        }
        .map_err(|e| db_error("applying migrations", e))
    }

    /// Closes the pool.
    pub async fn close(&self) {
        match self {
            Db::Postgres(p) => p.close().await,
            Db::Sqlite(p) => p.close().await,
        }
    }
}
