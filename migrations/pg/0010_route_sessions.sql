-- The session of each forwarded call counted in a route prefix's rate (a keyed hash): the gate
-- never spreads a prefix over more routing keys than sessions sent it in the minute.
ALTER TABLE fleet_route_times ADD COLUMN session text;
