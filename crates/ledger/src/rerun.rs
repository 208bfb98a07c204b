//! `--resume SESSION --rerun-stage NAME`: ask a stage again, and every stage
//! after it, for every item of a session. Each of those requests gets a new
//! request_version (the old ones and their answers stay in the ledger); an
//! item's outcome is moved to `llm_batch_result_history` and its
//! auto-accepted decision is undone, so the new answers decide it again.

use crate::db::{Connection, OptionalExtension, TransactionBehavior, params};

use super::{LedgerError, now_ts};

/// A stage of the job as a rerun records it.
#[derive(Debug, Clone)]
pub struct RerunStage {
    pub name: String,
    /// Its place in the job (0: the first stage).
    pub index: usize,
    pub provider_name: String,
    pub model: String,
    pub template_hash: String,
    pub params_hash: String,
}

/// What a rerun reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rerun {
    pub items: u64,
    pub requests: u64,
    pub outcomes_superseded: u64,
}

/// Why a rerun did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RerunError {
    /// Refused, and why (for the operator): the session has provider
    /// batches still open.
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl From<crate::db::Error> for RerunError {
    fn from(e: crate::db::Error) -> Self {
        RerunError::Ledger(LedgerError::Db(e))
    }
}

/// Ask `stages[from]` and every stage after it again for every item of
/// `session_id` (`stages`: the job's stages, in order).
pub(crate) fn rerun_stages(
    conn: &mut Connection,
    stages: &[RerunStage],
    session_id: &str,
    from: usize,
    actor: &str,
) -> Result<Rerun, RerunError> {
    let now = now_ts();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut done = Rerun::default();
    refuse_with_open_batches(&tx, session_id)?;
    let items: Vec<String> = tx
        .prepare("SELECT item_id FROM session_item WHERE session_id = ?1 ORDER BY position")?
        .query_map(params![session_id], |r| r.get(0))?
        .collect::<crate::db::Result<_>>()?;
    let why = format!("rerun-stage {} by {actor}", stages[from].name);
    let earlier: Vec<&str> = stages[..from].iter().map(|s| s.name.as_str()).collect();
    for item in &items {
        // An item that did not get through the stages before the rerun one
        // keeps its outcome: there is nothing for those stages to judge.
        if !passed_all(&tx, session_id, item, &earlier)? {
            continue;
        }
        done.requests += ask_again(&tx, session_id, item, &stages[from..], now)?;
        done.items += 1;
        if supersede_outcome(&tx, session_id, item, &why, now)? {
            done.outcomes_superseded += 1;
        }
    }
    // The checkpoints of the stages asked again start over.
    for stage in &stages[from..] {
        tx.execute(
            "UPDATE run_stages SET completed = 0, failed = 0, skipped = 0, state = 'pending',
                 started_at = NULL, completed_at = NULL, updated_at = ?3
             WHERE session_id = ?1 AND stage = ?2",
            params![session_id, stage.name, now],
        )?;
    }
    tx.execute(
        "INSERT INTO session_event (session_id, at, level, kind, message, actor)
         VALUES (?1, ?2, 'info', 'rerun_stage', ?3, ?4)",
        params![
            session_id,
            now,
            format!(
                "stage {} and the stages after it asked again for {} items ({} requests, {} outcomes superseded)",
                stages[from].name, done.items, done.requests, done.outcomes_superseded
            ),
            actor
        ],
    )?;
    tx.commit()?;
    Ok(done)
}

/// Lines of open provider batches point at the requests being replaced:
/// they would be paid for and then dropped. Collect or cancel them first.
fn refuse_with_open_batches(tx: &Connection, session_id: &str) -> Result<(), RerunError> {
    let open: i64 = tx.query_row(
        "SELECT COUNT(*) FROM provider_batch WHERE session_id = ?1 AND state != 'ingested'",
        params![session_id],
        |r| r.get(0),
    )?;
    if open > 0 {
        return Err(RerunError::Refused(format!(
            "session {session_id} has {open} provider batch(es) still open: resume it to collect them (or cancel them) before asking a stage again"
        )));
    }
    Ok(())
}

