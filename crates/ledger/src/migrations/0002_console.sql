-- 0002: what the console needs from the ledger (the bus between processes).

-- Run controls beyond desired_state. `stop_after_stage` asks the engine to
-- finish the stage it is in and then freeze (NULL: no such request). The
-- tune_* columns are an operator's retune of a live run (NULL: the config's).
-- `live_json` is the engine's own view written with each heartbeat
-- (concurrency, in flight, limits, rates, why it is slow), so a console in
-- another process shows the same gauges as one in the same process.
ALTER TABLE llm_batch_session ADD COLUMN stop_after_stage TEXT;
ALTER TABLE llm_batch_session ADD COLUMN tune_rpm INTEGER;
ALTER TABLE llm_batch_session ADD COLUMN tune_tpm INTEGER;
ALTER TABLE llm_batch_session ADD COLUMN tune_concurrency INTEGER;
ALTER TABLE llm_batch_session ADD COLUMN live_json TEXT;

-- Notable things that happened to a session, newest read first: state
-- changes, operator controls (with who asked), fatal stops, rate limiting.
CREATE TABLE session_event (
    event_id    INTEGER PRIMARY KEY,
    session_id  TEXT NOT NULL REFERENCES llm_batch_session(session_id),
    at          REAL NOT NULL,
    level       TEXT NOT NULL CHECK (level IN ('info', 'warn', 'error')),
    kind        TEXT NOT NULL,
    message     TEXT NOT NULL,
    actor       TEXT
);
CREATE INDEX idx_session_event_session ON session_event(session_id, at);

-- Append-only log of human review decisions. Undo appends an 'undo' row and
-- marks the reversed one, so the last decision can be undone after a restart.
-- `prev_decision_json` is the decision row before the action, to restore.
CREATE TABLE review_log (
    log_id              INTEGER PRIMARY KEY,
    review_id           INTEGER NOT NULL REFERENCES review_item(review_id),
    item_id             TEXT NOT NULL,
    action              TEXT NOT NULL CHECK (action IN ('accept', 'reject', 'undo')),
    actor               TEXT NOT NULL,
    at                  REAL NOT NULL,
    prev_decision_json  TEXT,
    undoes_log_id       INTEGER REFERENCES review_log(log_id),
    undone_by_log_id    INTEGER REFERENCES review_log(log_id)
);
CREATE INDEX idx_review_log_actor ON review_log(actor, log_id);

-- The events pane reads a session's failed attempts and errored items; both
-- are rare, so partial indexes keep them cheap on a million-row ledger.
CREATE INDEX idx_llm_messages_trouble ON llm_messages(session_id, finished_at)
    WHERE state IN ('failed', 'ambiguous');
CREATE INDEX idx_llm_messages_open ON llm_messages(session_id) WHERE state = 'sent';
CREATE INDEX idx_batch_result_error ON llm_batch_result(session_id, processed_at)
    WHERE outcome = 'error';
-- The review queue pages pending items by confidence; claims are per item.
CREATE INDEX idx_review_item_queue ON review_item(status, confidence DESC, review_id);
