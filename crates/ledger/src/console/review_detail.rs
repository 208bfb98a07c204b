//! One review item in full: its evidence, the suggestion, what every stage
//! answered and, in a staged job, the generator's answer beside its
//! critic's verdict and why the routing sent it to review.

use crate::db::{Connection, OptionalExtension, params};

use super::columns::{real, text};
use super::schema::{has_column, has_table};
use crate::now_ts;
use crate::watch::{ReplacedSuggestion, ReviewDetail, StageOutput, StageVerdict};

/// One review item in full: its evidence, the suggestion and what every
/// stage of every request for the item answered. Texts are returned as
/// stored (the renderer makes them safe for the terminal).
pub(super) fn review_detail(
    conn: &Connection,
    review_id: i64,
) -> crate::db::Result<Option<ReviewDetail>> {
    let now = now_ts();
    let detail = conn
        .prepare_cached(
            "SELECT r.review_id, r.item_id, r.session_id, r.status, d.evidence_json, r.llm_suggestion_json,
                    r.confidence, r.rationale, r.model_id, r.decided_by, r.decided_at,
                    CASE WHEN r.claim_expires_at > ?2 THEN r.claimed_by END, r.audit, r.stale
             FROM review_item r LEFT JOIN decision d ON d.item_id = r.item_id
             WHERE r.review_id = ?1",
        )?
        .query_row(params![review_id, now], |r| {
            let evidence: Option<String> = r.get(4)?;
            let suggestion: String = r.get(5)?;
            Ok(ReviewDetail {
                review_id: r.get(0)?,
                item_id: r.get(1)?,
                session_id: r.get(2)?,
                status: r.get(3)?,
                evidence_json: pretty_json(evidence.as_deref().unwrap_or("")),
                suggestion_json: pretty_json(&suggestion),
                confidence: r.get(6)?,
                rationale: r.get(7)?,
                model_id: r.get(8)?,
                stages: Vec::new(),
                decided_by: r.get(9)?,
                decided_at: r.get(10)?,
                claimed_by: r.get(11)?,
                audit: r.get::<_, i64>(12)? != 0,
                stale: r.get::<_, i64>(13)? != 0,
                ..ReviewDetail::default()
            })
        })
        .optional()?;
    let Some(mut detail) = detail else {
        return Ok(None);
    };
    // The item's requests come off the (item_id, stage, ...) unique index.
    let mut stmt = conn.prepare_cached(
        "SELECT q.stage, q.provider, q.model, q.status,
                MAX(q.attempt, (SELECT COALESCE(MAX(a.attempt), 0) FROM llm_messages a WHERE a.request_id = q.request_id)),
                q.parsed_output_json, m.assistant_output, m.finish_reason,
                COALESCE(m.input_tokens, 0), COALESCE(m.output_tokens, 0), COALESCE(m.cost_usd, 0)
         FROM llm_requests q LEFT JOIN llm_messages m ON m.message_id = COALESCE(q.result_message_id,
             (SELECT MAX(x.message_id) FROM llm_messages x WHERE x.request_id = q.request_id AND x.assistant_output IS NOT NULL))
         WHERE q.item_id = ?1
         ORDER BY q.created_at, q.request_id",
    )?;
    let stages = stmt.query_map(params![detail.item_id], |r| {
        Ok(StageOutput {
            stage: r.get(0)?,
            provider: r.get(1)?,
            model: r.get(2)?,
            status: r.get(3)?,
            attempts: u64::try_from(r.get::<_, i64>(4)?).unwrap_or(0),
            parsed_output_json: r.get(5)?,
            raw_output: r.get(6)?,
            finish_reason: r.get(7)?,
            input_tokens: u64::try_from(r.get::<_, i64>(8)?).unwrap_or(0),
            output_tokens: u64::try_from(r.get::<_, i64>(9)?).unwrap_or(0),
            cost_usd: r.get(10)?,
        })
    })?;
    detail.stages = stages.collect::<crate::db::Result<_>>()?;
    if let Some(session) = detail.session_id.clone() {
        routed(conn, &session, &mut detail)?;
    }
    if has_column(conn, "review_item", "superseded_by")? {
        supersessions(conn, &mut detail)?;
    }
    Ok(Some(detail))
}

/// How many earlier suggestions the card names.
const REPLACED_SHOWN: i64 = 5;

/// The earlier suggestions this review item superseded, newest first, and
/// the one that superseded it.
fn supersessions(conn: &Connection, d: &mut ReviewDetail) -> crate::db::Result<()> {
    let mut stmt = conn.prepare_cached(
        "SELECT review_id, session_id, llm_suggestion_json, confidence, created_at
         FROM review_item WHERE superseded_by = ?1
         ORDER BY created_at DESC, review_id DESC LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![d.review_id, REPLACED_SHOWN], |r| {
        let suggestion: String = r.get(2)?;
        Ok(ReplacedSuggestion {
            review_id: r.get(0)?,
            session_id: r.get(1)?,
            suggestion: compact_json(&suggestion),
            confidence: r.get(3)?,
            created_at: r.get(4)?,
        })
    })?;
    d.replaced = rows.collect::<crate::db::Result<_>>()?;
    d.superseded_by = conn
        .prepare_cached(
            "SELECT n.review_id, n.session_id FROM review_item r JOIN review_item n ON n.review_id = r.superseded_by
             WHERE r.review_id = ?1",
        )?
        .query_row(params![d.review_id], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(())
}

/// Compact JSON, or the text as it is when it is not JSON.
fn compact_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string(&v).ok())
        .unwrap_or_else(|| text.to_string())
}

