-- A fleet of gates on one PostgreSQL: the shared state every instance decides from.
-- Times are unix milliseconds of the database's clock; money is nano-USD.

-- One row per key: the row every admission of the key locks (SELECT ... FOR UPDATE through an
-- upsert), which serialises a key's admissions across instances. It also carries the key's
-- decision clock, strictly increasing, so two decisions of a key never share a millisecond.
CREATE TABLE fleet_keys (
    key_id          text PRIMARY KEY,
    last_decided_ms bigint NOT NULL
);

-- Every committed decision: the ledger row, and the attempt the sliding windows count.
CREATE TABLE fleet_decisions (
    decision_id      text PRIMARY KEY,
    key_id           text NOT NULL,
    decided_at_ms    bigint NOT NULL,
    fingerprint      text,
    step_fingerprint text,
    model            text NOT NULL,
    verdict          text NOT NULL,
    reason           text NOT NULL,
    reserved_nano    bigint NOT NULL,
    -- The ledger's DecisionRow as JSON (counts, hashes, figures: never content).
    row_json         text NOT NULL
);
CREATE INDEX fleet_decisions_key_time ON fleet_decisions (key_id, decided_at_ms);
CREATE INDEX fleet_decisions_key_fp ON fleet_decisions (key_id, fingerprint, decided_at_ms);
CREATE INDEX fleet_decisions_key_step ON fleet_decisions (key_id, step_fingerprint, decided_at_ms);
CREATE INDEX fleet_decisions_key_model ON fleet_decisions (key_id, model, decided_at_ms);
CREATE INDEX fleet_decisions_time ON fleet_decisions (decided_at_ms);

-- Open reservations: a forwarded decision's worst case, until its usage settles it or it
-- expires (charged at its worst case).
CREATE TABLE fleet_reservations (
    decision_id    text PRIMARY KEY,
    key_id         text NOT NULL,
    nano           bigint NOT NULL,
    expires_ms     bigint NOT NULL,
    served_model   text NOT NULL,
    wire           text NOT NULL,
    output_ceiling bigint,
    fingerprint    text NOT NULL,
    reusable       boolean NOT NULL
);
CREATE INDEX fleet_reservations_key ON fleet_reservations (key_id);
CREATE INDEX fleet_reservations_expiry ON fleet_reservations (expires_ms);

-- What each forwarded decision was charged, once: its usage, or its worst case on expiry.
-- The primary key makes settling idempotent by decision (reservation) id.
CREATE TABLE fleet_usage (
    decision_id text PRIMARY KEY,
    key_id      text NOT NULL,
    at_ms       bigint NOT NULL,
    spend_nano  bigint NOT NULL,
    -- 'usage' (reported by the proxy or a digest client) or 'expired'.
    kind        text NOT NULL,
    -- The ledger's UsageRow as JSON; NULL for an expiry charge.
    row_json    text
);
CREATE INDEX fleet_usage_key_time ON fleet_usage (key_id, at_ms);
