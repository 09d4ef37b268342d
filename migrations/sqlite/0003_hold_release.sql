-- 3: releasing holds (SPEC §2.7).
-- - `holds.state` admits 'denied' (a person refused the hold); SQLite cannot alter a
-- CHECK, so the table is rebuilt.
-- - `holds.decision` / `holds.receipt`: the CHALLENGE that opened the hold (the decision
-- as JSON and the signed receipt body), so that a re-send while it is pending gets the
-- same answer after a restart. Blanked by `Forget` with the fingerprint.
-- - `leases`: attending leases granted by approvals.
CREATE TABLE holds_v3 (
    hold_id           TEXT    PRIMARY KEY,
    key_id            TEXT    NOT NULL,
    fingerprint       TEXT,
    created_ms        INTEGER NOT NULL,
    expires_ms        INTEGER NOT NULL,
    state             TEXT    NOT NULL
        CHECK (state IN ('pending', 'approved', 'used', 'expired', 'denied')),
    worst_case_tokens INTEGER NOT NULL,
    decision          TEXT,
    receipt           BLOB
);
INSERT INTO holds_v3 (hold_id, key_id, fingerprint, created_ms, expires_ms, state,
                      worst_case_tokens)
    SELECT hold_id, key_id, fingerprint, created_ms, expires_ms, state, worst_case_tokens
    FROM holds;
DROP TABLE holds;
ALTER TABLE holds_v3 RENAME TO holds;
CREATE INDEX holds_key_time ON holds (key_id, created_ms);
CREATE INDEX holds_open ON holds (created_ms) WHERE state IN ('pending', 'approved');

CREATE TABLE leases (
    hold_id    TEXT    PRIMARY KEY,
    key_id     TEXT    NOT NULL,
    granted_ms INTEGER NOT NULL,
    until_ms   INTEGER NOT NULL
);
CREATE INDEX leases_until ON leases (until_ms);
