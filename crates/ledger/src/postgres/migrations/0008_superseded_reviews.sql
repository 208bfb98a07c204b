-- 0008 (PostgreSQL): an item never has two pending review items. A newer
-- answer for an item still pending review supersedes the older suggestion:
-- the older row becomes 'superseded' (kept as history, out of the queue)
-- and names the review item that replaced it. `superseded_by` has no
-- REFERENCES, as in SQLite (a copy inserts rows in review_id order).
-- Ledgers that already hold two pending review items for one item keep the
-- newest pending and supersede the others.
ALTER TABLE review_item DROP CONSTRAINT IF EXISTS review_item_status_check;
ALTER TABLE review_item ADD CONSTRAINT review_item_status_check
    CHECK (status IN ('pending', 'accepted', 'rejected', 'superseded'));
ALTER TABLE review_item ADD COLUMN superseded_by BIGINT;
ALTER TABLE review_item ADD COLUMN superseded_at DOUBLE PRECISION;

WITH ranked AS (
    SELECT review_id,
           FIRST_VALUE(review_id) OVER newest_first AS newest_id,
           FIRST_VALUE(created_at) OVER newest_first AS newest_at
    FROM review_item
    WHERE status = 'pending'
    WINDOW newest_first AS (PARTITION BY item_id ORDER BY created_at DESC, review_id DESC)
)
UPDATE review_item r
SET status = 'superseded', superseded_by = ranked.newest_id, superseded_at = ranked.newest_at,
    claimed_by = NULL, claim_expires_at = NULL
FROM ranked
WHERE r.review_id = ranked.review_id AND ranked.newest_id <> ranked.review_id;

-- The invariant itself: at most one pending review item per item.
CREATE UNIQUE INDEX idx_review_item_one_pending ON review_item(item_id) WHERE status = 'pending';
-- "Does more than one session have items in the queue?": the smallest and
-- the largest session id among the pending rows.
CREATE INDEX idx_review_item_session_queue ON review_item(status, session_id);
-- The review card lists what a review item replaced.
CREATE INDEX idx_review_item_superseded_by ON review_item(superseded_by)
    WHERE superseded_by IS NOT NULL;
