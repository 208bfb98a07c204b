//! Candidates: the indeterminate items a new session may take, counted or
//! visited in pages, leaving out what live sessions still have to answer.

use std::ops::ControlFlow;

use super::sessions::LIVE_HEARTBEAT_SECS;
use crate::db::{Connection, Dialect, Value, params};

/// An indeterminate item chosen for a session.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub item_id: String,
    pub evidence_json: String,
}

/// Which indeterminate items a new session may take.
#[derive(Debug, Clone, Copy)]
pub struct CandidateFilter {
    pub limit: Option<u64>,
    /// Take items that already have a pending review item too (by default
    /// they are left out: they await a human, and asking again would cost
    /// a request and replace the suggestion in the queue).
    pub rereview_pending: bool,
}

impl CandidateFilter {
    /// Items that a live session (another process) still has to answer are
    /// never taken twice.
    fn sql(&self, select: &str, live_sessions: bool, dialect: Dialect) -> String {
        let mut sql = format!("{select} FROM decision d WHERE d.state = 'indeterminate'");
        // A pending suggestion made on evidence `import --update` replaced
        // since (stale) no longer holds its item back: the new evidence is
        // asked about, and the new suggestion supersedes the old one.
        if !self.rereview_pending {
            sql.push_str(
                " AND NOT EXISTS (SELECT 1 FROM review_item r WHERE r.item_id = d.item_id AND r.status = 'pending' AND r.stale = 0)",
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

pub(super) fn live_cutoff(conn: &Connection) -> crate::db::Result<Option<f64>> {
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

/// Indeterminate items that a new session leaves out by default because
/// they have a pending review item (one per item: the queue's index).
pub(crate) fn count_awaiting_review(conn: &Connection) -> crate::db::Result<u64> {
    let n: i64 = conn.query_row(
        "SELECT COUNT(*) FROM review_item r JOIN decision d ON d.item_id = r.item_id
         WHERE r.status = 'pending' AND r.stale = 0 AND d.state = 'indeterminate'",
        params![],
        |r| r.get(0),
    )?;
    Ok(u64::try_from(n).unwrap_or(0))
}

/// Why visiting the candidates stopped.
#[derive(Debug, thiserror::Error)]
pub enum CandidateError {
    /// The ledger could not be read.
    #[error(transparent)]
    Ledger(#[from] crate::LedgerError),
    /// The visitor stopped the visit (it keeps its own reason).
    #[error("the visit of the candidates was stopped")]
    Stopped,
}

impl From<crate::db::Error> for CandidateError {
    fn from(e: crate::db::Error) -> Self {
        CandidateError::Ledger(crate::LedgerError::Db(e))
    }
}

/// Visit the items a new session would take, in import order.
pub(crate) fn for_each_candidate(
    conn: &Connection,
    filter: CandidateFilter,
    mut visit: impl FnMut(Candidate) -> ControlFlow<()>,
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
        let candidate = Candidate {
            item_id: row.get(0)?,
            evidence_json: row.get(1)?,
        };
        if visit(candidate).is_break() {
            return Err(CandidateError::Stopped);
        }
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
    mut visit: impl FnMut(Candidate) -> ControlFlow<()>,
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
            let candidate = Candidate {
                item_id: row.get(0)?,
                evidence_json: row.get(1)?,
            };
            if visit(candidate).is_break() {
                return Err(CandidateError::Stopped);
            }
            got += 1;
        }
        n += got;
        if got < page {
            return Ok(n);
        }
    }
}
