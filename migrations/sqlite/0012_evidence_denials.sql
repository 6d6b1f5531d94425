-- Denials listed newest first per tenant (`GET /api/denials`, the console's
-- evidence explorer), as `evidence_begins` does for calls that ran.
CREATE INDEX evidence_denials ON evidence (tenant, at_ms DESC, id DESC) WHERE kind = 'denied';
