//! Session planning and the reads the engine needs. Writes during a run go
//! through `writer`; these run before it starts (planning, resume repair) or
//! read-only alongside it.

use crate::db::{Connection, Dialect, OptionalExtension, TransactionBehavior, Value, params};

/// The maximum age of a resumable session.
pub const RESUME_WINDOW_SECS: f64 = 7.0 * 24.0 * 3600.0;

/// An indeterminate item chosen for a session.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub item_id: String,
    pub evidence_json: String,
}

/// A session whose heartbeat is younger than this is being run by a live
/// process (the engine beats every 400 ms).
pub const LIVE_HEARTBEAT_SECS: f64 = 5.0;

/// Which indeterminate items a new session may take.
#[derive(Debug, Clone, Copy)]
pub struct CandidateFilter {
    pub limit: Option<u64>,
    /// Leave out items with a pending review item.
    pub skip_reviewed: bool,
}

impl CandidateFilter {
    /// Items that a live session (another process) still has to answer are
    /// never taken twice.
    fn sql(&self, select: &str, live_sessions: bool, dialect: Dialect) -> String {
        let mut sql = format!("{select} FROM decision d WHERE d.state = 'indeterminate'");
        if self.skip_reviewed {
            sql.push_str(
                " AND NOT EXISTS (SELECT 1 FROM review_item r WHERE r.item_id = d.item_id AND r.status = 'pending')",
            );
        }
        // A request whose line waits in a provider batch of a stopped session
        // may still be answered (and billed): its item is not taken again
        // until that session is resumed and the batch collected.
        sql.push_str(
            " AND NOT EXISTS (SELECT 1 FROM llm_requests q
                 JOIN provider_batch_item bi ON bi.request_id = q.request_id
                 JOIN provider_batch b ON b.batch_id = bi.batch_id
                 JOIN llm_messages m ON m.request_id = bi.request_id AND m.attempt = bi.attempt
                 WHERE q.item_id = d.item_id AND b.state != 'ingested' AND m.state = 'sent')",
        );
        if live_sessions {
            sql.push_str(
                " AND NOT EXISTS (SELECT 1 FROM session_item si JOIN llm_batch_session s ON s.session_id = si.session_id
                   WHERE si.item_id = d.item_id AND s.state IN ('running', 'paused') AND s.heartbeat_at >= ?2
                     AND NOT EXISTS (SELECT 1 FROM llm_batch_result b WHERE b.session_id = si.session_id AND b.item_id = si.item_id))",
            );
        }
        // Import (rowid) order streams straight off the state index; ordering
        // by item_id would make SQLite sort every row, evidence included.
        // PostgreSQL keeps the import order in its own column.
        sql.push_str(match dialect {
            Dialect::Sqlite => " ORDER BY d.rowid LIMIT ?1",
            Dialect::Postgres => " ORDER BY d.import_seq LIMIT ?1",
        });
        sql
    }

    /// The LIMIT parameter: none is -1 to SQLite, NULL to PostgreSQL.
    fn limit(&self, dialect: Dialect) -> Value {
        match (self.limit, dialect) {
            (Some(l), _) => Value::Integer(i64::try_from(l).unwrap_or(i64::MAX)),
            (None, Dialect::Sqlite) => Value::Integer(-1),
            (None, Dialect::Postgres) => Value::Null,
        }
    }
}

fn live_cutoff(conn: &Connection) -> crate::db::Result<Option<f64>> {
    let cutoff = conn.now()? - LIVE_HEARTBEAT_SECS;
    let live: i64 = conn.query_row(
        "SELECT COUNT(*) FROM llm_batch_session WHERE state IN ('running', 'paused') AND heartbeat_at >= ?1",
        params![cutoff],
        |r| r.get(0),
    )?;
    Ok((live > 0).then_some(cutoff))
}

/// How many items a new session would take.
pub(crate) fn count_candidates(
    conn: &Connection,
    filter: CandidateFilter,
) -> crate::db::Result<u64> {
    let cutoff = live_cutoff(conn)?;
    let sql = format!(
        "SELECT COUNT(*) FROM ({}) AS candidate",
        filter.sql("SELECT 1", cutoff.is_some(), conn.dialect())
    );
    let limit = filter.limit(conn.dialect());
    let n: i64 = match cutoff {
        Some(c) => conn.query_row(&sql, params![limit, c], |r| r.get(0))?,
        None => conn.query_row(&sql, params![limit], |r| r.get(0))?,
    };
    Ok(n as u64)
}

