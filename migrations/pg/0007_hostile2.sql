-- The decision clock is the database's clock, never pushed ahead of it (a key that floods
-- once ran its own clock seconds into the future): `last_seq` numbers a key's decisions within
-- one millisecond instead, so two receipts of one key still differ.
ALTER TABLE fleet_keys ADD COLUMN last_seq integer NOT NULL DEFAULT 0;
-- A stored Responses object is read back from the upstream that created it, and a call that
-- continues it is judged as a step by the answer it continues (a keyed hash of that answer's
-- tool calls or text: no content). NULL in rows written before.
ALTER TABLE fleet_responses ADD COLUMN upstream text;
ALTER TABLE fleet_responses ADD COLUMN answer text;
