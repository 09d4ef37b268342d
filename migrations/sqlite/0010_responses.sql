-- 10: which key created each stored Responses object, and the context the provider billed
-- for it (`ResponseBinding`). An id created before this table is bound to no key: every
-- key is refused it (docs/routes-and-security.md, "Security").
CREATE TABLE responses (
    response_id    TEXT    PRIMARY KEY,
    key_id         TEXT    NOT NULL,
    created_ms     INTEGER NOT NULL,
    context_tokens INTEGER
) WITHOUT ROWID;
