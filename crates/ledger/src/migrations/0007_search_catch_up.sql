-- 0007: the review search index catches up in batches, not row by row.
-- Indexing each suggestion as its row was inserted cost about a third of the
-- ledger writer's time at full speed: every small transaction wrote its own
-- index segment, and merging them was most of the work. Now a new review
-- item only notes its id in `review_search_pending`; the writer indexes the
-- noted rows thousands at a time (`ledger::search_index`), and a search reads
-- the noted rows directly, so nothing is ever missing from a search.
CREATE TABLE review_search_pending (review_id INTEGER PRIMARY KEY);

DROP TRIGGER review_search_insert;
DROP TRIGGER review_search_delete;
DROP TRIGGER review_search_update;

CREATE TRIGGER review_search_insert AFTER INSERT ON review_item BEGIN
    INSERT INTO review_search_pending (review_id) VALUES (new.review_id);
END;

-- Only an indexed row has entries to remove: deleting entries that were
-- never added would corrupt an external-content index.
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
