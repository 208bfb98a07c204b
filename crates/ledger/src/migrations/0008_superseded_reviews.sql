-- 0008: an item never has two pending review items. A newer answer for an
-- item still pending review supersedes the older suggestion: the older row
-- becomes 'superseded' (it stays as history, out of the queue) and names
-- the review item that replaced it. `superseded_by` has no REFERENCES: a
-- copy between ledgers inserts rows in review_id order, and the newer row
-- comes after the one naming it.
--
-- SQLite cannot change a CHECK in place: the table is rebuilt (the
-- migration runs with foreign keys off, so review_log's rows keep pointing
-- at the same review ids), and its indexes and search triggers made again.
-- Ledgers that already hold two pending review items for one item (from
-- before this migration) keep the newest pending and supersede the others.
CREATE TABLE review_item_new (
    review_id            INTEGER PRIMARY KEY,
    item_id              TEXT NOT NULL REFERENCES decision(item_id),
    session_id           TEXT REFERENCES llm_batch_session(session_id),
    source               TEXT NOT NULL,                 -- 'LLM_REVIEW'
    status               TEXT NOT NULL DEFAULT 'pending'
                         CHECK (status IN ('pending', 'accepted', 'rejected', 'superseded')),
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
    superseded_by        INTEGER,                       -- the review item that replaced it
    superseded_at        REAL,
    UNIQUE (session_id, item_id)
);

INSERT INTO review_item_new (review_id, item_id, session_id, source, status, llm_suggestion_json,
    confidence, rationale, model_id, request_id, created_at, decided_by, decided_at, claimed_by,
    claim_expires_at, superseded_by, superseded_at)
SELECT review_id, item_id, session_id, source,
       CASE WHEN status = 'pending' AND review_id != newest_id THEN 'superseded' ELSE status END,
       llm_suggestion_json, confidence, rationale, model_id, request_id, created_at, decided_by,
       decided_at,
       CASE WHEN status = 'pending' AND review_id != newest_id THEN NULL ELSE claimed_by END,
       CASE WHEN status = 'pending' AND review_id != newest_id THEN NULL ELSE claim_expires_at END,
       CASE WHEN status = 'pending' AND review_id != newest_id THEN newest_id END,
       CASE WHEN status = 'pending' AND review_id != newest_id THEN newest_at END
FROM (SELECT r.*,
             FIRST_VALUE(review_id) OVER newest_first AS newest_id,
             FIRST_VALUE(created_at) OVER newest_first AS newest_at
      FROM review_item r
      WINDOW newest_first AS (PARTITION BY item_id, status = 'pending'
                              ORDER BY created_at DESC, review_id DESC))
ORDER BY review_id;

DROP TABLE review_item;
ALTER TABLE review_item_new RENAME TO review_item;

CREATE INDEX idx_review_item_status ON review_item(status, confidence);
CREATE INDEX idx_review_item_item ON review_item(item_id);
CREATE INDEX idx_review_item_queue ON review_item(status, confidence DESC, review_id);
-- The invariant itself: at most one pending review item per item.
CREATE UNIQUE INDEX idx_review_item_one_pending ON review_item(item_id) WHERE status = 'pending';
-- "Does more than one session have items in the queue?" is the smallest
-- and the largest session id among the pending rows: two index lookups.
CREATE INDEX idx_review_item_session_queue ON review_item(status, session_id);
-- The review card lists what a review item replaced.
CREATE INDEX idx_review_item_superseded_by ON review_item(superseded_by)
    WHERE superseded_by IS NOT NULL;

-- The search index's triggers (0007) went with the old table.
CREATE TRIGGER review_search_insert AFTER INSERT ON review_item BEGIN
    INSERT INTO review_search_pending (review_id) VALUES (new.review_id);
END;

CREATE TRIGGER review_search_delete AFTER DELETE ON review_item BEGIN
    INSERT INTO review_search(review_search, rowid, item_id, llm_suggestion_json, rationale)
    SELECT 'delete', old.review_id, old.item_id, old.llm_suggestion_json, old.rationale
    WHERE NOT EXISTS (SELECT 1 FROM review_search_pending WHERE review_id = old.review_id);
    DELETE FROM review_search_pending WHERE review_id = old.review_id;
END;

CREATE TRIGGER review_search_update AFTER UPDATE OF item_id, llm_suggestion_json, rationale
ON review_item
WHEN NOT EXISTS (SELECT 1 FROM review_search_pending WHERE review_id = old.review_id) BEGIN
    INSERT INTO review_search(review_search, rowid, item_id, llm_suggestion_json, rationale)
    VALUES ('delete', old.review_id, old.item_id, old.llm_suggestion_json, old.rationale);
    INSERT INTO review_search(rowid, item_id, llm_suggestion_json, rationale)
    VALUES (new.review_id, new.item_id, new.llm_suggestion_json, new.rationale);
END;
