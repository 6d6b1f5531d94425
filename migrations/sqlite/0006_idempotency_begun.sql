-- A key's owner marks it begun; see the Postgres migration.
ALTER TABLE idempotency ADD COLUMN call_id TEXT;
ALTER TABLE idempotency ADD COLUMN begin_id TEXT;
