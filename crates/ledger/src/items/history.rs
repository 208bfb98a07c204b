//! Taking an item out of the sessions that ran it, when nothing was ever
//! sent for it (its prompt could not be rendered, so it ended in `error`
//! at no cost, or it was still pending): its session rows and requests go,
//! and every counter that counted it (the session's total, processed and
//! error counts, each stage's total and failed or skipped count) drops by
//! one in the same transaction, so counters and rows still agree.

use crate::db::{Connection, params};

/// What the item's session history is, for the removal to decide on.
pub(super) enum History {
    /// No session took it.
    None,
    /// Only sessions in which nothing was sent for it, none run by a live
    /// process now: it can be taken out of them.
    Unsent(Vec<String>),
    /// Something was sent for it, it was reviewed or decided: it stays.
    Kept(Vec<String>),
    /// A live process runs this session now.
    Running(String),
}

/// The sessions that took `id`, and whether anything of it was ever sent.
pub(super) fn history_of(conn: &Connection, id: &str) -> crate::db::Result<History> {
    let mut stmt = conn.prepare_cached(
        "SELECT session_id FROM session_item WHERE item_id = ?1
         UNION SELECT session_id FROM session_request WHERE item_id = ?1
         UNION SELECT session_id FROM llm_batch_result WHERE item_id = ?1
         UNION SELECT session_id FROM review_item WHERE item_id = ?1 AND session_id IS NOT NULL
         ORDER BY 1",
    )?;
    let sessions = stmt
        .query_map(params![id], |r| r.get::<_, String>(0))?
        .collect::<Result<Vec<String>, _>>()?;
    // Sent (an attempt, a batch line), reviewed, replaced by a rerun, or
    // answered other than in error: that is history to keep.
    let kept: i64 = conn.query_row(
        "SELECT (SELECT COUNT(*) FROM llm_messages m JOIN llm_requests q ON q.request_id = m.request_id
                 WHERE q.item_id = ?1)
              + (SELECT COUNT(*) FROM provider_batch_item bi JOIN llm_requests q ON q.request_id = bi.request_id
                 WHERE q.item_id = ?1)
              + (SELECT COUNT(*) FROM review_item WHERE item_id = ?1)
              + (SELECT COUNT(*) FROM review_log WHERE item_id = ?1)
              + (SELECT COUNT(*) FROM llm_batch_result_history WHERE item_id = ?1)
              + (SELECT COUNT(*) FROM llm_batch_result WHERE item_id = ?1 AND outcome != 'error')
              + (SELECT COUNT(*) FROM session_request WHERE item_id = ?1 AND state = 'passed')
              + (SELECT COUNT(*) FROM decision WHERE item_id = ?1 AND state != 'indeterminate')",
        params![id],
        |r| r.get(0),
    )?;
    if kept > 0 {
        return Ok(History::Kept(sessions));
    }
    if sessions.is_empty() {
        return Ok(History::None);
    }
    for s in &sessions {
        if crate::store::run_by_live_process(conn, s)? {
            return Ok(History::Running(s.clone()));
        }
    }
    Ok(History::Unsent(sessions))
}

/// Take `id` out of `session`: its stage rows (each stage's counts drop
/// with them), its outcome (the session's processed and error counts
/// drop), its place in the session (the total drops).
pub(super) fn take_out(conn: &Connection, session: &str, id: &str) -> crate::db::Result<()> {
    let now = conn.now()?;
    conn.execute(
        "UPDATE run_stages SET total = total - 1,
             failed = failed - (SELECT COUNT(*) FROM session_request r
                                WHERE r.session_id = ?1 AND r.item_id = ?2 AND r.stage = run_stages.stage
                                  AND r.state = 'failed'),
             skipped = skipped - (SELECT COUNT(*) FROM session_request r
                                  WHERE r.session_id = ?1 AND r.item_id = ?2 AND r.stage = run_stages.stage
                                    AND r.state = 'skipped'),
             updated_at = ?3
         WHERE session_id = ?1
           AND stage IN (SELECT stage FROM session_request WHERE session_id = ?1 AND item_id = ?2)",
        params![session, id, now],
    )?;
    let (processed, errors): (i64, i64) = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(CASE WHEN outcome = 'error' THEN 1 ELSE 0 END), 0)
         FROM llm_batch_result WHERE session_id = ?1 AND item_id = ?2",
        params![session, id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let listed: i64 = conn.query_row(
        "SELECT COUNT(*) FROM session_item WHERE session_id = ?1 AND item_id = ?2",
        params![session, id],
        |r| r.get(0),
    )?;
    conn.execute(
        "UPDATE llm_batch_session SET total_count = total_count - ?2,
             processed_count = processed_count - ?3, error_count = error_count - ?4, updated_at = ?5
         WHERE session_id = ?1",
        params![session, listed, processed, errors, now],
    )?;
    for table in [
        "DELETE FROM llm_batch_result WHERE session_id = ?1 AND item_id = ?2",
        "DELETE FROM session_request WHERE session_id = ?1 AND item_id = ?2",
        "DELETE FROM session_item WHERE session_id = ?1 AND item_id = ?2",
    ] {
        conn.execute(table, params![session, id])?;
    }
    Ok(())
}

/// The item's requests, once no session row points at them any more.
pub(super) fn drop_requests(conn: &Connection, id: &str) -> crate::db::Result<()> {
    conn.execute("DELETE FROM llm_requests WHERE item_id = ?1", params![id])?;
    Ok(())
}
