-- 0001: the first ledger. Migrations are numbered and never edited once landed.
-- Times are unix seconds as REAL (UTC). All names are snake_case.

-- One row per item to decide. `state` stays 'indeterminate' until an auto-accept
-- or a human accepts a suggestion.
CREATE TABLE decision (
    item_id              TEXT PRIMARY KEY,
    state                TEXT NOT NULL DEFAULT 'indeterminate'
                         CHECK (state IN ('indeterminate', 'decided')),
    evidence_json        TEXT NOT NULL,
    decided_answer_json  TEXT,
    decided_by           TEXT,      -- 'llm_auto_accept' or 'review:<user>'
    decided_at           REAL,
    confidence           REAL,
    model_id             TEXT,
    adjudication_id      TEXT,      -- llm_requests.request_id that produced the answer
    source_file          TEXT,
    source_line          INTEGER,
    imported_at          REAL NOT NULL,
    updated_at           REAL NOT NULL
);
CREATE INDEX idx_decision_state ON decision(state);

-- One row per run of batch-adjudicate (the seed's table plus the honest counters).
CREATE TABLE llm_batch_session (
    session_id            TEXT PRIMARY KEY,
    started_at            REAL NOT NULL,
    completed_at          REAL,
    total_count           INTEGER NOT NULL,
    processed_count       INTEGER NOT NULL DEFAULT 0,
    accepted_count        INTEGER NOT NULL DEFAULT 0,
    reviewed_count        INTEGER NOT NULL DEFAULT 0,
    rejected_count        INTEGER NOT NULL DEFAULT 0,
    error_count           INTEGER NOT NULL DEFAULT 0,
    config_snapshot_json  TEXT NOT NULL,
    state                 TEXT NOT NULL
                          CHECK (state IN ('running', 'paused', 'completed', 'cancelled', 'error')),
    -- what an operator asked for; any engine running the session obeys it (the ledger is the bus)
    desired_state         TEXT NOT NULL DEFAULT 'running'
                          CHECK (desired_state IN ('running', 'paused', 'cancelled')),
    stop_reason           TEXT,
    attempt_count         INTEGER NOT NULL DEFAULT 0,
    retry_count           INTEGER NOT NULL DEFAULT 0,
    rate_limited_count    INTEGER NOT NULL DEFAULT 0,
    ambiguous_count       INTEGER NOT NULL DEFAULT 0,
    input_tokens          INTEGER NOT NULL DEFAULT 0,
    output_tokens         INTEGER NOT NULL DEFAULT 0,
    cost_usd              REAL NOT NULL DEFAULT 0,
    estimated_tokens      INTEGER NOT NULL DEFAULT 0,
    estimated_cost_usd    REAL NOT NULL DEFAULT 0,
    max_cost_usd          REAL,
    owner_pid             INTEGER,
    owner_host            TEXT,
    heartbeat_at          REAL,
    updated_at            REAL NOT NULL
);

-- The items a session set out to process, in dispatch order.
CREATE TABLE session_item (
    session_id  TEXT NOT NULL REFERENCES llm_batch_session(session_id),
    position    INTEGER NOT NULL,
    item_id     TEXT NOT NULL REFERENCES decision(item_id),
    request_id  INTEGER NOT NULL REFERENCES llm_requests(request_id),
    PRIMARY KEY (session_id, item_id),
    UNIQUE (session_id, position)
);
-- Planning asks "is this item in a live session?" per candidate.
CREATE INDEX idx_session_item_item ON session_item(item_id);

-- One logical LLM call. Retries are attempts of the same request (llm_messages).
CREATE TABLE llm_requests (
    request_id         INTEGER PRIMARY KEY,
    item_id            TEXT NOT NULL REFERENCES decision(item_id),
    stage              TEXT NOT NULL,
    provider           TEXT NOT NULL,
    model              TEXT NOT NULL,
    request_version    INTEGER NOT NULL DEFAULT 1,
    status             TEXT NOT NULL DEFAULT 'pending'
                       -- in flight is not a status: an attempt 'sent' in llm_messages
                       -- with no answer yet says it, and survives a crash
                       CHECK (status IN ('pending', 'completed', 'error')),
    attempt            INTEGER NOT NULL DEFAULT 0,   -- sends so far
    transport_retries  INTEGER NOT NULL DEFAULT 0,
    gate_failures      INTEGER NOT NULL DEFAULT 0,
    last_error         TEXT,
    template_hash      TEXT NOT NULL,
    params_hash        TEXT NOT NULL,
    parsed_output_json TEXT,                         -- the gate's output once it passed
    result_message_id  INTEGER REFERENCES llm_messages(message_id),
    created_at         REAL NOT NULL,
    updated_at         REAL NOT NULL,
    UNIQUE (item_id, stage, provider, model, request_version)
);
CREATE INDEX idx_llm_requests_status ON llm_requests(status);

-- One row per attempt (send). Written before the HTTP call (state 'sent'),
-- completed after it. A 'sent' row with no answer after a crash is ambiguous.
CREATE TABLE llm_messages (
    message_id           INTEGER PRIMARY KEY,
    request_id           INTEGER NOT NULL REFERENCES llm_requests(request_id),
    attempt              INTEGER NOT NULL,
    session_id           TEXT REFERENCES llm_batch_session(session_id),
    -- sent as X-Client-Request-Id: '<session>-<request_id>-<attempt>', so
    -- unique by construction (no index: one less write per attempt)
    client_request_id    TEXT NOT NULL,
    state                TEXT NOT NULL
                         CHECK (state IN ('sent', 'answered', 'failed', 'ambiguous')),
    system_prompt        TEXT,
    user_prompt          TEXT NOT NULL,
    assistant_output     TEXT,
    finish_reason        TEXT,
    http_status          INTEGER,
    error_kind           TEXT,
    error_message        TEXT,
    provider_request_id  TEXT,
    model_reported       TEXT,
    input_tokens         INTEGER,
    output_tokens        INTEGER,
    total_tokens         INTEGER,
    cached_input_tokens  INTEGER,
    reasoning_tokens     INTEGER,
    cost_usd             REAL,
    latency_ms           REAL,
    sent_at              REAL NOT NULL,
    finished_at          REAL,
    UNIQUE (request_id, attempt)
);

-- The outcome of each item in a session: at most one (the primary key).
-- `file_id`, `crg_mbid` and `rr_mbid` keep the seed's column names: file_id is
-- the item id, the mbids are read from the answer when it has them.
CREATE TABLE llm_batch_result (
    session_id       TEXT NOT NULL REFERENCES llm_batch_session(session_id),
    item_id          TEXT NOT NULL REFERENCES decision(item_id),
    processed_at     REAL NOT NULL,
    outcome          TEXT NOT NULL CHECK (outcome IN ('accepted', 'review', 'rejected', 'error')),
    answer_json      TEXT,
    confidence       REAL,
    rationale        TEXT,
    model_id         TEXT,
    error_message    TEXT,
    adjudication_id  TEXT,
    stage            TEXT NOT NULL,
    request_id       INTEGER REFERENCES llm_requests(request_id),
    attempts         INTEGER NOT NULL DEFAULT 0,
    input_tokens     INTEGER NOT NULL DEFAULT 0,
    output_tokens    INTEGER NOT NULL DEFAULT 0,
    cost_usd         REAL NOT NULL DEFAULT 0,
    file_id          TEXT GENERATED ALWAYS AS (item_id) VIRTUAL,
    crg_mbid         TEXT GENERATED ALWAYS AS (json_extract(answer_json, '$.crg_mbid')) VIRTUAL,
    rr_mbid          TEXT GENERATED ALWAYS AS (json_extract(answer_json, '$.rr_mbid')) VIRTUAL,
    PRIMARY KEY (session_id, item_id)
);
CREATE INDEX idx_batch_result_session ON llm_batch_result(session_id);
CREATE INDEX idx_batch_result_outcome ON llm_batch_result(outcome);

-- Medium-confidence suggestions waiting for an operator.
CREATE TABLE review_item (
    review_id            INTEGER PRIMARY KEY,
    item_id              TEXT NOT NULL REFERENCES decision(item_id),
    session_id           TEXT REFERENCES llm_batch_session(session_id),
    source               TEXT NOT NULL,                 -- 'LLM_REVIEW'
    status               TEXT NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'accepted', 'rejected')),
    llm_suggestion_json  TEXT NOT NULL,
    confidence           REAL,
    rationale            TEXT,
    model_id             TEXT,
    request_id           INTEGER REFERENCES llm_requests(request_id),
    created_at           REAL NOT NULL,
    decided_by           TEXT,
    decided_at           REAL,
    claimed_by           TEXT,
    claim_expires_at     REAL,
    UNIQUE (session_id, item_id)
);
CREATE INDEX idx_review_item_status ON review_item(status, confidence);
CREATE INDEX idx_review_item_item ON review_item(item_id);
