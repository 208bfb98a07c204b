//! What `docket calibrate` and the console's calibration page read: a
//! session's human review decisions (with the model's confidence, and
//! whether the human took the suggestion as it was), every routed item's
//! confidence, and the session's config snapshot; and the event a threshold
//! change is recorded with. The arithmetic is in
//! `docket_model::calibration`.

use docket_model::calibration::Reviewed;

use crate::db::params;
use crate::{Ledger, LedgerError, now_ts};

/// A session's calibration inputs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CalibrationInput {
    /// Every decided review item of the session that had a suggestion and
    /// a confidence (superseded and pending ones are left out).
    pub reviewed: Vec<Reviewed>,
    /// The confidence of every result of the session that has one.
    pub confidences: Vec<f64>,
    /// The session's config snapshot (JSON).
    pub snapshot_json: String,
}

impl CalibrationInput {
    /// The precision the session's accept band should reach: its job's
    /// `[routing] target_precision` as the session recorded it; the
    /// default for a session from before that setting.
    pub fn target_precision(&self) -> f64 {
        let snap: serde_json::Value = serde_json::from_str(&self.snapshot_json).unwrap_or_default();
        snap.pointer("/config/routing/target_precision")
            .and_then(serde_json::Value::as_f64)
            .filter(|t| *t > 0.0 && *t <= 1.0)
            .unwrap_or(docket_model::calibration::DEFAULT_TARGET)
    }

    /// The report at the session's own target (the console's page, the
    /// run report, `docket calibrate` without `--target-precision`).
    pub fn session_summary(&self) -> docket_model::calibration::Summary {
        self.summary(self.target_precision())
    }

    /// The report at `target`, with the thresholds the session routed with.
    pub fn summary(&self, target: f64) -> docket_model::calibration::Summary {
        let (accept, review) = self.thresholds();
        docket_model::calibration::Summary::of(
            &self.reviewed,
            &self.confidences,
            accept,
            review,
            target,
        )
    }

    /// The thresholds the session routed with, `(auto_accept, review)`:
    /// its flags (the config's, or the command line's), the auto-accept
    /// raised by `--min-confidence`; the defaults when the snapshot has
    /// none.
    pub fn thresholds(&self) -> (f64, f64) {
        let snap: serde_json::Value = serde_json::from_str(&self.snapshot_json).unwrap_or_default();
        let (review, accept) = docket_model::routing::session_thresholds(&snap);
        (accept.unwrap_or(0.85), review.unwrap_or(0.60))
    }
}

// Agreement: accepted as suggested. A reject disagrees, and so does an
// accept with the operator's own answer (a correction: its log row keeps
// `corrected_answer_json`), unless that was undone.
const REVIEWED_SQL: &str = "SELECT r.confidence, \
       CASE WHEN r.status = 'accepted' AND NOT EXISTS (SELECT 1 FROM review_log g \
            WHERE g.review_id = r.review_id AND g.corrected_answer_json IS NOT NULL \
            AND g.undone_by_log_id IS NULL) THEN 1 ELSE 0 END, \
       r.audit \
     FROM review_item r \
     WHERE r.session_id = ?1 AND r.status IN ('accepted', 'rejected') \
       AND r.confidence IS NOT NULL AND r.llm_suggestion_json != 'null' \
     ORDER BY r.review_id";

impl Ledger {
    /// The session's calibration inputs; `None` when there is no such session.
    pub fn calibration_input(
        &self,
        session_id: &str,
    ) -> Result<Option<CalibrationInput>, LedgerError> {
        Ok(calibration_input(self.conn(), session_id)?)
    }

    /// Record on the session that `docket calibrate --apply` changed the
    /// job's config (an `info` event of kind `config`, with who did it).
    pub fn record_config_change(
        &self,
        session_id: &str,
        message: &str,
        actor: &str,
    ) -> Result<(), LedgerError> {
        Ok(config_event(
            self.conn(),
            session_id,
            now_ts(),
            message,
            actor,
        )?)
    }
}

/// An `info` event of kind `config` on the session: its job's config or
/// flags changed (`calibrate --apply`, a resume with other flags).
pub(crate) fn config_event(
    conn: &crate::db::Connection,
    session_id: &str,
    at: f64,
    message: &str,
    actor: &str,
) -> crate::db::Result<()> {
    conn.prepare_cached(
        "INSERT INTO session_event (session_id, at, level, kind, message, actor)
         VALUES (?1, ?2, 'info', 'config', ?3, ?4)",
    )?
    .execute(params![session_id, at, message, actor])?;
    Ok(())
}

/// The session's calibration inputs (for `docket calibrate` and the
/// console's calibration view); `None` when there is no such session.
pub(crate) fn calibration_input(
    conn: &crate::db::Connection,
    session_id: &str,
) -> crate::db::Result<Option<CalibrationInput>> {
    let snapshot: Option<String> = crate::db::OptionalExtension::optional(conn.query_row(
        "SELECT config_snapshot_json FROM llm_batch_session WHERE session_id = ?1",
        params![session_id],
        |r| r.get(0),
    ))?;
    let Some(snapshot_json) = snapshot else {
        return Ok(None);
    };
    let mut stmt = conn.prepare_cached(REVIEWED_SQL)?;
    let reviewed = stmt
        .query_map(params![session_id], |r| {
            Ok(Reviewed {
                confidence: r.get(0)?,
                agreed: r.get::<_, i64>(1)? != 0,
                audit: r.get::<_, i64>(2)? != 0,
            })
        })?
        .collect::<crate::db::Result<Vec<_>>>()?;
    let mut stmt = conn.prepare_cached(
        "SELECT confidence FROM llm_batch_result \
         WHERE session_id = ?1 AND confidence IS NOT NULL ORDER BY item_id",
    )?;
    let confidences = stmt
        .query_map(params![session_id], |r| r.get::<_, f64>(0))?
        .collect::<crate::db::Result<Vec<_>>>()?;
    Ok(Some(CalibrationInput {
        reviewed,
        confidences,
        snapshot_json,
    }))
}
