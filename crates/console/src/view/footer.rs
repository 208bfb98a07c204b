//! The footer: mode, badges, the most useful keys for the focused pane (from
//! the live keymap), and the latest message. A message too long for one row
//! is never cut: the footer grows, the message word-wrapped onto the rows
//! above the panes' bottom (a session id in it stays whole), and the key
//! hints step aside until the next key clears it.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::styled;
use super::wrap::{cells, wrap_line};
use crate::action::Action;
use crate::app::{App, Mode, Overlay, Pane};
use crate::keymap::Section;
use crate::theme::Theme;
use docket_model::sanitize::truncate;

/// The most rows the footer takes for a long message: a third of the screen.
pub(super) fn max_rows(screen_height: u16) -> u16 {
    (screen_height / 3).max(1)
}

/// The footer's rows for a screen `width` wide, at most `max_rows` of them
/// (the last one ends in `…` only when even that many cannot hold it).
pub(super) fn footer_lines<'a>(
    app: &App,
    width: u16,
    max_rows: u16,
    theme: Theme,
) -> Vec<Line<'a>> {
    let line = footer_line(app, width, theme);
    let mut rows = wrap_line(line, usize::from(width));
    let max = usize::from(max_rows.max(1));
    if rows.len() > max {
        rows.truncate(max);
        if let Some(last) = rows.last_mut() {
            last.spans.push(Span::raw("…"));
            let text: String = last.spans.iter().map(|s| s.content.as_ref()).collect();
            if cells(&text) > usize::from(width) {
                *last = Line::from(truncate(&text, usize::from(width)));
            }
        }
    }
    rows
}

pub(super) fn draw_footer(frame: &mut Frame, area: Rect, lines: Vec<Line>) {
    frame.render_widget(Paragraph::new(lines), area);
}

/// The footer as one line, maybe wider than the screen (then wrapped).
fn footer_line<'a>(app: &App, width: u16, theme: Theme) -> Line<'a> {
    let mode = app.mode();
    let mut spans = vec![
        styled(format!(" {} ", mode.label()), theme.badge()),
        Span::raw(" "),
    ];
    if app.paused() {
        spans.push(styled(" PAUSED ", theme.alert_badge()));
        spans.push(Span::raw(" "));
    }
    if app.read_only {
        spans.push(styled(" READ-ONLY ", theme.alert_badge()));
        spans.push(Span::raw(" "));
    }
    if !app.marks.is_empty() {
        spans.push(styled(
            format!("{} marked ", app.marks.len()),
            theme.marked(),
        ));
    }
    match &app.overlay {
        Overlay::Filter(input) | Overlay::Command(input) => {
            let prefix = if mode == Mode::Filter { "/" } else { ":" };
            spans.push(Span::raw(format!(
                "{prefix}{}",
                docket_model::sanitize::for_terminal(input.value())
            )));
            spans.push(styled("▏", theme.key()));
        }
        _ => {
            // A PostgreSQL ledger down comes before all: what is shown is
            // as of its last answer until it is back.
            if let Some(down) = docket_ledger::db::unreachable() {
                spans.push(styled(
                    format!("{} │ ", docket_model::sanitize::for_terminal(&down)),
                    theme.warn(),
                ));
            }
            // The latest message comes first: it answers the last key, so it
            // must not be cut; the hints fill what is left, whole or not at all.
            if let Some(t) = &app.toast {
                spans.push(styled(format!("{t} │ "), theme.warn()));
            }
            let mut used: usize = spans.iter().map(|s| cells(&s.content)).sum();
            for (section, action, label) in hints(app) {
                if let Some(k) = app.keymap.first_key(section, action) {
                    let hint = format!(" {label}  ");
                    let hint_width = cells(&k) + cells(&hint);
                    if used + hint_width > usize::from(width) {
                        break;
                    }
                    used += hint_width;
                    spans.push(styled(k, theme.key()));
                    spans.push(Span::raw(hint));
                }
            }
        }
    }
    if let (Some(t), Overlay::Filter(_) | Overlay::Command(_)) = (&app.toast, &app.overlay) {
        spans.push(styled(format!("  │ {t}"), theme.warn()));
    }
    Line::from(spans)
}

/// The keys worth showing now, most useful first.
fn hints(app: &App) -> Vec<(Section, Action, &'static str)> {
    use Action as A;
    use Section::{Global as G, Review as R};
    match (&app.overlay, app.focus) {
        (
            Overlay::Help { .. }
            | Overlay::Batches { .. }
            | Overlay::Workers { .. }
            | Overlay::Event { .. },
            _,
        ) => vec![(G, A::Back, "close"), (G, A::Down, "scroll")],
        (Overlay::Charts { .. }, _) => vec![(G, A::Back, "close"), (G, A::FocusNext, "next chart")],
        (Overlay::Dialog(_), _) => Vec::new(),
        (Overlay::Correct(_), _) => Vec::new(),
        (Overlay::Detail { .. }, _) => vec![
            (R, A::Accept, "accept"),
            (R, A::Reject, "reject"),
            (R, A::Correct, "correct"),
            (R, A::Skip, "skip"),
            (R, A::Undo, "undo"),
            (G, A::Back, "back"),
            (G, A::Help, "help"),
        ],
        (_, Pane::Review) if !app.read_only => vec![
            (R, A::Accept, "accept"),
            (R, A::Reject, "reject"),
            (R, A::Skip, "skip"),
            (R, A::Undo, "undo"),
            (R, A::ToggleMark, "mark"),
            (G, A::Open, "detail"),
            (G, A::Filter, "filter"),
            (G, A::Help, "help"),
        ],
        (_, Pane::Events) => vec![
            (G, A::Open, "open"),
            (G, A::Filter, "filter"),
            (G, A::FocusNext, "next pane"),
            (G, A::Help, "help"),
            (G, A::Quit, "quit"),
        ],
        (_, Pane::Sessions) => vec![
            (G, A::Open, "watch"),
            (G, A::Filter, "filter"),
            (G, A::FocusNext, "next pane"),
            (G, A::Help, "help"),
            (G, A::Quit, "quit"),
        ],
        _ if app.read_only => vec![
            (G, A::FocusNext, "next pane"),
            (G, A::FocusReview, "review"),
            (G, A::Help, "help"),
            (G, A::Quit, "quit"),
        ],
        _ if app.snap.view.is_none() => vec![
            (G, A::FocusNext, "next pane"),
            (G, A::FocusReview, "review"),
            (G, A::CommandLine, "cmd"),
            (G, A::Help, "help"),
            (G, A::Quit, "quit"),
        ],
        _ => vec![
            (
                G,
                A::PauseResume,
                if app.paused() { "resume" } else { "pause" },
            ),
            (G, A::CancelRun, "cancel"),
            (G, A::FocusNext, "next pane"),
            (G, A::FocusReview, "review"),
            (G, A::CommandLine, "cmd"),
            (G, A::Help, "help"),
            (G, A::Quit, "quit"),
        ],
    }
}
