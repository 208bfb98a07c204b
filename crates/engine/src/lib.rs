//! The batch engine: `batch-adjudicate` from config to a finished session.
//!
//! `prepare` loads and checks everything that can be wrong before a request
//! is sent (config, template, gate, thresholds, key); `run` plans or resumes a
//! session, asks to continue, then dispatches under the shared limiter and
//! records every attempt and outcome in the ledger.
//!
//! This crate owns running a job: planning, dispatch and the work queue's
//! use (claims, leases, heartbeats), each attempt through the gate and the
//! critic, retries under the limiter, routing, cost, templates and item
//! import. It reaches the ledger only through the ledger API and the
//! providers only through their traits; it may not touch SQL, a provider's
//! wire format or the terminal, and it does not depend on the mock (a
//! `kind = "mock"` job gets its server from `RunOptions::mock`).

mod as_written;
mod attempt;
mod batch_cancel;
mod batching;
mod budget;
mod connect;
mod control;
pub mod cost;
mod ctx;
mod deadline;
mod delivery;
mod disk_guard;
/// The ledger disk's floor and free space, as the run's guard reads them.
pub mod disk {
    pub use super::disk_guard::{MIN_FREE_ENV, ledger_dir, min_free_bytes, resume_room, space};
}
mod dispatch;
mod feed;
pub mod gate;
mod gate_watch;
pub mod items;
mod per_stage;
mod plan;
mod prepare;
mod profile;
mod reach_probe;
mod reach_watch;
pub mod renders;
mod resume;
mod session_keys;
pub use plan::EXACT_COUNT_MAX;
pub mod mock;
mod progress;
pub mod stages;
mod start;
mod stats;
pub mod template;
mod worker;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use batch_cancel::{BatchCancelError, BatchCancelReport, cancel_open_batches};
pub use budget::Budget;
pub use plan::RunDuration;
pub use plan::{Estimate, Plan};
pub use prepare::{config_path, prepare};
pub use progress::{DryRunPlan, Reporter, StdoutReporter, format_summary};
pub use stats::{Stats, StatsSnapshot};

use crate::gate::GateBuildError;
use crate::template::TemplateError;
use connect::{connect, preflight};
use docket_ledger::store::SessionRow;
use docket_ledger::work::RunSessions;
use docket_ledger::{Ledger, LedgerError, LedgerLocation};
use docket_model::config::{ConfigError, LoadedConfig};
use docket_model::routing::{ThresholdError, Thresholds};
use resume::{keep_session_flags, resume_session};
use start::{Started, start_session};

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Gate(#[from] GateBuildError),
    #[error(transparent)]
    Thresholds(#[from] ThresholdError),
    #[error("{0}")]
    Ledger(String),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Provider(#[from] docket_providers::ProviderSetupError),
    /// The preflight found a provider unreachable or refusing its key:
    /// nothing was created or sent.
    #[error("{0}")]
    Preflight(String),
}

/// A read or write on an open ledger that failed: `"ledger: <what failed>"`.
/// (Opening it fails with an error that names the ledger file itself: see
/// `EngineError::opening`.)
impl From<LedgerError> for EngineError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::Sql(e) => EngineError::Ledger(format!("ledger: {e}")),
            e => EngineError::opening(e),
        }
    }
}

impl EngineError {
    /// The exit code: 3 for a provider that cannot be used (as for a
    /// credentials error in a run), 2 for everything else (usage, config,
    /// input, the ledger).
    pub fn exit_code(&self) -> i32 {
        match self {
            EngineError::Preflight(_) => 3,
            _ => 2,
        }
    }

    /// The ledger could not be opened (or its writer started): the error
    /// names the ledger file, and reads as it is.
    pub(crate) fn opening(e: LedgerError) -> Self {
        EngineError::Ledger(e.to_string())
    }
}

/// Open (creating and migrating if needed) the ledger the engine works on.
pub(crate) fn open_ledger(at: &LedgerLocation) -> Result<Ledger, EngineError> {
    Ledger::open(at).map_err(EngineError::opening)
}

/// The flags of `batch-adjudicate`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub workspace: PathBuf,
    pub limit: Option<u64>,
    pub min_confidence: Option<f64>,
    pub rate_limit: Option<u64>,
    pub dry_run: bool,
    pub resume: Option<String>,
    pub force: bool,
    /// `--rereview-pending`: take items that already have a pending review
    /// item too (their new suggestion supersedes the old one). By default a
    /// new session leaves them out.
    pub rereview_pending: bool,
    pub auto_accept_threshold: Option<f64>,
    pub review_threshold: Option<f64>,
    pub max_cost: Option<f64>,
    /// `--completion-mode`: overrides `[job] completion_mode`.
    pub completion_mode: Option<docket_model::config::CompletionMode>,
    /// Point the provider at this base URL instead of the config's.
    pub base_url_override: Option<String>,
    /// How long in-flight requests may finish after a stop.
    pub grace: Option<Duration>,
    /// `--rerun-stage NAME`: new requests (a new request_version) for this
    /// stage and every stage after it.
    pub rerun_stage: Option<String>,
    /// `docket worker`: join the session in `resume` as one more worker,
    /// leaving its run controls (a pause, a stop after a stage) as they are.
    pub join: bool,
    /// Ask every provider of the job for its models list before a session
    /// is created or resumed (the CLI's default; `--no-preflight` skips it).
    pub preflight: bool,
    /// Starts the built-in mock provider for a provider of `kind = "mock"`.
    /// The engine does not depend on the mock: the binary hands it one
    /// (and so does the test kit); a mock job run without one stops with a
    /// usage error before anything is sent.
    pub mock: Option<Arc<dyn mock::StartMock>>,
    /// `--profile NAME`: a named rate-limit profile from the ledger whose
    /// limits override its provider's section for this run.
    pub profile: Option<String>,
}

