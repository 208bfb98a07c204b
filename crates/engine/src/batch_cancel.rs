//! `docket cancel SESSION` when no process runs the session: its provider
//! batches are still running (and billing) at the provider, and no engine
//! is there to cancel them, so the command does it itself. What they
//! finished stays at the provider until a resume collects it.

use std::collections::HashMap;
use std::path::Path;

use docket_ledger::batches::BatchOp;
use docket_ledger::control::RunControls;
use docket_ledger::work::BatchLedger;
use docket_ledger::{Ledger, LedgerError, LedgerLocation};
use docket_model::config::{ConfigError, LoadedConfig};
use docket_providers::batch::{BatchProvider, BatchStatus, build_batch};

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

/// Why `cancel_open_batches` could not do its work (a batch the provider
/// would not cancel is in the report instead).
#[derive(Debug, thiserror::Error)]
pub enum BatchCancelError {
    /// The workspace's ledger could not be found or opened.
    #[error("{0}")]
    Open(LedgerError),
    /// Reading the session's batches, or recording a cancel, failed.
    #[error("ledger: {0}")]
    Ledger(LedgerError),
    /// docket.toml could not be loaded (it names the providers' Batch APIs).
    #[error("{0}")]
    Config(ConfigError),
}

/// Cancel every provider batch of `session_id` still open, recording the
/// request (and who asked) in the ledger. The caller checks that no live
/// process runs the session (that process cancels its own batches).
pub async fn cancel_open_batches(
    workspace: &Path,
    session_id: &str,
    actor: &str,
) -> Result<BatchCancelReport, BatchCancelError> {
    let path = LedgerLocation::for_workspace(workspace).map_err(BatchCancelError::Open)?;
    let open = {
        let ledger = Ledger::open(&path).map_err(BatchCancelError::Open)?;
        ledger
            .open_batches(session_id)
            .map_err(BatchCancelError::Ledger)?
    };
    let mut report = BatchCancelReport::default();
    if open.is_empty() {
        return Ok(report);
    }
    let cfg_path = workspace.join(docket_model::config::CONFIG_FILE);
    let config = LoadedConfig::load(&cfg_path).map_err(BatchCancelError::Config)?;
    let mut adapters: HashMap<String, Box<dyn BatchProvider>> = HashMap::new();
    let ledger = Ledger::open(&path).map_err(BatchCancelError::Open)?;
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
        let adapter = match adapter_for(&mut adapters, &config, &cfg_path, &b.provider) {
            Ok(adapter) => adapter,
            Err(why) => {
                report.failed.push((b.tag, why));
                continue;
            }
        };
        ledger
            .record_batch(&BatchOp::CancelRequested { tag: b.tag.clone() })
            .map_err(BatchCancelError::Ledger)?;
        match adapter.cancel(&id).await {
            Ok(s) => {
                record_cancelled(&ledger, session_id, actor, &b.tag, &id, &s)?;
                report
                    .cancelled
                    .push((b.tag, id, s.state.as_str().to_string()));
            }
            Err(e) => report.failed.push((b.tag, e.to_string())),
        }
    }
    Ok(report)
}

/// The Batch API client of `provider`, built once per provider; why not,
/// when the config no longer names it or it has no Batch API here.
fn adapter_for<'a>(
    adapters: &'a mut HashMap<String, Box<dyn BatchProvider>>,
    config: &LoadedConfig,
    cfg_path: &Path,
    provider: &str,
) -> Result<&'a dyn BatchProvider, String> {
    if !adapters.contains_key(provider) {
        let Some(pcfg) = config.config.providers.get(provider) else {
            return Err(format!(
                "provider \"{provider}\" is no longer in {}: cannot reach its Batch API",
                cfg_path.display()
            ));
        };
        match build_batch(provider, pcfg, None) {
            Ok(Some(a)) => {
                adapters.insert(provider.to_string(), a);
            }
            Ok(None) => return Err(format!("provider \"{provider}\" has no Batch API here")),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(&*adapters[provider])
}

/// The batch's state after the cancel, on record, with a note of who
/// cancelled it.
fn record_cancelled(
    ledger: &Ledger,
    session_id: &str,
    actor: &str,
    tag: &str,
    id: &str,
    s: &BatchStatus,
) -> Result<(), BatchCancelError> {
    ledger
        .record_batch(&BatchOp::Status {
            tag: tag.to_string(),
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
        .map_err(BatchCancelError::Ledger)?;
    let _ = ledger.note(
        session_id,
        &format!(
            "provider batch {} ({}) cancelled at the provider (now {})",
            tag,
            docket_model::sanitize::for_terminal(id),
            s.state.as_str()
        ),
        actor,
    );
    Ok(())
}
