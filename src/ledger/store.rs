//! Session planning and the reads the engine needs. Writes during a run go
//! through `writer`; these run before it starts (planning, resume repair) or
//! read-only alongside it.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use super::now_ts;

/// The maximum age of a resumable session.
pub const RESUME_WINDOW_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// An indeterminate item chosen for a session.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub item_id: String,
    pub evidence_json: String,
}

/// Visit indeterminate items in import order, at most `limit`; with
/// `skip_reviewed`, items that already have a pending review item are left out.
pub fn for_each_candidate(
    conn: &Connection,
    limit: Option<u64>,
    skip_reviewed: bool,
    mut visit: impl FnMut(Candidate) -> Result<(), String>,
) -> Result<u64, String> {
    // Import (rowid) order streams straight off the state index; ordering by
    // item_id would make SQLite sort every row, evidence included, in memory.
    let sql = if skip_reviewed {
        "SELECT d.item_id, d.evidence_json FROM decision d
         WHERE d.state = 'indeterminate'
           AND NOT EXISTS (SELECT 1 FROM review_item r WHERE r.item_id = d.item_id AND r.status = 'pending')
         ORDER BY d.rowid LIMIT ?1"
    } else {
        "SELECT d.item_id, d.evidence_json FROM decision d WHERE d.state = 'indeterminate' ORDER BY d.rowid LIMIT ?1"
    };
    let limit = limit.map(|l| l as i64).unwrap_or(-1);
    let mut stmt = conn.prepare(sql).map_err(|e| e.to_string())?;
    let mut rows = stmt.query(params![limit]).map_err(|e| e.to_string())?;
    let mut n = 0;
    while let Some(row) = rows.next().map_err(|e| e.to_string())? {
        visit(Candidate {
            item_id: row.get(0).map_err(|e| e.to_string())?,
            evidence_json: row.get(1).map_err(|e| e.to_string())?,
        })?;
        n += 1;
    }
    Ok(n)
}

/// What a new session is created with.
pub struct NewSession<'a> {
    pub session_id: &'a str,
    pub config_snapshot_json: &'a str,
    pub stage: &'a str,
    pub provider: &'a str,
    pub model: &'a str,
    pub template_hash: &'a str,
    pub params_hash: &'a str,
    pub estimated_tokens: u64,
    pub estimated_cost_usd: f64,
    pub max_cost_usd: Option<f64>,
    pub item_ids: &'a [String],
}

/// Create the session, its requests (reusing answered ones) and its item
/// list, in one transaction.
pub fn create_session(conn: &mut Connection, s: &NewSession<'_>) -> rusqlite::Result<()> {
    let now = now_ts();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute(
        "INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, state, desired_state,
             estimated_tokens, estimated_cost_usd, max_cost_usd, owner_pid, owner_host, heartbeat_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, 'running', 'running', ?5, ?6, ?7, ?8, ?9, ?2, ?2)",
        params![
            s.session_id,
            now,
            s.item_ids.len() as i64,
            s.config_snapshot_json,
            s.estimated_tokens as i64,
            s.estimated_cost_usd,
            s.max_cost_usd,
            std::process::id(),
            hostname()
        ],
    )?;
    {
        let mut upsert = tx.prepare(
            "INSERT INTO llm_requests (item_id, stage, provider, model, request_version, status, template_hash, params_hash, created_at, updated_at)
             VALUES (?1, ?2, ?3, ?4, 1, 'pending', ?5, ?6, ?7, ?7)
             ON CONFLICT (item_id, stage, provider, model, request_version) DO UPDATE SET
                 -- an answered request is reused, never sent again; anything
                 -- unfinished starts this session with fresh budgets
                 status = CASE WHEN status = 'completed' THEN status ELSE 'pending' END,
                 gate_failures = CASE WHEN status = 'completed' THEN gate_failures ELSE 0 END,
                 transport_retries = CASE WHEN status = 'completed' THEN transport_retries ELSE 0 END,
                 updated_at = excluded.updated_at
             RETURNING request_id",
        )?;
        let mut link = tx.prepare("INSERT INTO session_item (session_id, position, item_id, request_id) VALUES (?1, ?2, ?3, ?4)")?;
        for (pos, item_id) in s.item_ids.iter().enumerate() {
            let request_id: i64 = upsert.query_row(
                params![
                    item_id,
                    s.stage,
                    s.provider,
                    s.model,
                    s.template_hash,
                    s.params_hash,
                    now
                ],
                |r| r.get(0),
            )?;
            link.execute(params![s.session_id, pos as i64, item_id, request_id])?;
        }
    }
    tx.commit()
}

#[derive(Debug, Clone)]
pub struct SessionRow {
    pub session_id: String,
    pub started_at: f64,
    pub completed_at: Option<f64>,
    pub total_count: u64,
    pub processed_count: u64,
    pub accepted_count: u64,
    pub reviewed_count: u64,
    pub rejected_count: u64,
    pub error_count: u64,
    pub state: String,
    pub desired_state: String,
    pub stop_reason: Option<String>,
    pub retry_count: u64,
    pub rate_limited_count: u64,
    pub ambiguous_count: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
    pub estimated_tokens: u64,
    pub estimated_cost_usd: f64,
    pub max_cost_usd: Option<f64>,
    pub config_snapshot_json: String,
}

