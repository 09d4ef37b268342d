-- 6: hold and recorded-usage fingerprints as their 32 bytes, like the decisions' (2): the
-- typed `Hash` is written as a BLOB (`sql_types`). Only 64 lowercase hex digits (all the
-- gate makes) convert, so distinct values stay distinct under `recorded`'s primary key.
UPDATE holds SET fingerprint = unhex(fingerprint)
    WHERE typeof(fingerprint) = 'text' AND length(fingerprint) = 64
      AND fingerprint NOT GLOB '*[^0-9a-f]*';
UPDATE recorded SET fingerprint = unhex(fingerprint)
    WHERE typeof(fingerprint) = 'text' AND length(fingerprint) = 64
      AND fingerprint NOT GLOB '*[^0-9a-f]*';
