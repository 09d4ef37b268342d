-- The session of each forwarded call counted in a route prefix's rate (a keyed hash): past the
-- rate a session gets a route of its own only when another session shares the prefix (a lone
-- session keeps the shared route at any rate).
ALTER TABLE fleet_route_times ADD COLUMN session text;
