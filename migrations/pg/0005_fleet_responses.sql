-- Which key created each stored Responses object (the provider's response id, as an instance
-- saw it in the answer it relayed), and the context the provider billed for it (input plus
-- output tokens; NULL until known). Only that key may read, delete, cancel or continue it,
-- through any instance. No content: an id, a key id, a time and a count. An id created before
-- this table is bound to no key: every key is refused it.
CREATE TABLE fleet_responses (
    response_id    text   PRIMARY KEY,
    key_id         text   NOT NULL,
    created_ms     bigint NOT NULL,
    context_tokens bigint
);
