-- Evidence: every Begin, End and Denial, one row each, keyed by envelope id.
-- Partitioned by day on at_ms (Unix milliseconds); partitions are created on demand
-- by soulbase_evidence_ensure_partition and dropped by retention
-- (soulbase_evidence_drop_before). The primary key includes the partition key; an
-- envelope's time never changes, so (at_ms, id) is as unique as id and makes
-- re-sent batches no-ops (ON CONFLICT DO NOTHING).
CREATE TABLE evidence (
    id        text   NOT NULL,
    at_ms     bigint NOT NULL,
    tenant    text   NOT NULL,
    kind      text   NOT NULL CHECK (kind IN ('begin', 'end', 'denied')),
    call_id   text   NOT NULL,
    tool_id   text,
    begin_id  text,
    status    text,
    record    jsonb  NOT NULL,
    PRIMARY KEY (at_ms, id)
) PARTITION BY RANGE (at_ms);

-- By call id (show, replay), and the End closing a Begin (same call id, so listing
-- finds it here: a separate (begin_id) index cost a tenth of the ingest rate).
CREATE INDEX evidence_by_call ON evidence (call_id);
-- Listing a tenant's calls newest first (Begins only); a tool filter is applied
-- along this index (a second per-tool index cost a quarter of the ingest rate).
CREATE INDEX evidence_begins ON evidence (tenant, at_ms DESC, id DESC) WHERE kind = 'begin';

-- Creates the partition holding day `day_ms` (any instant of that UTC day).
CREATE FUNCTION soulbase_evidence_ensure_partition(day_ms bigint) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    lo bigint := (day_ms / 86400000) * 86400000;
    name text := 'evidence_d' || to_char(to_timestamp(lo / 1000) AT TIME ZONE 'UTC', 'YYYYMMDD');
BEGIN
    IF to_regclass(name) IS NOT NULL THEN
        RETURN;
    END IF;
    -- Serialize creators (several writers, several replicas).
    PERFORM pg_advisory_xact_lock(hashtext('soulbase_evidence_partitions'));
    IF to_regclass(name) IS NULL THEN
        EXECUTE format('CREATE TABLE %I PARTITION OF evidence FOR VALUES FROM (%s) TO (%s)',
                       name, lo, lo + 86400000);
    END IF;
END $$;

-- Drops every partition wholly before `cutoff_ms` and deletes older rows from the
-- partition straddling it; returns the number of partitions dropped.
CREATE FUNCTION soulbase_evidence_drop_before(cutoff_ms bigint) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    part record;
    dropped integer := 0;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('soulbase_evidence_partitions'));
    FOR part IN
        SELECT c.relname AS name
        FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        JOIN pg_class p ON p.oid = i.inhparent
        WHERE p.relname = 'evidence'
          AND c.relname ~ '^evidence_d[0-9]{8}$'
          AND (extract(epoch FROM to_date(substr(c.relname, 11), 'YYYYMMDD'))::bigint * 1000 + 86400000) <= cutoff_ms
    LOOP
        EXECUTE format('DROP TABLE %I', part.name);
        dropped := dropped + 1;
    END LOOP;
    DELETE FROM evidence WHERE at_ms < cutoff_ms;
    RETURN dropped;
END $$;
