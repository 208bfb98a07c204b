-- 0006 (PostgreSQL): the ledger is the work queue. Any number of worker processes claim a
-- session's items from here; a claim is a lease with a fencing token, so a
-- worker that stalls past its lease (or dies) is taken over, and whatever it
-- writes after that is refused instead of doubled.

-- The claim on an item of a session. `claim_token` grows on every claim:
-- every write a worker makes for the item carries the token it claimed
-- with, and commits only while the row still has it. `lease_until` is NULL
-- when nobody holds the item (never claimed, released, or it has its
-- outcome); `claimed_by` keeps the last holder's worker id.
ALTER TABLE session_item ADD COLUMN claimed_by TEXT;
ALTER TABLE session_item ADD COLUMN lease_until DOUBLE PRECISION;
ALTER TABLE session_item ADD COLUMN claim_token BIGINT NOT NULL DEFAULT 0;
-- Renewal, release and "does anyone still hold work here" read the held rows.
CREATE INDEX idx_session_item_held ON session_item(session_id, lease_until)
    WHERE lease_until IS NOT NULL;

-- Spend whose result was refused because the worker had lost its lease
-- (it stalled past it and another worker took the item over): paid for,
-- never applied.
ALTER TABLE llm_batch_session ADD COLUMN orphaned_count BIGINT NOT NULL DEFAULT 0;
ALTER TABLE llm_batch_session ADD COLUMN orphaned_cost_usd DOUBLE PRECISION NOT NULL DEFAULT 0;

-- Every process that works (or worked) on a session: the console lists
-- them, and their number splits the provider's limits between them.
CREATE TABLE session_worker (
    worker_id         TEXT PRIMARY KEY,      -- user@host:pid#random
    session_id        TEXT NOT NULL REFERENCES llm_batch_session(session_id) DEFERRABLE,
    user_name         TEXT NOT NULL,
    host              TEXT NOT NULL,
    pid               BIGINT NOT NULL,
    started_at        DOUBLE PRECISION NOT NULL,
    heartbeat_at      DOUBLE PRECISION NOT NULL,
    ended_at          DOUBLE PRECISION,                  -- it let go of the session
    claims            BIGINT NOT NULL DEFAULT 0,   -- items it holds now
    sent              BIGINT NOT NULL DEFAULT 0,   -- attempts it sent
    requests_per_sec  DOUBLE PRECISION NOT NULL DEFAULT 0,
    orphaned          BIGINT NOT NULL DEFAULT 0,   -- its results refused (lease lost)
    -- its own gauges (a serialized watch::LiveGauges); the session's
    -- live_json is the sum over its live workers
    live_json         TEXT
);
CREATE INDEX idx_session_worker_session ON session_worker(session_id, heartbeat_at);

-- A provider batch is polled and ingested by one worker at a time: the one
-- holding its lease. A dead worker's batches are taken over when it lapses.
ALTER TABLE provider_batch ADD COLUMN claimed_by TEXT;
ALTER TABLE provider_batch ADD COLUMN lease_until DOUBLE PRECISION;
