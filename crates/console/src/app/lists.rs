//! The list panes' own filters (`/` on the events or sessions pane): what
//! each shows, and where its cursor may go. The review queue's filter is a
//! ledger search (`App::review_query`); these two filter what is loaded.

use super::{App, Pane};
use docket_ledger::watch::{Event, SessionSummary};

/// Whether `needle` occurs in any of `hay`, ignoring case.
fn matches<'a>(needle: &str, hay: impl IntoIterator<Item = &'a str>) -> bool {
    let needle = needle.to_lowercase();
    hay.into_iter().any(|h| h.to_lowercase().contains(&needle))
}

impl App {
    /// The events the events pane lists: all of them, or those whose
    /// message, kind or item matches its filter.
    pub fn visible_events(&self) -> Vec<&Event> {
        let Some(f) = self.events_filter.as_deref() else {
            return self.snap.events.iter().collect();
        };
        self.snap
            .events
            .iter()
            .filter(|e| {
                let item = e.item_id.as_deref().unwrap_or("");
                matches(f, [e.message.as_str(), e.kind.as_str(), item])
            })
            .collect()
    }

    /// The sessions the sessions pane lists: all, or those whose id, state
    /// or stop reason matches its filter.
    pub fn visible_sessions(&self) -> Vec<&SessionSummary> {
        let Some(f) = self.sessions_filter.as_deref() else {
            return self.snap.sessions.iter().collect();
        };
        self.snap
            .sessions
            .iter()
            .filter(|s| {
                let why = s.stop_reason.as_deref().unwrap_or("");
                matches(f, [s.session_id.as_str(), s.state.as_str(), why])
            })
            .collect()
    }

    /// The filter of `pane` (the review queue's for any pane without one).
    pub fn filter_of(&self, pane: Pane) -> Option<&str> {
        match pane {
            Pane::Events => self.events_filter.as_deref(),
            Pane::Sessions => self.sessions_filter.as_deref(),
            _ => self.filter.as_deref(),
        }
    }

    /// The events and sessions cursors inside their (filtered) lists.
    pub(super) fn clamp_list_cursors(&mut self) {
        let sessions = self.visible_sessions().len();
        if self.sessions_cursor >= sessions {
            self.sessions_cursor = sessions.saturating_sub(1);
        }
        let events = self.visible_events().len();
        if self.events_scroll >= events {
            self.events_scroll = events.saturating_sub(1);
        }
    }
}
