//! Every command the console understands, independent of the key that
//! triggers it. `keymap` maps keys to these; the app maps these to effects.

use serde::{Deserialize, Serialize};

/// One user-level command of the console.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Move the selection up one row.
    Up,
    /// Move the selection down one row.
    Down,
    /// Jump to the first row.
    Top,
    /// Jump to the last row.
    Bottom,
    /// Scroll up one page.
    PageUp,
    /// Scroll down one page.
    PageDown,
    /// Focus the next pane.
    FocusNext,
    /// Focus the previous pane.
    FocusPrev,
    /// Focus the stages pane.
    FocusStages,
    /// Focus the outcomes pane.
    FocusOutcomes,
    /// Focus the gauges pane.
    FocusGauges,
    /// Focus the events pane.
    FocusEvents,
    /// Focus the review queue.
    FocusReview,
    /// Focus the sessions pane.
    FocusSessions,
    /// Open the selected row (Enter).
    Open,
    /// Close an overlay, clear the filter or leave a mode; never quits.
    Back,
    /// Start typing a filter for the focused list.
    Filter,
    /// Show the key help overlay.
    Help,
    /// Open the `:` command line.
    CommandLine,
    /// Quit the console (the run keeps going).
    Quit,
    /// Quit (ctrl-c): as quit; pressed again in the quit dialog of a live
    /// run, it cancels the run (resumable), as ctrl-c does headless.
    ForceQuit,
    /// Accept the suggestion for the selected (or marked) items.
    Accept,
    /// Reject the suggestion for the selected (or marked) items.
    Reject,
    /// Correct the answer of the selected item (another candidate, or its
    /// fields edited) and accept that.
    Correct,
    /// Skip the selected item for now.
    Skip,
    /// Undo the last review decision.
    Undo,
    /// Mark or unmark the selected item.
    ToggleMark,
    /// Mark every item in the (filtered) queue.
    MarkAll,
    /// Clear all marks.
    ClearMarks,
    /// Pause or resume the run.
    PauseResume,
    /// Let the run finish the current stage, then stop.
    StopAtStage,
    /// Cancel the run (asks for confirmation).
    CancelRun,
    /// Show the watched session's provider batches.
    Batches,
    /// Show the watched session's workers.
    Workers,
    /// Show the charts (confidence histogram per stage, rates, cost).
    Charts,
    /// Answer yes in a confirmation dialog.
    ConfirmYes,
    /// Answer no in a confirmation dialog.
    ConfirmNo,
    /// Quitting with a live run: close the console, keep the run going headless.
    QuitKeep,
    /// Quitting with a live run: pause it (in-flight requests finish), save, exit.
    QuitPause,
    /// Quitting with a live run: cancel it (resumable), save, exit.
    QuitCancel,
    /// Submit the text being typed (filter or command line).
    InputSubmit,
    /// Abandon the text being typed.
    InputCancel,
    /// Complete the word being typed.
    InputComplete,
    /// Jump to the next item matching the filter.
    NextMatch,
    /// Jump to the previous item matching the filter.
    PrevMatch,
}

impl Action {
    /// Every action, in help order.
    pub const ALL: &[Action] = &[
        Action::Up,
        Action::Down,
        Action::Top,
        Action::Bottom,
        Action::PageUp,
        Action::PageDown,
        Action::FocusNext,
        Action::FocusPrev,
        Action::FocusStages,
        Action::FocusOutcomes,
        Action::FocusGauges,
        Action::FocusEvents,
        Action::FocusReview,
        Action::FocusSessions,
        Action::Open,
        Action::Back,
        Action::Filter,
        Action::Help,
        Action::CommandLine,
        Action::Quit,
        Action::ForceQuit,
        Action::Accept,
        Action::Reject,
        Action::Correct,
        Action::Skip,
        Action::Undo,
        Action::ToggleMark,
        Action::MarkAll,
        Action::ClearMarks,
        Action::PauseResume,
        Action::StopAtStage,
        Action::CancelRun,
        Action::Batches,
        Action::Workers,
        Action::Charts,
        Action::ConfirmYes,
        Action::ConfirmNo,
        Action::QuitKeep,
        Action::QuitPause,
        Action::QuitCancel,
        Action::InputSubmit,
        Action::InputCancel,
        Action::InputComplete,
        Action::NextMatch,
        Action::PrevMatch,
    ];

