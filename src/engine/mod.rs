//! The batch engine: `batch-adjudicate` from config to a finished session.
//!
//! `prepare` loads and checks everything that can be wrong before a request
//! is sent (config, template, gate, thresholds, key); `run` plans or resumes a
//! session, asks to continue, then dispatches under the shared limiter and
//! records every attempt and outcome in the ledger.

mod batch_cancel;
mod batching;
mod budget;
mod dispatch;
mod plan;
mod progress;
mod stats;
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

use crate::config::{ConfigError, LoadedConfig, ProviderKind};
use crate::cost::{Price, price_of};
use crate::gate::{Gate, GateBuildError};
use crate::ledger::store::{self, RESUME_WINDOW_SECS, SessionRow};
use crate::ledger::{LEDGER_FILE, LedgerError, now_ts};
use crate::mock::MockServer;
use crate::routing::{ThresholdError, Thresholds};
use crate::template::{PromptTemplate, TemplateError};

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
    Provider(#[from] crate::provider::ProviderSetupError),
}

impl From<LedgerError> for EngineError {
    fn from(e: LedgerError) -> Self {
        EngineError::Ledger(e.to_string())
    }
}

impl From<rusqlite::Error> for EngineError {
    fn from(e: rusqlite::Error) -> Self {
        EngineError::Ledger(format!("ledger: {e}"))
    }
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
}

/// Everything checked and loaded before planning.
pub struct Prepared {
    pub config: LoadedConfig,
    pub ledger_path: PathBuf,
    pub template: PromptTemplate,
    pub gate: Gate,
    pub thresholds: Thresholds,
    pub stage: String,
    pub provider_name: String,
    pub provider_kind: ProviderKind,
    pub model: String,
    pub max_tokens: u64,
    pub expected_output_tokens: u64,
    pub temperature: Option<f64>,
    pub max_attempts: u32,
    pub max_transport_attempts: u32,
    pub request_timeout: Duration,
    pub rpm: u64,
    pub tpm: u64,
    pub max_concurrency: usize,
    pub price: Price,
    pub price_known: bool,
    pub params_hash: String,
    /// The gate's schema, sent as the provider's structured output: built
    /// once and shared by every request.
    pub response_schema: Option<Arc<(String, serde_json::Value)>>,
    /// The model's tokenizer, loaded only when a budget needs exact counts.
    pub budget_counter: Option<crate::cost::TokenCounter>,
    /// The stage's batching (`[stages.batch]`).
    pub batch: crate::config::BatchConfig,
    /// The batch price against the synchronous one when this stage's
    /// requests go to a Batch API (None: they go synchronously).
    pub batch_price_factor: Option<f64>,
}

pub fn config_path(workspace: &Path) -> PathBuf {
    workspace.join(crate::config::CONFIG_FILE)
}

