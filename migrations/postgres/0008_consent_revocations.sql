-- Consent tokens revoked by id (`POST /api/consent/{id}/revoke`): every replica
-- sharing this database refuses them from the next call on.
CREATE TABLE IF NOT EXISTS consent_revocations (
    token_id   TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    revoked_by TEXT NOT NULL,
    revoked_ms BIGINT NOT NULL,
    -- A token is revoked in its own tenant: another tenant's approver who learnt
    -- its id records a revocation that does not apply to it.
    PRIMARY KEY (token_id, tenant)
);
