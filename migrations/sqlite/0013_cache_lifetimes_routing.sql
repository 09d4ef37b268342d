-- 13: cache lifetimes and routing (SPEC §2.11b): what the gate did to a call's caching
-- (`CacheEdits` bits) on its decision; on its usage, the derived saving of lifetimes and of
-- routing, what a rewrite after a pause cost, and what one-hour entries cost above 5-minute
-- ones. Counterfactual figures, never in spend.
ALTER TABLE decisions ADD COLUMN cache_edits INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN cache_saving_lifetimes_nano INTEGER;
ALTER TABLE usage ADD COLUMN cache_saving_routing_nano INTEGER;
ALTER TABLE usage ADD COLUMN cache_rebuild_nano INTEGER;
ALTER TABLE usage ADD COLUMN cache_premium_1h_nano INTEGER NOT NULL DEFAULT 0;
