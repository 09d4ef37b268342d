-- 12: a stored Responses object is read back from the upstream that created it, and a call
-- continuing it is judged by the answer it continues (a keyed hash: no content). NULL in
-- rows written before.
ALTER TABLE responses ADD COLUMN upstream TEXT;
ALTER TABLE responses ADD COLUMN answer BLOB;
