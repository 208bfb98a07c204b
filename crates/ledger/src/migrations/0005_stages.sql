-- 0005: staged pipelines. A job runs ordered stages per item (a generator,
-- then a critic of it, ...); every stage of every item is one request.

-- Every request a session runs: one per (item, stage). `session_item`
-- keeps the first stage's request, as before.
CREATE TABLE session_request (
    session_id  TEXT NOT NULL REFERENCES llm_batch_session(session_id),
    item_id     TEXT NOT NULL REFERENCES decision(item_id),
    stage       TEXT NOT NULL,
    position    INTEGER NOT NULL,               -- the stage's place in the job, from 0
    request_id  INTEGER NOT NULL REFERENCES llm_requests(request_id),
    -- 'passed': its answer passed the gate; 'failed': its budgets are spent
    -- (the item's outcome is `error`); 'skipped': an earlier stage failed,
    -- so it never ran
    state       TEXT NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'passed', 'failed', 'skipped')),
    -- the stage's output for the item once passed: its request's parsed
    -- answer, with criteria asked again one by one merged in
    output_json TEXT,
    updated_at  REAL NOT NULL,
    PRIMARY KEY (session_id, item_id, stage)
);
CREATE INDEX idx_session_request_request ON session_request(request_id);

-- Per session and stage: the checkpoint the seed calls `run_stages`.
CREATE TABLE run_stages (
    session_id     TEXT NOT NULL REFERENCES llm_batch_session(session_id),
    stage          TEXT NOT NULL,
    position       INTEGER NOT NULL,
    role           TEXT NOT NULL CHECK (role IN ('generator', 'critic')),
    critic_of      TEXT,                        -- the stage a critic judges
    total          INTEGER NOT NULL DEFAULT 0,  -- items the session set out to run through it
    completed      INTEGER NOT NULL DEFAULT 0,  -- passed the gate
    failed         INTEGER NOT NULL DEFAULT 0,  -- budgets spent
    skipped        INTEGER NOT NULL DEFAULT 0,  -- an earlier stage failed
    last_batch_id  INTEGER REFERENCES provider_batch(batch_id),
    state          TEXT NOT NULL DEFAULT 'pending'
                   CHECK (state IN ('pending', 'running', 'done')),
    started_at     REAL,
    completed_at   REAL,
    updated_at     REAL NOT NULL,
    PRIMARY KEY (session_id, stage)
);

-- What the critic said, and how the routing rule used it.
ALTER TABLE llm_batch_result ADD COLUMN critic_json TEXT;
ALTER TABLE llm_batch_result ADD COLUMN critic_verdict TEXT;
ALTER TABLE llm_batch_result ADD COLUMN routing_note TEXT;

-- Outcomes replaced by `--rerun-stage`, kept for the audit trail.
CREATE TABLE llm_batch_result_history (
    history_id       INTEGER PRIMARY KEY,
    session_id       TEXT NOT NULL,
    item_id          TEXT NOT NULL,
    processed_at     REAL NOT NULL,
    outcome          TEXT NOT NULL,
    answer_json      TEXT,
    confidence       REAL,
    rationale        TEXT,
    model_id         TEXT,
    error_message    TEXT,
    adjudication_id  TEXT,
    stage            TEXT NOT NULL,
    request_id       INTEGER,
    attempts         INTEGER NOT NULL,
    input_tokens     INTEGER NOT NULL,
    output_tokens    INTEGER NOT NULL,
    cost_usd         REAL NOT NULL,
    critic_json      TEXT,
    critic_verdict   TEXT,
    routing_note     TEXT,
    superseded_at    REAL NOT NULL,
    superseded_by    TEXT NOT NULL                 -- e.g. 'rerun-stage critic by cli:alice'
);
CREATE INDEX idx_result_history_item ON llm_batch_result_history(session_id, item_id);

-- Sessions from before: one stage each.
INSERT INTO session_request (session_id, item_id, stage, position, request_id, state, output_json, updated_at)
SELECT si.session_id, si.item_id, r.stage, 0, si.request_id,
       CASE WHEN b.outcome IS NULL THEN 'pending'
            WHEN b.outcome = 'error' THEN 'failed' ELSE 'passed' END,
       CASE WHEN b.outcome IS NULL OR b.outcome = 'error' THEN NULL ELSE r.parsed_output_json END,
       COALESCE(b.processed_at, r.updated_at)
FROM session_item si
JOIN llm_requests r ON r.request_id = si.request_id
LEFT JOIN llm_batch_result b ON b.session_id = si.session_id AND b.item_id = si.item_id;

INSERT INTO run_stages (session_id, stage, position, role, total, completed, failed, state,
                        started_at, completed_at, updated_at)
SELECT s.session_id,
       COALESCE((SELECT r.stage FROM session_item si JOIN llm_requests r ON r.request_id = si.request_id
                 WHERE si.session_id = s.session_id LIMIT 1), 'adjudicate'),
       0, 'generator', s.total_count,
       s.processed_count - s.error_count, s.error_count,
       CASE WHEN s.state = 'completed' THEN 'done' ELSE 'running' END,
       s.started_at, s.completed_at, s.updated_at
FROM llm_batch_session s;
