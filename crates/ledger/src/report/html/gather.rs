//! What the run report shows, read from the ledger through the reads
//! `batch-results`, the exports and the console already use: the session's
//! header numbers (`session_head`), its results (`for_each_result`, the rows
//! of `batch-results --format json`), its attempts (`for_each_attempt`, the
//! rows of `export --what attempts`), its stages and provider batches (the
//! console's reads), and each batch's cost (`batch_costs`). Rows are folded
//! into counts as they stream by; only each attempt's times and cost are
//! kept (a few bytes each) until the time series' scale is known.

use std::collections::BTreeMap;

use docket_model::calibration::Summary;
use serde_json::Value;

use super::series::Series;
use crate::Ledger;
use crate::console::ConsoleReads;
use crate::report::reads::{AttemptReports, BatchCost, BatchCosts, Reports};
use crate::report::results::RESULT_KINDS;
use crate::report::{ATTEMPT_KINDS, Cell, Kind, ReportError, SessionHead};
use crate::watch::{ProviderBatchRow, StageProgress};

/// Confidence bins of a histogram: 0.05 wide, the last one closed at 1.0.
pub(super) const BINS: usize = 20;

/// Item errors listed by id in the report (the count is always whole).
const ITEM_ERROR_EXAMPLES: usize = 20;

// Indexes into a result row (`RESULT_COLUMNS`).
const R_ITEM: usize = 1;
const R_OUTCOME: usize = 2;
const R_CONFIDENCE: usize = 3;
const R_ERROR: usize = 6;
const R_STAGE: usize = 8;
const R_INPUT: usize = 11;
const R_OUTPUT: usize = 12;
const R_COST: usize = 13;

// Indexes into an attempt row (`ATTEMPT_COLUMNS`).
const A_STAGE: usize = 2;
const A_STATE: usize = 5;
const A_HTTP: usize = 6;
const A_INPUT: usize = 9;
const A_OUTPUT: usize = 10;
const A_COST: usize = 11;
const A_ERROR_KIND: usize = 13;
const A_ERROR_MESSAGE: usize = 14;
const A_SENT: usize = 15;
const A_FINISHED: usize = 16;

/// Outcome counts and totals of a set of results, as `batch-results` has them.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Outcomes {
    pub accepted: i64,
    pub review: i64,
    pub rejected: i64,
    pub error: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
}

impl Outcomes {
    pub fn results(&self) -> i64 {
        self.accepted + self.review + self.rejected + self.error
    }

    fn add(&mut self, c: &[Cell]) {
        match c[R_OUTCOME].as_str().unwrap_or("") {
            "accepted" => self.accepted += 1,
            "review" => self.review += 1,
            "rejected" => self.rejected += 1,
            _ => self.error += 1,
        }
        self.input_tokens += c[R_INPUT].as_i64().unwrap_or(0);
        self.output_tokens += c[R_OUTPUT].as_i64().unwrap_or(0);
        self.cost_usd += c[R_COST].as_f64().unwrap_or(0.0);
    }
}

/// What one stage's attempts sent and cost.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Spend {
    pub attempts: i64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cost_usd: f64,
}

/// One stage's row of the stage table.
#[derive(Debug, Clone)]
pub(super) struct StageLine {
    pub name: String,
    pub role: String,
    pub provider: String,
    pub model: String,
    /// The engine's checkpoint (items, done, failed, skipped); None when
    /// the session has none for this stage.
    pub progress: Option<StageProgress>,
    /// The outcomes of the items whose answer this stage gave.
    pub outcomes: Outcomes,
    pub spend: Spend,
    /// Confidence histogram: the routed confidence for the answer stage,
    /// else the `confidence` field of the stage's outputs; None when the
    /// stage gave no confidence at all.
    pub histogram: Option<[u64; BINS]>,
}

/// Attempts that failed, of one kind.
#[derive(Debug, Default, Clone)]
pub(super) struct ErrorKind {
    pub count: i64,
    /// The latest message of this kind.
    pub example: String,
}

