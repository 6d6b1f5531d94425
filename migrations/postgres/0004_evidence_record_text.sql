-- Evidence records are stored as the JSON text the spool holds, not as jsonb.
-- Soulbase only ever reads a record whole (show, list, replay), and converting
-- every row to jsonb on ingest was about a third of the database's work per
-- event. Text also keeps any string the record carries: jsonb refuses the escape
-- \u0000, which would make a whole batch unstorable. Ad-hoc SQL can still look
-- inside a record with record::jsonb.
ALTER TABLE evidence ALTER COLUMN record TYPE text USING record::text;

-- During a rolling upgrade an older process's binary COPY still prefixes each
-- record with jsonb's version byte; refuse such rows (the older process keeps them
-- in its spool and retries until it is upgraded) rather than store them garbled.
-- Changing the type rewrites every partition under an exclusive lock: on a large
-- evidence table, run this migration in a maintenance window.
ALTER TABLE evidence ADD CONSTRAINT evidence_record_is_json_text CHECK (left(record, 1) = '{');
