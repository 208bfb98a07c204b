//! The charts overlay's read: a session's confidences by stage (from its
//! outcomes, `llm_batch_result`), its attempts on a time line (from
//! `llm_messages`) and its calibration inputs (human decisions against
//! confidences, as `docket calibrate` reads them). The console asks for it
//! only while the charts are on screen, and at most every few seconds: it
//! reads every attempt row of the session.

use crate::db::Connection;
use crate::db::params;

use super::columns::{real, text};
use crate::watch::{AttemptPoint, CONFIDENCE_BINS, ChartData, StageHistogram, Timeline};

/// The charts of `session_id`; empty when there is no such session.
pub(super) fn charts(conn: &Connection, session_id: &str) -> crate::db::Result<ChartData> {
    let span = conn
        .prepare_cached(
            "SELECT started_at, completed_at FROM llm_batch_session WHERE session_id = ?1",
        )?
        .query_map(params![session_id], |r| Ok((real(r, 0)?, real(r, 1)?)))?
        .next()
        .transpose()?;
    let Some((Some(start), end)) = span else {
        return Ok(ChartData::default());
    };
    // A session still going runs up to now (its right edge moves).
    let end = end.unwrap_or_else(crate::now_ts).max(start);
    Ok(ChartData {
        confidence: histograms(conn, session_id)?,
        timeline: Timeline::build(start, end, &attempts(conn, session_id)?),
        calibration: crate::calibration::calibration_input(conn, session_id)?
            .map(|input| input.session_summary()),
    })
}

/// Each stage's outcomes counted by confidence (outcomes with none, as an
/// error has, are left out), and the critic's confidences apart.
fn histograms(conn: &Connection, session_id: &str) -> crate::db::Result<Vec<StageHistogram>> {
    let mut stmt = conn.prepare_cached(
        "SELECT stage, confidence FROM llm_batch_result
         WHERE session_id = ?1 AND confidence IS NOT NULL",
    )?;
    let rows = stmt.query_map(params![session_id], |r| {
        Ok((text(r, 0)?.unwrap_or_default(), real(r, 1)?))
    })?;
    let mut out: Vec<StageHistogram> = Vec::new();
    for row in rows {
        let (stage, confidence) = row?;
        let Some(bin) = confidence.and_then(crate::watch::confidence_bin) else {
            continue;
        };
        let i = match out.iter().position(|h| h.stage == stage) {
            Some(i) => i,
            None => {
                out.push(StageHistogram {
                    stage,
                    bins: vec![0; CONFIDENCE_BINS],
                });
                out.len() - 1
            }
        };
        out[i].bins[bin] += 1;
    }
    critic_histogram(conn, session_id, &mut out)?;
    // Job order (no ORDER BY above: sorting every outcome costs a third of
    // the read on a big session); a stage without a checkpoint goes last.
    let order = stage_positions(conn, session_id)?;
    let place = |stage: &str| {
        order
            .iter()
            .find(|(name, _)| name == stage)
            .map_or(i64::MAX, |(_, p)| *p)
    };
    out.sort_by(|a, b| {
        place(&a.stage)
            .cmp(&place(&b.stage))
            .then_with(|| a.stage.cmp(&b.stage))
    });
    Ok(out)
}

/// The critic's own confidences (in its answers, `critic_json`), as one
/// more histogram under the critic stage's name: the generator's
/// confidence is the outcome's, the critic's would otherwise not show.
fn critic_histogram(
    conn: &Connection,
    session_id: &str,
    out: &mut Vec<StageHistogram>,
) -> crate::db::Result<()> {
    if !super::schema::has_table(conn, "run_stages")?
        || !super::schema::has_column(conn, "llm_batch_result", "critic_json")?
    {
        return Ok(());
    }
    let stage: Option<String> = conn
        .prepare_cached(
            "SELECT stage FROM run_stages
             WHERE session_id = ?1 AND (role = 'critic' OR critic_of IS NOT NULL)
             ORDER BY position LIMIT 1",
        )?
        .query_map(params![session_id], |r| text(r, 0))?
        .next()
        .transpose()?
        .flatten();
    let Some(stage) = stage.filter(|s| !out.iter().any(|h| &h.stage == s)) else {
        return Ok(());
    };
    let mut stmt = conn.prepare_cached(
        "SELECT critic_json FROM llm_batch_result
         WHERE session_id = ?1 AND critic_json IS NOT NULL",
    )?;
    let mut bins = vec![0; CONFIDENCE_BINS];
    for json in stmt.query_map(params![session_id], |r| text(r, 0))? {
        // The gate's confidence field (`confidence`, as the review card
        // reads it); an answer without one is left out.
        let confidence = json?
            .and_then(|j| serde_json::from_str::<serde_json::Value>(&j).ok())
            .and_then(|v| v.get("confidence").and_then(serde_json::Value::as_f64));
        if let Some(bin) = confidence.and_then(crate::watch::confidence_bin) {
            bins[bin] += 1;
        }
    }
    if bins.iter().any(|&n| n > 0) {
        out.push(StageHistogram { stage, bins });
    }
    Ok(())
}

/// The session's stages and their places in the job (`run_stages`); empty
/// for a ledger from before stages (opened read-only, never migrated).
fn stage_positions(conn: &Connection, session_id: &str) -> crate::db::Result<Vec<(String, i64)>> {
    if !super::schema::has_table(conn, "run_stages")? {
        return Ok(Vec::new());
    }
    let mut stmt =
        conn.prepare_cached("SELECT stage, position FROM run_stages WHERE session_id = ?1")?;
    let rows = stmt.query_map(params![session_id], |r| {
        Ok((
            text(r, 0)?.unwrap_or_default(),
            super::columns::signed(r, 1)?,
        ))
    })?;
    rows.collect()
}

/// Every attempt of the session, as the time line counts it.
fn attempts(conn: &Connection, session_id: &str) -> crate::db::Result<Vec<AttemptPoint>> {
    let mut stmt = conn.prepare_cached(
        "SELECT sent_at, finished_at, state, http_status, error_kind, cost_usd
         FROM llm_messages WHERE session_id = ?1",
    )?;
    let rows = stmt.query_map(params![session_id], |r| {
        let state = text(r, 2)?.unwrap_or_default();
        let status = real(r, 3)?;
        let kind = text(r, 4)?.unwrap_or_default();
        Ok(AttemptPoint {
            sent_at: real(r, 0)?.unwrap_or(f64::NAN),
            finished_at: real(r, 1)?,
            throttled: status == Some(429.0) || kind == "rate_limited",
            failed: state == "failed",
            cost_usd: real(r, 5)?.unwrap_or(0.0),
        })
    })?;
    rows.collect()
}
