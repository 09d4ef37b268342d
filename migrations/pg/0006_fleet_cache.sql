-- Prompt caching placed by the gate (SPEC §2.11b), shared by the fleet: per key and cache
-- point (a keyed prefix hash, no content), the last time the key sent that prefix and the last
-- time a breakpoint was placed there. Rows older than the cache's lifetime are swept.
CREATE TABLE fleet_cache_points (
    key_id     text   NOT NULL,
    prefix     text   NOT NULL,
    seen_ms    bigint NOT NULL,
    placed_ms  bigint,
    PRIMARY KEY (key_id, prefix)
);
CREATE INDEX fleet_cache_points_seen ON fleet_cache_points (seen_ms);
-- Whether the gate placed breakpoints for the call: only then does its usage carry a cache
-- saving. Rows before it placed none.
ALTER TABLE fleet_reservations
    ADD COLUMN cache_placed boolean NOT NULL DEFAULT false;
