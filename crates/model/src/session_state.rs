//! A session's state as every view names it: the console's header, its
//! stage rows and sessions pane, and `docket sessions` all call
//! [`shown_state`] on what the ledger holds, so they can never disagree.
//!
//! The ledger stores what the engine last wrote (`state`), what an operator
//! asked (`desired_state`, `stop_after_stage`) and when an engine last beat
//! (`heartbeat_at`). None of them alone says what the run is doing: an
//! engine killed with `kill -9` leaves `running` behind, and a pause asked a
//! moment ago is not yet obeyed. The derivation here weighs them together.

/// Whether an engine is there to act on the session, from its heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// A heartbeat younger than the liveness window: an engine runs it.
    Live,
    /// A heartbeat older than the window: its engine died (killed, the
    /// machine went down) without letting go of the session.
    Gone,
    /// No heartbeat: the engine let go of the session when it stopped (or
    /// none ever ran it).
    Released,
}

impl Engine {
    /// From the session's newest heartbeat (unix seconds), the time now and
    /// how fresh a heartbeat must be to count as a live engine.
    pub fn from_heartbeat(heartbeat_at: Option<f64>, now: f64, live_window_secs: f64) -> Engine {
        match heartbeat_at {
            None => Engine::Released,
            Some(h) if h >= now - live_window_secs => Engine::Live,
            Some(_) => Engine::Gone,
        }
    }
}

/// What the ledger holds about a session's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateFacts<'a> {
    /// `llm_batch_session.state`, as the engine last wrote it.
    pub stored: &'a str,
    /// `llm_batch_session.desired_state`, as an operator last asked.
    pub desired: &'a str,
    /// An operator asked the engine to stop after the stage it is in.
    pub stop_after_stage: bool,
    pub engine: Engine,
}

/// The one vocabulary of session states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShownState {
    Running,
    /// Asked to pause; the engine has not stopped sending yet.
    Pausing,
    Paused,
    /// Asked to stop after the stage it is in; that stage runs on.
    StoppingAtStage,
    /// Asked to cancel; the engine is still winding down.
    Cancelling,
    Cancelled,
    /// Left `running` or `paused` by an engine that is gone: resumable.
    Interrupted,
    Completed,
    /// Stopped by an error (stored as `error`): resumable.
    Failed,
    /// A stored state this version does not know (a newer docket wrote it).
    Unknown,
}

/// Every state, in the order a legend lists them.
pub const ALL_STATES: [ShownState; 10] = [
    ShownState::Running,
    ShownState::Pausing,
    ShownState::Paused,
    ShownState::StoppingAtStage,
    ShownState::Cancelling,
    ShownState::Cancelled,
    ShownState::Interrupted,
    ShownState::Completed,
    ShownState::Failed,
    ShownState::Unknown,
];

/// The longest state word, in characters: a column this wide never cuts one.
pub const LONGEST_WORD: usize = "stopping at stage".len();

impl ShownState {
    /// The state's word, lower case.
    pub fn word(self) -> &'static str {
        match self {
            ShownState::Running => "running",
            ShownState::Pausing => "pausing",
            ShownState::Paused => "paused",
            ShownState::StoppingAtStage => "stopping at stage",
            ShownState::Cancelling => "cancelling",
            ShownState::Cancelled => "cancelled",
            ShownState::Interrupted => "interrupted",
            ShownState::Completed => "completed",
            ShownState::Failed => "failed",
            ShownState::Unknown => "unknown",
        }
    }

    /// A one-character glyph, so the state reads without colour.
    pub fn glyph(self) -> &'static str {
        match self {
            ShownState::Running => "▶",
            ShownState::Pausing | ShownState::Paused => "⏸",
            ShownState::StoppingAtStage => "⏹",
            ShownState::Cancelling | ShownState::Cancelled => "■",
            ShownState::Interrupted => "◌",
            ShownState::Completed => "✓",
            ShownState::Failed => "!",
            ShownState::Unknown => "?",
        }
    }

    /// An engine is working the session now (sending, or winding down).
    pub fn is_active(self) -> bool {
        matches!(
            self,
            ShownState::Running
                | ShownState::Pausing
                | ShownState::StoppingAtStage
                | ShownState::Cancelling
        )
    }
}

/// The session's state from what the ledger holds.
///
/// - No live engine: `running` or `paused` left behind by an engine that
///   died (a stale heartbeat) is **interrupted**, as is `running` with no
///   engine at all (nothing is sending); `paused` let go of cleanly stays
///   paused. An operator's wish cannot be obeyed without an engine, so it
///   does not change the word.
/// - A live engine: a wish it has not obeyed yet names the state
///   (cancelling, pausing, stopping at stage); else the stored state does.
/// - `completed` and `cancelled` are final whatever else is stored; `error`
///   reads **failed**.
pub fn shown_state(f: StateFacts<'_>) -> ShownState {
    let live = f.engine == Engine::Live;
    match f.stored {
        "completed" => ShownState::Completed,
        "cancelled" => ShownState::Cancelled,
        "error" => ShownState::Failed,
        "running" | "paused" if f.engine == Engine::Gone => ShownState::Interrupted,
        "running" if !live => ShownState::Interrupted,
        "paused" if !live => ShownState::Paused,
        "running" | "paused" if f.desired == "cancelled" => ShownState::Cancelling,
        "running" if f.desired == "paused" => ShownState::Pausing,
        "running" if f.stop_after_stage => ShownState::StoppingAtStage,
        "running" => ShownState::Running,
        // A resume asked of a live paused engine takes effect within a
        // second; until then it is still paused.
        "paused" => ShownState::Paused,
        _ => ShownState::Unknown,
    }
}

/// A stage row's word: `done` and `pending` stages say so; the stage being
/// worked (and, once the session stopped, every stage not done) carries the
/// session's word, so a paused session's stage reads paused, never running.
/// `stage_state` is the checkpoint's (`pending`, `running`, `done`).
pub fn stage_word(stage_state: &str, session: ShownState) -> &'static str {
    match stage_state {
        "done" => "done",
        "pending" if session.is_active() => "pending",
        _ => session.word(),
    }
}

#[cfg(test)]
mod tests;
