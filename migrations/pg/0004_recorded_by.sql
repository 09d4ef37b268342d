-- Who may settle a reservation: the proxy that forwarded the call ('proxy'), or the digest
-- client that asked POST /gate ('digest'); and the decision's input worst case (tokens),
-- which bounds what a digest client's record may report. Rows before it were the proxy's.
ALTER TABLE fleet_reservations
    ADD COLUMN recorded_by  text   NOT NULL DEFAULT 'proxy'
        CHECK (recorded_by IN ('proxy', 'digest')),
    ADD COLUMN input_tokens bigint NOT NULL DEFAULT 0;
