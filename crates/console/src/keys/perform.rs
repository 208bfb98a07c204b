//! What each action does to the console's state, and the effects it asks
//! the data side for.

use tui_input::Input;

use crate::action::Action;
use crate::app::{App, BULK_CONFIRM, Control, Dialog, Effect, Overlay, Pane, QuitChoice};
use crate::cmdline;

impl App {
    /// Carry out one action (from a key or from the `:` line).
    pub fn perform(&mut self, action: Action) -> Vec<Effect> {
        use Action as A;
        match action {
            A::Up | A::Down | A::Top | A::Bottom | A::PageUp | A::PageDown => {
                self.move_cursor(action)
            }
            A::FocusNext | A::FocusPrev if matches!(self.overlay, Overlay::Charts { .. }) => {
                self.chart_step(action == A::FocusNext)
            }
            A::FocusNext | A::FocusPrev => self.focus_step(action == A::FocusNext),
            A::FocusStages => self.focus_on(Pane::Stages),
            A::FocusOutcomes => self.focus_on(Pane::Outcomes),
            A::FocusGauges => self.focus_on(Pane::Gauges),
            A::FocusEvents => self.focus_on(Pane::Events),
            A::FocusReview => self.focus_on(Pane::Review),
            A::FocusSessions => self.focus_on(Pane::Sessions),
            A::Open => self.open(),
            A::Back => self.back(),
            A::Filter => self.open_filter(),
            A::Help | A::Batches | A::Workers => self.toggle_overlay(action),
            A::Charts => self.toggle_charts(),
            A::CommandLine => {
                self.overlay = Overlay::Command(Input::default());
                Vec::new()
            }
            A::Quit | A::ForceQuit => self.quit_asked(),
            A::Accept | A::Reject => self.decide(action == A::Accept),
            A::Skip => {
                if self.in_queue() {
                    self.move_review_cursor(1)
                } else {
                    Vec::new()
                }
            }
            A::Undo => self.undo(),
            A::Correct if self.in_queue() || matches!(self.overlay, Overlay::Detail { .. }) => {
                self.open_correction()
            }
            A::Correct => Vec::new(),
            A::ToggleMark => self.toggle_mark(),
            A::MarkAll => {
                // The footer and the queue's title count the marks: no
                // toast to say it a third time.
                self.marks = self.snap.review.rows.iter().map(|r| r.review_id).collect();
                Vec::new()
            }
            A::ClearMarks => {
                self.marks.clear();
                Vec::new()
            }
            A::NextMatch if self.in_queue() => self.move_review_cursor(1),
            A::PrevMatch if self.in_queue() => self.move_review_cursor(-1),
            A::NextMatch | A::PrevMatch => Vec::new(),
            A::PauseResume => {
                let resume = self.paused();
                self.control(if resume {
                    Control::Resume
                } else {
                    Control::Pause
                })
            }
            A::StopAtStage => self.control(Control::StopAtStage),
            A::CancelRun => self.cancel_run_asked(),
            A::ConfirmYes
            | A::ConfirmNo
            | A::QuitKeep
            | A::QuitPause
            | A::QuitCancel
            | A::InputSubmit
            | A::InputCancel
            | A::InputComplete => Vec::new(),
        }
    }

    /// The next (or previous) pane in `Pane::ORDER`, wrapping around.
    fn focus_step(&mut self, forward: bool) -> Vec<Effect> {
        let i = self.focus.number() - 1;
        let n = Pane::ORDER.len();
        let next = if forward {
            (i + 1) % n
        } else {
            (i + n - 1) % n
        };
        self.focus_on(Pane::ORDER[next])
    }

    /// Open the charts, or close them (`after_cursor_move` tells the data
    /// side to start or stop reading them).
    fn toggle_charts(&mut self) -> Vec<Effect> {
        let open = !matches!(self.overlay, Overlay::Charts { .. });
        self.overlay = if open {
            Overlay::Charts { page: 0 }
        } else {
            Overlay::None
        };
        self.after_cursor_move()
    }

    /// The next (or previous) chart of the one-chart layout, wrapping; on
    /// a big terminal (every chart at once) the calibration or the charts.
    fn chart_step(&mut self, forward: bool) -> Vec<Effect> {
        let n = crate::view::CHART_PAGES;
        let cal = crate::view::CALIBRATION_PAGE;
        let all = self.screen.charts_all.get();
        if let Overlay::Charts { page } = &mut self.overlay {
            *page = if all {
                if *page % n == cal { 0 } else { cal }
            } else if forward {
                (*page + 1) % n
            } else {
                (*page + n - 1) % n
            };
        }
        Vec::new()
    }

    /// `/` filters the focused list (events, sessions); from any other
    /// pane it searches the review queue.
    fn open_filter(&mut self) -> Vec<Effect> {
        let mut fx = Vec::new();
        if !matches!(self.focus, Pane::Events | Pane::Sessions) {
            fx = self.focus_on(Pane::Review);
        }
        let current = self.filter_of(self.focus).unwrap_or_default().to_string();
        self.overlay = Overlay::Filter(Input::new(current));
        fx.extend(self.after_cursor_move());
        fx
    }

