//! `docket export --what items`: a session's job (its config snapshot and
//! the stages the ledger knows), each stage's outputs, and one row per item
//! with the rows of its stage requests.

use crate::db::{Connection, OptionalExtension, Value, params};

use super::EachItem;
use super::rows::{read_cell, read_cells};
use crate::report::{Cell, Kind, ReportError};

/// One stage request of an item, as `for_each_item` hands it over.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageRow {
    /// The stage's name (`STAGE:CRITERION` for a criterion asked again).
    pub stage: String,
    /// `report::STAGE_COLUMNS`: request id, state, attempts, gate failures,
    /// read as the kinds the caller gave.
    pub cells: Vec<Cell>,
    pub attempts: Option<i64>,
    /// The stage's output for the item: the session's own copy (criteria
    /// asked again merged in) when the ledger has one, else the request's
    /// parsed answer.
    pub output_json: Option<String>,
    /// Sums over the request's attempts in this session.
    pub input_tokens: Option<i64>,
    pub output_tokens: Option<i64>,
    pub cost_usd: Option<f64>,
}

pub(super) fn session_config(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Option<String>> {
    conn.query_row(
        "SELECT config_snapshot_json FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| r.get(0),
    )
    .optional()
}

/// Every stage name the ledger recorded for the session, in the order of
/// their first position (then by name).
pub(super) fn session_stages(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Vec<String>> {
    let mut stmt = conn.prepare(
        "SELECT stage, MIN(position) AS p FROM ( \
           SELECT stage, position FROM run_stages WHERE session_id = ?1 \
           UNION ALL SELECT stage, position FROM session_request WHERE session_id = ?1) AS s \
         GROUP BY stage ORDER BY p, stage",
    )?;
    stmt.query_map(params![session_id], |r| r.get::<_, String>(0))?
        .collect()
}

/// Call `each` with every output the stage gave in the session.
pub(super) fn for_each_stage_output(
    conn: &Connection,
    session_id: &str,
    stage: &str,
    each: &mut dyn FnMut(&str),
) -> crate::db::Result<()> {
    let output = output_expr(conn)?;
    let mut stmt = conn.prepare(&format!(
        "SELECT {output} FROM session_request sr \
         JOIN llm_requests q ON q.request_id = sr.request_id \
         WHERE sr.session_id = ?1 AND sr.stage = ?2 AND {output} IS NOT NULL"
    ))?;
    let mut rows = stmt.query_large(params![session_id, stage])?;
    while let Some(r) = rows.next()? {
        let text: String = r.get(0)?;
        each(&text);
    }
    Ok(())
}

/// The items of the session (in its items, its requests or its results), in
/// dispatch order; for each, `report::ITEM_COLUMNS` read as `item_kinds`.
const ITEMS_SQL: &str = "WITH items(item_id) AS ( \
       SELECT item_id FROM session_item WHERE session_id = ?1 \
       UNION SELECT item_id FROM session_request WHERE session_id = ?1 \
       UNION SELECT item_id FROM llm_batch_result WHERE session_id = ?1) \
     SELECT i.item_id, si.position, b.outcome, b.confidence, b.rationale, b.routing_note, \
       b.critic_verdict, b.stage, b.error_message, b.processed_at, \
       d.state, d.decided_by, d.decided_at, rv.status, rv.decided_by, rv.decided_at, \
       b.attempts, b.input_tokens, b.output_tokens, b.cost_usd \
     FROM items i \
     LEFT JOIN session_item si ON si.session_id = ?1 AND si.item_id = i.item_id \
     LEFT JOIN llm_batch_result b ON b.session_id = ?1 AND b.item_id = i.item_id \
     LEFT JOIN decision d ON d.item_id = i.item_id \
     LEFT JOIN review_item rv ON rv.session_id = ?1 AND rv.item_id = i.item_id \
     ORDER BY si.position IS NULL, si.position, i.item_id";

pub(super) fn for_each_item(
    conn: &Connection,
    session_id: &str,
    item_kinds: &[Kind],
    stage_kinds: &[Kind],
    each: EachItem<'_>,
) -> Result<u64, ReportError> {
    let output = output_expr(conn)?;
    let mut stage_stmt = conn.prepare(&format!(
        "SELECT sr.stage, sr.request_id, sr.state, q.attempt, q.gate_failures, {output}, \
           (SELECT COALESCE(SUM(m.input_tokens), 0) FROM llm_messages m \
            WHERE m.request_id = sr.request_id AND (m.session_id = ?1 OR m.session_id IS NULL)), \
           (SELECT COALESCE(SUM(m.output_tokens), 0) FROM llm_messages m \
            WHERE m.request_id = sr.request_id AND (m.session_id = ?1 OR m.session_id IS NULL)), \
           (SELECT TOTAL(m.cost_usd) FROM llm_messages m \
            WHERE m.request_id = sr.request_id AND (m.session_id = ?1 OR m.session_id IS NULL)) \
         FROM session_request sr LEFT JOIN llm_requests q ON q.request_id = sr.request_id \
         WHERE sr.session_id = ?1 AND sr.item_id = ?2"
    ))?;
    let mut item_stmt = conn.prepare(ITEMS_SQL)?;

    // Buffers reused from item to item, so memory stays flat.
    let mut cells: Vec<Cell> = Vec::with_capacity(item_kinds.len());
    let mut stages: Vec<StageRow> = Vec::new();
    let mut rows = item_stmt.query_large(params![session_id])?;
    let mut count = 0u64;
    while let Some(row) = rows.next()? {
        read_cells(&row, item_kinds, &mut cells)?;
        let item_id = match cells.first() {
            Some(Cell::Text(s)) => s.clone(),
            Some(other) => other.csv_text(),
            None => read_cell(&row, 0, Kind::Text)?.csv_text(),
        };
        stages.clear();
        let mut stage_rows = stage_stmt.query(params![session_id, item_id])?;
        while let Some(sr) = stage_rows.next()? {
            let mut fixed = Vec::with_capacity(stage_kinds.len());
            for (j, kind) in stage_kinds.iter().enumerate() {
                fixed.push(read_cell(&sr, j + 1, *kind)?);
            }
            stages.push(StageRow {
                stage: sr.get(0)?,
                cells: fixed,
                attempts: sr.get(3)?,
                output_json: text(sr.get_value(5)?),
                input_tokens: sr.get(6)?,
                output_tokens: sr.get(7)?,
                cost_usd: sr.get(8)?,
            });
        }
        each(&cells, &stages)?;
        count += 1;
    }
    Ok(count)
}

/// A stored text; anything else is no text at all (an output that is not
/// JSON text has no fields to show).
fn text(v: Value) -> Option<String> {
    match v {
        Value::Text(t) => Some(t),
        _ => None,
    }
}

/// A stage's output for an item: the session's own copy (with criteria asked
/// again merged in) when the ledger has one, else the request's parsed
/// answer. Ledgers from before `session_request.output_json` have only the
/// latter.
fn output_expr(conn: &Connection) -> crate::db::Result<&'static str> {
    let has_output = conn.has_column("session_request", "output_json")?;
    Ok(if has_output {
        "COALESCE(sr.output_json, q.parsed_output_json)"
    } else {
        "q.parsed_output_json"
    })
}
