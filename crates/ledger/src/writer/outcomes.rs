//! What comes back from a provider, in the ledger: an attempt's record,
//! a stage's end, a new (or reused) request, and an item's final result
//! with its decision or review item.

use super::counters::Counters;
use super::{AttemptRecord, FinalResult, MadeRequest, NO_SUGGESTION, NewRequest, StageDone};
use crate::db::{Connection, Dialect, OptionalExtension, params};
use docket_model::routing::Outcome;

/// Record what came back for one attempt on its message row.
pub(super) fn close_attempt(
    conn: &Connection,
    a: &AttemptRecord,
    now: f64,
) -> crate::db::Result<()> {
    let total = match (a.input_tokens, a.output_tokens) {
        (None, None) => None,
        (i, o) => Some(i.unwrap_or(0) + o.unwrap_or(0)),
    };
    conn.prepare_cached(
        "UPDATE llm_messages SET state = ?3, assistant_output = ?4, finish_reason = ?5, http_status = ?6,
             error_kind = ?7, error_message = ?8, provider_request_id = ?9, model_reported = ?10,
             input_tokens = ?11, output_tokens = ?12, total_tokens = ?13, cached_input_tokens = ?14,
             reasoning_tokens = ?15, cost_usd = ?16, latency_ms = ?17, finished_at = ?18
         WHERE request_id = ?1 AND attempt = ?2",
    )?
    .execute(params![
        a.request_id,
        a.attempt,
        a.state,
        a.output,
        a.finish_reason,
        a.http_status,
        a.error_kind,
        a.error_message,
        a.provider_request_id,
        a.model_reported,
        a.input_tokens.map(|v| v as i64),
        a.output_tokens.map(|v| v as i64),
        total.map(|v| v as i64),
        a.cached_input_tokens.map(|v| v as i64),
        a.reasoning_tokens.map(|v| v as i64),
        a.cost_usd,
        a.latency_ms,
        now
    ])?;
    Ok(())
}

/// A stage's end: its request, the item's stage row, the stage checkpoint,
/// and the later stages that will not run.
pub(super) fn apply_stage_done(
    conn: &Connection,
    attempt: Option<&AttemptRecord>,
    d: &StageDone,
    now: f64,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    // The answer that passed is the attempt just closed (or, for a reused
    // answer, the one already linked).
    let passed_attempt = attempt.filter(|_| d.passed).map(|a| a.attempt);
    if d.update_request {
        conn.prepare_cached(
        "UPDATE llm_requests SET status = ?2, parsed_output_json = COALESCE(?3, parsed_output_json),
             result_message_id = COALESCE((SELECT message_id FROM llm_messages WHERE request_id = ?1 AND attempt = ?4), result_message_id),
             attempt = MAX(attempt, COALESCE(?5, 0)),
             transport_retries = transport_retries + ?6, gate_failures = gate_failures + ?7,
             last_error = COALESCE(?8, last_error), updated_at = ?9
         WHERE request_id = ?1",
    )?
    .execute(params![
        d.request_id,
        if d.passed { "completed" } else { "error" },
        d.parsed_json,
        passed_attempt,
        attempt.map(|a| a.attempt),
        attempt.is_some_and(|a| a.transport_failure) as i64,
        attempt.is_some_and(|a| a.gate_failure) as i64,
        d.error_message.as_ref().or(attempt.and_then(|a| a.error_message.as_ref())),
        now
    ])?;
    }
    if !d.settle_item {
        return Ok(());
    }
    let state = if d.passed { "passed" } else { "failed" };
    let changed = conn
        .prepare_cached(
            "UPDATE session_request SET state = ?4, output_json = ?5, updated_at = ?6
             WHERE session_id = ?1 AND item_id = ?2 AND stage = ?3 AND state = 'pending'",
        )?
        .execute(params![
            d.session_id,
            d.item_id,
            d.stage,
            state,
            d.output_json,
            now
        ])?;
    if changed > 0 {
        counters.stage(
            &d.session_id,
            &d.stage,
            d.passed as i64,
            (!d.passed) as i64,
            0,
        );
    }
    for later in &d.skipped {
        let n = conn
            .prepare_cached(
                "UPDATE session_request SET state = 'skipped', updated_at = ?4
                 WHERE session_id = ?1 AND item_id = ?2 AND stage = ?3 AND state = 'pending'",
            )?
            .execute(params![d.session_id, d.item_id, later, now])?;
        if n > 0 {
            counters.stage(&d.session_id, later, 0, 0, 1);
        }
    }
    Ok(())
}

