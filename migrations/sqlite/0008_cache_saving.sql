-- 8: the derived cache saving of a call whose prompt-cache breakpoints the gate placed
-- (SPEC §2.11b): NULL for every other call. Counterfactual; never in spend or savings.
ALTER TABLE usage ADD COLUMN cache_saving_nano INTEGER;
