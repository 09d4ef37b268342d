-- 2: cheaper writes of the ALLOW path (decision + usage).
-- - Decision ids and decision fingerprints of 64 lowercase hex digits (all the gate makes)
-- are stored as their 32 bytes, anything else as the text it is. Since the typed ids
-- (`sql_types`) every write is 32 bytes; a text row of 64 hex digits still reads.
-- - A usage row is unique per decision by the decision's row id (`usage.decision`, close
-- to the end of its index) instead of by the random decision id; a usage stored before
-- its decision (`decision` NULL) is unique by decision id. See `insert_usage`.
-- - `decisions.open` = 1 now means "may be open": loads also check for the usage and
-- expiry rows (`settled!`), so the writer clears it without a savepoint (see `settle`).
UPDATE decisions SET decision_id = unhex(decision_id)
    WHERE typeof(decision_id) = 'text' AND length(decision_id) = 64
      AND decision_id NOT GLOB '*[^0-9a-f]*';
UPDATE decisions SET fingerprint = unhex(fingerprint)
    WHERE typeof(fingerprint) = 'text' AND length(fingerprint) = 64
      AND fingerprint NOT GLOB '*[^0-9a-f]*';
UPDATE usage SET decision_id = unhex(decision_id)
    WHERE typeof(decision_id) = 'text' AND length(decision_id) = 64
      AND decision_id NOT GLOB '*[^0-9a-f]*';
UPDATE reservation_expiries SET decision_id = unhex(decision_id)
    WHERE typeof(decision_id) = 'text' AND length(decision_id) = 64
      AND decision_id NOT GLOB '*[^0-9a-f]*';

CREATE TABLE usage_v2 (
    id           INTEGER PRIMARY KEY,
    decision_id  BLOB    NOT NULL,
    decision     INTEGER,
    key_id       TEXT    NOT NULL,
    at_ms        INTEGER NOT NULL,
    served_model TEXT    NOT NULL,
    wire         TEXT    NOT NULL CHECK (wire IN ('json', 'sse')),
    complete     INTEGER NOT NULL,
    input        INTEGER NOT NULL,
    cache_write  INTEGER NOT NULL,
    cache_read   INTEGER NOT NULL,
    output       INTEGER NOT NULL,
    spend_nano   INTEGER NOT NULL
);
INSERT INTO usage_v2 (id, decision_id, decision, key_id, at_ms, served_model, wire,
                      complete, input, cache_write, cache_read, output, spend_nano)
    SELECT u.id, u.decision_id,
           (SELECT d.id FROM decisions AS d WHERE d.decision_id = u.decision_id),
           u.key_id, u.at_ms, u.served_model, u.wire, u.complete, u.input, u.cache_write,
           u.cache_read, u.output, u.spend_nano
    FROM usage AS u;
DROP TABLE usage;
ALTER TABLE usage_v2 RENAME TO usage;
CREATE UNIQUE INDEX usage_decision ON usage (decision);
CREATE UNIQUE INDEX usage_early ON usage (decision_id) WHERE decision IS NULL;
CREATE INDEX usage_key_time ON usage (key_id, at_ms);