/// Load and check config, template, gate and thresholds. Nothing is sent.
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
    let stage = config.config.stages[0].clone();
    let provider = config.provider_for(&stage).clone();
    let template = PromptTemplate::load(
        &config.resolve(&stage.template),
        stage
            .system_prompt
            .as_ref()
            .map(|p| config.resolve(p))
            .as_deref(),
    )?;
    let gate = Gate::build(&stage.gate, &config.root, &cfg_path)?;
    let response_schema = gate
        .response_schema()
        .map(|s| Arc::new((worker::schema_name(&stage.name), s.clone())));
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
    // A missing key stops the run here, before planning creates anything.
    crate::provider::check_key(&stage.provider, &provider)?;
    let (price, price_known) = price_of(&provider.model);
    let params = serde_json::json!({
        "max_tokens": stage.max_tokens.get_ref(),
        "temperature": stage.temperature.as_ref().map(|t| *t.get_ref()),
        "gate": &stage.gate,
    });
    Ok(Prepared {
        ledger_path: opts.workspace.join(LEDGER_FILE),
        template,
        gate,
        thresholds,
        stage: stage.name.clone(),
        provider_name: stage.provider.clone(),
        provider_kind: provider.kind,
        model: provider.model.clone(),
        max_tokens: *stage.max_tokens.get_ref(),
        expected_output_tokens: *stage.expected_output_tokens.get_ref(),
        temperature: stage.temperature.as_ref().map(|t| *t.get_ref()),
        max_attempts: (*stage.max_attempts.get_ref()).min(u64::from(u32::MAX)) as u32,
        max_transport_attempts: (*provider.max_transport_attempts.get_ref())
            .min(u64::from(u32::MAX)) as u32,
        request_timeout: Duration::from_secs_f64(*provider.request_timeout_secs.get_ref()),
        rpm: opts
            .rate_limit
            .unwrap_or(*provider.requests_per_minute.get_ref()),
        tpm: *provider.tokens_per_minute.get_ref(),
        max_concurrency: (*provider.max_concurrency.get_ref()).min(10_000) as usize,
        price,
        price_known,
        params_hash: crate::cost::sha256_hex(params.to_string().as_bytes()),
        response_schema,
        budget_counter: opts
            .max_cost
            .map(|_| crate::cost::TokenCounter::for_model(&provider.model)),
        batch_price_factor: (stage.batch.mode != crate::config::BatchMode::Sync
            && crate::provider::batch::has_batch_api(provider.kind))
        .then_some(crate::provider::batch::BATCH_PRICE_FACTOR),
        batch: stage.batch.clone(),
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
    if let Some(id) = opts.resume.clone() {
        tokio::task::block_in_place(|| keep_session_flags(&mut opts, &id));
    }
    let prepared = Arc::new(tokio::task::block_in_place(|| prepare(&opts))?);
    let resumed = opts.resume.is_some();
    let session_id = match &opts.resume {
        Some(id) => resume_session(&prepared, id, opts.max_cost, &*reporter)?,
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
    let (provider, batch_adapter, mock) = connect(&prepared, &opts).await?;
    let grace = opts.grace.unwrap_or(Duration::from_secs(10));
    let result = dispatch::dispatch(
        prepared.clone(),
        session_id.clone(),
        provider,
        reporter.clone(),
        interrupts,
        grace,
        resumed,
        batch_adapter,
    )
    .await;
    if let Some(m) = mock {
        m.shutdown().await;
    }
    let end = result?;
    let session = tokio::task::block_in_place(|| -> Result<Option<SessionRow>, EngineError> {
        let conn = crate::ledger::open(&prepared.ledger_path)?;
        Ok(store::load_session(&conn, &session_id)?)
    })?;
    if let Some(s) = &session {
        for l in format_summary(s, &end) {
            reporter.line(&l);
        }
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
        "template_hash": prepared.template.hash,
        "params_hash": prepared.params_hash,
    })
    .to_string();
    tokio::task::block_in_place(|| -> Result<(), EngineError> {
        let mut conn = crate::ledger::open(&prepared.ledger_path)?;
        store::create_session(
            &mut conn,
            &store::NewSession {
                session_id: &id,
                config_snapshot_json: &snapshot,
                stage: &prepared.stage,
                provider: &prepared.provider_name,
                model: &prepared.model,
                template_hash: &prepared.template.hash,
                params_hash: &prepared.params_hash,
                estimated_tokens: plan.estimate.prompt_tokens
                    + plan.estimate.expected_output_tokens,
                estimated_cost_usd: plan.estimate.cost_usd,
                max_cost_usd: opts.max_cost,
                item_ids: &plan.item_ids,
            },
        )?;
        Ok(())
    })?;
    reporter.line("");
    reporter.line(&format!("Creating batch session: {id}"));
    Ok(Started::Session(id))
}

/// The provider client, and the in-process mock when the provider is the
/// built-in one (its port is only known once it listens).
#[allow(clippy::type_complexity)]
async fn connect(
    prepared: &Prepared,
    opts: &RunOptions,
) -> Result<
    (
        Box<dyn crate::provider::ChatProvider>,
        Option<Arc<dyn crate::provider::batch::BatchProvider>>,
        Option<MockServer>,
    ),
    EngineError,
> {
    let provider_cfg = &prepared.config.config.providers[&prepared.provider_name];
    let mut mock = None;
    let mut base_url = opts.base_url_override.clone();
    if base_url.is_none() && prepared.provider_kind == ProviderKind::Mock {
        let server = MockServer::start(
            provider_cfg.mock.clone().unwrap_or_default(),
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        )
        .await
        .map_err(|e| EngineError::Usage(format!("cannot start the built-in mock provider: {e}")))?;
        base_url = Some(server.base_url());
        mock = Some(server);
    }
    let provider =
        crate::provider::build(&prepared.provider_name, provider_cfg, base_url.as_deref())?;
    let batch = crate::provider::batch::build_batch(
        &prepared.provider_name,
        provider_cfg,
        base_url.as_deref(),
    )?
    .map(Arc::from);
    Ok((provider, batch, mock))
}

fn resume_session(
    p: &Prepared,
    id: &str,
    max_cost: Option<f64>,
    reporter: &dyn Reporter,
) -> Result<String, EngineError> {
    tokio::task::block_in_place(|| {
        let mut conn = crate::ledger::open(&p.ledger_path)?;
        let Some(s) = store::load_session(&conn, id)? else {
            let hint = store::latest_session(&conn)?
                .map(|l| format!(" (newest: {l})"))
                .unwrap_or_default();
            return Err(EngineError::Usage(format!(
                "no session {id} in {}{hint}; list them with `docket sessions`",
                p.ledger_path.display()
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
        if s.state == "completed" {
            return Err(EngineError::Usage(format!(
                "session {id} is already completed ({} of {} items processed); see `docket batch-results {id}`",
                s.processed_count, s.total_count
            )));
        }
        check_same_job(p, &s)?;
        let ambiguous = match store::repair_interrupted(&mut conn, id, max_cost)? {
            store::Repair::Repaired { ambiguous } => ambiguous,
            store::Repair::Live {
                pid,
                host,
                heartbeat_age_secs,
            } => {
                return Err(EngineError::Usage(format!(
                    "session {id} is being run right now by process {} on {} (heartbeat {heartbeat_age_secs:.1} s ago); \
                     running it twice would pay twice. Pause or cancel it there (`docket pause {id}`), or wait for it.",
                    pid.map(|p| p.to_string()).unwrap_or_else(|| "?".into()),
                    host.unwrap_or_else(|| "?".into()),
                )));
            }
        };
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
    let path = opts.workspace.join(LEDGER_FILE);
    let Ok(conn) = crate::ledger::open_read_only(&path) else {
        return;
    };
    let Ok(Some(s)) = store::load_session(&conn, id) else {
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

/// A resumed session must send what it started with: the same stage,
/// provider, model, template and parameters. Mixing two jobs in one session
/// would make its results meaningless, so a change is refused, not followed.
fn check_same_job(p: &Prepared, s: &SessionRow) -> Result<(), EngineError> {
    let snap: serde_json::Value = serde_json::from_str(&s.config_snapshot_json).unwrap_or_default();
    let was_stage = snap
        .pointer("/config/stages/0/name")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let was_provider = snap
        .pointer("/config/stages/0/provider")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let was_model = snap
        .pointer(&format!("/config/providers/{was_provider}/model"))
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let mut changes = Vec::new();
    if was_stage != p.stage {
        changes.push(format!("stage {was_stage} -> {}", p.stage));
    }
    if was_provider != p.provider_name || was_model != p.model {
        changes.push(format!(
            "provider/model {was_provider}/{was_model} -> {}/{}",
            p.provider_name, p.model
        ));
    }
    if snap.get("template_hash").and_then(|v| v.as_str()) != Some(p.template.hash.as_str()) {
        changes.push("the prompt template".into());
    }
    if snap.get("params_hash").and_then(|v| v.as_str()) != Some(p.params_hash.as_str()) {
        changes.push("the stage parameters (max_tokens, temperature or gate)".into());
    }
    if changes.is_empty() {
        return Ok(());
    }
    Err(EngineError::Usage(format!(
        "session {} was started with a different job: {} changed in docket.toml since. \
         Restore them to resume it, or start a new session (answered requests are reused only when nothing changed).",
        s.session_id,
        changes.join(", ")
    )))
}

fn dry_run_report(p: &Prepared, plan: &Plan, reporter: &dyn Reporter) {
    reporter.line("");
    reporter.line(&format!(
        "Dry run: nothing was sent. A session would send {} requests to {} ({}) for stage \"{}\"; \
         routing: accept ≥ {:.2}, review ≥ {:.2}, reject below.",
        plan.estimate.items,
        p.provider_name,
        p.model,
        p.stage,
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
                reporter.line(&crate::sanitize::for_terminal(l));
            }
        }
        reporter.line("--- user ---");
        for l in prompt.user.lines() {
            reporter.line(&crate::sanitize::for_terminal(l));
        }
        reporter.line("--------------");
    }
}

/// `batch_YYYYMMDD_xxxxxx`: the date and six random lowercase letters/digits.
pub fn new_session_id() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    let suffix: String = (0..6)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect();
    format!("batch_{}_{suffix}", chrono::Utc::now().format("%Y%m%d"))
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
        assert_eq!(RunEnd::Paused("x".into()).exit_code(), 4);
        assert_eq!(RunEnd::Cancelled.exit_code(), 130);
    }
}
