-- 0007: in SQLite, the review search index catches up in batches
-- (`review_search_pending`). PostgreSQL's GIN index (0003) keeps itself up
-- to date with its own pending list, so there is nothing to add here; the
-- number is kept so both backends count the same versions.
SELECT 1;
