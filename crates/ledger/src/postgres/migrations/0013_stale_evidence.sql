-- 0013: stale evidence (`docket import --update`). `evidence_hash` is the
-- SHA-256 of the item's canonical evidence JSON (docket_model::evidence),
-- computed in Rust: SQL cannot canonicalise JSON, so items imported before
-- 0013 get theirs lazily, when an import next meets their id (their
-- requests' hashes with it). Every request records the hash of the
-- evidence it was made on; a run asks again (a new request_version) for an
-- item whose newest answer was made on other evidence.
ALTER TABLE decision ADD COLUMN evidence_hash TEXT;
ALTER TABLE llm_requests ADD COLUMN evidence_hash TEXT;
-- 1: the outcome (or review item) was made on evidence an import --update
-- replaced since. A pending stale review item no longer keeps its item out
-- of the next run; a decided one keeps its decision, marked.
ALTER TABLE llm_batch_result ADD COLUMN stale BIGINT NOT NULL DEFAULT 0;
ALTER TABLE review_item ADD COLUMN stale BIGINT NOT NULL DEFAULT 0;
-- The console's charts read a session's attempts; the two indexes on
-- llm_messages(session_id, ...) from 0002 are partial (failed, sent).
CREATE INDEX idx_llm_messages_session ON llm_messages(session_id);
