//! The console's state. Pure: keys and ledger snapshots go in, `Effect`s come
//! out as data for the runner to carry out, so every behaviour is testable
//! without a terminal or a ledger.

use std::collections::BTreeSet;

use tui_input::Input;

use super::keymap::{KeyPress, Keymap};

mod correction;
mod effect;
mod lists;
mod mode;
mod mouse;
mod screen;
pub use correction::CorrectionForm;
use docket_ledger::console::WorkerRow;
use docket_ledger::watch::{
    ChartData, Event, ProviderBatchRow, ProviderBatchSummary, ReviewDetail, ReviewPage,
    SessionSummary, SessionView, Tune,
};
pub use effect::Effect;
pub use mode::Mode;
pub use screen::{PREVIEW_MIN_HEIGHT, PREVIEW_MIN_WIDTH, Screen, preview_fits};

/// How many review rows the console keeps loaded around the cursor.
pub const REVIEW_WINDOW: u64 = 200;
/// Rejecting at least this many marked items at once asks first.
pub const BULK_CONFIRM: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Stages,
    Outcomes,
    Gauges,
    Events,
    Review,
    Sessions,
}

impl Pane {
    pub const ORDER: [Pane; 6] = [
        Pane::Stages,
        Pane::Outcomes,
        Pane::Gauges,
        Pane::Events,
        Pane::Review,
        Pane::Sessions,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Pane::Stages => "Stages",
            Pane::Outcomes => "Outcomes",
            Pane::Gauges => "Gauges",
            Pane::Events => "Events",
            Pane::Review => "Review queue",
            Pane::Sessions => "Sessions",
        }
    }

    pub fn number(self) -> usize {
        Pane::ORDER.iter().position(|p| *p == self).unwrap_or(0) + 1
    }

    /// The panes that hold a list (shown in the lower half on a small screen).
    pub fn is_list(self) -> bool {
        matches!(self, Pane::Events | Pane::Review | Pane::Sessions)
    }
}

/// A question the operator must answer before anything happens.
#[derive(Debug, Clone, PartialEq)]
pub enum Dialog {
    /// Cancel a session (not undoable; default No).
    CancelRun { session_id: String, pending: u64 },
    /// Reject many marked items at once.
    BulkReject { ids: Vec<i64> },
    /// Quit while a run started by this process is live.
    QuitLive,
}

/// What the console shows over the panes, if anything.
#[derive(Debug, Clone)]
pub enum Overlay {
    None,
    Help {
        scroll: u16,
    },
    Detail {
        scroll: u16,
    },
    /// The watched session's provider batches.
    Batches {
        scroll: u16,
    },
    /// The watched session's workers.
    Workers {
        scroll: u16,
    },
    /// The charts: all at once on a big terminal; on a small one the
    /// chart `page` (tab / backtab switch it).
    Charts {
        page: usize,
    },
    /// One event of the events pane in full (a copy: the pane moves on).
    Event {
        event: Box<Event>,
        scroll: u16,
    },
    Dialog(Dialog),
    Filter(Input),
    Command(Input),
    /// The correction form of a review item (another candidate, or its
    /// answer's fields edited).
    Correct(Box<CorrectionForm>),
}

/// How to leave the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuitChoice {
    /// Nothing of ours is running: just close.
    Close,
    /// Close the console; the run goes on with line output.
    KeepHeadless,
    /// Pause the run (in-flight requests finish), save it, exit.
    Pause,
    /// Cancel the run (resumable), exit.
    Cancel,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Control {
    Pause,
    Resume,
    StopAtStage,
    Cancel,
    Retune(Tune),
}

/// The latest read of the ledger.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub sessions: Vec<SessionSummary>,
    /// The watched session, when there is one.
    pub view: Option<SessionView>,
    pub events: Vec<Event>,
    pub review: ReviewPage,
    pub detail: Option<ReviewDetail>,
    /// The watched session's provider batches, open ones first.
    pub batches: Vec<ProviderBatchRow>,
    /// All of its provider batches, counted.
    pub batch_summary: ProviderBatchSummary,
    /// Every worker that worked on the watched session, newest first.
    pub workers: Vec<WorkerRow>,
    /// The watched session's charts, read only while they are shown.
    pub charts: Option<ChartData>,
    /// Ledger time of the read (unix seconds), for ages.
    pub now: f64,
}