    /// The snake_case name used in `keymap.toml` (same as the serde name).
    pub fn name(self) -> &'static str {
        match self {
            Action::Up => "up",
            Action::Down => "down",
            Action::Top => "top",
            Action::Bottom => "bottom",
            Action::PageUp => "page_up",
            Action::PageDown => "page_down",
            Action::FocusNext => "focus_next",
            Action::FocusPrev => "focus_prev",
            Action::FocusStages => "focus_stages",
            Action::FocusOutcomes => "focus_outcomes",
            Action::FocusGauges => "focus_gauges",
            Action::FocusEvents => "focus_events",
            Action::FocusReview => "focus_review",
            Action::FocusSessions => "focus_sessions",
            Action::Open => "open",
            Action::Back => "back",
            Action::Filter => "filter",
            Action::Help => "help",
            Action::CommandLine => "command_line",
            Action::Quit => "quit",
            Action::ForceQuit => "force_quit",
            Action::Accept => "accept",
            Action::Reject => "reject",
            Action::Correct => "correct",
            Action::Skip => "skip",
            Action::Undo => "undo",
            Action::ToggleMark => "toggle_mark",
            Action::MarkAll => "mark_all",
            Action::ClearMarks => "clear_marks",
            Action::PauseResume => "pause_resume",
            Action::StopAtStage => "stop_at_stage",
            Action::CancelRun => "cancel_run",
            Action::Batches => "batches",
            Action::Workers => "workers",
            Action::Charts => "charts",
            Action::ConfirmYes => "confirm_yes",
            Action::ConfirmNo => "confirm_no",
            Action::QuitKeep => "quit_keep",
            Action::QuitPause => "quit_pause",
            Action::QuitCancel => "quit_cancel",
            Action::InputSubmit => "input_submit",
            Action::InputCancel => "input_cancel",
            Action::InputComplete => "input_complete",
            Action::NextMatch => "next_match",
            Action::PrevMatch => "prev_match",
        }
    }

    /// The action with this snake_case name, if any.
    pub fn from_name(name: &str) -> Option<Action> {
        Action::ALL.iter().copied().find(|a| a.name() == name)
    }

    /// Short help text for the `?` overlay.
    pub fn describe(self) -> &'static str {
        match self {
            Action::Up => "move up",
            Action::Down => "move down",
            Action::Top => "go to the top",
            Action::Bottom => "go to the bottom",
            Action::PageUp => "page up",
            Action::PageDown => "page down",
            Action::FocusNext => "focus the next pane",
            Action::FocusPrev => "focus the previous pane",
            Action::FocusStages => "focus stages",
            Action::FocusOutcomes => "focus outcomes",
            Action::FocusGauges => "focus gauges",
            Action::FocusEvents => "focus events",
            Action::FocusReview => "focus the review queue",
            Action::FocusSessions => "focus sessions",
            Action::Open => "open the selection",
            Action::Back => "close / clear filter / leave mode",
            Action::Filter => "filter the list",
            Action::Help => "show this help",
            Action::CommandLine => "command line",
            Action::Quit => "quit (asks first while this console runs a live session)",
            Action::ForceQuit => "quit as q does (asks first too); twice: cancel the run",
            Action::Accept => "accept the suggestion",
            Action::Reject => "reject the suggestion",
            Action::Correct => "correct the answer (candidate or fields), accept it",
            Action::Skip => "skip this item",
            Action::Undo => "undo the last decision (all of a bulk one)",
            Action::ToggleMark => "mark / unmark the item",
            Action::MarkAll => "mark all items",
            Action::ClearMarks => "clear all marks",
            Action::PauseResume => "pause / resume the run",
            Action::StopAtStage => "stop after this stage",
            Action::CancelRun => "cancel the run",
            Action::Batches => "list the provider batches",
            Action::Workers => "list the session's workers",
            Action::Charts => "charts: confidence, rates, cost, calibration (tab: next)",
            Action::ConfirmYes => "yes",
            Action::ConfirmNo => "no",
            Action::QuitKeep => "quit, keep the run going headless",
            Action::QuitPause => "quit, pause the run and save it",
            Action::QuitCancel => "quit, cancel the run (resumable)",
            Action::InputSubmit => "submit",
            Action::InputCancel => "cancel typing",
            Action::InputComplete => "complete",
            Action::NextMatch => "next match",
            Action::PrevMatch => "previous match",
        }
    }
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn name_round_trips_for_every_action() {
        for &a in Action::ALL {
            assert_eq!(Action::from_name(a.name()), Some(a), "{a:?}");
        }
        assert_eq!(Action::from_name("acept"), None);
        assert_eq!(Action::from_name(""), None);
    }

    #[test]
    fn names_match_serde_and_are_unique() {
        let mut seen = HashSet::new();
        for &a in Action::ALL {
            assert!(seen.insert(a.name()), "duplicate name {}", a.name());
            let json = serde_json::to_string(&a).unwrap();
            assert_eq!(json, format!("\"{}\"", a.name()));
            let back: Action = serde_json::from_str(&json).unwrap();
            assert_eq!(back, a);
            assert!(!a.describe().is_empty());
        }
        assert_eq!(Action::ALL.len(), 45);
    }
}
