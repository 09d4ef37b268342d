-- 11: no index by session. No query used it — a session's decisions are listed within
-- one key, whose (key, time) index the planner takes (`a_session_listing_reads_by_key_and_time`)
-- — while every decision row paid for it: an entry at a random place, one more page
-- written to the WAL at each commit (docs/performance.md).
DROP INDEX IF EXISTS decisions_by_session;
