-- The schedule of repeated steps (SPEC §2.3, issue "fair over hours"), shared by the fleet so
-- that instances sharing a key's sessions pace them as one instance would: per key and step
-- fingerprint (a keyed hash, no content), the run of that step — how many steps were decided
-- in it, when its first and latest were — and per key and agent session (a keyed hash), the
-- step it made last (a session that makes another step ends the run).
CREATE TABLE fleet_step_runs (
    key_id   text   NOT NULL,
    step     text   NOT NULL,
    steps    bigint NOT NULL,
    first_ms bigint NOT NULL,
    last_ms  bigint NOT NULL,
    PRIMARY KEY (key_id, step)
);
CREATE INDEX fleet_step_runs_last ON fleet_step_runs (last_ms);
CREATE TABLE fleet_session_steps (
    key_id  text   NOT NULL,
    session text   NOT NULL,
    step    text   NOT NULL,
    at_ms   bigint NOT NULL,
    PRIMARY KEY (key_id, session)
);
CREATE INDEX fleet_session_steps_at ON fleet_session_steps (at_ms);
