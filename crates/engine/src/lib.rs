//! The batch engine: `batch-adjudicate` from config to a finished session.
//!
//! `prepare` loads and checks everything that can be wrong before a request
//! is sent (config, template, gate, thresholds, key); `run` plans or resumes a
//! session, asks to continue, then dispatches under the shared limiter and
//! records every attempt and outcome in the ledger.

mod attempt;
mod batch_cancel;
mod batching;
mod budget;
mod control;
pub mod cost;
mod ctx;
mod deadline;
mod delivery;
mod disk_guard;
mod dispatch;
mod feed;
pub mod gate;
mod gate_watch;
pub mod items;
mod per_stage;
mod plan;
mod reach_probe;
mod reach_watch;
pub use plan::EXACT_COUNT_MAX;
pub mod mock;
mod progress;
pub mod stages;
mod stats;
pub mod template;
mod worker;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use batch_cancel::{BatchCancelReport, cancel_open_batches};
pub use budget::Budget;
pub use plan::{Estimate, Plan};
pub use progress::{Reporter, StdoutReporter, format_summary};
pub use stats::{Stats, StatsSnapshot};

use crate::gate::GateBuildError;
use crate::template::TemplateError;
use docket_ledger::control::RunControls;
use docket_ledger::rerun::RerunError;
use docket_ledger::store::{self, RESUME_WINDOW_SECS, SessionRow};
use docket_ledger::work::{RunSessions, WorkQueue};
use docket_ledger::{Ledger, LedgerError, LedgerLocation, now_ts};
use docket_model::config::{ConfigError, LoadedConfig, ProviderKind};
use docket_model::routing::{ThresholdError, Thresholds};

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

/// A read or write on an open ledger that failed: "ledger: <what failed>".
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
    pub skip_reviewed: bool,
    pub auto_accept_threshold: Option<f64>,
    pub review_threshold: Option<f64>,
    pub max_cost: Option<f64>,
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
    /// `--rerun-stage`: this stage and the later ones get new requests.
    pub rerun_from: Option<usize>,
}

impl Prepared {
    pub fn first(&self) -> &stages::Stage {
        &self.stages[0]
    }

    pub fn answer_stage(&self) -> &stages::Stage {
        &self.stages[self.answer]
    }
}

pub fn config_path(workspace: &Path) -> PathBuf {
    workspace.join(docket_model::config::CONFIG_FILE)
}

