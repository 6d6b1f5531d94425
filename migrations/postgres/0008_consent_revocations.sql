-- Consent tokens revoked by id (`POST /api/consent/{id}/revoke`): every replica
-- sharing this database refuses them from the next call on.
CREATE TABLE IF NOT EXISTS consent_revocations (
    token_id   TEXT PRIMARY KEY,
    tenant     TEXT NOT NULL,
    revoked_by TEXT NOT NULL,
    revoked_ms BIGINT NOT NULL
);
