-- Registry state: every owner's tools (manifest + own state), tenant overrides of
-- global tools, tenant allow-lists. Written as a whole snapshot on change; read at
-- start-up to restore the registry. owner = '' for global tools.
CREATE TABLE registry_tools (
    owner       text   NOT NULL,
    tool_id     text   NOT NULL,
    manifest    jsonb  NOT NULL,
    state       text   NOT NULL CHECK (state IN ('registered', 'enabled', 'paused', 'deprecated')),
    digest      text   NOT NULL,
    updated_ms  bigint NOT NULL,
    PRIMARY KEY (owner, tool_id)
);
CREATE TABLE registry_overrides (
    tenant   text NOT NULL,
    tool_id  text NOT NULL,
    value    text NOT NULL,
    PRIMARY KEY (tenant, tool_id)
);
CREATE TABLE registry_allow_lists (
    tenant  text  PRIMARY KEY,
    tools   jsonb NOT NULL
);