    /// Help, batches or workers: open it, or close it when it is open.
    fn toggle_overlay(&mut self, action: Action) -> Vec<Effect> {
        match action {
            Action::Help => {
                self.overlay = match self.overlay {
                    Overlay::Help { .. } => Overlay::None,
                    _ => Overlay::Help { scroll: 0 },
                };
                Vec::new()
            }
            Action::Batches => {
                self.overlay = match self.overlay {
                    Overlay::Batches { .. } => Overlay::None,
                    _ => Overlay::Batches { scroll: 0 },
                };
                self.after_cursor_move()
            }
            _ => {
                self.overlay = match self.overlay {
                    Overlay::Workers { .. } => Overlay::None,
                    _ => Overlay::Workers { scroll: 0 },
                };
                self.after_cursor_move()
            }
        }
    }

    fn undo(&mut self) -> Vec<Effect> {
        if self.read_only {
            self.set_toast("Read-only console: undo is off.");
            return Vec::new();
        }
        vec![Effect::Undo]
    }

    fn toggle_mark(&mut self) -> Vec<Effect> {
        if !self.in_queue() {
            return Vec::new();
        }
        if let Some(id) = self.cursor_row().map(|r| r.review_id) {
            if !self.marks.remove(&id) {
                self.marks.insert(id);
            }
            return self.move_review_cursor(1);
        }
        Vec::new()
    }

    /// Cancelling asks first: a dialog for a session still going, a toast
    /// when there is nothing to cancel.
    fn cancel_run_asked(&mut self) -> Vec<Effect> {
        if self.read_only {
            self.set_toast("Read-only console: run controls are off.");
            return Vec::new();
        }
        match &self.snap.view {
            Some(v) if v.row.state != "completed" => {
                self.overlay = Overlay::Dialog(Dialog::CancelRun {
                    session_id: v.row.session_id.clone(),
                    pending: v.row.total_count.saturating_sub(v.row.processed_count),
                });
            }
            Some(v) => self.set_toast(format!(
                "{} is completed: nothing to cancel.",
                v.row.session_id
            )),
            None => self.set_toast("No session to cancel."),
        }
        Vec::new()
    }

    fn focus_on(&mut self, pane: Pane) -> Vec<Effect> {
        self.focus = pane;
        self.after_cursor_move()
    }

    fn move_cursor(&mut self, action: crate::action::Action) -> Vec<Effect> {
        use Action as A;
        let page: i64 = 10;
        let delta = |len: i64, cur: i64| -> i64 {
            let to = match action {
                A::Up => cur - 1,
                A::Down => cur + 1,
                A::Top => 0,
                A::Bottom => len - 1,
                A::PageUp => cur - page,
                A::PageDown => cur + page,
                _ => cur,
            };
            to.clamp(0, (len - 1).max(0))
        };
        // Overlays scroll within what the last frame could show (set by the
        // view), so G lands on the last page, never on a blank box.
        let scroll_len = i64::from(self.scroll_max.get()) + 1;
        if let Overlay::Help { scroll }
        | Overlay::Detail { scroll }
        | Overlay::Batches { scroll }
        | Overlay::Workers { scroll }
        | Overlay::Event { scroll, .. } = &mut self.overlay
        {
            // In the detail view j/k scroll; the cursor moves with s/a/r.
            *scroll = delta(scroll_len, i64::from(*scroll)) as u16;
            return Vec::new();
        }
        match self.focus {
            Pane::Review => {
                let total = self.snap.review.total as i64;
                self.review_cursor = delta(total, self.review_cursor as i64) as u64;
                self.review_cursor_id = None;
                self.restored.clear();
                self.after_cursor_move()
            }
            Pane::Sessions => {
                let len = self.visible_sessions().len() as i64;
                self.sessions_cursor = delta(len, self.sessions_cursor as i64) as usize;
                Vec::new()
            }
            Pane::Events => {
                let len = self.visible_events().len() as i64;
                self.events_scroll = delta(len, self.events_scroll as i64) as usize;
                Vec::new()
            }
            _ => Vec::new(),
        }
    }

    fn open(&mut self) -> Vec<Effect> {
        match self.focus {
            Pane::Review if self.cursor_row().is_some() => {
                self.overlay = Overlay::Detail { scroll: 0 };
                self.detail_wanted = None;
                self.after_cursor_move()
            }
            Pane::Events => {
                if let Some(e) = self.visible_events().get(self.events_scroll) {
                    self.overlay = Overlay::Event {
                        event: Box::new((*e).clone()),
                        scroll: 0,
                    };
                }
                Vec::new()
            }
            Pane::Sessions => {
                let Some(s) = self.visible_sessions().get(self.sessions_cursor).copied() else {
                    return Vec::new();
                };
                let id = s.session_id.clone();
                self.chosen_session = Some(id.clone());
                self.set_toast(format!("Watching {id}"));
                self.focus = Pane::Stages;
                let mut fx = vec![Effect::Watch(Some(id))];
                fx.extend(self.after_cursor_move());
                fx
            }
            _ => Vec::new(),
        }
    }

