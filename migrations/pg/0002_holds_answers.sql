-- Holds, attending leases, recorded usage and stored answers, shared by the fleet.

-- CHALLENGE holds: created by the admission that decided the CHALLENGE, approved or denied by
-- a conditional UPDATE (one winner), used by the admission it releases (under the key's lock).
CREATE TABLE fleet_holds (
    hold_id           text PRIMARY KEY,
    key_id            text NOT NULL,
    fingerprint       text NOT NULL,
    created_ms        bigint NOT NULL,
    expires_ms        bigint NOT NULL,
    state             text NOT NULL,
    worst_case_tokens bigint NOT NULL,
    reason            text,
    -- The CHALLENGE that opened it (decision JSON and the signed receipt body): what a
    -- re-send gets while it is pending, on any instance.
    opening_decision  text,
    opening_receipt   bytea
);
CREATE INDEX fleet_holds_open ON fleet_holds (key_id, fingerprint, created_ms)
    WHERE state IN ('pending', 'approved');
CREATE INDEX fleet_holds_open_expiry ON fleet_holds (expires_ms)
    WHERE state IN ('pending', 'approved');

CREATE TABLE fleet_leases (
    hold_id    text PRIMARY KEY,
    key_id     text NOT NULL,
    granted_ms bigint NOT NULL,
    until_ms   bigint NOT NULL
);
CREATE INDEX fleet_leases_key ON fleet_leases (key_id, until_ms);

-- The provider-reported usage of a complete, reproducible answer: what a SERVE of it does
-- not buy. Written by the settle that books the usage.
CREATE TABLE fleet_recorded (
    key_id      text NOT NULL,
    fingerprint text NOT NULL,
    wire        text NOT NULL,
    usage       text NOT NULL,
    at_ms       bigint NOT NULL,
    PRIMARY KEY (key_id, fingerprint, wire)
);

-- Stored answers, scoped exactly like the in-memory store (key, fingerprint, wire form),
-- bounded by age and by total bytes (the sweep trims the oldest).
CREATE TABLE fleet_answers (
    key_id       text NOT NULL,
    fingerprint  text NOT NULL,
    wire         text NOT NULL,
    content_type text NOT NULL,
    body         bytea NOT NULL,
    bytes        bigint NOT NULL,
    stored_ms    bigint NOT NULL,
    expires_ms   bigint NOT NULL,
    PRIMARY KEY (key_id, fingerprint, wire)
);
CREATE INDEX fleet_answers_stored ON fleet_answers (stored_ms);