/// Load and check config, templates, gates and thresholds. Nothing is sent.
pub fn prepare(opts: &RunOptions) -> Result<Prepared, EngineError> {
    let cfg_path = config_path(&opts.workspace);
    if !cfg_path.exists() {
        return Err(EngineError::Usage(format!(
            "{}: no docket.toml here (create a workspace with `docket init {}`, or pass --workspace)",
            cfg_path.display(),
            opts.workspace.display()
        )));
    }
    let config = LoadedConfig::load(&cfg_path)?;
    if !config.config.job.enabled && !opts.force {
        return Err(EngineError::Usage(format!(
            "{}: job.enabled = false: LLM adjudication is disabled for this workspace (pass --force to run anyway)",
            cfg_path.display()
        )));
    }
    let routing = &config.config.routing;
    let thresholds = Thresholds::new(
        opts.auto_accept_threshold
            .unwrap_or(*routing.auto_accept_threshold.get_ref()),
        opts.review_threshold
            .unwrap_or(*routing.review_threshold.get_ref()),
        opts.min_confidence,
    )?;
    if let Some(m) = opts.max_cost
        && !(m.is_finite() && m >= 0.0)
    {
        return Err(EngineError::Usage(format!(
            "--max-cost {m}: must be a non-negative amount of USD"
        )));
    }
    let stages = stages::load_stages(&config, &cfg_path, opts)?;
    let answer_name = config.answer_stage().name.clone();
    let answer = stages
        .iter()
        .position(|s| s.name == answer_name)
        .unwrap_or(0);
    let rerun_from = match &opts.rerun_stage {
        None => None,
        Some(name) => Some(stages.iter().position(|s| &s.name == name).ok_or_else(|| {
            EngineError::Usage(format!(
                "--rerun-stage {name}: no such stage in {} (stages: {})",
                cfg_path.display(),
                stages
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?),
    };
    Ok(Prepared {
        ledger: LedgerLocation::for_workspace(&opts.workspace).map_err(EngineError::opening)?,
        thresholds,
        critic: stages::critic_routing(&config),
        flag_injection: config.config.routing.flag_injection,
        stages,
        answer,
        rerun_from,
        config,
    })
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
    let session_id = match &opts.resume {
        Some(id) => resume_session(&prepared, id, &opts, &*reporter)?,
        None => match start_session(&prepared, &opts, &*reporter, confirm)? {
            Started::Session(id) => id,
            Started::Ended(end) => {
                return Ok(RunReport {
                    session_id: None,
                    end,
                    session: None,
                });
            }
        },
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

enum Started {
    Session(String),
    /// Nothing to do, a dry run, or the operator said no.
    Ended(RunEnd),
}

/// Plan, estimate, ask, and create the session with its items and requests.
fn start_session(
    prepared: &Prepared,
    opts: &RunOptions,
    reporter: &dyn Reporter,
    confirm: impl FnOnce(&Estimate) -> bool,
) -> Result<Started, EngineError> {
    reporter.line("Batch LLM Adjudication");
    reporter.line("======================");
    reporter.line("");
    let plan =
        tokio::task::block_in_place(|| plan::plan(prepared, opts.limit, opts.skip_reviewed))?;
    reporter.line(&format!(
        "Querying INDETERMINATE decisions... {} found",
        plan.estimate.items
    ));
    if plan.estimate.items == 0 {
        reporter
            .line("Nothing to do: no indeterminate items (import some with `docket import FILE`).");
        return Ok(Started::Ended(RunEnd::NothingToDo));
    }
    for l in plan.estimate.describe() {
        reporter.line(&l);
    }
    if opts.dry_run {
        dry_run_report(prepared, &plan, reporter);
        return Ok(Started::Ended(RunEnd::DryRun));
    }
    if let Some(max) = opts.max_cost {
        reporter.line(&format!(
            "Budget: at most ${max:.4} (dispatch pauses before the spend could pass it)"
        ));
    }
    // Answers made with another template or parameters are neither reused
    // nor asked again behind the operator's back.
    let stale = tokio::task::block_in_place(|| -> Result<_, EngineError> {
        let ledger = open_ledger(&prepared.ledger)?;
        Ok(ledger.stale_answers(&new_stages(prepared), &plan.item_ids)?)
    })?;
    if !stale.is_empty() {
        let list: Vec<String> = stale
            .iter()
            .map(|(stage, n)| format!("stage {stage}: {n} item(s)"))
            .collect();
        return Err(EngineError::Usage(format!(
            "answers exist that were made with another prompt template or other stage parameters ({}). \
             They are not reused and not asked again silently: pass `--rerun-stage {}` to ask that stage (and the ones after it) again \
             with a new request_version, or restore the template and parameters to reuse them.",
            list.join("; "),
            stale[0].0
        )));
    }
    if !confirm(&plan.estimate) {
        reporter.line("Not started.");
        return Ok(Started::Ended(RunEnd::Declined));
    }
    let id = new_session_id();
    // Names of key variables only: no key is ever read into the config.
    let snapshot = serde_json::json!({
        "config": prepared.config.snapshot_json(),
        "flags": {
            "limit": opts.limit, "min_confidence": opts.min_confidence, "rate_limit": opts.rate_limit,
            "skip_reviewed": opts.skip_reviewed, "force": opts.force,
            "auto_accept_threshold": prepared.thresholds.auto_accept,
            "review_threshold": prepared.thresholds.review, "max_cost": opts.max_cost,
        },
        "template_hash": prepared.first().template.hash,
        "params_hash": prepared.first().params_hash,
        "stages": prepared.stages.iter().map(|s| serde_json::json!({
            "name": s.name, "provider": s.provider_name, "model": s.model,
            "template_hash": s.template.hash, "params_hash": s.params_hash,
        })).collect::<Vec<_>>(),
        "rerun_stage": prepared.rerun_from.map(|i| prepared.stages[i].name.clone()),
        "keys": key_fingerprints(prepared),
    })
    .to_string();
    let new_stages = new_stages(prepared);
    let taken = tokio::task::block_in_place(|| -> Result<usize, EngineError> {
        let mut ledger = open_ledger(&prepared.ledger)?;
        Ok(ledger.create_session(&store::NewSession {
            session_id: &id,
            config_snapshot_json: &snapshot,
            stages: &new_stages,
            estimated_tokens: plan.estimate.prompt_tokens + plan.estimate.expected_output_tokens,
            estimated_cost_usd: plan.estimate.cost_usd,
            max_cost_usd: opts.max_cost,
            item_ids: &plan.item_ids,
        })?)
    })?;
    if taken == 0 {
        reporter.line(
            "Nothing to do: every planned item was taken or decided meanwhile by another session started at the same time \
             (see `docket sessions`).",
        );
        return Ok(Started::Ended(RunEnd::NothingToDo));
    }
    reporter.line("");
    if taken < plan.item_ids.len() {
        reporter.line(&format!(
            "{} of the {} planned items were taken or decided meanwhile by another session started at the same time; this session takes the other {taken}.",
            plan.item_ids.len() - taken,
            plan.item_ids.len()
        ));
    }
    reporter.line(&format!("Creating batch session: {id}"));
    Ok(Started::Session(id))
}

/// The stages as a new session records them.
fn new_stages(p: &Prepared) -> Vec<store::NewStage<'_>> {
    p.stages
        .iter()
        .map(|s| store::NewStage {
            name: &s.name,
            provider: &s.provider_name,
            model: &s.model,
            template_hash: &s.template.hash,
            params_hash: &s.params_hash,
            critic_of: s.critic_of.map(|c| p.stages[c].name.as_str()),
            rerun: p.rerun_from.is_some_and(|r| s.index >= r),
        })
        .collect()
}

/// The stages as a rerun records them.
fn rerun_stages(p: &Prepared) -> Vec<docket_ledger::rerun::RerunStage> {
    p.stages
        .iter()
        .map(|s| docket_ledger::rerun::RerunStage {
            name: s.name.clone(),
            index: s.index,
            provider_name: s.provider_name.clone(),
            model: s.model.clone(),
            template_hash: s.template.hash.clone(),
            params_hash: s.params_hash.clone(),
        })
        .collect()
}

/// Every provider the job's stages use: its chat client, its Batch API
/// (where docket has one), and the in-process mock for `kind = "mock"` (its
/// port is only known once it listens).
pub(crate) struct Connections {
    pub chat: std::collections::HashMap<String, Arc<dyn docket_providers::ChatProvider>>,
    pub batch: std::collections::HashMap<String, Arc<dyn docket_providers::batch::BatchProvider>>,
    pub mocks: Vec<Box<dyn mock::RunningMock>>,
}

async fn connect(prepared: &Prepared, opts: &RunOptions) -> Result<Connections, EngineError> {
    let mut out = Connections {
        chat: Default::default(),
        batch: Default::default(),
        mocks: Vec::new(),
    };
    for stage in &prepared.stages {
        let name = &stage.provider_name;
        if out.chat.contains_key(name) {
            continue;
        }
        let provider_cfg = &prepared.config.config.providers[name];
        let mut base_url = opts.base_url_override.clone();
        if base_url.is_none() && stage.provider_kind == ProviderKind::Mock {
            let start = opts.mock.as_ref().ok_or_else(|| {
                EngineError::Usage(format!(
                    "providers.{name}: kind = \"mock\" needs the built-in mock provider, which this program does not carry"
                ))
            })?;
            let server = start
                .start(provider_cfg.mock.clone().unwrap_or_default())
                .await
                .map_err(|e| {
                    EngineError::Usage(format!("cannot start the built-in mock provider: {e}"))
                })?;
            base_url = Some(server.base_url());
            out.mocks.push(server);
        }
        let chat = docket_providers::build(name, provider_cfg, base_url.as_deref())?;
        out.chat.insert(name.clone(), Arc::from(chat));
        if let Some(b) =
            docket_providers::batch::build_batch(name, provider_cfg, base_url.as_deref())?
        {
            out.batch.insert(name.clone(), Arc::from(b));
        }
    }
    Ok(out)
}

/// Ask each of the job's providers for its models list (see
/// `ChatProvider::preflight`), all at once. A provider that cannot be
/// reached or refuses its key stops the run; so does one whose own list
/// leaves out the configured model (row I4), naming `providers.NAME.model`
/// and the listed names closest to it. A compatible server's list may
/// leave models out: there it is said, and the run goes on.
async fn preflight(
    prepared: &Prepared,
    connections: &Connections,
    reporter: &dyn Reporter,
) -> Result<(), EngineError> {
    use docket_providers::models::{self, ListSays};
    let checks = connections
        .chat
        .iter()
        .map(|(name, chat)| async move { (name, chat.preflight().await) });
    for (name, result) in futures::future::join_all(checks).await {
        let cfg = &prepared.config.config.providers[name];
        let place = cfg
            .base_url
            .as_deref()
            .or(cfg.kind.default_base_url())
            .map(|u| format!(" at {}", docket_model::sanitize::for_terminal(u)))
            .unwrap_or_default();
        let provider = format!("provider {name} (kind = \"{}\"){place}", cfg.kind.as_str());
        let listed = match result {
            Ok(listed) => listed,
            Err(e) => {
                let what = if e.class == docket_providers::ErrorClass::Auth {
                    "refused its key"
                } else {
                    "could not be reached"
                };
                return Err(EngineError::Preflight(format!(
                    "{provider} {what}: {e}. Nothing was created or sent. \
                     Check providers.{name} in docket.toml (base_url, api_key_env) and the network, \
                     or skip this check with --no-preflight"
                )));
            }
        };
        // An empty list names nothing to compare with.
        let Some(listed) = listed.filter(|l| !l.is_empty()) else {
            continue;
        };
        let mock_serves_a_set = cfg
            .mock
            .as_ref()
            .is_some_and(|m| !m.models.trim().is_empty());
        let says = models::list_says(cfg.kind, mock_serves_a_set);
        if says == ListSays::Unchecked || models::listed(cfg.kind, &cfg.model, &listed) {
            continue;
        }
        let shown = |id: &str| {
            let id: String = docket_model::sanitize::for_terminal(id)
                .chars()
                .take(80)
                .collect();
            format!("\"{id}\"")
        };
        let close = models::close_to(&cfg.model, &listed, 3);
        let hint = if close.is_empty() {
            let some: Vec<String> = listed.iter().take(5).map(|id| shown(id)).collect();
            format!("; it lists, among others, {}", some.join(", "))
        } else {
            let close: Vec<String> = close.into_iter().map(shown).collect();
            format!("; closest listed: {}", close.join(", "))
        };
        let model = shown(&cfg.model);
        let count = listed.len();
        let models_word = if count == 1 { "model" } else { "models" };
        if says == ListSays::Indicative {
            let warning = format!(
                "Warning: {provider} does not list model {model} among its {count} {models_word}{hint}. \
                 Going on: a compatible server's list may leave out models it serves; if it refuses \
                 them, the session pauses before any spend"
            );
            tracing::warn!("{warning}");
            reporter.line(&warning);
            continue;
        }
        let key = format!("providers.{name}.model");
        let at = match model_line(&prepared.config.path, name) {
            Some(line) => format!("{}:{line}: {key}: ", prepared.config.path.display()),
            None => format!("{}: {key}: ", prepared.config.path.display()),
        };
        // A proxy or gateway behind `kind = "openai"` may list less than
        // it routes: say how to go on without the check.
        let proxy = match cfg.base_url.as_deref() {
            Some(url) if cfg.kind.default_base_url() != Some(url) => format!(
                " (if {} is a proxy or gateway whose list leaves out models it routes, set kind = \"openai_compatible\": \
                 its list is then only a warning)",
                docket_model::sanitize::for_terminal(url)
            ),
            _ => String::new(),
        };
        return Err(EngineError::Preflight(format!(
            "{at}{provider} does not serve model {model}: its models list ({count} {models_word}) \
             does not name it{hint}. Nothing was created or sent. Fix {key} in docket.toml, \
             or skip this check with --no-preflight{proxy}"
        )));
    }
    Ok(())
}

/// The line of `providers.NAME.model` in the config file, read again for
/// its position (the loaded config keeps none for it).
fn model_line(path: &Path, provider: &str) -> Option<usize> {
    #[derive(serde::Deserialize)]
    struct Doc {
        #[serde(default)]
        providers: std::collections::BTreeMap<String, Provider>,
    }
    #[derive(serde::Deserialize)]
    struct Provider {
        model: toml::Spanned<String>,
    }
    let text = std::fs::read_to_string(path).ok()?;
    let doc: Doc = toml::from_str(&text).ok()?;
    let start = doc.providers.get(provider)?.model.span().start;
    Some(text.get(..start)?.matches('\n').count() + 1)
}

fn resume_session(
    p: &Prepared,
    id: &str,
    opts: &RunOptions,
    reporter: &dyn Reporter,
) -> Result<String, EngineError> {
    let max_cost = opts.max_cost;
    tokio::task::block_in_place(|| {
        let mut ledger = open_ledger(&p.ledger)?;
        let Some(s) = ledger.load_session(id)? else {
            let hint = ledger
                .latest_session()?
                .map(|l| format!(" (newest: {l})"))
                .unwrap_or_default();
            return Err(EngineError::Usage(format!(
                "no session {id} in {}{hint}; list them with `docket sessions`",
                p.ledger
            )));
        };
        let age = now_ts() - s.started_at;
        if age > RESUME_WINDOW_SECS {
            return Err(EngineError::Usage(format!(
                "session {id} started {:.1} days ago; sessions can be resumed for 7 days only. \
                 Start a new session with `docket batch-adjudicate` (answered requests are reused, not paid again).",
                age / 86_400.0
            )));
        }
        if s.state == "completed" && p.rerun_from.is_none() {
            return Err(EngineError::Usage(format!(
                "session {id} is already completed ({} of {} items processed); see `docket batch-results {id}` \
                 (or ask a stage again with `--rerun-stage NAME`)",
                s.processed_count, s.total_count
            )));
        }
        if opts.join && !matches!(s.state.as_str(), "running" | "paused") {
            return Err(EngineError::Usage(format!(
                "session {id} is {}: a worker joins a running or paused session only; \
                 continue it with `docket batch-adjudicate --resume {id}`",
                s.state
            )));
        }
        check_same_job(p, &s)?;
        check_same_keys(p, &s, ledger.open_provider_batches(id)?, reporter)?;
        if p.rerun_from.is_some() && ledger.live_workers(id)? > 0 {
            return Err(EngineError::Usage(format!(
                "session {id} is being worked on right now; --rerun-stage rewrites its requests and needs it to itself. \
                 Pause or cancel it first (`docket cancel {id}`), then resume it with --rerun-stage."
            )));
        }
        let repair = ledger.repair_interrupted(id, max_cost, !opts.join)?;
        let ambiguous = repair.ambiguous;
        if repair.live_workers > 0 {
            reporter.line(&format!(
                "Session {id} is being worked on by {} other worker(s): joining them (items are claimed from the ledger, \
                 so nothing is sent twice; the provider's limits are shared between the workers).",
                repair.live_workers
            ));
        }
        // Asked again only once this process holds the session (the repair
        // above claimed it under the write lock): no live engine runs it.
        if let Some(from) = p.rerun_from {
            let actor = format!("cli:{}", docket_ledger::review::Operator::current().user);
            let r = ledger
                .rerun_stages(&rerun_stages(p), id, from, &actor)
                .map_err(|e| match e {
                    RerunError::Refused(m) => EngineError::Usage(m),
                    RerunError::Ledger(e) => e.into(),
                })?;
            reporter.line(&format!(
                "Asking stage \"{}\" and the stages after it again: {} requests for {} items get a new request_version \
                 ({} outcomes moved to llm_batch_result_history; their auto-accepts undone).",
                p.stages[from].name, r.requests, r.items, r.outcomes_superseded
            ));
        }
        let s = ledger.load_session(id)?.unwrap_or(s);
        reporter.line(&format!(
            "Resuming session {id}: {} of {} items already processed{}",
            s.processed_count,
            s.total_count,
            if ambiguous > 0 {
                format!("; {ambiguous} request(s) were in flight at the stop and will be sent again (counted as ambiguous)")
            } else {
                String::new()
            }
        ));
        Ok(id.to_string())
    })
}

/// A resumed session routes with the thresholds (and paces with the rate
/// limit) it started with, unless the operator passes the flag again.
fn keep_session_flags(opts: &mut RunOptions, id: &str) {
    let Ok(ledger) =
        LedgerLocation::for_workspace(&opts.workspace).and_then(Ledger::open_read_only)
    else {
        return;
    };
    let Ok(Some(s)) = ledger.load_session(id) else {
        return;
    };
    let Ok(snap) = serde_json::from_str::<serde_json::Value>(&s.config_snapshot_json) else {
        return;
    };
    let flag = |name: &str| {
        snap.pointer(&format!("/flags/{name}"))
            .and_then(serde_json::Value::as_f64)
    };
    opts.auto_accept_threshold = opts.auto_accept_threshold.or(flag("auto_accept_threshold"));
    opts.review_threshold = opts.review_threshold.or(flag("review_threshold"));
    opts.min_confidence = opts.min_confidence.or(flag("min_confidence"));
    opts.rate_limit = opts.rate_limit.or(flag("rate_limit").map(|r| r as u64));
}

/// Each provider of the job that takes a key: its variable's name and the
/// key's fingerprint (`provider::key_fingerprint`), never the key.
fn key_fingerprints(p: &Prepared) -> serde_json::Value {
    let mut keys = serde_json::Map::new();
    for s in &p.stages {
        let Some(cfg) = p.config.config.providers.get(&s.provider_name) else {
            continue;
        };
        if let Some(var) = &cfg.api_key_env {
            keys.insert(
                s.provider_name.clone(),
                serde_json::json!({
                    "env": var,
                    "fingerprint": docket_providers::key_fingerprint(cfg),
                }),
            );
        }
    }
    serde_json::Value::Object(keys)
}

/// A resumed session with provider batches still open must poll them with
/// the key that created them: another key (another project or account)
/// would see a 404 and the batches look failed when they are not (row B8).
/// With no batch open, another key is only said.
fn check_same_keys(
    p: &Prepared,
    s: &SessionRow,
    open_batches: u64,
    reporter: &dyn Reporter,
) -> Result<(), EngineError> {
    let snap: serde_json::Value = serde_json::from_str(&s.config_snapshot_json).unwrap_or_default();
    let Some(was) = snap.get("keys").and_then(|k| k.as_object()) else {
        // A session from before fingerprints were kept.
        return Ok(());
    };
    let now = key_fingerprints(p);
    for (provider, then) in was {
        let (Some(then_fp), Some(now_fp)) = (
            then.get("fingerprint").and_then(|f| f.as_str()),
            now.get(provider)
                .and_then(|p| p.get("fingerprint"))
                .and_then(|f| f.as_str()),
        ) else {
            continue;
        };
        if then_fp == now_fp {
            continue;
        }
        let var = then.get("env").and_then(|v| v.as_str()).unwrap_or("?");
        let what = format!(
            "session {} was started with another key for provider {provider}: {var} was {then_fp}, it is {now_fp} now",
            s.session_id
        );
        if open_batches > 0 {
            return Err(EngineError::Usage(format!(
                "{what}. Its {open_batches} provider batch(es) still open were created with the first key and \
                 another key may not see them (they would look failed). Set {var} back to that key to resume."
            )));
        }
        reporter.line(&format!("Note: {what}."));
    }
    Ok(())
}

/// A resumed session must send what it started with: the same stage,
/// provider, model, template and parameters. Mixing two jobs in one session
/// would make its results meaningless, so a change is refused, not followed.
fn check_same_job(p: &Prepared, s: &SessionRow) -> Result<(), EngineError> {
    let snap: serde_json::Value = serde_json::from_str(&s.config_snapshot_json).unwrap_or_default();
    // What the session started with, stage by stage; sessions from before
    // staged pipelines recorded one stage's hashes at the top level.
    let was: Vec<(String, String, String, String, String)> =
        match snap.get("stages").and_then(|v| v.as_array()) {
            Some(stages) => stages
                .iter()
                .map(|st| {
                    let f = |k: &str| st.get(k).and_then(|v| v.as_str()).unwrap_or("").to_string();
                    (
                        f("name"),
                        f("provider"),
                        f("model"),
                        f("template_hash"),
                        f("params_hash"),
                    )
                })
                .collect(),
            None => {
                let name = snap
                    .pointer("/config/stages/0/name")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                let provider = snap
                    .pointer("/config/stages/0/provider")
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                let model = snap
                    .pointer(&format!("/config/providers/{provider}/model"))
                    .and_then(|v| v.as_str())
                    .unwrap_or("")
                    .to_string();
                let f = |k: &str| {
                    snap.get(k)
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_string()
                };
                vec![(name, provider, model, f("template_hash"), f("params_hash"))]
            }
        };
    let mut changes = Vec::new();
    let now: Vec<&str> = p.stages.iter().map(|s| s.name.as_str()).collect();
    let before: Vec<&str> = was.iter().map(|w| w.0.as_str()).collect();
    if now != before {
        changes.push(format!("stages {} -> {}", before.join(","), now.join(",")));
    } else {
        for (st, (name, provider, model, th, ph)) in p.stages.iter().zip(&was) {
            if *provider != st.provider_name || *model != st.model {
                changes.push(format!(
                    "stage {name}: provider/model {provider}/{model} -> {}/{}",
                    st.provider_name, st.model
                ));
            }
            if *th != st.template.hash {
                changes.push(format!("stage {name}: the prompt template"));
            }
            if *ph != st.params_hash {
                changes.push(format!(
                    "stage {name}: the stage parameters (max_tokens, temperature, gate, criteria or repair prompt)"
                ));
            }
        }
    }
    if changes.is_empty() {
        return Ok(());
    }
    Err(EngineError::Usage(format!(
        "session {} was started with a different job: {} changed in docket.toml since. \
         Restore them to resume it, or start a new session (answered requests are reused only when nothing changed; \
         `--rerun-stage NAME` asks a stage again).",
        s.session_id,
        changes.join(", ")
    )))
}

fn dry_run_report(p: &Prepared, plan: &Plan, reporter: &dyn Reporter) {
    reporter.line("");
    let stages: Vec<String> = p
        .stages
        .iter()
        .map(|s| {
            format!(
                "\"{}\" ({} {}{})",
                s.name,
                s.provider_name,
                s.model,
                s.critic_of
                    .map(|c| format!(", critic of {}", p.stages[c].name))
                    .unwrap_or_default()
            )
        })
        .collect();
    reporter.line(&format!(
        "Dry run: nothing was sent. A session would run {} items through {} stage(s): {}; \
         routing on stage \"{}\": accept ≥ {:.2}, review ≥ {:.2}, reject below.",
        plan.estimate.items,
        p.stages.len(),
        stages.join(" → "),
        p.answer_stage().name,
        p.thresholds.effective_accept(),
        p.thresholds.review
    ));
    if let Some(prompt) = &plan.estimate.first_prompt {
        reporter.line(&format!(
            "First rendered prompt (item {}):",
            plan.item_ids.first().map(String::as_str).unwrap_or("")
        ));
        if let Some(s) = &prompt.system {
            reporter.line("--- system ---");
            for l in s.lines() {
                reporter.line(&docket_model::sanitize::for_terminal(l));
            }
        }
        reporter.line("--- user ---");
        for l in prompt.user.lines() {
            reporter.line(&docket_model::sanitize::for_terminal(l));
        }
        reporter.line("--------------");
    }
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
