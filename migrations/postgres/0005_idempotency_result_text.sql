-- A stored idempotent result is kept as the JSON text Soulbase wrote, not as jsonb.
-- It is only ever read back whole, and jsonb refuses the escape \u0000: a tool whose
-- output held one could not be completed, and its key stayed in flight until the
-- lease ran out. The table holds only recent keys, so the rewrite is short.
ALTER TABLE idempotency ALTER COLUMN result TYPE text USING result::text;
