-- 9: sessions (SPEC §2.11a) and pacing (§2.3): the agent session a decision belongs to
-- (a keyed hash, blanked by `Forget` with the fingerprint) and how long the gate held it.
ALTER TABLE decisions ADD COLUMN session BLOB;
ALTER TABLE decisions ADD COLUMN paced_ms INTEGER NOT NULL DEFAULT 0;
CREATE INDEX decisions_by_session ON decisions (key_id, session);
