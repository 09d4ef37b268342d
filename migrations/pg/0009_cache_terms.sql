-- Cache lifetimes and routing placed by the gate (SPEC §2.11b), shared by the fleet so every
-- instance places them alike: per key and agent session (a keyed hash), when its latest call
-- was forwarded, how many were, the pauses between them and the provider's figures (the latest
-- prompt and how much it grew); per key and route prefix (a keyed hash), when its forwarded
-- calls were decided (their rate picks a routing key). No content.
CREATE TABLE fleet_session_cache (
    key_id         text   NOT NULL,
    session        text   NOT NULL,
    last_ms        bigint,
    calls          bigint NOT NULL,
    pauses         bigint NOT NULL,
    prompt_tokens  bigint NOT NULL,
    grown_tokens   bigint NOT NULL,
    PRIMARY KEY (key_id, session)
);
CREATE INDEX fleet_session_cache_last ON fleet_session_cache (last_ms);
CREATE TABLE fleet_route_times (
    key_id text   NOT NULL,
    prefix text   NOT NULL,
    at_ms  bigint NOT NULL
);
CREATE INDEX fleet_route_times_key ON fleet_route_times (key_id, prefix, at_ms);
-- What the gate did to a call's caching (CacheEdits bits) and its session, so that settling
-- attributes the call's savings and feeds its session's figures.
ALTER TABLE fleet_reservations
    ADD COLUMN cache_edits smallint NOT NULL DEFAULT 0,
    ADD COLUMN session text;
