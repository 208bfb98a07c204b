-- 0003: the review queue's substring search. SQLite keeps an FTS5 trigram
-- index; PostgreSQL's equivalent is a pg_trgm GIN index, which makes
-- `ILIKE '%text%'` an index lookup. pg_trgm ships with PostgreSQL but
-- creating an extension may need rights a managed database does not grant:
-- without it the search still works (ILIKE scans the pending rows), only
-- slower on a very large queue.
DO $$
BEGIN
    CREATE EXTENSION IF NOT EXISTS pg_trgm;
    CREATE INDEX idx_review_item_search ON review_item
        USING gin ((item_id || ' ' || llm_suggestion_json || ' ' || COALESCE(rationale, '')) gin_trgm_ops);
-- Only "not installed" and "not allowed" are expected; anything else is a
-- real failure and stops the migration.
EXCEPTION WHEN undefined_file OR insufficient_privilege OR feature_not_supported THEN
    RAISE NOTICE 'pg_trgm unavailable (%): the review search scans instead of using an index', SQLERRM;
END
$$;
