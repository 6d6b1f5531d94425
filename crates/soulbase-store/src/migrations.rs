//! The migrations of `migrations/`, embedded so a deployed binary can apply them at
//! start-up (`evidence.migrate_on_start`). `cargo xtask migrate` applies the same
//! files from the directory; the checksums agree (a test keeps the lists in step).

use std::borrow::Cow;

use sqlx::SqlSafeStr;
use sqlx::migrate::{Migration, MigrationType, Migrator};

fn migration(version: i64, description: &'static str, sql: &'static str) -> Migration {
    Migration::new(
        version,
        Cow::Borrowed(description),
        MigrationType::Simple,
        sql.into_sql_str(),
        false,
    )
}

/// The Postgres migrations (`migrations/postgres`).
pub fn postgres() -> Migrator {
    Migrator::with_migrations(vec![
        migration(
            1,
            "evidence",
            include_str!("../../../migrations/postgres/0001_evidence.sql"),
        ),
        migration(
            2,
            "idempotency",
            include_str!("../../../migrations/postgres/0002_idempotency.sql"),
        ),
        migration(
            3,
            "registry",
            include_str!("../../../migrations/postgres/0003_registry.sql"),
        ),
        migration(
            4,
            "evidence record text",
            include_str!("../../../migrations/postgres/0004_evidence_record_text.sql"),
        ),
        migration(
            5,
            "idempotency result text",
            include_str!("../../../migrations/postgres/0005_idempotency_result_text.sql"),
        ),
        migration(
            6,
            "idempotency begun",
            include_str!("../../../migrations/postgres/0006_idempotency_begun.sql"),
        ),
        migration(
            7,
            "registry revisions",
            include_str!("../../../migrations/postgres/0007_registry_revisions.sql"),
        ),
        migration(
            8,
            "consent revocations",
            include_str!("../../../migrations/postgres/0008_consent_revocations.sql"),
        ),
        migration(
            9,
            "audit",
            include_str!("../../../migrations/postgres/0009_audit.sql"),
        ),
        migration(
            10,
            "evidence conversations",
            include_str!("../../../migrations/postgres/0010_evidence_conversations.sql"),
        ),
        migration(
            11,
            "consent requests",
            include_str!("../../../migrations/postgres/0011_consent_requests.sql"),
        ),
        migration(
            12,
            "evidence denials",
            include_str!("../../../migrations/postgres/0012_evidence_denials.sql"),
        ),
    ])
}

/// The SQLite migrations (`migrations/sqlite`).
pub fn sqlite() -> Migrator {
    Migrator::with_migrations(vec![
        migration(
            1,
            "evidence",
            include_str!("../../../migrations/sqlite/0001_evidence.sql"),
        ),
        migration(
            2,
            "idempotency",
            include_str!("../../../migrations/sqlite/0002_idempotency.sql"),
        ),
        migration(
            3,
            "registry",
            include_str!("../../../migrations/sqlite/0003_registry.sql"),
        ),
        migration(
            6,
            "idempotency begun",
            include_str!("../../../migrations/sqlite/0006_idempotency_begun.sql"),
        ),
        migration(
            7,
            "registry revisions",
            include_str!("../../../migrations/sqlite/0007_registry_revisions.sql"),
        ),
        migration(
            8,
            "consent revocations",
            include_str!("../../../migrations/sqlite/0008_consent_revocations.sql"),
        ),
        migration(
            9,
            "audit",
            include_str!("../../../migrations/sqlite/0009_audit.sql"),
        ),
        migration(
            10,
            "evidence conversations",
            include_str!("../../../migrations/sqlite/0010_evidence_conversations.sql"),
        ),
        migration(
            11,
            "consent requests",
            include_str!("../../../migrations/sqlite/0011_consent_requests.sql"),
        ),
        migration(
            12,
            "evidence denials",
            include_str!("../../../migrations/sqlite/0012_evidence_denials.sql"),
        ),
        migration(
            13,
            "evidence kind check",
            include_str!("../../../migrations/sqlite/0013_evidence_kind_check.sql"),
        ),
    ])
}
