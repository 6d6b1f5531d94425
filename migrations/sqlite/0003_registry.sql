-- Registry state; see the Postgres migration. owner = '' for global tools.
CREATE TABLE registry_tools (
    owner       TEXT    NOT NULL,
    tool_id     TEXT    NOT NULL,
    manifest    TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('registered', 'enabled', 'paused', 'deprecated')),
    digest      TEXT    NOT NULL,
    updated_ms  INTEGER NOT NULL,
    PRIMARY KEY (owner, tool_id)
);
CREATE TABLE registry_overrides (
    tenant   TEXT NOT NULL,
    tool_id  TEXT NOT NULL,
    value    TEXT NOT NULL,
    PRIMARY KEY (tenant, tool_id)
);
CREATE TABLE registry_allow_lists (
    tenant  TEXT PRIMARY KEY,
    tools   TEXT NOT NULL
);
