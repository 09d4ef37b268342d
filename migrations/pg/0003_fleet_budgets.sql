-- A budget set at run time (PUT /budget) through any instance holds for the whole fleet: it
-- lives on the key's row, which admissions lock, and overrides the config's budget.
ALTER TABLE fleet_keys
    ADD COLUMN budget_set   boolean NOT NULL DEFAULT false,
    ADD COLUMN ceiling_nano bigint,
    ADD COLUMN period       text;
