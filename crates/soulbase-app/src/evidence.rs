//! The evidence and persistence seam of this process.
//!
//! With the `tools` or `evidence` role, [`open`] opens
//! [`soulbase_store::Persistence`] from the configuration: the durable spool sink
//! (`<data_dir>/spool`, `evidence.durability`) draining into SQLite
//! (`<data_dir>/evidence.db`, the default) or Postgres (`evidence.backend: postgres`,
//! `evidence.url`) — or, for a `tools` role with `server.remote.evidence`, into the
//! remote evidence role — the SQL idempotency store and the registry store; retention
//! runs hourly (`evidence.retention_days`, at least 1). Without either role
//! nothing is opened and the sink refuses records ([`NoEvidence`]). On shutdown
//! [`EvidenceFlush::flush`] drains the spool into the store (what does not make it
//! stays in the spool for the next start). The registry needs no flush: each change
//! is committed to the store before it applies ([`registry_admin`]), and
//! [`EvidenceFlush::start`] follows what other replicas commit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use soulbase_config::Config;
use soulbase_errors::{ErrorCode, SoulError};
use soulbase_evidence::DurableSink;
use soulbase_observe::{Durable, EvidenceRecord, EvidenceSink, EvidenceStore};
use soulbase_store::Persistence;
use soulbase_tools::Registry;
use soulbase_tools::registry::admin::RegistryAdmin;
use soulbase_tools::registry::{RecordKey, Take, ToolOwner};

/// SQLite's memory from the process's global allocator: called at the start of
/// the binary's `main` (see its safety contract).
pub use soulbase_store::install_sqlite_allocator;

/// How often retention runs.
const RETENTION_EVERY: Duration = Duration::from_secs(3600);

/// Counters for `/metrics`.
#[derive(Default)]
pub struct EvidenceStats {
    accepted: AtomicU64,
    sink: Option<DurableSink>,
}

