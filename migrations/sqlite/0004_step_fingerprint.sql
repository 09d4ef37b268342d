-- 4: the step fingerprint, so the loop windows rebuilt at start match by it too.
ALTER TABLE decisions ADD COLUMN step_fingerprint BLOB;
