-- Consent requests (`GET /api/consent/requests`): a call refused
-- CONSENT.REQUIRED opens one for its tenant, actor, tool and arguments digest;
-- an approver of the tenant approves it (the token issued is kept here for the
-- requester) or declines it. Kept with the evidence, so every replica sharing
-- this database sees the same requests.
CREATE TABLE IF NOT EXISTS consent_requests (
    id               TEXT NOT NULL PRIMARY KEY,
    tenant           TEXT NOT NULL,
    actor            TEXT NOT NULL,
    tool             TEXT NOT NULL,
    args_digest      TEXT NOT NULL,
    call_id          TEXT NOT NULL,
    requested_ms     INTEGER NOT NULL,
    -- 'pending', 'approved', 'declined' or 'expired' (a pending request past its
    -- time is marked so when the same call is refused again; until then it is
    -- read as expired).
    status           TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'declined', 'expired')),
    decided_by       TEXT,
    decided_ms       INTEGER,
    scope            TEXT CHECK (scope IN ('call', 'tool')),
    reason           TEXT,
    token            TEXT,
    token_id         TEXT,
    token_expires_ms INTEGER
);
-- One pending request per refused call's tenant, actor, tool and arguments: a
-- retry reuses it.
CREATE UNIQUE INDEX IF NOT EXISTS consent_requests_pending
    ON consent_requests (tenant, actor, tool, args_digest) WHERE status = 'pending';
-- An approver's listing: a tenant's requests, newest first.
CREATE INDEX IF NOT EXISTS consent_requests_tenant ON consent_requests (tenant, requested_ms DESC);
