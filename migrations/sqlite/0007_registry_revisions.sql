-- Registry records are versioned one by one; see the Postgres migration.
ALTER TABLE registry_tools ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;
ALTER TABLE registry_tools ADD COLUMN removed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE registry_overrides ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;
ALTER TABLE registry_overrides ADD COLUMN removed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE registry_overrides ADD COLUMN updated_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE registry_allow_lists ADD COLUMN revision INTEGER NOT NULL DEFAULT 1;
ALTER TABLE registry_allow_lists ADD COLUMN removed INTEGER NOT NULL DEFAULT 0;
ALTER TABLE registry_allow_lists ADD COLUMN updated_ms INTEGER NOT NULL DEFAULT 0;
