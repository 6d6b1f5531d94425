-- Idempotency records: one per (tenant, tool, key). The primary key makes the claim
-- atomic across replicas: exactly one INSERT wins; the others read the row and
-- wait for its result. A claim whose owner died is taken over after its lease.
CREATE TABLE idempotency (
    tenant          text   NOT NULL,
    tool            text   NOT NULL,
    key             text   NOT NULL,
    args_digest     text   NOT NULL,
    state           text   NOT NULL CHECK (state IN ('in_flight', 'done')),
    result          jsonb,
    owner           text   NOT NULL,
    lease_until_ms  bigint NOT NULL,
    created_ms      bigint NOT NULL,
    updated_ms      bigint NOT NULL,
    PRIMARY KEY (tenant, tool, key)
);
CREATE INDEX idempotency_by_age ON idempotency (updated_ms);
