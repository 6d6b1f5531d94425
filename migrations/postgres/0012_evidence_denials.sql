-- Denials listed newest first per tenant (`GET /api/denials`, the console's
-- evidence explorer), as `evidence_begins` does for calls that ran. Partial:
-- only denied rows pay for it at ingest. Created on the partitioned table, so
-- every partition (existing and future) gets it; on a large table build it in a
-- maintenance window.
CREATE INDEX evidence_denials ON evidence (tenant, at_ms DESC, id DESC) WHERE kind = 'denied';
