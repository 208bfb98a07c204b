//! Key handling: a key becomes an `Action` through the keymap (or goes to the
//! text input that has focus), and an action changes the state and returns
//! effects. No terminal, no ledger.

use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyEventKind};
use tui_input::Input;
use tui_input::backend::crossterm::EventHandler;

use super::action::Action;
use super::app::{App, Control, Dialog, Effect, Overlay, Pane, QuitChoice};
use super::cmdline;
use super::keymap::{KeyMatch, Section};

mod perform;

impl App {
    /// Handle one key press.
    pub fn handle_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        match &self.overlay {
            Overlay::Dialog(_) => return self.handle_dialog_key(key),
            Overlay::Filter(_) | Overlay::Command(_) => return self.handle_input_key(key),
            Overlay::Correct(_) => return self.handle_correction_key(key),
            _ => {}
        }
        let sections: &[Section] = match (&self.overlay, self.focus) {
            (
                Overlay::Help { .. }
                | Overlay::Batches { .. }
                | Overlay::Workers { .. }
                | Overlay::Charts { .. }
                | Overlay::Event { .. },
                _,
            ) => &[Section::Global],
            (Overlay::Detail { .. }, _) | (_, Pane::Review) => &[Section::Review, Section::Global],
            _ => &[Section::Global],
        };
        match self.keymap.resolve(sections, &mut self.pending_keys, key) {
            KeyMatch::Action(a) => {
                self.toast = None;
                self.perform(a)
            }
            KeyMatch::Pending | KeyMatch::Unbound => Vec::new(),
        }
    }

    fn handle_dialog_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        let Overlay::Dialog(dialog) = self.overlay.clone() else {
            return Vec::new();
        };
        let mut pending = Vec::new();
        let action =
            match self
                .keymap
                .resolve(&[Section::Confirm, Section::Global], &mut pending, key)
            {
                KeyMatch::Action(a) => Some(a),
                _ => None,
            };
        if dialog == Dialog::QuitLive {
            // The quit dialog offers three ways out ([confirm] quit_*).
            let choice = match action {
                Some(Action::QuitKeep) => Some(QuitChoice::KeepHeadless),
                Some(Action::QuitPause) => Some(QuitChoice::Pause),
                Some(Action::QuitCancel) => Some(QuitChoice::Cancel),
                // A second Ctrl-C means what it means headless: stop, resumable.
                Some(Action::ForceQuit) => Some(QuitChoice::Cancel),
                _ => None,
            };
            if let Some(c) = choice {
                self.overlay = Overlay::None;
                self.quit = Some(c);
                return vec![Effect::Quit(c)];
            }
            if matches!(action, Some(Action::ConfirmNo | Action::Back)) {
                self.overlay = Overlay::None;
            }
            return Vec::new();
        }
        match action {
            Some(Action::ConfirmYes) => {
                self.overlay = Overlay::None;
                match dialog {
                    Dialog::CancelRun { session_id, .. } => {
                        self.set_toast(format!("Cancelling {session_id}..."));
                        vec![Effect::Control {
                            session_id,
                            control: Control::Cancel,
                        }]
                    }
                    Dialog::BulkReject { ids } => {
                        self.marks.clear();
                        vec![Effect::Reject(ids)]
                    }
                    Dialog::QuitLive => Vec::new(),
                }
            }
            // Anything else is No: the safe answer is the default.
            Some(_) => {
                self.overlay = Overlay::None;
                self.set_toast("Not done.");
                Vec::new()
            }
            None if key.code == KeyCode::Enter => {
                self.overlay = Overlay::None;
                self.set_toast("Not done.");
                Vec::new()
            }
            None => Vec::new(),
        }
    }

    fn handle_input_key(&mut self, key: KeyEvent) -> Vec<Effect> {
        let mut pending = Vec::new();
        let action = match self.keymap.resolve(&[Section::Input], &mut pending, key) {
            KeyMatch::Action(a) => Some(a),
            _ => None,
        };
        let is_filter = matches!(self.overlay, Overlay::Filter(_));
        match action {
            Some(Action::InputSubmit) => {
                let text = self.input_value();
                self.overlay = Overlay::None;
                if is_filter {
                    // The filter stays; Esc in the list clears it.
                    Vec::new()
                } else {
                    self.run_command(&text)
                }
            }
            Some(Action::InputCancel) => {
                self.overlay = Overlay::None;
                if is_filter {
                    self.set_filter(None)
                } else {
                    Vec::new()
                }
            }
            Some(Action::InputComplete) => {
                if !is_filter {
                    let text = self.input_value();
                    let (completed, options) = cmdline::complete(&text, &self.snap.sessions);
                    if let Overlay::Command(input) = &mut self.overlay {
                        *input = Input::new(completed);
                    }
                    if options.len() > 1 {
                        self.set_toast(options.join("  "));
                    }
                }
                Vec::new()
            }
            _ => {
                let changed = match &mut self.overlay {
                    Overlay::Filter(input) | Overlay::Command(input) => input
                        .handle_event(&TermEvent::Key(key))
                        .is_some_and(|c| c.value),
                    _ => false,
                };
                if is_filter && changed {
                    let text = self.input_value();
                    self.set_filter(if text.is_empty() { None } else { Some(text) })
                } else {
                    Vec::new()
                }
            }
        }
    }

    fn input_value(&self) -> String {
        match &self.overlay {
            Overlay::Filter(i) | Overlay::Command(i) => i.value().to_string(),
            _ => String::new(),
        }
    }

    /// Filter the focused list: the events or sessions pane filters what
    /// it holds; any other pane's `/` is the review queue's search.
    pub(super) fn set_filter(&mut self, filter: Option<String>) -> Vec<Effect> {
        self.set_filter_of(self.focus, filter)
    }

    /// Set `pane`'s filter (the review queue's for a pane without one).
    pub(super) fn set_filter_of(&mut self, pane: Pane, filter: Option<String>) -> Vec<Effect> {
        match pane {
            Pane::Events => {
                self.events_filter = filter;
                self.events_scroll = 0;
                Vec::new()
            }
            Pane::Sessions => {
                self.sessions_filter = filter;
                self.sessions_cursor = 0;
                Vec::new()
            }
            _ => {
                self.filter = filter;
                self.review_cursor = 0;
                self.review_cursor_id = None;
                self.restored.clear();
                self.marks.clear();
                vec![Effect::Query(self.review_query())]
            }
        }
    }
}