/// Everything the report shows.
pub(super) struct Gathered {
    pub head: SessionHead,
    pub job: String,
    /// (review, auto-accept) thresholds the run routed with.
    pub thresholds: (Option<f64>, Option<f64>),
    pub config_toml: String,
    /// A short fingerprint of the recorded config (`config::version`).
    pub config_version: String,
    pub flags: Vec<(String, String)>,
    pub outcomes: Outcomes,
    pub stages: Vec<StageLine>,
    pub series: Series,
    pub attempt_errors: BTreeMap<String, ErrorKind>,
    pub item_errors: Vec<(String, String)>,
    pub batches: Vec<(ProviderBatchRow, Option<BatchCost>)>,
    /// Human agreement with the model per band, at the session's target
    /// precision (what `docket calibrate` says without `--target-precision`).
    pub calibration: Option<Summary>,
}

/// Read everything the report of `session_id` shows.
pub(super) fn gather(ledger: &Ledger, session_id: &str) -> Result<Gathered, ReportError> {
    let head = ledger
        .session_head(session_id)?
        .ok_or_else(|| ReportError::UnknownSession(session_id.to_string()))?;
    let snapshot: Value = ledger
        .session_config(session_id)?
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let mut g = Gathered {
        job: snapshot["config"]["job"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        thresholds: docket_model::routing::session_thresholds(&snapshot),
        config_toml: super::config::as_toml(&snapshot["config"]),
        config_version: super::config::version(&snapshot["config"]),
        flags: super::config::flags(&snapshot["flags"]),
        outcomes: Outcomes::default(),
        stages: stage_lines(ledger, session_id, &snapshot)?,
        series: Series::default(),
        attempt_errors: BTreeMap::new(),
        item_errors: Vec::new(),
        batches: Vec::new(),
        calibration: ledger
            .calibration_input(session_id)?
            .map(|c| c.session_summary()),
        head,
    };
    read_results(ledger, &mut g)?;
    read_attempts(ledger, &mut g)?;
    read_stage_outputs(ledger, &mut g)?;
    let costs = ledger.batch_costs(session_id)?;
    let mut batches = ledger.provider_batches(session_id, usize::MAX)?;
    batches.sort_by_key(|b| b.batch_id);
    g.batches = batches
        .into_iter()
        .map(|b| {
            let cost = costs.iter().find(|c| c.batch_id == b.batch_id).cloned();
            (b, cost)
        })
        .collect();
    Ok(g)
}

/// The session's stages in job order, with the provider and model each
/// ran on (from the snapshot) and the engine's checkpoint.
fn stage_lines(
    ledger: &Ledger,
    session_id: &str,
    snapshot: &Value,
) -> Result<Vec<StageLine>, ReportError> {
    let progress = ledger.run_stages(session_id)?;
    let mut names = ledger.session_stages(session_id)?;
    for p in &progress {
        if !names.contains(&p.name) {
            names.push(p.name.clone());
        }
    }
    let recorded = snapshot["stages"].as_array().cloned().unwrap_or_default();
    Ok(names
        .into_iter()
        .map(|name| {
            let rec = recorded.iter().find(|s| s["name"].as_str() == Some(&name));
            let text = |k: &str| rec.and_then(|s| s[k].as_str()).unwrap_or("").to_string();
            let progress = progress.iter().find(|p| p.name == name).cloned();
            StageLine {
                role: progress
                    .as_ref()
                    .map(|p| p.role.clone())
                    .unwrap_or_default(),
                provider: text("provider"),
                model: text("model"),
                progress,
                outcomes: Outcomes::default(),
                spend: Spend::default(),
                histogram: None,
                name,
            }
        })
        .collect())
}

/// The stage line named `name`, added at the end when the ledger knew no
/// such stage (a result of a stage since renamed).
fn stage_mut<'a>(stages: &'a mut Vec<StageLine>, name: &str) -> &'a mut StageLine {
    let i = match stages.iter().position(|s| s.name == name) {
        Some(i) => i,
        None => {
            stages.push(StageLine {
                name: name.to_string(),
                role: String::new(),
                provider: String::new(),
                model: String::new(),
                progress: None,
                outcomes: Outcomes::default(),
                spend: Spend::default(),
                histogram: None,
            });
            stages.len() - 1
        }
    };
    &mut stages[i]
}