/// Why visiting the candidates stopped.
#[derive(Debug, thiserror::Error)]
pub enum CandidateError {
    /// The ledger could not be read.
    #[error(transparent)]
    Ledger(#[from] super::LedgerError),
    /// The visitor stopped the visit, saying why.
    #[error("{0}")]
    Stopped(String),
}

impl From<crate::db::Error> for CandidateError {
    fn from(e: crate::db::Error) -> Self {
        CandidateError::Ledger(super::LedgerError::Db(e))
    }
}

/// Visit the items a new session would take, in import order.
pub(crate) fn for_each_candidate(
    conn: &Connection,
    filter: CandidateFilter,
    mut visit: impl FnMut(Candidate) -> Result<(), String>,
) -> Result<u64, CandidateError> {
    let cutoff = live_cutoff(conn)?;
    if conn.dialect() == Dialect::Postgres {
        return for_each_candidate_paged(conn, filter, cutoff, visit);
    }
    let sql = filter.sql(
        "SELECT d.item_id, d.evidence_json",
        cutoff.is_some(),
        conn.dialect(),
    );
    let limit = filter.limit(conn.dialect());
    let mut stmt = conn.prepare(&sql)?;
    let mut rows = match cutoff {
        Some(c) => stmt.query(params![limit, c]),
        None => stmt.query(params![limit]),
    }?;
    let mut n = 0;
    while let Some(row) = rows.next()? {
        visit(Candidate {
            item_id: row.get(0)?,
            evidence_json: row.get(1)?,
        })
        .map_err(CandidateError::Stopped)?;
        n += 1;
    }
    Ok(n)
}

/// Candidates read from PostgreSQL a page at a time, in import order
/// (PostgreSQL's answers come whole: one query for a million candidates
/// would hold every evidence in memory at once).
fn for_each_candidate_paged(
    conn: &Connection,
    filter: CandidateFilter,
    cutoff: Option<f64>,
    mut visit: impl FnMut(Candidate) -> Result<(), String>,
) -> Result<u64, CandidateError> {
    const PAGE: u64 = 2_000;
    let base = filter.sql(
        "SELECT d.item_id, d.evidence_json, d.import_seq",
        cutoff.is_some(),
        Dialect::Postgres,
    );
    // The page's start goes before the order: `... AND d.import_seq > ?N
    // ORDER BY d.import_seq LIMIT ?1`.
    let after_param = if cutoff.is_some() { "?3" } else { "?2" };
    let sql = base.replacen(
        " ORDER BY d.import_seq",
        &format!(" AND d.import_seq > {after_param} ORDER BY d.import_seq"),
        1,
    );
    let mut stmt = conn.prepare(&sql)?;
    let mut after: i64 = -1;
    let mut n: u64 = 0;
    loop {
        let page = match filter.limit {
            Some(l) => PAGE.min(l.saturating_sub(n)),
            None => PAGE,
        };
        if page == 0 {
            return Ok(n);
        }
        let page_param = i64::try_from(page).unwrap_or(i64::MAX);
        let mut rows = match cutoff {
            Some(c) => stmt.query(params![page_param, c, after]),
            None => stmt.query(params![page_param, after]),
        }?;
        let mut got = 0;
        while let Some(row) = rows.next()? {
            after = row.get(2)?;
            visit(Candidate {
                item_id: row.get(0)?,
                evidence_json: row.get(1)?,
            })
            .map_err(CandidateError::Stopped)?;
            got += 1;
        }
        n += got;
        if got < page {
            return Ok(n);
        }
    }
}

/// A stage of a new session's job.
pub struct NewStage<'a> {
    pub name: &'a str,
    pub provider: &'a str,
    pub model: &'a str,
    pub template_hash: &'a str,
    pub params_hash: &'a str,
    pub critic_of: Option<&'a str>,
    /// `--rerun-stage` reached this stage: new requests (a new
    /// request_version) instead of the answered ones.
    pub rerun: bool,
}

/// What a new session is created with.
pub struct NewSession<'a> {
    pub session_id: &'a str,
    pub config_snapshot_json: &'a str,
    /// In job order; the first is the one `session_item` links.
    pub stages: &'a [NewStage<'a>],
    pub estimated_tokens: u64,
    pub estimated_cost_usd: f64,
    pub max_cost_usd: Option<f64>,
    pub item_ids: &'a [String],
}