impl std::fmt::Debug for EvidenceStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EvidenceStats")
            .field("accepted", &self.accepted.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl EvidenceStats {
    /// Records accepted by this process and not yet in the store (approximate: the
    /// store also receives records recovered from an earlier run).
    pub fn depth(&self) -> u64 {
        self.accepted
            .load(Ordering::Relaxed)
            .saturating_sub(self.written() + self.quarantined())
    }

    /// Records written to the store by this process.
    pub fn written(&self) -> u64 {
        self.sink.as_ref().map_or(0, |s| s.stats().records_drained)
    }

    /// Records the store refused for good, kept in the spool's quarantine file.
    pub fn quarantined(&self) -> u64 {
        self.sink
            .as_ref()
            .map_or(0, |s| s.stats().records_quarantined)
    }

    /// Bytes in the spool.
    pub fn spool_bytes(&self) -> u64 {
        self.sink.as_ref().map_or(0, |s| s.stats().disk_bytes)
    }

    /// How long the store has been behind the spool: an upper bound on the age
    /// of the oldest record not yet in the store (zero while caught up).
    pub fn drain_lag(&self) -> std::time::Duration {
        self.sink
            .as_ref()
            .map_or(std::time::Duration::ZERO, |s| s.stats().drain_lag)
    }
}

/// The [`DurableSink`], counting what it accepts.
#[derive(Clone)]
pub struct CountedSink {
    inner: DurableSink,
    stats: Arc<EvidenceStats>,
}

#[async_trait]
impl EvidenceSink for CountedSink {
    async fn record(&self, record: EvidenceRecord) -> Result<(), SoulError> {
        let r = self.inner.record(record).await;
        if r.is_ok() {
            self.stats.accepted.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    async fn submit(&self, begin: EvidenceRecord) -> Result<Durable, SoulError> {
        let durable = self.inner.submit(begin).await?;
        let stats = self.stats.clone();
        Ok(Box::pin(async move {
            durable.await?;
            stats.accepted.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }))
    }
}

/// The sink of a process without the `tools` role: nothing executes here, so any
/// record is refused with `EVIDENCE.UNAVAILABLE`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoEvidence;

#[async_trait]
impl EvidenceSink for NoEvidence {
    async fn record(&self, _record: EvidenceRecord) -> Result<(), SoulError> {
        Err(SoulError::new(
            ErrorCode::EvidenceUnavailable,
            "this process does not serve the tools role and records no evidence",
        ))
    }
}

/// The opened persistence of a `tools` server.
pub struct Opened {
    /// Everything persistent.
    pub persistence: Arc<Persistence>,
    /// The sink to give the pipeline.
    pub sink: CountedSink,
    /// Its counters.
    pub stats: Arc<EvidenceStats>,
}

/// Opens persistence from `config` (migrating when configured, recovering the
/// spool: every Begin without an End is closed `aborted`). With `drain_to` (the
/// remote evidence role) the spool drains there instead of into the database.
pub async fn open(
    config: &Config,
    drain_to: Option<Arc<dyn EvidenceStore>>,
) -> Result<Opened, SoulError> {
    let persistence = match drain_to {
        Some(store) => Persistence::open_draining_to(config, store).await?,
        None => Persistence::open(config).await?,
    };
    let r = &persistence.recovery;
    if !r.aborted.is_empty() || r.truncated_bytes > 0 {
        tracing::warn!(
            aborted = r.aborted.len(),
            truncated_bytes = r.truncated_bytes,
            "evidence spool recovered after an unclean stop"
        );
    }
    tracing::info!(
        backend = ?config.evidence.backend,
        durability = ?config.evidence.durability,
        data_dir = %config.data_dir.display(),
        "evidence persistence opened"
    );
    let stats = Arc::new(EvidenceStats {
        accepted: AtomicU64::new(0),
        sink: Some(persistence.sink.clone()),
    });
    Ok(Opened {
        sink: CountedSink {
            inner: persistence.sink.clone(),
            stats: stats.clone(),
        },
        persistence: Arc::new(persistence),
        stats,
    })
}

/// How much of a committed registry record this process takes: only the state
/// of the global tools its own sources define — its builtins (group `soulbase`)
/// and its skills directory's tools (group `skills`), which each replica loads
/// from its own binary and its own copy of the directory (so a skill removed
/// while the server was down does not come back, and a newer binary's builtin is
/// never replaced by an older stored manifest) — and everything of the rest.
fn take(key: &RecordKey) -> Take {
    match key {
        RecordKey::Tool {
            owner: ToolOwner::Global,
            id,
        } if matches!(id.group(), "soulbase" | "skills") => Take::StateOnly,
        _ => Take::Whole,
    }
}

/// The registry's admin on the shared store: changes are committed there first.
pub fn registry_admin(persistence: &Persistence, registry: &Registry) -> RegistryAdmin {
    RegistryAdmin::with_take_policy(
        registry.clone(),
        Arc::new(persistence.registry.clone()),
        Arc::new(take),
    )
}

/// Restores the registry from the store (see [`take`] for what is taken): after
/// the builtins and the skills directory are loaded, so their stored states
/// apply.
pub async fn restore_registry(
    persistence: &Persistence,
    admin: &RegistryAdmin,
) -> Result<(), SoulError> {
    let restored = persistence.registry.restore_into(admin).await?;
    tracing::info!(restored, "registry restored");
    Ok(())
}

/// Stops persistence on shutdown.
pub struct EvidenceFlush {
    persistence: Option<Arc<Persistence>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stats: Arc<EvidenceStats>,
}

impl EvidenceFlush {
    /// A flush for a process that persists nothing.
    pub fn none() -> Self {
        Self {
            persistence: None,
            tasks: Vec::new(),
            stats: Arc::new(EvidenceStats::default()),
        }
    }

    /// Starts retention and, with the `tools` role, following the registry
    /// changes other replicas commit (`admin`), for `opened`.
    pub fn start(opened: &Opened, admin: Option<&RegistryAdmin>, retention_days: u32) -> Self {
        let mut tasks: Vec<_> = admin
            .map(|a| opened.persistence.registry.follow(a.clone()))
            .into_iter()
            .collect();
        if retention_days > 0 {
            tasks.push(
                opened
                    .persistence
                    .spawn_retention(retention_days, RETENTION_EVERY),
            );
        }
        Self {
            persistence: Some(opened.persistence.clone()),
            tasks,
            stats: opened.stats.clone(),
        }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<EvidenceStats> {
        self.stats.clone()
    }

    /// Drains the spool into the store within `timeout` (the rest stays durable in
    /// the spool); returns how many records this process wrote to the store.
    /// (Registry changes need no flush: each was committed before it applied.)
    pub async fn flush(self, timeout: Duration) -> u64 {
        for t in &self.tasks {
            t.abort();
        }
        let Some(p) = self.persistence else {
            return 0;
        };
        p.sink.shutdown(timeout).await;
        self.stats.written()
    }
}

/// Offers the quarantine of `persistence`'s spool to the store its drainer
/// writes to (the database, or the remote evidence role) again, for `by`
/// ([`DurableSink::retry_quarantine`]), and audits it as `by`'s
/// (`evidence.quarantine_retry`, tenant `global`, target `quarantine_file`) when
/// the file changed. Runs as a task of its own: a caller that goes away (an HTTP
/// client hanging up) neither interrupts it nor loses its audit record.
pub async fn retry_quarantine(
    persistence: &Persistence,
    audit: Arc<dyn soulbase_observe::AuditLog>,
    by: &soulbase_types::Subject,
    quarantine_file: String,
) -> Result<soulbase_evidence::quarantine::RequeueReport, SoulError> {
    let sink = persistence.sink.clone();
    let by = by.clone();
    let task = tokio::spawn(async move {
        let report = sink.retry_quarantine().await?;
        if report.rewritten {
            let detail = format!(
                "{} stored, {} still refused, {} unreadable; {} line(s) stay",
                report.stored,
                report.refused.len(),
                report.unreadable.len(),
                report.remaining()
            );
            let record = soulbase_observe::AuditRecord::new(
                soulbase_types::TenantId::global(),
                &by,
                soulbase_observe::AuditKind::EvidenceQuarantineRetry,
                quarantine_file,
            )
            .detail(detail);
            crate::audit::append(audit.as_ref(), record).await;
        }
        Ok(report)
    });
    task.await.map_err(SoulError::internal)?
}

/// The records the database refused for good, kept in the quarantine file of
/// the spool `config` names (read beside a running sink: the drainer only ever
/// appends whole lines).
pub fn quarantined(
    config: &soulbase_config::Config,
) -> Result<Vec<soulbase_evidence::quarantine::QuarantineEntry>, SoulError> {
    soulbase_evidence::quarantine::read(&soulbase_store::spool_dir(config))
}