impl Snapshot {
    /// The same ledger state, whatever the time of the read.
    pub fn same_data(&self, other: &Snapshot) -> bool {
        // A batch waiting for its next poll shows a countdown: a new second
        // is new data while one does.
        let ticking = |s: &Snapshot| {
            s.batches.iter().any(|b| {
                !docket_ledger::watch::is_terminal_state(&b.state) && b.next_poll_at.is_some()
            })
        };
        if (ticking(self) || ticking(other)) && self.now.floor() != other.now.floor() {
            return false;
        }
        // A gone worker's heartbeat age is drawn as `12s` or `3m`: only a
        // change in what is drawn is new data, so it does not redraw the
        // console every second. A live one beats every second or so, its
        // age always a second or two: only its going is news (`alive`).
        let drawn_ages = |s: &Snapshot| -> Vec<Option<String>> {
            s.workers
                .iter()
                .map(|w| (!w.alive).then(|| crate::human::human_secs(w.heartbeat_age_secs)))
                .collect()
        };
        if drawn_ages(self) != drawn_ages(other) {
            return false;
        }
        // The session heartbeat's age grows with every read and is not drawn.
        let timeless = |s: &Snapshot| {
            let mut s = s.clone();
            s.now = 0.0;
            if let Some(v) = s.view.as_mut() {
                v.heartbeat_age_secs = None;
            }
            for w in &mut s.workers {
                w.heartbeat_age_secs = 0.0;
            }
            s
        };
        timeless(self) == timeless(other)
    }
}

/// The console state.
pub struct App {
    pub keymap: Keymap,
    pub(super) pending_keys: Vec<KeyPress>,
    pub read_only: bool,
    pub focus: Pane,
    pub overlay: Overlay,
    pub snap: Snapshot,
    /// The session chosen in the sessions pane (None: follow the newest).
    pub chosen_session: Option<String>,
    /// The selected row of the (filtered) sessions list.
    pub sessions_cursor: usize,
    /// The selected row of the (filtered) events list.
    pub events_scroll: usize,
    /// Absolute index in the filtered pending queue.
    pub review_cursor: u64,
    /// The review item under the cursor, kept across refreshes.
    pub review_cursor_id: Option<i64>,
    pub marks: BTreeSet<i64>,
    /// The review queue's filter (a ledger search).
    pub filter: Option<String>,
    /// The events pane's filter.
    pub events_filter: Option<String>,
    /// The sessions pane's filter.
    pub sessions_filter: Option<String>,
    /// Review items an undo just made pending again: the cursor goes to the
    /// first of them the queue shows.
    pub(super) restored: Vec<i64>,
    /// A run this process started (the console opened on it).
    pub in_process_session: Option<String>,
    /// Its engine is still dispatching.
    pub in_process_live: bool,
    pub toast: Option<String>,
    pub quit: Option<QuitChoice>,
    /// Whether the first snapshot arrived (until then: "reading the ledger").
    pub loaded: bool,
    /// Claim requested for this id (to ask once per cursor move).
    pub(super) claimed: Option<i64>,
    /// Who this console is when it holds an item (`user@host:pid`); an
    /// item held by anyone else is not ours to decide.
    pub claimant: Option<String>,
    /// Where docket's log files are, for the help screen.
    pub log_files: Option<String>,
    /// The furthest an open overlay can scroll, as the last frame measured.
    pub scroll_max: std::cell::Cell<u16>,
    pub(super) detail_wanted: Option<i64>,
    /// The data side was told to read the charts.
    pub(super) charts_wanted: bool,
    /// The terminal's size, the mouse, and where the panes were drawn.
    pub screen: Screen,
    /// The job's `[review]` templates (queue summary, card), if any.
    pub review_templates: Option<std::sync::Arc<docket_model::review_card::ReviewTemplates>>,
}

impl App {
    pub fn new(keymap: Keymap, read_only: bool) -> App {
        App {
            keymap,
            pending_keys: Vec::new(),
            read_only,
            focus: Pane::Stages,
            overlay: Overlay::None,
            snap: Snapshot::default(),
            chosen_session: None,
            sessions_cursor: 0,
            events_scroll: 0,
            review_cursor: 0,
            review_cursor_id: None,
            marks: BTreeSet::new(),
            filter: None,
            events_filter: None,
            sessions_filter: None,
            restored: Vec::new(),
            in_process_session: None,
            in_process_live: false,
            toast: None,
            quit: None,
            loaded: false,
            claimed: None,
            claimant: None,
            log_files: None,
            scroll_max: std::cell::Cell::new(0),
            detail_wanted: None,
            charts_wanted: false,
            screen: Screen::default(),
            review_templates: None,
        }
    }

    pub fn mode(&self) -> Mode {
        match &self.overlay {
            Overlay::None => Mode::Normal,
            Overlay::Help { .. } => Mode::Help,
            Overlay::Detail { .. } => Mode::Detail,
            Overlay::Correct(_) => Mode::Correct,
            Overlay::Batches { .. } => Mode::Batches,
            Overlay::Workers { .. } => Mode::Workers,
            Overlay::Charts { .. } => Mode::Charts,
            Overlay::Event { .. } => Mode::Event,
            Overlay::Dialog(_) => Mode::Confirm,
            Overlay::Filter(_) => Mode::Filter,
            Overlay::Command(_) => Mode::Command,
        }
    }

    /// The effects to run when the console opens.
    pub fn start(&mut self) -> Vec<Effect> {
        vec![
            Effect::Watch(self.chosen_session.clone()),
            Effect::Query(self.review_query()),
        ]
    }

    /// The watched session's id, if any.
    pub fn session_id(&self) -> Option<&str> {
        self.snap.view.as_ref().map(|v| v.row.session_id.as_str())
    }

