//! `docket cancel SESSION` when no process runs the session: its provider
//! batches are still running (and billing) at the provider, and no engine
//! is there to cancel them, so the command does it itself. What they
//! finished stays at the provider until a resume collects it.

use std::path::Path;

use docket_ledger::batches::BatchOp;
use docket_ledger::control::RunControls;
use docket_ledger::work::BatchLedger;
use docket_ledger::{Ledger, LedgerLocation};
use docket_providers::batch::{BatchProvider, build_batch};

/// What `cancel_open_batches` did.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BatchCancelReport {
    /// Provider batches asked to stop (tag, provider id, state after).
    pub cancelled: Vec<(String, String, String)>,
    /// Batches with no provider id yet (a lost create answer): a resume
    /// looks for them first.
    pub without_id: Vec<String>,
    /// Batches the provider would not cancel, with why.
    pub failed: Vec<(String, String)>,
}

/// Cancel every provider batch of `session_id` still open, recording the
/// request (and who asked) in the ledger. The caller checks that no live
/// process runs the session (that process cancels its own batches).
pub async fn cancel_open_batches(
    workspace: &Path,
    session_id: &str,
    actor: &str,
) -> Result<BatchCancelReport, String> {
    let path = LedgerLocation::for_workspace(workspace).map_err(|e| e.to_string())?;
    let open = {
        let ledger = Ledger::open(&path).map_err(|e| e.to_string())?;
        ledger
            .open_batches(session_id)
            .map_err(|e| format!("ledger: {e}"))?
    };
    let mut report = BatchCancelReport::default();
    if open.is_empty() {
        return Ok(report);
    }
    let cfg_path = workspace.join(docket_model::config::CONFIG_FILE);
    let config = docket_model::config::LoadedConfig::load(&cfg_path).map_err(|e| e.to_string())?;
    let mut adapters: std::collections::HashMap<String, Box<dyn BatchProvider>> =
        Default::default();
    let ledger = Ledger::open(&path).map_err(|e| e.to_string())?;
    for b in open {
        let Some(id) = b.provider_batch_id.clone() else {
            report.without_id.push(b.tag);
            continue;
        };
        if matches!(
            b.state.as_str(),
            "completed" | "failed" | "expired" | "cancelled"
        ) {
            // Over at the provider: nothing runs or bills any more.
            continue;
        }
        if !adapters.contains_key(&b.provider) {
            let Some(pcfg) = config.config.providers.get(&b.provider) else {
                report.failed.push((
                    b.tag,
                    format!(
                        "provider \"{}\" is no longer in {}: cannot reach its Batch API",
                        b.provider,
                        cfg_path.display()
                    ),
                ));
                continue;
            };
            match build_batch(&b.provider, pcfg, None) {
                Ok(Some(a)) => {
                    adapters.insert(b.provider.clone(), a);
                }
                Ok(None) => {
                    report.failed.push((
                        b.tag,
                        format!("provider \"{}\" has no Batch API here", b.provider),
                    ));
                    continue;
                }
                Err(e) => {
                    report.failed.push((b.tag, e.to_string()));
                    continue;
                }
            }
        }
        let adapter = &adapters[&b.provider];
        ledger
            .record_batch(&BatchOp::CancelRequested { tag: b.tag.clone() })
            .map_err(|e| format!("ledger: {e}"))?;
        match adapter.cancel(&id).await {
            Ok(s) => {
                ledger
                    .record_batch(&BatchOp::Status {
                        tag: b.tag.clone(),
                        state: s.state.as_str().to_string(),
                        completed: s.counts.completed,
                        failed: s.counts.failed,
                        output_ref: s.output_ref.clone(),
                        error_ref: s.error_ref.clone(),
                        error_message: None,
                        next_poll_at: None,
                        polled: true,
                        ended: s.state.is_terminal(),
                    })
                    .map_err(|e| format!("ledger: {e}"))?;
                let _ = ledger.note(
                    session_id,
                    &format!(
                        "provider batch {} ({}) cancelled at the provider (now {})",
                        b.tag,
                        docket_model::sanitize::for_terminal(&id),
                        s.state.as_str()
                    ),
                    actor,
                );
                report
                    .cancelled
                    .push((b.tag, id, s.state.as_str().to_string()));
            }
            Err(e) => report.failed.push((b.tag, e.to_string())),
        }
    }
    Ok(report)
}
