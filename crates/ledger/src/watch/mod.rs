//! What the console shows, as plain data: sessions, one session's live
//! state and events, its provider batches, its workers and the review
//! queue. No SQL here: `ledger::console::ConsoleReads` fills these from a
//! ledger, so a console in another process or SSH login shows a run exactly
//! as one in the same process does, whatever backend holds the ledger.

mod batches;
mod charts;
mod stage;

pub use batches::{BATCH_STATES, is_terminal_state, state_rank};
pub use charts::{
    AttemptPoint, CONFIDENCE_BINS, ChartData, StageHistogram, TIMELINE_SLICES, Timeline,
    confidence_bin,
};
pub use stage::{DEFAULT_STAGE, configured_stage, current_stage};

use crate::store::SessionRow;

/// The review queue's page size when a query asks for 0 rows.
pub const DEFAULT_PAGE: u64 = 50;

/// One line of the sessions pane.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSummary {
    pub session_id: String,
    pub state: String,
    pub desired_state: String,
    pub started_at: f64,
    pub completed_at: Option<f64>,
    pub total: u64,
    pub processed: u64,
    pub accepted: u64,
    pub review: u64,
    pub rejected: u64,
    pub errors: u64,
    pub cost_usd: f64,
    pub estimated_cost_usd: f64,
    pub stop_reason: Option<String>,
    /// An engine's heartbeat is fresh (the run is live in some process).
    pub live: bool,
    /// The state every view shows (`session_state::shown_state` of the
    /// stored state, the wishes and the engine's heartbeat).
    pub shown: ShownState,
}

pub use docket_model::live::{LiveGauges, Tune};
pub use docket_model::session_state::{Engine, ShownState, StateFacts, shown_state, stage_word};

/// One stage of a session's job. From its `run_stages` checkpoint when the
/// session has one (every stage, in job order), else counted from the
/// session's own counters (one stage, `state` None).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageProgress {
    pub name: String,
    pub total: u64,
    /// Items finished with the stage: passed, failed or skipped.
    pub done: u64,
    /// Their budgets spent.
    pub failed: u64,
    /// Requests sent and not answered yet (synchronous ones; from the
    /// ledger, the same count as the session's `in_flight`).
    pub in_flight: u64,
    /// Batch lines submitted and waiting at the provider (not in flight).
    pub at_provider: u64,
    /// Never ran because an earlier stage failed for the item.
    pub skipped: u64,
    /// Its place in the job, from 0.
    pub position: u64,
    /// `critic` or `generator` (empty: not recorded).
    pub role: String,
    /// The stage a critic judges.
    pub critic_of: Option<String>,
    /// `pending`, `running` or `done` as the engine checkpoints it; None
    /// when the session has no `run_stages` rows.
    pub state: Option<String>,
}

impl StageProgress {
    pub fn is_critic(&self) -> bool {
        self.role == "critic" || self.critic_of.is_some()
    }

    /// Nothing of the stage is left: no item pending or in flight, and the
    /// engine (when it checkpoints the stage) says it is done.
    pub fn is_finished(&self) -> bool {
        self.in_flight == 0
            && self.at_provider == 0
            && self.done >= self.total
            && self.state.as_deref().is_none_or(|s| s == "done")
    }
}

/// One session in full, for the stages, outcomes and gauges panes.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionView {
    pub row: SessionRow,
    pub stop_after_stage: Option<String>,
    /// The rate-limit profile the run was started with, and its version
    /// (`--profile`); None without one.
    pub profile: Option<(String, i64)>,
    pub tune: Tune,
    /// None when no engine has written gauges yet.
    pub gauges: Option<LiveGauges>,
    pub stages: Vec<StageProgress>,
    /// An engine's heartbeat is fresh.
    pub live: bool,
    /// The state every view shows (see `SessionSummary::shown`).
    pub shown: ShownState,
    pub heartbeat_age_secs: Option<f64>,
    /// Synchronous requests sent and not answered yet (from the ledger):
    /// the one "in flight" every pane shows.
    pub in_flight: u64,
    /// Batch lines submitted and waiting at the provider, counted apart.
    pub at_provider: u64,
    /// total - processed - in_flight - at_provider, never negative.
    pub pending: u64,
}

/// One provider Batch API job of a session (a `provider_batch` row). Texts
/// are safe for a terminal; times are unix seconds, None when NULL or not
/// a finite number.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderBatchRow {
    pub batch_id: i64,
    /// docket's own id for the batch (OpenAI metadata, Gemini display name).
    pub tag: String,
    pub stage: String,
    /// The provider's name in docket.toml.
    pub provider: String,
    pub provider_kind: String,
    pub model: String,
    /// As stored: submitting, validating, in_progress, finalizing,
    /// completed, failed, expired, cancelling, cancelled, unknown, ingested
    /// (or a state this version does not know).
    pub state: String,
    /// The provider's id, once the create answered.
    pub provider_batch_id: Option<String>,
    pub request_count: u64,
    /// The provider's counts.
    pub completed_count: u64,
    pub failed_count: u64,
    /// Result lines applied to the ledger.
    pub ingested_count: u64,
    pub quarantined_count: u64,
    pub poll_count: u64,
    pub error_message: Option<String>,
    pub cancel_requested_at: Option<f64>,
    pub created_at: Option<f64>,
    pub submitted_at: Option<f64>,
    pub ended_at: Option<f64>,
    pub last_polled_at: Option<f64>,
    pub next_poll_at: Option<f64>,
    /// When the provider's counts last moved (None: not since submission,
    /// or a ledger from before this was kept).
    pub counts_changed_at: Option<f64>,
}