    /// Paused or pausing, as the header says it (`ShownState`): the footer's
    /// badge and the pause key agree with it (an interrupted session whose
    /// engine died paused is not shown as paused).
    pub fn paused(&self) -> bool {
        self.snap.view.as_ref().is_some_and(|v| {
            matches!(
                v.shown,
                docket_ledger::watch::ShownState::Paused
                    | docket_ledger::watch::ShownState::Pausing
            )
        })
    }

    pub fn review_query(&self) -> docket_ledger::watch::ReviewQuery {
        let offset = self.review_cursor.saturating_sub(REVIEW_WINDOW / 2);
        docket_ledger::watch::ReviewQuery {
            filter: self.filter.clone(),
            session: None,
            offset,
            limit: REVIEW_WINDOW,
        }
    }

    /// The review row under the cursor, when loaded.
    pub fn cursor_row(&self) -> Option<&docket_ledger::watch::ReviewRow> {
        let page = &self.snap.review;
        let idx = self.review_cursor.checked_sub(page.offset)?;
        page.rows.get(usize::try_from(idx).ok()?)
    }

    /// A new ledger read. Keeps the cursor on the same item when it is still
    /// pending; when it left the queue (decided here or elsewhere), the
    /// cursor stays at its position, which is the next item: auto-advance.
    pub fn apply_snapshot(&mut self, snap: Snapshot) -> Vec<Effect> {
        self.loaded = true;
        self.snap = snap;
        let total = self.snap.review.total;
        let restored = self
            .snap
            .review
            .rows
            .iter()
            .find(|r| self.restored.contains(&r.review_id))
            .map(|r| r.review_id);
        if restored.is_some() {
            self.review_cursor_id = restored;
            self.restored.clear();
        }
        if let Some(id) = self.review_cursor_id
            && let Some(i) = self.snap.review.rows.iter().position(|r| r.review_id == id)
        {
            self.review_cursor = self.snap.review.offset + i as u64;
        }
        if total == 0 {
            self.review_cursor = 0;
        } else if self.review_cursor >= total {
            self.review_cursor = total - 1;
        }
        // Marks outside the loaded window are kept (the operator marked
        // them and moved on); one decided meanwhile by someone else is
        // skipped, and said so, when the bulk action runs. An empty queue
        // has nothing left to mark.
        if self.snap.review.total == 0 {
            self.marks.clear();
        }
        self.clamp_list_cursors();
        self.after_cursor_move()
    }

    /// Keep the loaded window, the claim and the detail on the cursor.
    pub(super) fn after_cursor_move(&mut self) -> Vec<Effect> {
        let mut fx = Vec::new();
        let page = &self.snap.review;
        let loaded_end = page.offset + page.rows.len() as u64;
        let outside = self.review_cursor < page.offset
            || (self.review_cursor >= loaded_end && loaded_end < page.total);
        if outside {
            fx.push(Effect::Query(self.review_query()));
        }
        let id = self.cursor_row().map(|r| r.review_id);
        if !outside {
            self.review_cursor_id = id;
        }
        let wants_claim = !self.read_only && self.focus == Pane::Review;
        let claim = if wants_claim { id } else { None };
        if claim != self.claimed && !outside {
            self.claimed = claim;
            fx.push(Effect::Claim(claim));
        }
        // The detail view and the preview show the same item card.
        let detail = match self.overlay {
            Overlay::Detail { .. } | Overlay::Correct(_) => id,
            _ if self.preview_shown() => id,
            _ => None,
        };
        if detail != self.detail_wanted && !outside {
            self.detail_wanted = detail;
            if let Overlay::Detail { scroll } = &mut self.overlay {
                *scroll = 0;
            }
            fx.push(Effect::Detail(detail));
        }
        // The charts' data is read only while they are on screen.
        let charts = matches!(self.overlay, Overlay::Charts { .. });
        if charts != self.charts_wanted {
            self.charts_wanted = charts;
            fx.push(Effect::Charts(charts));
        }
        fx
    }

    /// The holder of an item when it is someone else (a live lease).
    pub fn held_by_other<'a>(&self, claimed_by: Option<&'a str>) -> Option<&'a str> {
        claimed_by.filter(|who| self.claimant.as_deref() != Some(*who))
    }

    pub fn set_toast(&mut self, text: impl Into<String>) {
        self.toast = Some(docket_model::sanitize::for_terminal(&text.into()));
    }

    /// An undo made these review items pending again: the cursor goes to
    /// the first of them the queue shows, as soon as a read shows it.
    pub fn undone(&mut self, review_ids: Vec<i64>) -> Vec<Effect> {
        self.restored = review_ids;
        let found = self
            .snap
            .review
            .rows
            .iter()
            .position(|r| self.restored.contains(&r.review_id));
        match found {
            Some(i) => {
                self.review_cursor = self.snap.review.offset + i as u64;
                self.review_cursor_id = None;
                self.restored.clear();
                self.after_cursor_move()
            }
            None => Vec::new(),
        }
    }
}