/// The fields of a critic's answer read for its verdict, confidence and
/// rationale (the defaults of `[routing.critic]` and the gate).
const VERDICT_FIELDS: [&str; 2] = ["verdict", "agree"];
const CONFIDENCE_FIELDS: [&str; 1] = ["confidence"];
const RATIONALE_FIELDS: [&str; 4] = ["rationale", "reason", "reasoning", "explanation"];

/// The answer stage's output and its critic's verdict, from the session's
/// result for the item (with the critic's own request when the result has
/// none), and the routing note. Leaves the detail as it is on a ledger
/// without staged columns, or an item with no result yet.
fn routed(conn: &Connection, session: &str, d: &mut ReviewDetail) -> crate::db::Result<()> {
    let staged =
        has_table(conn, "run_stages")? && has_column(conn, "llm_batch_result", "critic_json")?;
    if !staged {
        return Ok(());
    }
    let result = conn
        .prepare_cached(
            "SELECT stage, answer_json, confidence, rationale, critic_json, critic_verdict, routing_note
             FROM llm_batch_result WHERE session_id = ?1 AND item_id = ?2",
        )?
        .query_row(params![session, d.item_id], |r| {
            Ok((
                text(r, 0)?,
                text(r, 1)?,
                real(r, 2)?,
                text(r, 3)?,
                text(r, 4)?,
                text(r, 5)?,
                text(r, 6)?,
            ))
        })
        .optional()?;
    let (answer_stage, answer, confidence, rationale, critic_json, verdict, note) =
        result.unwrap_or_default();
    d.routing_note = note.filter(|n| !n.trim().is_empty());
    // The critic of the answer stage (any critic when it is not named).
    // `x IS ?2` compares values only in SQLite; PostgreSQL refuses it.
    let critic_stage: Option<String> = conn
        .prepare_cached(
            "SELECT stage FROM run_stages
             WHERE session_id = ?1 AND (role = 'critic' OR critic_of IS NOT NULL)
             ORDER BY (critic_of IS NOT DISTINCT FROM ?2) DESC, position LIMIT 1",
        )?
        .query_row(params![session, answer_stage], |r| text(r, 0))
        .optional()?
        .flatten();
    if answer.is_some() || answer_stage.is_some() {
        d.generator = Some(StageVerdict {
            stage: answer_stage.clone().unwrap_or_default(),
            output_json: answer.or_else(|| Some(d.suggestion_json.clone())),
            confidence: confidence.or(d.confidence),
            rationale: rationale.or_else(|| d.rationale.clone()),
            verdict: None,
        });
    }
    let critic_output = match (&critic_json, &critic_stage) {
        (Some(j), _) => Some(j.clone()),
        (None, Some(stage)) => stage_output(conn, session, &d.item_id, stage)?,
        (None, None) => None,
    };
    if critic_output.is_none() && verdict.is_none() {
        return Ok(());
    }
    let fields = critic_output
        .as_deref()
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok());
    let field = |names: &[&str]| {
        let obj = fields.as_ref()?.as_object()?;
        names.iter().find_map(|n| obj.get(*n))
    };
    let as_text = |v: &serde_json::Value| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    d.critic = Some(StageVerdict {
        stage: critic_stage.unwrap_or_else(|| "critic".into()),
        verdict: verdict
            .filter(|v| !v.trim().is_empty())
            .or_else(|| field(&VERDICT_FIELDS).map(as_text)),
        confidence: field(&CONFIDENCE_FIELDS).and_then(serde_json::Value::as_f64),
        rationale: field(&RATIONALE_FIELDS).map(as_text),
        output_json: critic_output,
    });
    Ok(())
}

/// A stage's output for the item: what the session recorded when it
/// passed, else its request's parsed answer.
fn stage_output(
    conn: &Connection,
    session: &str,
    item_id: &str,
    stage: &str,
) -> crate::db::Result<Option<String>> {
    Ok(conn
        .prepare_cached(
            "SELECT COALESCE(sr.output_json, q.parsed_output_json)
             FROM session_request sr LEFT JOIN llm_requests q ON q.request_id = sr.request_id
             WHERE sr.session_id = ?1 AND sr.item_id = ?2 AND sr.stage = ?3",
        )?
        .query_row(params![session, item_id, stage], |r| text(r, 0))
        .optional()?
        .flatten())
}

/// Pretty-printed JSON, or the text as it is when it is not JSON.
fn pretty_json(text: &str) -> String {
    serde_json::from_str::<serde_json::Value>(text)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| text.to_string())
}
