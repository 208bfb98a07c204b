//! Steering a session through the ledger: `pause`, `resume`, `cancel` and
//! `stop-at-stage`.

use std::path::Path;

use docket::control::Desired;
use docket::engine;
use docket::ledger::control::RunControls;
use docket::ledger::work::RunSessions;
use docket::ledger::{Ledger, LedgerLocation};

use super::ledger::with_ledger;
use super::{fail, print_json};
use crate::cli::SummaryFormat;

/// `pause`, `resume`, `cancel` (a desired state) or `stop-at-stage` (None),
/// written to the ledger with who asked; the engine running the session, in
/// whatever process, obeys within a second.
pub(super) fn control(
    ws: &Path,
    session: &str,
    desired: Option<Desired>,
    format: SummaryFormat,
) -> i32 {
    let actor = format!("cli:{}", docket::review::Operator::current().user);
    with_ledger(ws, |l| {
        let before = states_of(l, session)?;
        let running = l.run_by_live_process(session).map_err(|e| e.to_string())?;
        let live = if running {
            "the engine running it obeys within a second"
        } else {
            "it is not running now; `docket batch-adjudicate --resume` continues it"
        };
        let (asked, stage, said) = match desired {
            Some(d) => {
                l.set_desired(session, d, &actor)
                    .map_err(|e| e.to_string())?;
                let verb = match d {
                    Desired::Paused => "pause",
                    Desired::Running => "resume",
                    Desired::Cancelled => "cancel",
                };
                (
                    verb,
                    None,
                    format!("Session {session}: asked to {verb} ({live})."),
                )
            }
            None => {
                let stage = l
                    .stop_after_stage(session, &actor)
                    .map_err(|e| e.to_string())?;
                let said =
                    format!("Session {session}: asked to stop after stage {stage} ({live}).");
                ("stop_at_stage", Some(stage), said)
            }
        };
        match format {
            SummaryFormat::Table => println!("{said}"),
            SummaryFormat::Json => print_json(&serde_json::json!({
                "session_id": session,
                "asked": asked,
                "stage": stage,
                "running": running,
                "before": before,
                "after": states_of(l, session)?,
                "message": said,
            })),
        }
        Ok(())
    })
}

/// The session's state and the state it was asked for, as JSON.
fn states_of(l: &Ledger, session: &str) -> Result<serde_json::Value, String> {
    let row = l
        .load_session(session)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| docket::ids::unknown_session(session))?;
    Ok(serde_json::json!({"state": row.state, "desired_state": row.desired_state}))
}

/// `docket cancel`: asked through the ledger like the other controls; when
/// no process runs the session, its provider batches are cancelled here
/// (nobody else would, and the provider bills them until they stop).
pub(super) async fn cancel(ws: &Path, session: &str, format: SummaryFormat) -> i32 {
    let code = control(ws, session, Some(Desired::Cancelled), format);
    if code != 0 {
        return code;
    }
    let idle = LedgerLocation::for_workspace(ws)
        .and_then(Ledger::open)
        .ok()
        .and_then(|l| l.run_by_live_process(session).ok())
        .is_some_and(|live| !live);
    if !idle {
        return 0;
    }
    // With --format json the JSON document is all of stdout: these lines
    // go to standard error.
    let say = |text: String| match format {
        SummaryFormat::Table => println!("{text}"),
        SummaryFormat::Json => eprintln!("{text}"),
    };
    let actor = format!("cli:{}", docket::review::Operator::current().user);
    match engine::cancel_open_batches(ws, session, &actor).await {
        Ok(r) => {
            for (tag, id, state) in &r.cancelled {
                say(format!(
                    "Provider batch {tag} ({}): cancelled at the provider (now {state}).",
                    docket::sanitize::for_terminal(id)
                ));
            }
            for tag in &r.without_id {
                say(format!(
                    "Provider batch {tag}: its create answer was never recorded; `docket batch-adjudicate --resume {session}` looks for it at the provider."
                ));
            }
            for (tag, why) in &r.failed {
                eprintln!(
                    "docket: provider batch {tag} could not be cancelled: {}",
                    docket::sanitize::for_terminal(why)
                );
            }
            if !r.cancelled.is_empty() {
                say(format!(
                    "What they finished before stopping is paid for: `docket batch-adjudicate --resume {session}` collects it."
                ));
            }
            if r.failed.is_empty() { 0 } else { 1 }
        }
        Err(e) => fail(e),
    }
}
