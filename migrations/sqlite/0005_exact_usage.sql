-- 5: exact usage (docs/usage-accounting.md).
-- - `usage.cache_write_1h`: of `cache_write`, the 1-hour writes (priced apart);
-- `usage.web_search_requests`: server-side web searches (priced per request).
-- - `usage.ending`: how the answer ended (`complete`, `error_event`, `truncated`, ...);
-- NULL in rows written before. `usage.basis`: what the spend was settled at
-- (`reported`, `worst_case`, `none`); every earlier row was settled at what was reported.
-- - `prices.cache_write_1h`, `prices.web_search_per_1k`: NULL when not set.
ALTER TABLE usage ADD COLUMN cache_write_1h INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN web_search_requests INTEGER NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN ending TEXT;
ALTER TABLE usage ADD COLUMN basis TEXT NOT NULL DEFAULT 'reported';
ALTER TABLE prices ADD COLUMN cache_write_1h INTEGER;
ALTER TABLE prices ADD COLUMN web_search_per_1k INTEGER;
