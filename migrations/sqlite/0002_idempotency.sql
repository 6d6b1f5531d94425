-- Idempotency records: one per (tenant, tool, key); see the Postgres migration.
CREATE TABLE idempotency (
    tenant          TEXT    NOT NULL,
    tool            TEXT    NOT NULL,
    key             TEXT    NOT NULL,
    args_digest     TEXT    NOT NULL,
    state           TEXT    NOT NULL CHECK (state IN ('in_flight', 'done')),
    result          TEXT,
    owner           TEXT    NOT NULL,
    lease_until_ms  INTEGER NOT NULL,
    created_ms      INTEGER NOT NULL,
    updated_ms      INTEGER NOT NULL,
    PRIMARY KEY (tenant, tool, key)
);
CREATE INDEX idempotency_by_age ON idempotency (updated_ms);
