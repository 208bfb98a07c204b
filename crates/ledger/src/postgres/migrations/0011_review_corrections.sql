-- 0011: an operator's correction of a suggestion. A correction is an accept
-- (action 'accept') with the operator's own answer: the decision holds it,
-- and its log row keeps it with the answer's fields that differ from the
-- suggestion (comma-separated, in the answer's order), so the review log
-- says who changed what and when, and undo takes it back like any accept.
ALTER TABLE review_log ADD COLUMN corrected_answer_json TEXT;
ALTER TABLE review_log ADD COLUMN corrected_fields TEXT;
-- The decisions export names each item's standing correction.
CREATE INDEX idx_review_log_corrections ON review_log(item_id)
    WHERE corrected_answer_json IS NOT NULL;