    fn back(&mut self) -> Vec<Effect> {
        match self.overlay {
            Overlay::None => {}
            _ => {
                self.overlay = Overlay::None;
                return self.after_cursor_move();
            }
        }
        // Esc clears the focused list's filter first, then the queue's.
        if self.filter_of(self.focus).is_some() {
            return self.set_filter(None);
        }
        if self.filter.is_some() {
            return self.set_filter_of(Pane::Review, None);
        }
        if !self.marks.is_empty() {
            self.marks.clear();
        }
        Vec::new()
    }

    fn quit_asked(&mut self) -> Vec<Effect> {
        if self.in_process_live && !self.read_only {
            self.overlay = Overlay::Dialog(Dialog::QuitLive);
            return Vec::new();
        }
        let choice = if self.in_process_live {
            QuitChoice::KeepHeadless
        } else {
            QuitChoice::Close
        };
        self.quit = Some(choice);
        vec![Effect::Quit(choice)]
    }

    /// The review queue has the keys: focused with nothing over it, or the
    /// detail of its cursor item open.
    fn in_queue(&self) -> bool {
        match self.overlay {
            Overlay::Detail { .. } => true,
            Overlay::None => self.focus == Pane::Review,
            _ => false,
        }
    }

    /// Move the review cursor by `delta`, whatever overlay is open (skip and
    /// mark move on in the detail view too).
    pub(crate) fn move_review_cursor(&mut self, delta: i64) -> Vec<Effect> {
        let total = self.snap.review.total as i64;
        let to = (self.review_cursor as i64 + delta).clamp(0, (total - 1).max(0));
        self.review_cursor = to as u64;
        self.review_cursor_id = None;
        self.restored.clear();
        self.after_cursor_move()
    }

    fn decide(&mut self, accept: bool) -> Vec<Effect> {
        if !self.in_queue() {
            return Vec::new();
        }
        if self.read_only {
            self.set_toast("Read-only console: decisions are off.");
            return Vec::new();
        }
        let ids: Vec<i64> = if self.marks.is_empty() {
            match self.cursor_row() {
                Some(r) if self.held_by_other(r.claimed_by.as_deref()).is_some() => {
                    let who = r.claimed_by.clone().unwrap_or_default();
                    self.set_toast(format!("{} is held by {who}", r.item_id));
                    return Vec::new();
                }
                Some(r) => vec![r.review_id],
                None => return Vec::new(),
            }
        } else {
            self.marks.iter().copied().collect()
        };
        if !accept && ids.len() >= BULK_CONFIRM {
            self.overlay = Overlay::Dialog(Dialog::BulkReject { ids });
            return Vec::new();
        }
        let single = self.marks.is_empty();
        self.marks.clear();
        let mut fx = if accept {
            vec![Effect::Accept(ids)]
        } else {
            vec![Effect::Reject(ids)]
        };
        if single {
            // Auto-advance now, not when the ledger answers: a quick second
            // key must land on the next item, not on the one just decided.
            fx.extend(self.move_review_cursor(1));
        }
        fx
    }

    pub(crate) fn control(&mut self, control: Control) -> Vec<Effect> {
        if self.read_only {
            self.set_toast("Read-only console: run controls are off.");
            return Vec::new();
        }
        let Some(v) = &self.snap.view else {
            self.set_toast("No session to control.");
            return Vec::new();
        };
        if v.row.state == "completed" {
            let id = v.row.session_id.clone();
            self.set_toast(format!("{id} is completed."));
            return Vec::new();
        }
        if !v.live {
            // Nothing would obey: say what will.
            let id = v.row.session_id.clone();
            self.set_toast(format!(
                "No engine runs {id} now; continue it with `docket batch-adjudicate --resume {id}`"
            ));
            return Vec::new();
        }
        vec![Effect::Control {
            session_id: v.row.session_id.clone(),
            control,
        }]
    }

    pub(super) fn run_command(&mut self, text: &str) -> Vec<Effect> {
        match cmdline::parse(text) {
            Ok(cmdline::Command::Action(a)) => self.perform(a),
            Ok(cmdline::Command::Control(c)) => self.control(c),
            Ok(cmdline::Command::Session(id)) => {
                if self.snap.sessions.iter().any(|s| s.session_id == id) {
                    self.chosen_session = Some(id.clone());
                    self.set_toast(format!("Watching {id}"));
                    vec![Effect::Watch(Some(id))]
                } else {
                    self.set_toast(format!("No session {id}"));
                    Vec::new()
                }
            }
            Ok(cmdline::Command::Export { what, format, path }) => {
                vec![Effect::Export {
                    session: self.session_id().map(str::to_string),
                    what,
                    format,
                    path,
                }]
            }
            Ok(cmdline::Command::Nothing) => Vec::new(),
            Err(e) => {
                self.set_toast(e.to_string());
                Vec::new()
            }
        }
    }
}