/// The newest request of an (item, stage): (id, version, status),
/// (template hash, parameters hash, parsed output), (the evidence hash it
/// was asked on, the item's now).
type Newest = (
    (i64, i64, String),
    (String, String, Option<String>),
    (Option<String>, Option<String>),
);

pub(super) fn apply_new_request(
    conn: &Connection,
    r: &NewRequest,
    now: f64,
) -> crate::db::Result<MadeRequest> {
    let newest: Option<Newest> = conn
        .prepare_cached(
            "SELECT r.request_id, r.request_version, r.status, r.template_hash, r.params_hash, r.parsed_output_json,
                 r.evidence_hash, d.evidence_hash
             FROM llm_requests r JOIN decision d ON d.item_id = r.item_id
             WHERE r.item_id = ?1 AND r.stage = ?2 AND r.provider = ?3 AND r.model = ?4
             ORDER BY r.request_version DESC LIMIT 1",
        )?
        .query_row(params![r.item_id, r.stage, r.provider, r.model], |x| {
            Ok((
                (x.get(0)?, x.get(1)?, x.get(2)?),
                (x.get(3)?, x.get(4)?, x.get(5)?),
                (x.get(6)?, x.get(7)?),
            ))
        })
        .optional()?;
    let (id, answered) = match newest {
        // Reused when answered with today's template and parameters on the
        // item's evidence as it is now (`docket import --update`).
        Some(((id, _, status), (th, ph, parsed), (asked_on, now_hash)))
            if status == "completed"
                && th == r.template_hash
                && ph == r.params_hash
                && !crate::import::other_evidence(&asked_on, &now_hash) =>
        {
            (id, parsed)
        }
        Some(((id, _, status), _, _)) if status != "completed" => {
            conn.prepare_cached(
                "UPDATE llm_requests SET status = 'pending', gate_failures = 0, transport_retries = 0,
                     template_hash = ?2, params_hash = ?3, updated_at = ?4,
                     evidence_hash = (SELECT evidence_hash FROM decision WHERE item_id = ?5) WHERE request_id = ?1",
            )?
            .execute(params![id, r.template_hash, r.params_hash, now, r.item_id])?;
            (id, None)
        }
        newest => {
            let version = newest.map_or(1, |n| n.0.1 + 1);
            let id = conn
                .prepare_cached(
                    "INSERT INTO llm_requests (item_id, stage, provider, model, request_version, status, template_hash, params_hash,
                         created_at, updated_at, evidence_hash)
                     VALUES (?1, ?2, ?3, ?4, ?5, 'pending', ?6, ?7, ?8, ?8, (SELECT evidence_hash FROM decision WHERE item_id = ?1))
                     RETURNING request_id",
                )?
                .query_row(
                    params![r.item_id, r.stage, r.provider, r.model, version, r.template_hash, r.params_hash, now],
                    |x| x.get(0),
                )?;
            (id, None)
        }
    };
    conn.prepare_cached(
        "INSERT INTO session_request (session_id, item_id, stage, position, request_id, state, output_json, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, 'pending', NULL, ?6)
         ON CONFLICT (session_id, item_id, stage) DO UPDATE SET request_id = excluded.request_id, updated_at = excluded.updated_at",
    )?
    .execute(params![r.session_id, r.item_id, r.stage, r.position, id, now])?;
    let attempts: i64 = conn
        .prepare_cached(
            "SELECT MAX(r.attempt, (SELECT COALESCE(MAX(m.attempt), 0) FROM llm_messages m WHERE m.request_id = r.request_id))
             FROM llm_requests r WHERE r.request_id = ?1",
        )?
        .query_row(params![id], |x| x.get(0))?;
    Ok(MadeRequest {
        request_id: id,
        answered,
        attempts,
    })
}