pub fn load_session(conn: &Connection, session_id: &str) -> rusqlite::Result<Option<SessionRow>> {
    conn.query_row(
        "SELECT session_id, started_at, completed_at, total_count, processed_count, accepted_count, reviewed_count,
                rejected_count, error_count, state, desired_state, stop_reason, retry_count, rate_limited_count,
                ambiguous_count, input_tokens, output_tokens, cost_usd, estimated_tokens, estimated_cost_usd,
                max_cost_usd, config_snapshot_json
         FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| {
            Ok(SessionRow {
                session_id: r.get(0)?,
                started_at: r.get(1)?,
                completed_at: r.get(2)?,
                total_count: r.get::<_, i64>(3)? as u64,
                processed_count: r.get::<_, i64>(4)? as u64,
                accepted_count: r.get::<_, i64>(5)? as u64,
                reviewed_count: r.get::<_, i64>(6)? as u64,
                rejected_count: r.get::<_, i64>(7)? as u64,
                error_count: r.get::<_, i64>(8)? as u64,
                state: r.get(9)?,
                desired_state: r.get(10)?,
                stop_reason: r.get(11)?,
                retry_count: r.get::<_, i64>(12)? as u64,
                rate_limited_count: r.get::<_, i64>(13)? as u64,
                ambiguous_count: r.get::<_, i64>(14)? as u64,
                input_tokens: r.get::<_, i64>(15)? as u64,
                output_tokens: r.get::<_, i64>(16)? as u64,
                cost_usd: r.get(17)?,
                estimated_tokens: r.get::<_, i64>(18)? as u64,
                estimated_cost_usd: r.get(19)?,
                max_cost_usd: r.get(20)?,
                config_snapshot_json: r.get(21)?,
            })
        },
    )
    .optional()
}

/// Before a resume: every attempt of this session still marked 'sent' left
/// the machine and never got an answer recorded. Mark it ambiguous (it may
/// have been billed), count it, and put its request back to pending so it is
/// sent again. Returns how many were found.
pub fn repair_interrupted(
    conn: &mut Connection,
    session_id: &str,
    max_cost_usd: Option<f64>,
) -> rusqlite::Result<u64> {
    let now = now_ts();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let n = tx.execute(
        "UPDATE llm_messages SET state = 'ambiguous', error_kind = 'ambiguous',
             error_message = 'no answer was recorded before the process stopped; it may have been billed', finished_at = ?2
         WHERE state = 'sent' AND +session_id = ?1
           AND request_id IN (SELECT request_id FROM session_item WHERE session_id = ?1)",
        params![session_id, now],
    )? as u64;
    tx.execute(
        "UPDATE llm_requests SET status = 'pending', updated_at = ?2
         WHERE status = 'in_flight' AND request_id IN (SELECT request_id FROM session_item WHERE session_id = ?1)",
        params![session_id, now],
    )?;
    tx.execute(
        "UPDATE llm_batch_session SET ambiguous_count = ambiguous_count + ?2, attempt_count = attempt_count + ?2,
             state = 'running', desired_state = 'running',
             stop_reason = NULL, completed_at = NULL, max_cost_usd = COALESCE(?3, max_cost_usd),
             owner_pid = ?4, owner_host = ?5, heartbeat_at = ?6, updated_at = ?6
         WHERE session_id = ?1",
        params![session_id, n as i64, max_cost_usd, std::process::id(), hostname(), now],
    )?;
    tx.commit()?;
    Ok(n)
}

/// One item still to process in a session.
#[derive(Debug, Clone)]
pub struct WorkItem {
    pub position: i64,
    pub item_id: String,
    pub request_id: i64,
    pub evidence_json: String,
    pub status: String,
    pub attempt: i64,
    pub gate_failures: i64,
    pub transport_retries: i64,
    pub parsed_output_json: Option<String>,
}

/// The next `n` unprocessed items after `after_position`, in order.
pub fn next_work(
    conn: &Connection,
    session_id: &str,
    after_position: i64,
    n: usize,
) -> rusqlite::Result<Vec<WorkItem>> {
    let mut stmt = conn.prepare_cached(
        "SELECT si.position, si.item_id, si.request_id, d.evidence_json, r.status,
                -- attempts are numbered from the messages: one sent just before a
                -- crash is on disk there even though the request never heard of it
                MAX(r.attempt, (SELECT COALESCE(MAX(m.attempt), 0) FROM llm_messages m WHERE m.request_id = r.request_id)),
                r.gate_failures, r.transport_retries, r.parsed_output_json
         FROM session_item si
         JOIN decision d ON d.item_id = si.item_id
         JOIN llm_requests r ON r.request_id = si.request_id
         WHERE si.session_id = ?1 AND si.position > ?2
           AND NOT EXISTS (SELECT 1 FROM llm_batch_result b WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
         ORDER BY si.position LIMIT ?3",
    )?;
    let rows = stmt.query_map(params![session_id, after_position, n as i64], |r| {
        Ok(WorkItem {
            position: r.get(0)?,
            item_id: r.get(1)?,
            request_id: r.get(2)?,
            evidence_json: r.get(3)?,
            status: r.get(4)?,
            attempt: r.get(5)?,
            gate_failures: r.get(6)?,
            transport_retries: r.get(7)?,
            parsed_output_json: r.get(8)?,
        })
    })?;
    rows.collect()
}

/// What an operator asked of the session (the ledger is the bus).
pub fn desired_state(conn: &Connection, session_id: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT desired_state FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| r.get(0),
    )
    .optional()
}

/// Ask a session to pause, resume or cancel; any engine running it obeys.
pub fn set_desired_state(
    conn: &Connection,
    session_id: &str,
    desired: &str,
) -> rusqlite::Result<usize> {
    conn.execute(
        "UPDATE llm_batch_session SET desired_state = ?2, updated_at = ?3 WHERE session_id = ?1",
        params![session_id, desired, now_ts()],
    )
}

/// The newest session id, for messages that suggest one.
pub fn latest_session(conn: &Connection) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT session_id FROM llm_batch_session ORDER BY started_at DESC LIMIT 1",
        [],
        |r| r.get(0),
    )
    .optional()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}
