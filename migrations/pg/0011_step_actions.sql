-- A run of a repeated step survives one other result of the same call between two of its
-- steps (SPEC §2.3, issue "fair over hours"): per key and agent session, the step it made
-- before its latest, and its latest step's action (a keyed hash of its tool calls without
-- their results; NULL for a turn without a tool call). No content.
ALTER TABLE fleet_session_steps ADD COLUMN before_step text;
ALTER TABLE fleet_session_steps ADD COLUMN action text;