/// An item's final result: the attempt that ended it, its stage's end, the
/// result row with the item's spend, and the decision or review item its
/// outcome calls for.
pub(super) fn apply_final(
    conn: &Connection,
    attempt: Option<&AttemptRecord>,
    f: &FinalResult,
    now: f64,
    counters: &mut Counters,
) -> crate::db::Result<()> {
    if let Some(a) = attempt {
        close_attempt(conn, a, now)?;
    }
    if let Some(d) = &f.stage_done {
        apply_stage_done(conn, attempt, d, now, counters)?;
    }
    let adjudication_id = f.request_id.to_string();
    record_result(conn, f, &adjudication_id, now)?;
    counters.attempt(&f.session_id, attempt, Some(f.outcome));
    settle_outcome(conn, f, &adjudication_id, now)
}

/// What the item took: its attempts, tokens and cost.
struct ItemSpend {
    attempts: i64,
    input: i64,
    output: i64,
    cost: f64,
}

/// Every attempt of every stage of the item in this session. `+session_id`
/// keeps the planner on the request_id index: the session index would
/// scan every message of the session for each result.
fn item_spend(conn: &Connection, f: &FinalResult) -> crate::db::Result<ItemSpend> {
    let (attempts, input, output, cost): (i64, i64, i64, f64) = if f.only_request {
        // One request for the item (a one-stage job): straight off its index.
        conn.prepare_cached(
            "SELECT COUNT(*), COALESCE(SUM(input_tokens), 0), COALESCE(SUM(output_tokens), 0), COALESCE(SUM(cost_usd), 0)
             FROM llm_messages WHERE request_id = ?1 AND +session_id = ?2",
        )?
        .query_row(params![f.request_id, f.session_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
    } else {
        conn.prepare_cached(
            "SELECT COUNT(m.message_id), COALESCE(SUM(m.input_tokens), 0), COALESCE(SUM(m.output_tokens), 0),
                    COALESCE(SUM(m.cost_usd), 0)
             FROM session_request sr JOIN llm_messages m ON m.request_id = sr.request_id AND +m.session_id = sr.session_id
             WHERE sr.session_id = ?2 AND sr.item_id = ?1",
        )?
        .query_row(params![f.item_id, f.session_id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
    };
    Ok(ItemSpend {
        attempts,
        input,
        output,
        cost,
    })
}

/// The item's result row, with what the item took.
fn record_result(
    conn: &Connection,
    f: &FinalResult,
    adjudication_id: &str,
    now: f64,
) -> crate::db::Result<()> {
    let spend = item_spend(conn, f)?;
    // The primary key (session_id, item_id) makes a second result for the
    // same item a hard error: at most one recorded result, ever.
    conn.prepare_cached(
        "INSERT INTO llm_batch_result (session_id, item_id, processed_at, outcome, answer_json, confidence, rationale,
             model_id, error_message, adjudication_id, stage, request_id, attempts, input_tokens, output_tokens, cost_usd,
             critic_json, critic_verdict, routing_note)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
    )?
    .execute(params![
        f.session_id,
        f.item_id,
        now,
        f.outcome.as_str(),
        f.answer_json,
        f.confidence,
        f.rationale,
        f.model_id,
        f.error_message,
        adjudication_id,
        f.stage,
        f.request_id,
        spend.attempts,
        spend.input,
        spend.output,
        spend.cost,
        f.critic_json,
        f.critic_verdict,
        f.routing_note
    ])?;
    Ok(())
}

/// An accepted answer decides the item; one for review goes to the queue.
fn settle_outcome(
    conn: &Connection,
    f: &FinalResult,
    adjudication_id: &str,
    now: f64,
) -> crate::db::Result<()> {
    match f.outcome {
        Outcome::Accepted => {
            // Never overwrite a decision someone made meanwhile.
            let decided = conn.prepare_cached(
                "UPDATE decision SET state = 'decided', decided_answer_json = ?2, decided_by = 'llm_auto_accept',
                     decided_at = ?3, confidence = ?4, model_id = ?5, adjudication_id = ?6, updated_at = ?3
                 WHERE item_id = ?1 AND state = 'indeterminate'",
            )?
            .execute(params![f.item_id, f.answer_json, now, f.confidence, f.model_id, adjudication_id])?;
            if decided > 0 {
                // The item is decided: an older suggestion still pending
                // review is out of date (kept as history, out of the queue).
                conn.prepare_cached(
                    "UPDATE review_item SET status = 'superseded', superseded_at = ?2,
                         claimed_by = NULL, claim_expires_at = NULL
                     WHERE item_id = ?1 AND status = 'pending'",
                )?
                .execute(params![f.item_id, now])?;
                if f.audit {
                    open_review_item(conn, f, now)?;
                }
            }
        }
        Outcome::Review => open_review_item(conn, f, now)?,
        Outcome::Rejected if f.audit => open_review_item(conn, f, now)?,
        // A suggestion made on evidence `import --update` replaced is out
        // of date once the new evidence was judged (kept as history).
        Outcome::Rejected => {
            conn.prepare_cached(
                "UPDATE review_item SET status = 'superseded', superseded_at = ?2,
                     claimed_by = NULL, claim_expires_at = NULL
                 WHERE item_id = ?1 AND status = 'pending' AND stale = 1",
            )?
            .execute(params![f.item_id, now])?;
        }
        Outcome::Error => {}
    }
    Ok(())
}

/// The item's review item for this session. An item never has two pending
/// review items: an older one still pending (another session's answer) is
/// superseded by this one, kept as history and named by it. A session that
/// already has a review item for the item (a replayed or re-asked outcome)
/// keeps the one it has. An audit sample's item is marked `audit`.
fn open_review_item(conn: &Connection, f: &FinalResult, now: f64) -> crate::db::Result<()> {
    if conn.dialect() == Dialect::Postgres {
        // Writers of two sessions may settle the same item at once: the
        // item's row lock orders them, so the second supersedes the first
        // instead of meeting it in the one-pending index.
        conn.prepare_cached("SELECT item_id FROM decision WHERE item_id = ?1 FOR UPDATE")?
            .query_row(params![f.item_id], |r| r.get::<_, String>(0))
            .optional()?;
    }
    let has_one = conn
        .prepare_cached("SELECT review_id FROM review_item WHERE session_id = ?1 AND item_id = ?2")?
        .query_row(params![f.session_id, f.item_id], |r| r.get::<_, i64>(0))
        .optional()?;
    if has_one.is_some() {
        return Ok(());
    }
    conn.prepare_cached(
        "UPDATE review_item SET status = 'superseded', superseded_at = ?2, superseded_by = NULL,
             claimed_by = NULL, claim_expires_at = NULL
         WHERE item_id = ?1 AND status = 'pending'",
    )?
    .execute(params![f.item_id, now])?;
    let review_id: i64 = conn
        .prepare_cached(
            "INSERT INTO review_item (item_id, session_id, source, status, llm_suggestion_json, confidence, rationale,
                 model_id, request_id, created_at, audit)
             VALUES (?1, ?2, 'LLM_REVIEW', 'pending', ?3, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING review_id",
        )?
        .query_row(
            params![
                f.item_id,
                f.session_id,
                // No answer passed the gate (row S7): nothing to accept.
                f.answer_json.as_deref().unwrap_or(NO_SUGGESTION),
                f.confidence,
                f.rationale,
                f.model_id,
                f.request_id,
                now,
                i64::from(f.audit)
            ],
            |r| r.get(0),
        )?;
    // Also links a suggestion whose successor a `--rerun-stage` removed.
    conn.prepare_cached(
        "UPDATE review_item SET superseded_by = ?2
         WHERE item_id = ?1 AND status = 'superseded' AND superseded_by IS NULL",
    )?
    .execute(params![f.item_id, review_id])?;
    Ok(())
}
