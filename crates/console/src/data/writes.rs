//! What the operator's effects write: claims, decisions, undo and run
//! controls, and `:export`; each returns the toast that says how it went.

use std::time::Instant;

use super::{DataMsg, DataWorker};
use crate::app::{Control, Effect};
use docket_ledger::Ledger;
use docket_ledger::control::{self, Desired, RunControls};
use docket_ledger::review::{Applied, Claim, ReviewDecisions};

impl DataWorker {
    pub(super) fn apply(
        &mut self,
        ledger: Option<&Ledger>,
        fx: Effect,
        out: &impl Fn(DataMsg) -> bool,
    ) {
        let toast = |t: String| {
            out(DataMsg::Toast(t));
        };
        match fx {
            Effect::Activity => {
                self.last_key = Instant::now();
                if self.claim_idle
                    && let (Some(l), Some(id)) = (ledger, self.claim)
                    && !self.read_only
                {
                    self.claim_idle = false;
                    self.claim_at = Instant::now();
                    if let Ok(Claim::HeldByOther(who)) = l.claim(id, &self.operator) {
                        toast(format!(
                            "held by {who}: another operator took it while you were away"
                        ));
                    }
                }
            }
            Effect::Watch(s) => self.watch = s,
            Effect::Query(q) => self.query = q,
            Effect::Detail(d) => self.detail = d,
            Effect::Charts(on) => {
                self.charts_wanted = on;
                self.charts_cache = None;
            }
            Effect::Quit(_) => {}
            other => {
                let Some(l) = ledger else {
                    toast("no ledger yet".into());
                    return;
                };
                // A read-only console writes nothing to the ledger; it may
                // still export (a file of its own).
                if self.read_only && !matches!(other, Effect::Export { .. }) {
                    return;
                }
                if other == Effect::Undo {
                    let (said, restored) = undo(l, &self.operator);
                    if !restored.is_empty() {
                        out(DataMsg::Undone(restored));
                    }
                    toast(said);
                    return;
                }
                if let Some(t) = self.write(l, other) {
                    toast(t);
                }
            }
        }
    }

    /// Decisions and controls; returns what to tell the operator.
    fn write(&mut self, ledger: &Ledger, fx: Effect) -> Option<String> {
        let op = &self.operator;
        let actor = format!("review:{}", op.user);
        match fx {
            Effect::Claim(id) => {
                if let Some(old) = self.claim
                    && Some(old) != id
                {
                    let _ = ledger.release(old, op);
                }
                self.claim = id;
                self.claim_at = Instant::now();
                let id = id?;
                match ledger.claim(id, op) {
                    Ok(Claim::HeldByOther(who)) => {
                        Some(format!("held by {who}: another operator is on it"))
                    }
                    Ok(_) => None,
                    Err(e) => Some(e.to_string()),
                }
            }
            Effect::Accept(ids) => Some(match ledger.accept(&ids, op) {
                Ok(a) => applied("Accepted", &a),
                Err(e) => e.to_string(),
            }),
            Effect::Reject(ids) => Some(match ledger.reject(&ids, op) {
                Ok(a) => applied("Rejected", &a),
                Err(e) => e.to_string(),
            }),
            Effect::Correct { review_id, answer } => {
                Some(match ledger.correct(review_id, &answer, op) {
                    Ok(a) => applied("Corrected", &a),
                    Err(e) => e.to_string(),
                })
            }
            // Carried out in `apply`, which also tells the UI what came back.
            Effect::Undo => None,
            Effect::Control {
                session_id,
                control: ctl,
            } => Some(match do_control(ledger, &session_id, ctl, &actor) {
                Ok(msg) => msg,
                Err(e) => e,
            }),
            Effect::Export {
                session,
                what,
                format,
                path,
            } => Some(export(
                ledger,
                &self.workspace,
                session,
                &what,
                &format,
                &path,
            )),
            Effect::Watch(_)
            | Effect::Query(_)
            | Effect::Detail(_)
            | Effect::Charts(_)
            | Effect::Quit(_)
            | Effect::Activity => None,
        }
    }
}

/// `:export`: a file in the workspace (reads only, so a read-only console
/// may export too).
fn export(
    ledger: &Ledger,
    workspace: &std::path::Path,
    session: Option<String>,
    what: &str,
    format: &str,
    path: &str,
) -> String {
    use docket_ledger::report::{ExportFormat, ExportOptions, ExportWhat};
    let opts = ExportOptions {
        session: if what == "decisions" { None } else { session },
        what: match what {
            "decisions" => ExportWhat::Decisions,
            "requests" => ExportWhat::Requests,
            "items" => ExportWhat::Items,
            _ => ExportWhat::Results,
        },
        format: match format {
            "jsonl" => ExportFormat::Jsonl,
            "parquet" => ExportFormat::Parquet,
            _ => ExportFormat::Csv,
        },
    };
    let target = workspace.join(path);
    let result = docket_ledger::report::export_file(ledger, &opts, workspace, &target)
        .map_err(|e| e.to_string());
    match result {
        Ok(n) => format!("Exported {n} rows to {}", target.display()),
        Err(e) => format!("export to {} failed: {e}", target.display()),
    }
}

/// Undo the operator's last decision: what to say, and the review items
/// pending again (the cursor goes to them).
fn undo(ledger: &Ledger, op: &docket_ledger::review::Operator) -> (String, Vec<i64>) {
    match ledger.undo_last(op) {
        Ok(Some(u)) => {
            let item = docket_model::sanitize::truncate(&u.item_id, 40);
            // A correction is logged as an accept with its own answer.
            let what = if u.corrected {
                "correction"
            } else {
                u.action.as_str()
            };
            let said = match u.review_ids.len() {
                0 | 1 => format!("Undid {what} of {item}"),
                n => format!("Undid {what} of {n} items"),
            };
            (said, u.review_ids)
        }
        Ok(None) => ("Nothing to undo.".into(), Vec::new()),
        Err(e) => (e.to_string(), Vec::new()),
    }
}

fn applied(verb: &str, a: &Applied) -> String {
    let mut msg = match a.done.len() {
        0 => format!("{verb} nothing"),
        1 => format!("{verb} 1 item (u undoes)"),
        n => format!("{verb} {n} items (one u undoes them all)"),
    };
    if let Some((_, why)) = a.skipped.first() {
        msg.push_str(&format!("; skipped {}: {why}", a.skipped.len()));
    }
    msg
}

fn do_control(ledger: &Ledger, sid: &str, ctl: Control, actor: &str) -> Result<String, String> {
    let e = |e: control::ControlError| e.to_string();
    match ctl {
        Control::Pause => ledger
            .set_desired(sid, Desired::Paused, actor)
            .map(|()| "Pause asked: no new requests; in-flight ones finish.".into())
            .map_err(e),
        Control::Resume => ledger
            .set_desired(sid, Desired::Running, actor)
            .map(|()| "Resume asked.".into())
            .map_err(e),
        Control::Cancel => ledger
            .set_desired(sid, Desired::Cancelled, actor)
            .map(|()| "Cancel asked: the session stops and stays resumable.".into())
            .map_err(e),
        Control::StopAtStage => ledger
            .stop_after_stage(sid, actor)
            .map(|stage| format!("Stops after stage {stage}."))
            .map_err(e),
        Control::Retune(t) => ledger
            .retune(sid, t, actor)
            .map(|()| "Retune asked: the engine follows within a second.".into())
            .map_err(e),
    }
}
