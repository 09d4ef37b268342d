-- Recorded usage makes an answer servable for as long as answers are kept (a day): the sweep
-- deletes older rows by their time.
CREATE INDEX fleet_recorded_at ON fleet_recorded (at_ms);
