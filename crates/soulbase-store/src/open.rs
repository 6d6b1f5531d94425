//! Wiring from configuration: the database, the durable sink over its evidence
//! store, the idempotency store and the registry store, plus retention.

use std::sync::Arc;
use std::time::Duration;

use soulbase_config::{Config, DurabilityMode, EvidenceBackend};
use soulbase_errors::SoulError;
use soulbase_evidence::{Durability, DurableSink, RecoveryReport, SpoolOptions};
use soulbase_observe::EvidenceStore;
use soulbase_types::UnixMillis;

use crate::idempotency::DEFAULT_LEASE;
use crate::{Db, RegistryStore, SqlEvidenceStore, SqlIdempotency};

/// Everything persistent, opened from one configuration.
pub struct Persistence {
    /// The database.
    pub db: Db,
    /// The durable sink to give the pipeline.
    pub sink: DurableSink,
    /// The evidence store the spool drains into and queries read: the database's
    /// own ([`SqlEvidenceStore`]), or the one given to [`Persistence::open_draining_to`]
    /// (a remote evidence role).
    pub evidence: Arc<dyn EvidenceStore>,
    /// Whether `evidence` is this database's own store (retention purges it here;
    /// a remote store runs its own retention).
    pub evidence_is_local: bool,
    /// The idempotency store to give the pipeline.
    pub idempotency: Arc<SqlIdempotency>,
    /// Registry persistence.
    pub registry: RegistryStore,
    /// What spool recovery found at start-up.
    pub recovery: RecoveryReport,
}

/// The database URL `config` selects: `evidence.url`, or for SQLite
/// `<data_dir>/evidence.db` when unset.
pub fn database_url(config: &Config) -> String {
    match (&config.evidence.url, config.evidence.backend) {
        (Some(url), _) => url.clone(),
        (None, EvidenceBackend::Sqlite | EvidenceBackend::Postgres) => {
            format!("sqlite://{}", config.data_dir.join("evidence.db").display())
        }
    }
}

/// The idempotency lease `config` sets (`evidence.idempotency_lease_ms`).
pub fn idempotency_lease(config: &Config) -> Duration {
    Duration::from_millis(config.evidence.idempotency_lease_ms)
}

/// The evidence spool's directory for `config`: `<data_dir>/spool`.
pub fn spool_dir(config: &Config) -> std::path::PathBuf {
    config.data_dir.join("spool")
}

/// The spool's disk reserve in a server: room for the Ends of 2048 running calls
/// (2 KiB each), above what the listeners let in at once over HTTP/1 (1024
/// connections by default). A call past that many running ones is refused
/// (`EVIDENCE.UNAVAILABLE`), so that every running call can always write its End.
pub const DISK_RESERVE: u64 = 4 << 20;

/// Spool options for `config`: [`spool_dir`], its durability, [`DISK_RESERVE`] and cap — when
/// `evidence.spool_max_bytes` is unset, derived from the free space of the
/// spool's volume ([`soulbase_evidence::default_max_bytes`]; 1 GiB if the volume
/// cannot be measured).
pub fn spool_options(config: &Config) -> SpoolOptions {
    let durability = match config.evidence.durability {
        DurabilityMode::Sync => Durability::Sync,
        DurabilityMode::Async => Durability::Async,
    };
    let mut options = SpoolOptions::new(spool_dir(config)).durability(durability);
    options.disk_reserve = DISK_RESERVE;
    let max_bytes = match config.evidence.spool_max_bytes {
        Some(bytes) => bytes,
        None => match soulbase_evidence::default_max_bytes(&options.dir, options.disk_reserve) {
            Ok(bytes) => {
                tracing::info!(
                    spool_max_bytes = bytes,
                    "evidence.spool_max_bytes derived from the spool volume's free space"
                );
                bytes
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not measure the spool's volume; evidence.spool_max_bytes is 1 GiB");
                1 << 30
            }
        },
    };
    options.max_bytes(max_bytes)
}

impl Persistence {
    /// Connects (migrating when `evidence.migrate_on_start`), recovers the spool and
    /// starts draining it.
    pub async fn open(config: &Config) -> Result<Persistence, SoulError> {
        Self::open_parts(
            &database_url(config),
            config.evidence.migrate_on_start,
            spool_options(config),
            None,
            idempotency_lease(config),
        )
        .await
    }

    /// Like [`Persistence::open`], but the spool drains into `evidence` (another
    /// process's evidence role) instead of this database, which then holds only
    /// idempotency and registry state. Records stay in the local spool until
    /// `evidence` has stored them, so an unreachable evidence role loses nothing.
    pub async fn open_draining_to(
        config: &Config,
        evidence: Arc<dyn EvidenceStore>,
    ) -> Result<Persistence, SoulError> {
        Self::open_parts(
            &database_url(config),
            config.evidence.migrate_on_start,
            spool_options(config),
            Some(evidence),
            idempotency_lease(config),
        )
        .await
    }

    /// Like [`Persistence::open`] with explicit parts.
    pub async fn open_with(
        url: &str,
        migrate: bool,
        spool: SpoolOptions,
    ) -> Result<Persistence, SoulError> {
        Self::open_parts(url, migrate, spool, None, DEFAULT_LEASE).await
    }

    /// Like [`Persistence::open_with`], with the idempotency lease (how long a
    /// dead replica's key blocks a retry).
    pub async fn open_with_lease(
        url: &str,
        migrate: bool,
        spool: SpoolOptions,
        lease: Duration,
    ) -> Result<Persistence, SoulError> {
        Self::open_parts(url, migrate, spool, None, lease).await
    }

    async fn open_parts(
        url: &str,
        migrate: bool,
        spool: SpoolOptions,
        remote: Option<Arc<dyn EvidenceStore>>,
        lease: Duration,
    ) -> Result<Persistence, SoulError> {
        let db = Db::connect(url, migrate).await?;
        let evidence_is_local = remote.is_none();
        let evidence = remote.unwrap_or_else(|| Arc::new(SqlEvidenceStore::new(db.clone())));
        let (sink, recovery) = DurableSink::open(spool, evidence.clone()).await?;
        // A keyed call's End is stored with its outcome when this database is the
        // evidence store; the heartbeat renews the leases of keys in progress.
        let idempotency = Arc::new(
            SqlIdempotency::new(db.clone())
                .with_lease(lease)
                .with_evidence(evidence_is_local),
        );
        idempotency.spawn_heartbeat();
        Ok(Persistence {
            evidence_is_local,
            idempotency,
            registry: RegistryStore::new(db.clone()),
            db,
            sink,
            evidence,
            recovery,
        })
    }

    /// Deletes evidence (when the store is local) and finished idempotency records
    /// older than `days`.
    pub async fn apply_retention(&self, days: u32) -> Result<u64, SoulError> {
        let cutoff = UnixMillis(
            UnixMillis::now()
                .0
                .saturating_sub(i64::from(days).saturating_mul(86_400_000)),
        );
        let n = if self.evidence_is_local {
            self.evidence.purge_before(cutoff).await?
        } else {
            0
        };
        let m = self.idempotency.purge_before(cutoff).await?;
        Ok(n + m)
    }

    /// Runs retention now and then every `every` (until the task is aborted).
    pub fn spawn_retention(
        self: &Arc<Self>,
        days: u32,
        every: Duration,
    ) -> tokio::task::JoinHandle<()> {
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                if let Err(e) = this.apply_retention(days).await {
                    tracing::warn!(error = %e, "evidence retention failed");
                }
                tokio::time::sleep(every).await;
            }
        })
    }
}
