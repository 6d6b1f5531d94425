-- The check on `evidence.kind` as comparisons joined by OR instead of an IN list.
-- SQLite codes a CHECK's IN list of more than two constants as an ephemeral index
-- it clears and fills again for every row inserted (four B-tree inserts a row,
-- the drain's ingest ~8,500 instructions a governed call: docs/performance.md);
-- comparisons accept exactly the same values. No stored row changes, so the
-- table's definition is edited in place, by SQLite's documented procedure for
-- changes that leave the stored content as it is
-- (https://sqlite.org/lang_altertable.html#otheralter), rather than the table
-- rebuilt: instant on any size of database. A definition that does not hold the
-- expected text is left as it is (the IN list: correct, only slower).
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
   SET sql = replace(sql,
                     'CHECK (kind IN (''begin'', ''end'', ''denied'', ''conversation''))',
                     'CHECK (kind = ''begin'' OR kind = ''end'' OR kind = ''denied'' OR kind = ''conversation'')')
 WHERE type = 'table' AND name = 'evidence';
-- Writing off again, and this connection reads the definitions anew.
PRAGMA writable_schema = RESET;
-- A schema change: every other open connection reads them anew too.
CREATE TABLE soulbase_schema_changed (x);
DROP TABLE soulbase_schema_changed;
