//! Steering a session through the ledger: `pause`, `resume`, `cancel` and
//! `stop-at-stage`.

use std::path::Path;

use docket::control::Desired;
use docket::engine;
use docket::ledger::control::RunControls;
use docket::ledger::{Ledger, LedgerLocation};

use super::fail;
use super::ledger::with_ledger;

/// `pause`, `resume`, `cancel` (a desired state) or `stop-at-stage` (None),
/// written to the ledger with who asked; the engine running the session, in
/// whatever process, obeys within a second.
pub(super) fn control(ws: &Path, session: &str, desired: Option<Desired>) -> i32 {
    let actor = format!("cli:{}", docket::review::Operator::current().user);
    with_ledger(ws, |l| {
        let live = if l.run_by_live_process(session).map_err(|e| e.to_string())? {
            "the engine running it obeys within a second"
        } else {
            "it is not running now; `docket batch-adjudicate --resume` continues it"
        };
        match desired {
            Some(d) => {
                l.set_desired(session, d, &actor)
                    .map_err(|e| e.to_string())?;
                let verb = match d {
                    Desired::Paused => "pause",
                    Desired::Running => "resume",
                    Desired::Cancelled => "cancel",
                };
                println!("Session {session}: asked to {verb} ({live}).");
            }
            None => {
                let stage = l
                    .stop_after_stage(session, &actor)
                    .map_err(|e| e.to_string())?;
                println!("Session {session}: asked to stop after stage {stage} ({live}).");
            }
        }
        Ok(())
    })
}

/// `docket cancel`: asked through the ledger like the other controls; when
/// no process runs the session, its provider batches are cancelled here
/// (nobody else would, and the provider bills them until they stop).
pub(super) async fn cancel(ws: &Path, session: &str) -> i32 {
    let code = control(ws, session, Some(Desired::Cancelled));
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
    let actor = format!("cli:{}", docket::review::Operator::current().user);
    match engine::cancel_open_batches(ws, session, &actor).await {
        Ok(r) => {
            for (tag, id, state) in &r.cancelled {
                println!(
                    "Provider batch {tag} ({}): cancelled at the provider (now {state}).",
                    docket::sanitize::for_terminal(id)
                );
            }
            for tag in &r.without_id {
                println!(
                    "Provider batch {tag}: its create answer was never recorded; `docket batch-adjudicate --resume {session}` looks for it at the provider."
                );
            }
            for (tag, why) in &r.failed {
                eprintln!(
                    "docket: provider batch {tag} could not be cancelled: {}",
                    docket::sanitize::for_terminal(why)
                );
            }
            if !r.cancelled.is_empty() {
                println!(
                    "What they finished before stopping is paid for: `docket batch-adjudicate --resume {session}` collects it."
                );
            }
            if r.failed.is_empty() { 0 } else { 1 }
        }
        Err(e) => fail(e),
    }
}
