//! Soulbase's SQL stores, on PostgreSQL (production, shared by replicas) and SQLite
//! (the embedded default: a newcomer needs no server).
//!
//! - [`SqlEvidenceStore`] — the [`EvidenceStore`](soulbase_observe::EvidenceStore):
//!   idempotent batch writes keyed by envelope id (Postgres: one `INSERT … SELECT
//!   FROM UNNEST` per batch into a table partitioned by day, partitions created on
//!   demand and dropped by retention), queries by call and by tenant/time/tool/status
//!   with keyset pagination.
//! - [`SqlIdempotency`] — the pipeline's `IdempotencyStore`: a unique
//!   (tenant, tool, key) makes a keyed call execute once, across replicas too.
//! - [`RegistryStore`] — registry manifests, states, overrides and allow-lists,
//!   versioned one by one and shared by replicas (`RegistryLedger`, `LISTEN/NOTIFY`).
//! - [`SqlConsentRevocations`] — revoked consent token ids, shared by replicas.
//! - [`SqlConsentRequests`] — the consent requests refused calls leave for
//!   approvers (pending, approved with the token kept for the requester, declined).
//! - [`SqlAuditLog`] — the audit of changes ([`AuditLog`](soulbase_observe::AuditLog)):
//!   registry, skill and configuration changes, who made them, hashes before and
//!   after.
//! - [`Persistence`] — all of the above plus the durable spool sink
//!   (`soulbase-evidence`), opened from the configuration.
//!
//! Migrations live in the workspace's `migrations/{postgres,sqlite}` and are embedded
//! here ([`migrations`]) so start-up can apply them (`evidence.migrate_on_start`).
//!
//! [`install_sqlite_allocator`] hands SQLite the process's global allocator; being
//! `sqlite3_config`, it must run before anything opens SQLite (an `unsafe fn`:
//! `soulbased` calls it first thing in `main`).

mod audit;
mod consent;
mod db;
mod evidence;
mod idempotency;
pub mod migrations;
mod open;
mod registry;
mod sqlite_alloc;

pub use audit::SqlAuditLog;
pub use consent::{SqlConsentRequests, SqlConsentRevocations};
pub use db::{Db, SQLITE_PAGE_SIZE, db_error, sqlite_pool_options};
pub use evidence::{COPY_MIN_BYTES, SqlEvidenceStore};
pub use idempotency::{DEFAULT_LEASE, SqlIdempotency};
pub use open::{
    DISK_RESERVE, Persistence, database_url, idempotency_lease, spool_dir, spool_options,
};
pub use registry::RegistryStore;
pub use sqlite_alloc::install as install_sqlite_allocator;