/// Whether `item` passed every one of the `earlier` stages.
fn passed_all(
    tx: &Connection,
    session_id: &str,
    item: &str,
    earlier: &[&str],
) -> crate::db::Result<bool> {
    for stage in earlier {
        let state: Option<String> = tx
            .query_row(
                "SELECT state FROM session_request WHERE session_id = ?1 AND item_id = ?2 AND stage = ?3",
                params![session_id, item, stage],
                |r| r.get(0),
            )
            .optional()?;
        if state.as_deref() != Some("passed") {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A new request version for each of `stages` for `item`, pending in the
/// session; returns how many.
fn ask_again(
    tx: &Connection,
    session_id: &str,
    item: &str,
    stages: &[RerunStage],
    now: f64,
) -> crate::db::Result<u64> {
    let mut requests = 0;
    for stage in stages {
        let version: i64 = tx.query_row(
            "SELECT COALESCE(MAX(request_version), 0) + 1 FROM llm_requests
                 WHERE item_id = ?1 AND stage = ?2 AND provider = ?3 AND model = ?4",
            params![item, stage.name, stage.provider_name, stage.model],
            |r| r.get(0),
        )?;
        let request_id: i64 = tx.query_row(
            "INSERT INTO llm_requests (item_id, stage, provider, model, request_version, status, template_hash, params_hash,
                     created_at, updated_at, evidence_hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?8, (SELECT evidence_hash FROM decision WHERE item_id = ?1))
                 RETURNING request_id",
            params![item, stage.name, stage.provider_name, stage.model, version, stage.template_hash, stage.params_hash, now],
            |r| r.get(0),
        )?;
        tx.execute(
            "INSERT INTO session_request (session_id, item_id, stage, position, request_id, state, output_json, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, 'pending', NULL, ?6)
                 ON CONFLICT (session_id, item_id, stage) DO UPDATE SET
                     request_id = excluded.request_id, state = 'pending', output_json = NULL, updated_at = excluded.updated_at",
            params![session_id, item, stage.name, stage.index as i64, request_id, now],
        )?;
        // Criteria asked on their own for the old answer go with it.
        tx.execute(
            "DELETE FROM session_request WHERE session_id = ?1 AND item_id = ?2 AND stage LIKE ?3 || ':%'",
            params![session_id, item, stage.name],
        )?;
        if stage.index == 0 {
            tx.execute(
                "UPDATE session_item SET request_id = ?3 WHERE session_id = ?1 AND item_id = ?2",
                params![session_id, item, request_id],
            )?;
        }
        requests += 1;
    }
    Ok(requests)
}

/// The outcome the stages asked again led to is history now, and what it
/// did is undone; false when the item had no outcome.
fn supersede_outcome(
    tx: &Connection,
    session_id: &str,
    item: &str,
    why: &str,
    now: f64,
) -> crate::db::Result<bool> {
    let superseded = tx.execute(
        "INSERT INTO llm_batch_result_history (session_id, item_id, processed_at, outcome, answer_json, confidence,
                 rationale, model_id, error_message, adjudication_id, stage, request_id, attempts, input_tokens,
                 output_tokens, cost_usd, critic_json, critic_verdict, routing_note, superseded_at, superseded_by)
             SELECT session_id, item_id, processed_at, outcome, answer_json, confidence, rationale, model_id,
                 error_message, adjudication_id, stage, request_id, attempts, input_tokens, output_tokens, cost_usd,
                 critic_json, critic_verdict, routing_note, ?3, ?4
             FROM llm_batch_result WHERE session_id = ?1 AND item_id = ?2",
        params![session_id, item, now, why],
    )?;
    if superseded == 0 {
        return Ok(false);
    }
    let (outcome, adjudication_id): (String, Option<String>) = tx.query_row(
        "SELECT outcome, adjudication_id FROM llm_batch_result WHERE session_id = ?1 AND item_id = ?2",
        params![session_id, item],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    tx.execute(
        "DELETE FROM llm_batch_result WHERE session_id = ?1 AND item_id = ?2",
        params![session_id, item],
    )?;
    // An auto-accept this outcome made is undone; a human's decision
    // stays as it is.
    if let Some(adj) = adjudication_id {
        tx.execute(
            "UPDATE decision SET state = 'indeterminate', decided_answer_json = NULL, decided_by = NULL,
                     decided_at = NULL, confidence = NULL, model_id = NULL, adjudication_id = NULL, updated_at = ?3
                 WHERE item_id = ?1 AND decided_by = 'llm_auto_accept' AND adjudication_id = ?2",
            params![item, adj, now],
        )?;
    }
    // What that suggestion superseded waits, unlinked, for the one the
    // item's new answer makes (the writer links it then).
    tx.execute(
        "UPDATE review_item SET superseded_by = NULL WHERE item_id = ?2 AND superseded_by IN
             (SELECT review_id FROM review_item WHERE session_id = ?1 AND item_id = ?2 AND status = 'pending')",
        params![session_id, item],
    )?;
    tx.execute(
        "DELETE FROM review_item WHERE session_id = ?1 AND item_id = ?2 AND status = 'pending'",
        params![session_id, item],
    )?;
    let col = match outcome.as_str() {
        "accepted" => "accepted_count",
        "review" => "reviewed_count",
        "rejected" => "rejected_count",
        _ => "error_count",
    };
    tx.execute(
        &format!(
            "UPDATE llm_batch_session SET processed_count = MAX(processed_count - 1, 0),
                     {col} = MAX({col} - 1, 0), updated_at = ?2 WHERE session_id = ?1"
        ),
        params![session_id, now],
    )?;
    Ok(true)
}
