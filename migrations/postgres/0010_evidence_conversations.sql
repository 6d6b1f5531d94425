-- The agent loop's own evidence: a conversation's start, model turns and end are
-- stored beside the calls it made, as kind 'conversation' keyed by the
-- conversation id in call_id (replaying that id rebuilds the conversation).
-- Replacing the check validates every partition (a scan, no rewrite).
ALTER TABLE evidence DROP CONSTRAINT evidence_kind_check;
ALTER TABLE evidence ADD CONSTRAINT evidence_kind_check
    CHECK (kind IN ('begin', 'end', 'denied', 'conversation'));
