-- Registry records are versioned one by one, so replicas sharing this database
-- change them with optimistic concurrency (a change names the revision it was
-- computed from; a stale one is refused) instead of rewriting a whole snapshot.
-- A removed record stays as a tombstone (removed = true) so its revision keeps
-- growing and a replica that was away learns of the removal.
ALTER TABLE registry_tools ADD COLUMN revision bigint NOT NULL DEFAULT 1;
ALTER TABLE registry_tools ADD COLUMN removed boolean NOT NULL DEFAULT false;
ALTER TABLE registry_overrides ADD COLUMN revision bigint NOT NULL DEFAULT 1;
ALTER TABLE registry_overrides ADD COLUMN removed boolean NOT NULL DEFAULT false;
ALTER TABLE registry_overrides ADD COLUMN updated_ms bigint NOT NULL DEFAULT 0;
ALTER TABLE registry_allow_lists ADD COLUMN revision bigint NOT NULL DEFAULT 1;
ALTER TABLE registry_allow_lists ADD COLUMN removed boolean NOT NULL DEFAULT false;
ALTER TABLE registry_allow_lists ADD COLUMN updated_ms bigint NOT NULL DEFAULT 0;