/// The bin of a confidence; None for a value outside [0, 1].
pub(super) fn bin_of(confidence: f64) -> Option<usize> {
    if !(0.0..=1.0).contains(&confidence) {
        return None;
    }
    Some(((confidence * BINS as f64) as usize).min(BINS - 1))
}

fn count_into(hist: &mut Option<[u64; BINS]>, confidence: Option<f64>) {
    if let Some(b) = confidence.and_then(bin_of) {
        hist.get_or_insert([0; BINS])[b] += 1;
    }
}

/// The results, exactly the rows of `batch-results --format json`.
fn read_results(ledger: &Ledger, g: &mut Gathered) -> Result<(), ReportError> {
    let session = g.head.session_id.clone();
    let Gathered {
        outcomes,
        stages,
        item_errors,
        ..
    } = g;
    ledger.for_each_result(Some(&session), RESULT_KINDS, &mut |c| {
        outcomes.add(c);
        let stage = stage_mut(stages, c[R_STAGE].as_str().unwrap_or(""));
        stage.outcomes.add(c);
        count_into(&mut stage.histogram, c[R_CONFIDENCE].as_f64());
        if c[R_OUTCOME].as_str() == Some("error") && item_errors.len() < ITEM_ERROR_EXAMPLES {
            item_errors.push((
                c[R_ITEM].as_str().unwrap_or("").to_string(),
                c[R_ERROR].as_str().unwrap_or("").to_string(),
            ));
        }
        Ok(())
    })?;
    Ok(())
}

/// The attempts, exactly the rows of `export --what attempts` (their
/// times read as seconds rather than ISO text).
fn read_attempts(ledger: &Ledger, g: &mut Gathered) -> Result<(), ReportError> {
    let mut kinds = ATTEMPT_KINDS.to_vec();
    kinds[A_SENT] = Kind::Float;
    kinds[A_FINISHED] = Kind::Float;
    let session = g.head.session_id.clone();
    let mut times = Vec::new();
    let Gathered {
        stages,
        attempt_errors,
        ..
    } = g;
    ledger.for_each_attempt(Some(&session), &kinds, &mut |c| {
        let spend = &mut stage_mut(stages, c[A_STAGE].as_str().unwrap_or("")).spend;
        spend.attempts += 1;
        spend.input_tokens += c[A_INPUT].as_i64().unwrap_or(0);
        spend.output_tokens += c[A_OUTPUT].as_i64().unwrap_or(0);
        let cost = c[A_COST].as_f64().unwrap_or(0.0);
        spend.cost_usd += cost;
        let state = c[A_STATE].as_str().unwrap_or("");
        let failed = matches!(state, "failed" | "ambiguous");
        if failed {
            let kind = c[A_ERROR_KIND].as_str().unwrap_or(state).to_string();
            let e = attempt_errors.entry(kind).or_default();
            e.count += 1;
            e.example = c[A_ERROR_MESSAGE].as_str().unwrap_or("").to_string();
        }
        if let Some(sent) = c[A_SENT].as_f64() {
            times.push(super::series::Attempt {
                sent,
                finished: c[A_FINISHED].as_f64(),
                cost,
                failed,
                rate_limited: c[A_HTTP].as_i64() == Some(429),
            });
        }
        Ok(())
    })?;
    g.series = Series::of(&times);
    Ok(())
}

/// Histograms of the stages that answered no item (critics, earlier
/// generators) from the `confidence` of their outputs, when they give one.
fn read_stage_outputs(ledger: &Ledger, g: &mut Gathered) -> Result<(), ReportError> {
    let session = g.head.session_id.clone();
    for stage in g.stages.iter_mut().filter(|s| s.histogram.is_none()) {
        let hist = &mut stage.histogram;
        ledger.for_each_stage_output(&session, &stage.name, &mut |text| {
            let v: Value = serde_json::from_str(text).unwrap_or(Value::Null);
            count_into(hist, v["confidence"].as_f64());
        })?;
    }
    Ok(())
}