/// Every provider batch of a session, counted.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProviderBatchSummary {
    /// Batches of the session, in any state.
    pub total: u64,
    /// Open batches (state != ingested) by state, in lifecycle order.
    pub open: Vec<(String, u64)>,
    /// Batches finished with (every line's outcome recorded).
    pub ingested: u64,
    /// request_count - ingested_count over the open batches.
    pub lines_waiting: u64,
}

impl ProviderBatchSummary {
    /// Batches not finished with.
    pub fn open_count(&self) -> u64 {
        self.open.iter().map(|(_, n)| n).sum()
    }

    /// Batches in this state (open ones, or `ingested`).
    pub fn in_state(&self, state: &str) -> u64 {
        if state == "ingested" {
            return self.ingested;
        }
        self.open
            .iter()
            .filter(|(s, _)| s == state)
            .map(|(_, n)| n)
            .sum()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// One line of the events pane.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub at: f64,
    pub level: Level,
    pub kind: String,
    pub message: String,
    pub item_id: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReviewQuery {
    /// Case-insensitive substring over item id, suggestion and rationale.
    pub filter: Option<String>,
    /// Only this session's review items (None: every session).
    pub session: Option<String>,
    pub offset: u64,
    pub limit: u64,
}

/// One line of the review queue (pending items, highest confidence first).
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewRow {
    pub review_id: i64,
    pub item_id: String,
    pub session_id: Option<String>,
    pub confidence: Option<f64>,
    /// The suggestion as compact JSON.
    pub suggestion: String,
    pub rationale: Option<String>,
    pub model_id: Option<String>,
    /// Held by someone (claimant string) with an unexpired lease.
    pub claimed_by: Option<String>,
    /// Sent by the audit sample (its item was auto-accepted or rejected).
    pub audit: bool,
    /// The item's evidence as compact JSON (for the job's `[review]`
    /// summary line); empty when the item has none.
    pub evidence: String,
    /// Made on evidence `docket import --update` replaced since.
    pub stale: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReviewPage {
    /// Pending items matching the query (all pages).
    pub total: u64,
    pub offset: u64,
    pub rows: Vec<ReviewRow>,
    /// More than one session has items in the queue (whatever the filter):
    /// rows then show their session.
    pub several_sessions: bool,
}

/// What one stage produced for the item (every request of the item).
#[derive(Debug, Clone, PartialEq)]
pub struct StageOutput {
    pub stage: String,
    pub provider: String,
    pub model: String,
    pub status: String,
    pub attempts: u64,
    pub parsed_output_json: Option<String>,
    pub raw_output: Option<String>,
    pub finish_reason: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cost_usd: f64,
}

/// What one stage of a staged job answered for an item, as the routing
/// saw it: the answer stage's (generator's) or its critic's. Texts as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageVerdict {
    pub stage: String,
    /// The parsed output (JSON as stored; not JSON when the ledger says so).
    pub output_json: Option<String>,
    pub confidence: Option<f64>,
    pub rationale: Option<String>,
    /// The critic's verdict (None for the generator).
    pub verdict: Option<String>,
}

/// The detail view of one review item.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReviewDetail {
    pub review_id: i64,
    pub item_id: String,
    pub session_id: Option<String>,
    pub status: String,
    /// Pretty-printed JSON.
    pub evidence_json: String,
    pub suggestion_json: String,
    pub confidence: Option<f64>,
    pub rationale: Option<String>,
    pub model_id: Option<String>,
    pub stages: Vec<StageOutput>,
    pub decided_by: Option<String>,
    pub decided_at: Option<f64>,
    pub claimed_by: Option<String>,
    /// Why the routing sent it where it is, when a rule changed the outcome
    /// (e.g. "critic disagreed: accept -> review").
    pub routing_note: Option<String>,
    /// The answer stage's output, when the session recorded a result.
    pub generator: Option<StageVerdict>,
    /// What a critic of the answer stage said (None: no critic).
    pub critic: Option<StageVerdict>,
    /// The earlier suggestions for the item that this one superseded,
    /// newest first (asked again while they were still pending).
    pub replaced: Vec<ReplacedSuggestion>,
    /// The review item that superseded this one, and its session.
    pub superseded_by: Option<(i64, Option<String>)>,
    /// Sent by the audit sample (its item was auto-accepted or rejected).
    pub audit: bool,
    /// Made on evidence `docket import --update` replaced since (a decided
    /// one keeps its decision).
    pub stale: bool,
}

/// An earlier suggestion a review item superseded: kept in the ledger as
/// history, named on the newer one's card. Texts as stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplacedSuggestion {
    pub review_id: i64,
    pub session_id: Option<String>,
    /// The suggestion as compact JSON.
    pub suggestion: String,
    pub confidence: Option<f64>,
    pub created_at: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_parse_partially_and_reject_garbage() {
        let g = LiveGauges::from_json(r#"{"in_flight":3,"stage":"adjudicate","eta_secs":12.5}"#);
        let g = g.expect("parses");
        assert_eq!(g.in_flight, 3);
        assert_eq!(g.eta_secs, Some(12.5));
        assert_eq!(g.rpm_limit, 0);
        assert!(LiveGauges::from_json("{not json").is_none());
        assert!(LiveGauges::from_json("42").is_none());
        assert!(LiveGauges::from_json("[1,2]").is_none());
        assert!(LiveGauges::from_json(r#"{"in_flight":"many"}"#).is_none());
    }
}
