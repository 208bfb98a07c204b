-- 0003: a trigram index over the review queue's text, so `/` in the console
-- finds a substring among 100,000 pending items by index, not by scanning
-- every suggestion. External content: the text lives once, in review_item;
-- triggers keep the index in step with every insert, update and delete.
CREATE VIRTUAL TABLE review_search USING fts5(
    item_id, llm_suggestion_json, rationale,
    content = 'review_item', content_rowid = 'review_id',
    tokenize = 'trigram'
);
INSERT INTO review_search(review_search) VALUES ('rebuild');

CREATE TRIGGER review_search_insert AFTER INSERT ON review_item BEGIN
    INSERT INTO review_search(rowid, item_id, llm_suggestion_json, rationale)
    VALUES (new.review_id, new.item_id, new.llm_suggestion_json, new.rationale);
END;

CREATE TRIGGER review_search_delete AFTER DELETE ON review_item BEGIN
    INSERT INTO review_search(review_search, rowid, item_id, llm_suggestion_json, rationale)
    VALUES ('delete', old.review_id, old.item_id, old.llm_suggestion_json, old.rationale);
END;

CREATE TRIGGER review_search_update AFTER UPDATE OF item_id, llm_suggestion_json, rationale
ON review_item BEGIN
    INSERT INTO review_search(review_search, rowid, item_id, llm_suggestion_json, rationale)
    VALUES ('delete', old.review_id, old.item_id, old.llm_suggestion_json, old.rationale);
    INSERT INTO review_search(rowid, item_id, llm_suggestion_json, rationale)
    VALUES (new.review_id, new.item_id, new.llm_suggestion_json, new.rationale);
END;
