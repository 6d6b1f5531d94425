-- The agent loop's own evidence (kind 'conversation'; see the Postgres
-- migration). SQLite cannot change a check constraint in place: the table is
-- rebuilt with the new one, rows and indexes as before.
CREATE TABLE evidence_v10 (
    id        TEXT    NOT NULL PRIMARY KEY,
    at_ms     INTEGER NOT NULL,
    tenant    TEXT    NOT NULL,
    kind      TEXT    NOT NULL CHECK (kind IN ('begin', 'end', 'denied', 'conversation')),
    call_id   TEXT    NOT NULL,
    tool_id   TEXT,
    begin_id  TEXT,
    status    TEXT,
    record    TEXT    NOT NULL
);
INSERT INTO evidence_v10 (id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record)
    SELECT id, at_ms, tenant, kind, call_id, tool_id, begin_id, status, record FROM evidence;
DROP TABLE evidence;
ALTER TABLE evidence_v10 RENAME TO evidence;
CREATE INDEX evidence_by_call ON evidence (call_id);
CREATE INDEX evidence_begins ON evidence (tenant, at_ms DESC, id DESC) WHERE kind = 'begin';
CREATE INDEX evidence_by_time ON evidence (at_ms);
