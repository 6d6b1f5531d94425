//! `cargo xtask migrate`: apply `migrations/` to a database with sqlx.

use std::path::PathBuf;

use sqlx::migrate::{MigrateDatabase, Migrator};

use crate::{Result, root};

/// The database kinds Soulbase keeps migrations for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// `postgres://…` — production.
    Postgres,
    /// `sqlite:…` — the embedded default.
    Sqlite,
}

impl Backend {
    /// Picks the backend from a URL's scheme.
    pub fn of_url(url: &str) -> Result<Backend> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Backend::Sqlite)
        } else {
            Err("the database URL must start with postgres://, postgresql:// or sqlite:".into())
        }
    }

    /// The migrations directory for this backend.
    pub fn dir(self) -> PathBuf {
        root().join("migrations").join(match self {
            Backend::Postgres => "postgres",
            Backend::Sqlite => "sqlite",
        })
    }
}

/// Creates the database if needed and applies every pending migration; returns how many exist.
pub async fn apply(url: &str) -> Result<usize> {
    let backend = Backend::of_url(url)?;
    let migrator = Migrator::new(backend.dir())
        .await
        .map_err(|e| format!("reading {}: {e}", backend.dir().display()))?;
    match backend {
        Backend::Postgres => {
            if !sqlx::Postgres::database_exists(url)
                .await
                .map_err(|e| format!("connecting to Postgres: {e}"))?
            {
                sqlx::Postgres::create_database(url)
                    .await
                    .map_err(|e| format!("creating the database: {e}"))?;
            }
            let pool = sqlx::PgPool::connect(url)
                .await
                .map_err(|e| format!("connecting to Postgres: {e}"))?;
            migrator
                .run(&pool)
                .await
                .map_err(|e| format!("migrating: {e}"))?;
            pool.close().await;
        }
        Backend::Sqlite => {
            if !sqlx::Sqlite::database_exists(url).await.unwrap_or(false) {
                sqlx::Sqlite::create_database(url)
                    .await
                    .map_err(|e| format!("creating the SQLite file: {e}"))?;
            }
            let pool = sqlx::SqlitePool::connect(url)
                .await
                .map_err(|e| format!("opening SQLite: {e}"))?;
            migrator
                .run(&pool)
                .await
                .map_err(|e| format!("migrating: {e}"))?;
            pool.close().await;
        }
    }
    Ok(migrator.iter().count())
}

/// `cargo xtask migrate [--database-url URL]`.
pub fn run(args: &[String]) -> Result<()> {
    let url = match args {
        [flag, url] if flag == "--database-url" => url.clone(),
        [] => std::env::var("DATABASE_URL").map_err(|_| {
            "set DATABASE_URL (e.g. postgres://postgres@127.0.0.1:5432/soulbase) or pass --database-url URL"
                .to_owned()
        })?,
        _ => return Err("usage: cargo xtask migrate [--database-url URL]".into()),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let n = rt.block_on(apply(&url))?;
    eprintln!("xtask: ✔ database is at the latest of {n} migration(s)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_from_url() {
        assert_eq!(
            Backend::of_url("postgres://u@h/db").unwrap(),
            Backend::Postgres
        );
        assert_eq!(
            Backend::of_url("postgresql://u@h/db").unwrap(),
            Backend::Postgres
        );
        assert_eq!(Backend::of_url("sqlite://x.db").unwrap(), Backend::Sqlite);
        assert!(Backend::of_url("mysql://x").is_err());
    }

    /// Applies the migrations twice to a brand-new Postgres database: the second run is a no-op.
    #[tokio::test]
    async fn migrations_apply_to_a_fresh_postgres_database() {
        let base = std::env::var("DATABASE_URL")
            .expect("DATABASE_URL must be set: run the suite with `cargo xtask test`");
        let db = format!("xtask_migrate_{}", std::process::id());
        let (server, _) = base
            .rsplit_once('/')
            .expect("DATABASE_URL has a database name");
        let url = format!("{server}/{db}");
        let _ = sqlx::Postgres::drop_database(&url).await;
        let n = apply(&url).await.unwrap();
        assert_eq!(apply(&url).await.unwrap(), n);
        let pool = sqlx::PgPool::connect(&url).await.unwrap();
        let applied: i64 =
            sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
                .fetch_one(&pool)
                .await
                .unwrap();
        assert_eq!(applied as usize, n);
        pool.close().await;
        sqlx::Postgres::drop_database(&url).await.unwrap();
    }

    #[tokio::test]
    async fn migrations_apply_to_a_fresh_sqlite_file() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("e.db").display());
        let n = apply(&url).await.unwrap();
        assert_eq!(apply(&url).await.unwrap(), n);
    }
}
