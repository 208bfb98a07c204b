//! The events pane: a session's notable happenings, newest first, merged
//! from three sources that each keep a small index of exactly these rows:
//! `session_event` (state changes, operator controls), failed or ambiguous
//! attempts (`idx_llm_messages_trouble`) and errored items
//! (`idx_batch_result_error`). Each source is read newest first with the
//! same limit, then the three lists are merged here.

use crate::db::{Connection, params};

use crate::watch::{Event, Level};
use docket_model::sanitize::for_terminal;

/// An event with what orders it: (at, source rank, id) orders ties the
/// same way on every refresh.
type Ranked = (f64, u8, i64, Event);

/// The newest `limit` events of a session, newest first. Every text is made
/// safe for a terminal (item ids and provider errors are untrusted).
pub(super) fn events(
    conn: &Connection,
    session_id: &str,
    limit: usize,
) -> crate::db::Result<Vec<Event>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let lim = i64::try_from(limit).unwrap_or(i64::MAX);
    let mut all: Vec<Ranked> = Vec::new();
    all.extend(session_events(conn, session_id, lim)?);
    all.extend(troubled_attempts(conn, session_id, lim)?);
    all.extend(errored_items(conn, session_id, lim)?);
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)).then(b.2.cmp(&a.2)));
    all.truncate(limit);
    Ok(all.into_iter().map(|(_, _, _, e)| e).collect())
}

/// The session's own events (state changes, operator controls).
fn session_events(conn: &Connection, session_id: &str, lim: i64) -> crate::db::Result<Vec<Ranked>> {
    let mut stmt = conn.prepare_cached(
        "SELECT event_id, at, level, kind, message FROM session_event
         WHERE session_id = ?1 ORDER BY at DESC, event_id DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![session_id, lim], |r| {
        let level: String = r.get(2)?;
        let kind: String = r.get(3)?;
        let message: String = r.get(4)?;
        Ok((
            r.get::<_, f64>(1)?,
            0u8,
            r.get::<_, i64>(0)?,
            Event {
                at: r.get(1)?,
                level: match level.as_str() {
                    "error" => Level::Error,
                    "warn" => Level::Warn,
                    _ => Level::Info,
                },
                kind: for_terminal(&kind),
                message: for_terminal(&message),
                item_id: None,
            },
        ))
    })?;
    rows.collect()
}

/// Failed or ambiguous attempts.
fn troubled_attempts(
    conn: &Connection,
    session_id: &str,
    lim: i64,
) -> crate::db::Result<Vec<Ranked>> {
    // The WHERE repeats the partial index's condition word for word, which is
    // what lets SQLite use it.
    let mut stmt = conn.prepare_cached(
        "SELECT m.message_id, COALESCE(m.finished_at, m.sent_at), m.state, m.attempt, m.http_status,
                m.error_kind, m.error_message, q.item_id
         FROM llm_messages m JOIN llm_requests q ON q.request_id = m.request_id
         WHERE m.session_id = ?1 AND m.state IN ('failed', 'ambiguous')
         ORDER BY m.finished_at DESC, m.message_id DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![session_id, lim], |r| {
        let state: String = r.get(2)?;
        let attempt: i64 = r.get(3)?;
        let http_status: Option<i64> = r.get(4)?;
        let error_kind: Option<String> = r.get(5)?;
        let error_message: Option<String> = r.get(6)?;
        let item_id: String = r.get(7)?;
        let mut message = format!("item {item_id} attempt {attempt}:");
        if let Some(status) = http_status {
            message.push_str(&format!(" http {status}"));
        }
        match error_kind.as_deref().filter(|k| !k.is_empty()) {
            Some(kind) => message.push_str(&format!(" {kind}")),
            None if http_status.is_none() => message.push_str(&format!(" {state}")),
            None => {}
        }
        if let Some(e) = error_message.as_deref().filter(|e| !e.is_empty()) {
            message.push_str(&format!(": {e}"));
        }
        let at: f64 = r.get(1)?;
        Ok((
            at,
            1u8,
            r.get::<_, i64>(0)?,
            Event {
                at,
                level: Level::Warn,
                kind: for_terminal(&format!("attempt_{state}")),
                message: for_terminal(&message),
                item_id: Some(for_terminal(&item_id)),
            },
        ))
    })?;
    rows.collect()
}

/// Items whose outcome is an error.
fn errored_items(conn: &Connection, session_id: &str, lim: i64) -> crate::db::Result<Vec<Ranked>> {
    let mut stmt = conn.prepare_cached(
        "SELECT COALESCE(request_id, 0), processed_at, item_id, error_message FROM llm_batch_result
         WHERE session_id = ?1 AND outcome = 'error'
         ORDER BY processed_at DESC, request_id DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![session_id, lim], |r| {
        let item_id: String = r.get(2)?;
        let error: Option<String> = r.get(3)?;
        let message = match error.as_deref().filter(|e| !e.is_empty()) {
            Some(e) => format!("item {item_id}: {e}"),
            None => format!("item {item_id}: error"),
        };
        let at: f64 = r.get(1)?;
        Ok((
            at,
            2u8,
            r.get::<_, i64>(0)?,
            Event {
                at,
                level: Level::Error,
                kind: "item_error".to_string(),
                message: for_terminal(&message),
                item_id: Some(for_terminal(&item_id)),
            },
        ))
    })?;
    rows.collect()
}
