-- Evidence: every Begin, End and Denial, one row each, keyed by envelope id
-- (re-sent batches are no-ops). Retention deletes by at_ms.
CREATE TABLE evidence (
    id        TEXT    NOT NULL PRIMARY KEY,
    at_ms     INTEGER NOT NULL,
    tenant    TEXT    NOT NULL,
    kind      TEXT    NOT NULL CHECK (kind IN ('begin', 'end', 'denied')),
    call_id   TEXT    NOT NULL,
    tool_id   TEXT,
    begin_id  TEXT,
    status    TEXT,
    record    TEXT    NOT NULL
);
-- By call id; also finds the End of a Begin (same call id).
CREATE INDEX evidence_by_call ON evidence (call_id);
CREATE INDEX evidence_begins ON evidence (tenant, at_ms DESC, id DESC) WHERE kind = 'begin';
CREATE INDEX evidence_by_time ON evidence (at_ms);
