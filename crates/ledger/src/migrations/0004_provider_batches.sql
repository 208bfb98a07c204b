-- 0004: provider Batch API jobs. A batch is recorded (with every line and
-- its attempt) before anything is uploaded, and its provider id the moment
-- the create answers, so a crash at any point loses nothing and pays for
-- nothing twice: a resume polls and ingests open batches, and looks for a
-- batch whose create answer was lost before it submits anything again.

CREATE TABLE provider_batch (
    batch_id           INTEGER PRIMARY KEY,
    -- docket's own id, sent as OpenAI/Azure metadata and the Gemini display
    -- name: `find` looks for it when the create answer was lost
    tag                TEXT NOT NULL UNIQUE,
    session_id         TEXT NOT NULL REFERENCES llm_batch_session(session_id),
    stage              TEXT NOT NULL,
    provider           TEXT NOT NULL,       -- the provider's name in docket.toml
    provider_kind      TEXT NOT NULL,
    model              TEXT NOT NULL,
    -- 'submitting': recorded, create not answered yet (or its answer lost);
    -- 'unknown': `find` saw several candidates and could not tell them apart;
    -- 'ingested': terminal and every line's attempt has its outcome
    state              TEXT NOT NULL CHECK (state IN (
                           'submitting', 'validating', 'in_progress', 'finalizing', 'completed',
                           'failed', 'expired', 'cancelling', 'cancelled', 'unknown', 'ingested')),
    provider_batch_id  TEXT,
    input_file_id      TEXT,
    output_ref         TEXT,
    error_ref          TEXT,
    request_count      INTEGER NOT NULL,
    input_bytes        INTEGER NOT NULL,
    completed_count    INTEGER NOT NULL DEFAULT 0,   -- the provider's counts
    failed_count       INTEGER NOT NULL DEFAULT 0,
    ingested_count     INTEGER NOT NULL DEFAULT 0,   -- result lines applied here
    quarantined_count  INTEGER NOT NULL DEFAULT 0,
    poll_count         INTEGER NOT NULL DEFAULT 0,
    error_message      TEXT,
    cancel_requested_at REAL,
    created_at         REAL NOT NULL,
    submitted_at       REAL,
    ended_at           REAL,                          -- terminal at the provider
    last_polled_at     REAL,
    next_poll_at       REAL,
    updated_at         REAL NOT NULL
);
CREATE INDEX idx_provider_batch_session ON provider_batch(session_id, batch_id);
-- Resume and the console look for batches that are not finished with.
CREATE INDEX idx_provider_batch_open ON provider_batch(state) WHERE state != 'ingested';

-- One line of a batch: one attempt of one request. `custom_id` is the
-- attempt's client_request_id ('<session>-<request_id>-<attempt>').
CREATE TABLE provider_batch_item (
    batch_id    INTEGER NOT NULL REFERENCES provider_batch(batch_id),
    custom_id   TEXT NOT NULL,
    request_id  INTEGER NOT NULL REFERENCES llm_requests(request_id),
    attempt     INTEGER NOT NULL,
    PRIMARY KEY (batch_id, custom_id)
) WITHOUT ROWID;
CREATE INDEX idx_provider_batch_item_attempt ON provider_batch_item(request_id, attempt);

-- Result lines that could not be applied: unparsable, an unknown custom_id,
-- or a second line for the same one. Kept for the operator, never applied.
CREATE TABLE provider_batch_quarantine (
    quarantine_id  INTEGER PRIMARY KEY,
    batch_id       INTEGER NOT NULL REFERENCES provider_batch(batch_id),
    line           INTEGER NOT NULL,
    custom_id      TEXT,
    reason         TEXT NOT NULL,
    at             REAL NOT NULL
);
CREATE INDEX idx_provider_batch_quarantine_batch ON provider_batch_quarantine(batch_id);