/// Answered requests a new session would reuse although they were made with
/// another template or parameters, per stage: (stage, count). Such answers
/// are never reused or sent again silently: the operator chooses
/// (`--rerun-stage`, or restoring the template).
pub(crate) fn stale_answers(
    conn: &Connection,
    stages: &[NewStage<'_>],
    item_ids: &[String],
) -> crate::db::Result<Vec<(String, u64)>> {
    let wanted: std::collections::HashSet<&str> = item_ids.iter().map(String::as_str).collect();
    // One pass per stage over its answered requests (newest version per
    // item), checked against the planned items in memory.
    let mut stmt = conn.prepare_cached(
        "SELECT r.item_id FROM llm_requests r
         WHERE r.stage = ?1 AND r.provider = ?2 AND r.model = ?3 AND r.status = 'completed'
           AND (r.template_hash != ?4 OR r.params_hash != ?5)
           AND r.request_version = (SELECT MAX(v.request_version) FROM llm_requests v
                                    WHERE v.item_id = r.item_id AND v.stage = r.stage
                                      AND v.provider = r.provider AND v.model = r.model)",
    )?;
    let mut out = Vec::new();
    for st in stages.iter().filter(|s| !s.rerun) {
        let mut rows = stmt.query(params![
            st.name,
            st.provider,
            st.model,
            st.template_hash,
            st.params_hash
        ])?;
        let mut n = 0u64;
        while let Some(r) = rows.next()? {
            let item: String = r.get(0)?;
            if wanted.contains(item.as_str()) {
                n += 1;
            }
        }
        if n > 0 {
            out.push((st.name.to_string(), n));
        }
    }
    Ok(out)
}

/// Create the session, its requests for every stage (reusing answered ones
/// made with the same template and parameters; `rerun` stages get a new
/// request_version), its item list and stage checkpoints, in one
/// transaction. Returns how many items it took: the planned items are
/// checked again under the write lock, and any that a live session took or
/// any session decided since the plan was read (two sessions started at the
/// same instant) are left out, so choosing and claiming are one atomic
/// step. With none left nothing is created.
pub(crate) fn create_session(
    conn: &mut Connection,
    s: &NewSession<'_>,
) -> crate::db::Result<usize> {
    let now = conn.now()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let item_ids = still_free(&tx, s.item_ids)?;
    // Every planned item taken meanwhile (a plan of none still makes its
    // empty session).
    if item_ids.is_empty() && !s.item_ids.is_empty() {
        tx.rollback()?;
        return Ok(0);
    }
    tx.execute(
        "INSERT INTO llm_batch_session (session_id, started_at, total_count, config_snapshot_json, state, desired_state,
             estimated_tokens, estimated_cost_usd, max_cost_usd, owner_pid, owner_host, heartbeat_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, 'running', 'running', ?5, ?6, ?7, ?8, ?9, ?2, ?2)",
        params![
            s.session_id,
            now,
            item_ids.len() as i64,
            s.config_snapshot_json,
            s.estimated_tokens as i64,
            s.estimated_cost_usd,
            s.max_cost_usd,
            std::process::id(),
            hostname()
        ],
    )?;
    {
        let mut link = tx.prepare(
            "INSERT INTO session_item (session_id, position, item_id, request_id) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut stage_row = tx.prepare(
            "INSERT INTO session_request (session_id, item_id, stage, position, request_id, state, output_json, updated_at)
             SELECT ?1, ?2, ?3, ?4, request_id, 'pending', NULL, ?5 FROM llm_requests WHERE request_id = ?6",
        )?;
        for (pos, st) in s.stages.iter().enumerate() {
            tx.execute(
                "INSERT INTO run_stages (session_id, stage, position, role, critic_of, total, state, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', ?7)",
                params![
                    s.session_id,
                    st.name,
                    pos as i64,
                    if st.critic_of.is_some() { "critic" } else { "generator" },
                    st.critic_of,
                    item_ids.len() as i64,
                    now
                ],
            )?;
        }
        for (pos, item_id) in item_ids.iter().enumerate() {
            for (si, st) in s.stages.iter().enumerate() {
                let request_id = request_for(&tx, item_id, st, now)?;
                if si == 0 {
                    link.execute(params![s.session_id, pos as i64, item_id, request_id])?;
                }
                stage_row.execute(params![
                    s.session_id,
                    item_id,
                    st.name,
                    si as i64,
                    now,
                    request_id
                ])?;
            }
        }
    }
    tx.commit()?;
    Ok(item_ids.len())
}

