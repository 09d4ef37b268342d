-- 1: the initial schema.
CREATE TABLE decisions (
    id                        INTEGER PRIMARY KEY,
    decision_id               TEXT    NOT NULL UNIQUE,
    key_id                    TEXT    NOT NULL,
    fingerprint               TEXT,
    verdict                   TEXT    NOT NULL
        CHECK (verdict IN ('SERVE', 'ALLOW', 'DOWNGRADE', 'CHALLENGE', 'BLOCK')),
    reason                    TEXT    NOT NULL,
    score                     REAL,
    model_requested           TEXT    NOT NULL,
    model_served              TEXT,
    wire                      TEXT    NOT NULL CHECK (wire IN ('json', 'sse')),
    decided_at_ms             INTEGER NOT NULL,
    reserved_nano             INTEGER NOT NULL,
    worst_case_tokens         INTEGER,
    tokens_not_bought         INTEGER NOT NULL,
    worst_case_tokens_avoided INTEGER NOT NULL,
    findings_tokens           INTEGER NOT NULL,
    hold_id                   TEXT,
    -- 1 while the decision holds a reservation not yet settled by usage or charged at
    -- expiry; kept by the writer so that the open reservations are read by index.
    open                      INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX decisions_key_time ON decisions (key_id, decided_at_ms);
CREATE INDEX decisions_time ON decisions (decided_at_ms);
CREATE INDEX decisions_open ON decisions (decided_at_ms) WHERE open = 1;

CREATE TABLE usage (
    id           INTEGER PRIMARY KEY,
    decision_id  TEXT    NOT NULL UNIQUE,
    key_id       TEXT    NOT NULL,
    at_ms        INTEGER NOT NULL,
    served_model TEXT    NOT NULL,
    wire         TEXT    NOT NULL CHECK (wire IN ('json', 'sse')),
    complete     INTEGER NOT NULL,
    input        INTEGER NOT NULL,
    cache_write  INTEGER NOT NULL,
    cache_read   INTEGER NOT NULL,
    output       INTEGER NOT NULL,
    spend_nano   INTEGER NOT NULL
);
CREATE INDEX usage_key_time ON usage (key_id, at_ms);

CREATE TABLE reservation_expiries (
    id           INTEGER PRIMARY KEY,
    decision_id  TEXT    NOT NULL UNIQUE,
    key_id       TEXT    NOT NULL,
    at_ms        INTEGER NOT NULL,
    charged_nano INTEGER NOT NULL
);
CREATE INDEX reservation_expiries_key_time ON reservation_expiries (key_id, at_ms);

CREATE TABLE holds (
    hold_id           TEXT    PRIMARY KEY,
    key_id            TEXT    NOT NULL,
    fingerprint       TEXT,
    created_ms        INTEGER NOT NULL,
    expires_ms        INTEGER NOT NULL,
    state             TEXT    NOT NULL
        CHECK (state IN ('pending', 'approved', 'used', 'expired')),
    worst_case_tokens INTEGER NOT NULL
);
CREATE INDEX holds_key_time ON holds (key_id, created_ms);

CREATE TABLE recorded (
    key_id      TEXT    NOT NULL,
    fingerprint TEXT    NOT NULL,
    wire        TEXT    NOT NULL CHECK (wire IN ('json', 'sse')),
    input       INTEGER NOT NULL,
    cache_write INTEGER NOT NULL,
    cache_read  INTEGER NOT NULL,
    output      INTEGER NOT NULL,
    at_ms       INTEGER NOT NULL,
    PRIMARY KEY (key_id, fingerprint, wire)
) WITHOUT ROWID;

CREATE TABLE budgets (
    key_id       TEXT PRIMARY KEY,
    ceiling_nano INTEGER,
    period       TEXT NOT NULL CHECK (period IN ('lifetime', 'day', 'month'))
);

CREATE TABLE prices (
    model       TEXT    PRIMARY KEY,
    input       INTEGER NOT NULL,
    cache_write INTEGER NOT NULL,
    cache_read  INTEGER NOT NULL,
    output      INTEGER NOT NULL,
    max_output  INTEGER NOT NULL
);
