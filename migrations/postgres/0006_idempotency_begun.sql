-- A key's owner marks it begun (its Begin is durable, the tool is about to run):
-- the call's id and Begin envelope. A key begun whose owner stopped is never run
-- again; once the owner's lease lapses it is settled as interrupted (the outcome
-- its spool recovery records as an aborted End). A key claimed but not begun is
-- taken over as before. Leases are now renewed by a live owner's heartbeat.
ALTER TABLE idempotency ADD COLUMN call_id text, ADD COLUMN begin_id text;
