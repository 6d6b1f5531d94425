-- The audit of changes (`GET /api/audit`, `soulbase audit list`): one row per
-- registry, skill-state, skill-set or configuration change that took effect —
-- who, what, when, and hashes of the thing before and after. Kept with the
-- evidence, so every replica sharing this database writes to and reads one log.
CREATE TABLE IF NOT EXISTS audit_log (
    -- The order records were written in: ties within one millisecond.
    seq          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    at_ms        BIGINT NOT NULL,
    tenant       TEXT NOT NULL,
    actor        TEXT NOT NULL,
    actor_tenant TEXT NOT NULL,
    kind         TEXT NOT NULL,
    target       TEXT NOT NULL,
    before_hash  TEXT,
    after_hash   TEXT,
    detail       TEXT NOT NULL
);
-- Listings are newest first, almost always for one tenant (a caller reads its
-- own tenant's records); an operator's listing of every tenant uses the second.
CREATE INDEX IF NOT EXISTS audit_log_tenant_at ON audit_log (tenant, at_ms DESC, seq DESC);
CREATE INDEX IF NOT EXISTS audit_log_at ON audit_log (at_ms DESC, seq DESC);