/// Everything checked and loaded before planning.
pub struct Prepared {
    pub config: LoadedConfig,
    pub ledger: docket_ledger::LedgerLocation,
    pub thresholds: Thresholds,
    /// In job order.
    pub stages: Vec<stages::Stage>,
    /// The stage whose answer is routed.
    pub answer: usize,
    /// The critic whose verdict bears on the routing.
    pub critic: Option<stages::CriticRouting>,
    /// `[routing] flag_injection`: evidence that reads like a prompt
    /// injection sends its item to review.
    pub flag_injection: bool,
    /// When the session is finished (the flag, else `[job]`).
    pub completion_mode: docket_model::config::CompletionMode,
    /// `--rerun-stage`: this stage and the later ones get new requests.
    pub rerun_from: Option<usize>,
    /// Per stage, what its template sees besides the item while an item's
    /// prompts are checked before anything is sent (see `renders`).
    pub stand_ins: Vec<serde_json::Map<String, serde_json::Value>>,
    /// `--profile`: the rate-limit profile version the run's limits came from.
    pub profile: Option<docket_model::profile::Profile>,
}

impl Prepared {
    pub fn first(&self) -> &stages::Stage {
        &self.stages[0]
    }

    pub fn answer_stage(&self) -> &stages::Stage {
        &self.stages[self.answer]
    }

