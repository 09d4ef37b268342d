-- 7: who may settle a decision: the proxy that forwarded it, or the digest client that
-- asked `POST /gate`. Rows before it were the proxy's: an old digest decision left open
-- is charged its worst case at expiry, never settled by a caller's claim.
ALTER TABLE decisions ADD COLUMN recorded_by TEXT NOT NULL DEFAULT 'proxy'
    CHECK (recorded_by IN ('proxy', 'digest'));