/// The planned items a new session may still take, checked again under
/// the write lock: still undecided (a session that ran meanwhile may have
/// decided some: asking again would pay twice), and held by no live
/// session.
fn still_free<'a>(conn: &Connection, item_ids: &'a [String]) -> crate::db::Result<Vec<&'a String>> {
    let cutoff = live_cutoff(conn)?;
    let mut undecided = conn
        .prepare_cached("SELECT 1 FROM decision WHERE item_id = ?1 AND state = 'indeterminate'")?;
    let mut held = conn.prepare_cached(
        "SELECT 1 FROM session_item si JOIN llm_batch_session s ON s.session_id = si.session_id
         WHERE si.item_id = ?1 AND s.state IN ('running', 'paused') AND s.heartbeat_at >= ?2
           AND NOT EXISTS (SELECT 1 FROM llm_batch_result b WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
         LIMIT 1",
    )?;
    let mut kept = Vec::with_capacity(item_ids.len());
    for id in item_ids {
        let free = undecided.exists(params![id])?
            && match cutoff {
                Some(cutoff) => !held.exists(params![id, cutoff])?,
                None => true,
            };
        if free {
            kept.push(id);
        }
    }
    Ok(kept)
}

/// The request a new session uses for (item, stage): the newest version,
/// reused as it is when answered (stale answers were refused before, see
/// `stale_answers`), made afresh when it never was; a new version when the
/// stage is rerun.
fn request_for(
    conn: &Connection,
    item_id: &str,
    st: &NewStage<'_>,
    now: f64,
) -> crate::db::Result<i64> {
    let newest: Option<(i64, i64, String)> = conn
        .prepare_cached(
            "SELECT request_id, request_version, status FROM llm_requests
             WHERE item_id = ?1 AND stage = ?2 AND provider = ?3 AND model = ?4
             ORDER BY request_version DESC LIMIT 1",
        )?
        .query_row(params![item_id, st.name, st.provider, st.model], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()?;
    match newest {
        Some((id, _, status)) if !st.rerun && status == "completed" => Ok(id),
        Some((id, _, _)) if !st.rerun => {
            // Never answered: fresh budgets, today's template and parameters.
            conn.prepare_cached(
                "UPDATE llm_requests SET status = 'pending', parsed_output_json = NULL, result_message_id = NULL,
                     gate_failures = 0, transport_retries = 0, template_hash = ?2, params_hash = ?3, updated_at = ?4
                 WHERE request_id = ?1",
            )?
            .execute(params![id, st.template_hash, st.params_hash, now])?;
            Ok(id)
        }
        newest => {
            let version = newest.map_or(1, |(_, v, _)| v + 1);
            conn.prepare_cached(
                "INSERT INTO llm_requests (item_id, stage, provider, model, request_version, status, template_hash, params_hash, created_at, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?8) RETURNING request_id",
            )?
            .query_row(
                params![item_id, st.name, st.provider, st.model, version, st.template_hash, st.params_hash, now],
                |r| r.get(0),
            )
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
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

pub fn load_session(conn: &Connection, session_id: &str) -> crate::db::Result<Option<SessionRow>> {
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

/// Answers paid for but refused because their worker had lost the item
/// (see `ledger::queue`): (count, USD).
pub(crate) fn orphaned_spend(conn: &Connection, session_id: &str) -> crate::db::Result<(u64, f64)> {
    conn.query_row(
        "SELECT orphaned_count, orphaned_cost_usd FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| Ok((r.get::<_, i64>(0)?.max(0) as u64, r.get(1)?)),
    )
    .optional()
    .map(Option::unwrap_or_default)
}

/// Whether a live process runs the session now (its heartbeat is fresh and,
/// on this machine, its process is alive): the rule `repair_interrupted`
/// uses to refuse a second runner.
pub fn run_by_live_process(conn: &Connection, session_id: &str) -> crate::db::Result<bool> {
    type Owner = (String, Option<f64>, Option<i64>, Option<String>);
    let row: Option<Owner> = conn
        .query_row(
            "SELECT state, heartbeat_at, owner_pid, owner_host FROM llm_batch_session WHERE session_id = ?1",
            params![session_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
        )
        .optional()?;
    let Some((state, heartbeat, pid, host)) = row else {
        return Ok(false);
    };
    let now = conn.now()?;
    let fresh = heartbeat.is_some_and(|h| now - h < LIVE_HEARTBEAT_SECS);
    let gone =
        host.as_deref() == Some(hostname().as_str()) && pid.is_some_and(|p| !process_alive(p));
    Ok(matches!(state.as_str(), "running" | "paused") && fresh && !gone)
}

/// Whether a process of this machine is alive (Linux: /proc). Elsewhere a
/// fresh heartbeat is trusted and the caller waits for it to go stale.
pub(crate) fn process_alive(pid: i64) -> bool {
    if pid == i64::from(std::process::id()) {
        return false;
    }
    if cfg!(target_os = "linux") {
        // A zombie (killed, not yet reaped) is as good as gone.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Ok(stat) => !stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z')),
            Err(_) => false,
        }
    } else {
        true
    }
}

/// One stage of an item still to process.
#[derive(Debug, Clone)]
pub struct StageWork {
    pub stage: String,
    pub position: i64,
    pub request_id: i64,
    /// 'pending', 'passed', 'failed' or 'skipped' (this session's view).
    pub state: String,
    /// The request's own status: 'completed' when an answer passed before
    /// (this session, or an earlier one whose answer is reused).
    pub status: String,
    pub attempt: i64,
    pub gate_failures: i64,
    pub transport_retries: i64,
    pub parsed_output_json: Option<String>,
    /// The stage's output for the item (passed).
    pub output_json: Option<String>,
}

/// One item still to process in a session, with every stage.
#[derive(Debug, Clone)]
pub struct WorkItem {
    pub position: i64,
    pub item_id: String,
    pub evidence_json: String,
    /// In job order.
    pub stages: Vec<StageWork>,
    /// The fencing token this worker claimed the item with (0: not claimed,
    /// a read for a report).
    pub claim_token: i64,
}

/// The next `n` items after `after_position` that have no outcome yet, in
/// order, with every stage's request.
pub(crate) fn next_work(
    conn: &Connection,
    session_id: &str,
    after_position: i64,
    n: usize,
) -> crate::db::Result<Vec<WorkItem>> {
    let mut stmt = conn.prepare_cached(
        "SELECT si.position, si.item_id, d.evidence_json
         FROM session_item si
         JOIN decision d ON d.item_id = si.item_id
         WHERE si.session_id = ?1 AND si.position > ?2
           AND NOT EXISTS (SELECT 1 FROM llm_batch_result b WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
         ORDER BY si.position LIMIT ?3",
    )?;
    let items = stmt
        .query_map(params![session_id, after_position, n as i64], work_item)?
        .collect::<crate::db::Result<Vec<_>>>()?;
    with_stages(conn, session_id, items)
}

/// The items between two positions (inclusive) that have no outcome yet,
/// with every stage's request.
pub(crate) fn work_between(
    conn: &Connection,
    session_id: &str,
    first: i64,
    last: i64,
) -> crate::db::Result<Vec<WorkItem>> {
    let mut stmt = conn.prepare_cached(
        "SELECT si.position, si.item_id, d.evidence_json
         FROM session_item si
         JOIN decision d ON d.item_id = si.item_id
         WHERE si.session_id = ?1 AND si.position BETWEEN ?2 AND ?3
           AND NOT EXISTS (SELECT 1 FROM llm_batch_result b WHERE b.session_id = si.session_id AND b.item_id = si.item_id)
         ORDER BY si.position",
    )?;
    let items = stmt
        .query_map(params![session_id, first, last], work_item)?
        .collect::<crate::db::Result<Vec<_>>>()?;
    with_stages(conn, session_id, items)
}

fn work_item(r: &crate::db::Row<'_>) -> crate::db::Result<WorkItem> {
    Ok(WorkItem {
        position: r.get(0)?,
        item_id: r.get(1)?,
        evidence_json: r.get(2)?,
        stages: Vec::new(),
        claim_token: 0,
    })
}

/// Fill in every stage's request of a page of items (in position order).
fn with_stages(
    conn: &Connection,
    session_id: &str,
    mut items: Vec<WorkItem>,
) -> crate::db::Result<Vec<WorkItem>> {
    let (Some(first), Some(last)) = (items.first(), items.last()) else {
        return Ok(items);
    };
    // Every stage of the page's items in one pass over the page's positions.
    let mut stages = conn.prepare_cached(
        "SELECT si.position, sr.stage, sr.position, sr.request_id, sr.state, r.status,
                -- attempts are numbered from the messages: one sent just before a
                -- crash is on disk there even though the request never heard of it
                MAX(r.attempt, (SELECT COALESCE(MAX(m.attempt), 0) FROM llm_messages m WHERE m.request_id = r.request_id)),
                r.gate_failures, r.transport_retries, r.parsed_output_json, sr.output_json
         -- CROSS JOIN keeps the page's positions the outer loop: left to
         -- itself the planner walks every session_request row of the
         -- session for each page (0.5 s a page at 1,000,000 items)
         FROM session_item si
         CROSS JOIN session_request sr ON sr.session_id = si.session_id AND sr.item_id = si.item_id
         JOIN llm_requests r ON r.request_id = sr.request_id
         WHERE si.session_id = ?1 AND si.position BETWEEN ?2 AND ?3
         ORDER BY si.position, sr.position, sr.stage",
    )?;
    let mut rows = stages.query(params![session_id, first.position, last.position])?;
    let mut at = 0usize;
    while let Some(r) = rows.next()? {
        let pos: i64 = r.get(0)?;
        while at < items.len() && items[at].position < pos {
            at += 1;
        }
        if at >= items.len() {
            break;
        }
        if items[at].position != pos {
            // An item with an outcome already (not in the page).
            continue;
        }
        items[at].stages.push(StageWork {
            stage: r.get(1)?,
            position: r.get(2)?,
            request_id: r.get(3)?,
            state: r.get(4)?,
            status: r.get(5)?,
            attempt: r.get(6)?,
            gate_failures: r.get(7)?,
            transport_retries: r.get(8)?,
            parsed_output_json: r.get(9)?,
            output_json: r.get(10)?,
        });
    }
    drop(rows);
    Ok(items)
}

/// What an operator asked of the session (the ledger is the bus).
pub fn desired_state(conn: &Connection, session_id: &str) -> crate::db::Result<Option<String>> {
    conn.query_row(
        "SELECT desired_state FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| r.get(0),
    )
    .optional()
}

/// Everything an operator may have asked of a running session: its desired
/// state, a stop after a stage, and a retune of its limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Controls {
    pub desired_state: String,
    pub stop_after_stage: Option<String>,
    pub tune: docket_model::live::Tune,
}

/// The run controls of a session (None when there is no such session). A
/// negative tune value is not a limit anyone meant: it reads as unset.
pub(crate) fn session_controls(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Option<Controls>> {
    let tune = |v: Option<i64>| v.and_then(|v| u64::try_from(v).ok());
    conn.prepare_cached(
        "SELECT desired_state, stop_after_stage, tune_rpm, tune_tpm, tune_concurrency
         FROM llm_batch_session WHERE session_id = ?1",
    )?
    .query_row(params![session_id], |r| {
        Ok(Controls {
            desired_state: r.get(0)?,
            stop_after_stage: r.get(1)?,
            tune: docket_model::live::Tune {
                rpm: tune(r.get(2)?),
                tpm: tune(r.get(3)?),
                concurrency: tune(r.get(4)?),
            },
        })
    })
    .optional()
}

/// Ask a session to pause, resume or cancel; any engine running it obeys.
pub fn set_desired_state(
    conn: &Connection,
    session_id: &str,
    desired: &str,
) -> crate::db::Result<usize> {
    conn.execute(
        "UPDATE llm_batch_session SET desired_state = ?2, updated_at = ?3 WHERE session_id = ?1",
        params![session_id, desired, conn.now()?],
    )
}

/// The newest session id, for messages that suggest one.
pub fn latest_session(conn: &Connection) -> crate::db::Result<Option<String>> {
    conn.query_row(
        "SELECT session_id FROM llm_batch_session ORDER BY started_at DESC LIMIT 1",
        params![],
        |r| r.get(0),
    )
    .optional()
}

pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_default()
}

/// An item's evidence as stored (JSON text); None for an unknown item.
pub(crate) fn evidence_of(conn: &Connection, item_id: &str) -> crate::db::Result<Option<String>> {
    conn.prepare_cached("SELECT evidence_json FROM decision WHERE item_id = ?1")?
        .query_row(params![item_id], |r| r.get(0))
        .optional()
}