    /// Each stage's template with its stand-ins, for `renders::render_all`.
    pub fn stage_checks(&self) -> impl Iterator<Item = renders::StageCheck<'_>> {
        self.stages
            .iter()
            .zip(&self.stand_ins)
            .map(|(s, stand_ins)| renders::StageCheck {
                name: &s.name,
                template: &s.template,
                stand_ins,
            })
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEnd {
    /// Every item has an outcome.
    Completed,
    /// Ctrl-C, SIGTERM or a cancel from the ledger; resumable.
    Cancelled,
    /// A non-retryable provider error (credentials, quota); resumable.
    Stopped(String),
    /// The ledger could not be written (disk full, an I/O error): nothing
    /// of the failed write was kept; resumable once it can be written.
    LedgerFailed(String),
    /// Paused with the process exiting (the budget); resumable.
    Paused(String),
    /// `--dry-run`: nothing sent.
    DryRun,
    /// No indeterminate items to process.
    NothingToDo,
    /// The operator said no at the prompt.
    Declined,
}

impl RunEnd {
    /// The process exit code for this end (see the README).
    pub fn exit_code(&self) -> i32 {
        match self {
            RunEnd::Completed | RunEnd::DryRun | RunEnd::NothingToDo | RunEnd::Declined => 0,
            RunEnd::Stopped(_) => 3,
            RunEnd::LedgerFailed(_) => 6,
            RunEnd::Paused(_) => 4,
            RunEnd::Cancelled => 130,
        }
    }
}

#[derive(Debug, Clone)]
pub struct RunReport {
    pub session_id: Option<String>,
    pub end: RunEnd,
    pub session: Option<SessionRow>,
}

/// A session that completed with items in `error`: a script must not take
/// it for a clean run.
pub const EXIT_COMPLETED_WITH_ERRORS: i32 = 5;

impl RunReport {
    /// The process's exit code: the end's, except that a completed
    /// session with items in error exits with its own code.
    pub fn exit_code(&self) -> i32 {
        let errors = self.session.as_ref().map_or(0, |s| s.error_count);
        match self.end {
            RunEnd::Completed if errors > 0 => EXIT_COMPLETED_WITH_ERRORS,
            _ => self.end.exit_code(),
        }
    }
}

/// Signals from outside the engine.
#[derive(Clone, Default)]
pub struct Interrupts {
    /// Stop dispatching, let in-flight requests finish within the grace, save.
    pub stop: CancellationToken,
    /// Abandon in-flight requests now (a second Ctrl-C).
    pub abort: CancellationToken,
    /// Stop like `stop` (in-flight requests finish within the grace), but
    /// end the session paused by the operator rather than cancelled: the
    /// console's "quit, pause it".
    pub pause: CancellationToken,
    /// With `stop`: cancel the session's provider batches too (a confirmed
    /// Ctrl-C, the console's "quit, cancel it"). Without it a stop leaves
    /// them running at the provider for a resume to collect.
    pub cancel_batches: CancellationToken,
}

/// `docket batch-adjudicate`.
///
/// `confirm` is asked once with the estimate before a new session starts; it
/// returns false to decline.
pub async fn run(
    opts: RunOptions,
    reporter: Arc<dyn Reporter>,
    confirm: impl FnOnce(&Estimate) -> bool,
    interrupts: Interrupts,
) -> Result<RunReport, EngineError> {
    let mut opts = opts;
    // A run's writes wait out another process's long write lock (row D1).
    docket_ledger::db::busy::wait_long();
    if let Some(id) = opts.resume.clone() {
        tokio::task::block_in_place(|| keep_session_flags(&mut opts, &id));
    }
    let prepared = Arc::new(tokio::task::block_in_place(|| prepare(&opts))?);
    // A damaged ledger stops the run before anything is written to it or
    // paid for (row D3): docket never writes over damage.
    if !opts.dry_run {
        tokio::task::block_in_place(|| {
            open_ledger(&prepared.ledger)?
                .quick_check()
                .map_err(EngineError::opening)
        })?;
    }
    // The providers first: one that cannot be reached, or refuses its key,
    // stops the run before a session exists or an item is touched.
    let early = if opts.preflight && !opts.dry_run {
        let connections = connect(&prepared, &opts).await?;
        preflight(&prepared, &connections, &*reporter).await?;
        Some(connections)
    } else {
        None
    };
    let resumed = opts.resume.is_some();
    let session_id = match open_session(&prepared, &opts, &*reporter, confirm)? {
        Started::Session(id) => id,
        Started::Ended(end) => {
            return Ok(RunReport {
                session_id: None,
                end,
                session: None,
            });
        }
    };
    reporter.session_started(&session_id);
    let connections = match early {
        Some(c) => c,
        None => connect(&prepared, &opts).await?,
    };
    let grace = opts.grace.unwrap_or(Duration::from_secs(10));
    let result = dispatch::dispatch(
        prepared.clone(),
        session_id.clone(),
        connections.chat,
        connections.batch,
        reporter.clone(),
        interrupts,
        grace,
        resumed,
    )
    .await;
    for m in connections.mocks {
        m.shutdown().await;
    }
    let end = result?;
    report_end(&prepared, session_id, end, &*reporter)
}

/// The session to dispatch: the one resumed, or a new one (when the plan,
/// a dry run or the operator does not end the run first).
fn open_session(
    prepared: &Prepared,
    opts: &RunOptions,
    reporter: &dyn Reporter,
    confirm: impl FnOnce(&Estimate) -> bool,
) -> Result<Started, EngineError> {
    match &opts.resume {
        Some(id) => Ok(Started::Session(resume_session(
            prepared, id, opts, reporter,
        )?)),
        None => start_session(prepared, opts, reporter, confirm),
    }
}

/// The session's summary and its orphaned spend, said; the run's report.
fn report_end(
    prepared: &Prepared,
    session_id: String,
    end: RunEnd,
    reporter: &dyn Reporter,
) -> Result<RunReport, EngineError> {
    let (session, orphaned) = tokio::task::block_in_place(|| -> Result<_, EngineError> {
        let ledger = open_ledger(&prepared.ledger)?;
        Ok((
            ledger.load_session(&session_id)?,
            ledger.orphaned_spend(&session_id)?,
        ))
    })?;
    if let Some(s) = &session {
        for l in format_summary(s, &end) {
            reporter.line(&l);
        }
    }
    if orphaned.0 > 0 {
        reporter.line(&format!(
            "  orphaned spend: {} answer(s), ${:.4}: paid for, but they came back to a worker that had lost its items \
             (it stalled past its lease and another worker took them over), so they were refused",
            orphaned.0, orphaned.1
        ));
    }
    Ok(RunReport {
        session_id: Some(session_id),
        end,
        session,
    })
}

/// `batch_YYYYMMDD_xxxxxx`: the date and six random lowercase letters/digits.
pub fn new_session_id() -> String {
    format!(
        "batch_{}_{}",
        chrono::Utc::now().format("%Y%m%d"),
        docket_model::ids::random_suffix(6)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_have_the_seed_shape() {
        let id = new_session_id();
        let re = regex::Regex::new(r"^batch_\d{8}_[a-z0-9]{6}$").unwrap();
        assert!(re.is_match(&id), "{id}");
        assert_ne!(new_session_id(), new_session_id());
    }

    #[test]
    fn exit_codes() {
        assert_eq!(RunEnd::Completed.exit_code(), 0);
        assert_eq!(RunEnd::Stopped("x".into()).exit_code(), 3);
        assert_eq!(RunEnd::LedgerFailed("x".into()).exit_code(), 6);
        assert_eq!(RunEnd::Paused("x".into()).exit_code(), 4);
        assert_eq!(RunEnd::Cancelled.exit_code(), 130);
    }
}
