//! Drawing. Only reads the state; every string from items or models goes
//! through `sanitize` before it reaches a cell.

mod charts;
mod footer;
mod lists;
mod overlays;
mod panes;
mod preview;
mod session_columns;
mod workers;
mod wrap;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Paragraph};

use super::app::{App, Overlay, Pane};
use super::theme::Theme;

pub use charts::{CALIBRATION_PAGE, CHART_PAGES};

/// Below this the console says so instead of drawing a broken layout.
pub const MIN_WIDTH: u16 = 80;
pub const MIN_HEIGHT: u16 = 24;

/// A wide screen shows every pane at once; a small one shows the focused
/// list pane in the lower half.
fn is_wide(area: Rect) -> bool {
    area.width >= 110 && area.height >= 32
}

pub fn draw(frame: &mut Frame, app: &App, theme: Theme) {
    let area = frame.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        draw_too_small(frame, area, theme);
        return;
    }
    let footer_lines = footer::footer_lines(app, area.width, footer::max_rows(area.height), theme);
    let footer_rows = u16::try_from(footer_lines.len()).unwrap_or(1);
    let [header, body, footer_area] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(10),
        Constraint::Length(footer_rows),
    ])
    .areas(area);
    panes::draw_header(frame, header, app, theme);
    // Clicks go to what this frame draws (nothing, under the detail view).
    app.screen.areas.borrow_mut().clear();
    match &app.overlay {
        Overlay::Detail { scroll } => overlays::draw_detail(frame, body, app, *scroll, theme),
        // The form is drawn over the card it corrects.
        Overlay::Correct(_) => overlays::draw_detail(frame, body, app, 0, theme),
        _ => draw_dashboard(frame, body, app, theme),
    }
    footer::draw_footer(frame, footer_area, footer_lines);
    match &app.overlay {
        Overlay::Help { scroll } => overlays::draw_help(frame, body, app, *scroll, theme),
        Overlay::Batches { scroll } => overlays::draw_batches(frame, body, app, *scroll, theme),
        Overlay::Workers { scroll } => workers::draw_workers(frame, body, app, *scroll, theme),
        Overlay::Charts { page } => charts::draw_charts(frame, body, app, *page, theme),
        Overlay::Event { event, scroll } => {
            overlays::draw_event(frame, body, app, event, *scroll, theme)
        }
        Overlay::Dialog(d) => overlays::draw_dialog(frame, body, app, d, theme),
        Overlay::Correct(form) => overlays::draw_correction(frame, body, form, theme),
        _ => {}
    }
}

fn draw_dashboard(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let n = app.snap.view.as_ref().map_or(1, |v| v.stages.len());
    let compact = stages_compact(area, n);
    let stages_h = panes::stages_height(n, compact);
    let top_h = (stages_h + 6).max(10);
    if is_wide(area) {
        let [top, middle, bottom] = Layout::vertical([
            Constraint::Length(top_h),
            Constraint::Min(8),
            Constraint::Length(8),
        ])
        .areas(area);
        let [left, gauges] =
            Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(top);
        let [stages, outcomes] =
            Layout::vertical([Constraint::Length(stages_h), Constraint::Min(6)]).areas(left);
        draw_run_panes(frame, app, [stages, outcomes, gauges], compact, theme);
        if preview::shown(app, area) {
            // lazygit-style: the queue on the left, its cursor item's card
            // on the right; the events pane makes way while the queue has
            // the focus.
            let [review, card] =
                Layout::horizontal([Constraint::Percentage(45), Constraint::Percentage(55)])
                    .areas(middle);
            placed(app, Pane::Review, review);
            lists::draw_review(frame, review, app, theme);
            preview::draw_preview(frame, card, app, theme);
        } else {
            // On a very wide screen the events pane takes half: its rows are
            // messages, and a review row reads well in 80 columns.
            let events_pct = if area.width >= 160 { 50 } else { 40 };
            let [review, events] = Layout::horizontal([
                Constraint::Percentage(100 - events_pct),
                Constraint::Percentage(events_pct),
            ])
            .areas(middle);
            placed(app, Pane::Review, review);
            placed(app, Pane::Events, events);
            lists::draw_review(frame, review, app, theme);
            lists::draw_events(frame, events, app, theme);
        }
        placed(app, Pane::Sessions, bottom);
        lists::draw_sessions(frame, bottom, app, theme);
    } else {
        let [top, bottom] =
            Layout::vertical([Constraint::Length(top_h), Constraint::Min(5)]).areas(area);
        let [left, gauges] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(top);
        let [stages, outcomes] =
            Layout::vertical([Constraint::Length(stages_h), Constraint::Min(6)]).areas(left);
        draw_run_panes(frame, app, [stages, outcomes, gauges], compact, theme);
        // The lower half shows the focused list, the review queue otherwise.
        let shown = if app.focus.is_list() {
            app.focus
        } else {
            Pane::Review
        };
        placed(app, shown, bottom);
        match shown {
            Pane::Events => lists::draw_events(frame, bottom, app, theme),
            Pane::Sessions => lists::draw_sessions(frame, bottom, app, theme),
            _ => lists::draw_review(frame, bottom, app, theme),
        }
    }
}

/// The stages, outcomes and gauges panes, where the layout put them.
fn draw_run_panes(frame: &mut Frame, app: &App, areas: [Rect; 3], compact: bool, theme: Theme) {
    let [stages, outcomes, gauges] = areas;
    placed(app, Pane::Stages, stages);
    placed(app, Pane::Outcomes, outcomes);
    placed(app, Pane::Gauges, gauges);
    panes::draw_stages(frame, stages, app, compact, theme);
    panes::draw_outcomes(frame, outcomes, app, theme);
    panes::draw_gauges(frame, gauges, app, theme);
}

/// Remember where `pane` is drawn, for the mouse.
fn placed(app: &App, pane: Pane, area: Rect) {
    app.screen.areas.borrow_mut().push((pane, area));
}

/// Rows the list panes keep below the run panes, at least.
const LIST_ROWS: u16 = 8;

/// One row per stage when two each would squeeze the lists below
/// [`LIST_ROWS`] (four stages at 80x24; never one or two stages).
fn stages_compact(area: Rect, n: usize) -> bool {
    if n <= 2 {
        return false;
    }
    let top_h = (panes::stages_height(n, false) + 6).max(10);
    // The wide layout also keeps 8 rows for the sessions pane.
    let below = if is_wide(area) {
        LIST_ROWS + 8
    } else {
        LIST_ROWS
    };
    area.height < top_h + below
}

fn draw_too_small(frame: &mut Frame, area: Rect, theme: Theme) {
    let lines = vec![
        Line::from(Span::styled("docket: terminal too small", theme.error())),
        Line::from(format!(
            "need {MIN_WIDTH}x{MIN_HEIGHT}, have {}x{}",
            area.width, area.height
        )),
        Line::from("enlarge the window; q quits, p pauses"),
    ];
    frame.render_widget(Paragraph::new(lines), area);
}

/// A pane's frame: a double border and a bold, marked title when focused,
/// so focus shows without colour.
pub(super) fn pane_block<'a>(app: &App, pane: Pane, extra: String, theme: Theme) -> Block<'a> {
    let focused = app.focus == pane && matches!(app.overlay, Overlay::None | Overlay::Filter(_));
    let marker = if focused { "▶ " } else { "" };
    let title = format!(" {marker}{} {}{extra} ", pane.number(), pane.title());
    Block::default()
        .borders(Borders::ALL)
        .border_type(if focused {
            BorderType::Double
        } else {
            BorderType::Plain
        })
        .border_style(theme.border(focused))
        .title(Span::styled(title, theme.title(focused)))
}

/// `1:02:03` or `2:03`.
pub(super) fn clock(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, (s / 60) % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

pub(super) fn share(n: u64, total: u64) -> String {
    if total == 0 {
        "0.0%".into()
    } else {
        format!("{:.1}%", n as f64 * 100.0 / total as f64)
    }
}

pub(super) fn styled<'a>(text: impl Into<String>, style: Style) -> Span<'a> {
    Span::styled(text.into(), style)
}

/// Compact thousands: 1234567 → 1.23M.
pub(super) fn compact(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1}k", n / 1e3)
    } else {
        format!("{n:.0}")
    }
}

pub(super) use crate::human::human_secs;

/// The provider batches in one line, the most detailed form that fits
/// `width`; None when the session has no batches.
pub(super) fn batch_summary_text(
    s: &docket_ledger::watch::ProviderBatchSummary,
    width: usize,
) -> Option<String> {
    if s.total == 0 {
        return None;
    }
    let open = s.open_count();
    let unknown = s.in_state("unknown");
    let mut states: Vec<String> = s
        .open
        .iter()
        .map(|(state, n)| format!("{n} {}", docket_model::sanitize::truncate(state, 20)))
        .collect();
    if s.ingested > 0 {
        states.push(format!("{} ingested", s.ingested));
    }
    let states = states.join(" · ");
    let waiting = |word: &str| {
        if open > 0 {
            format!(" · {} {word}", s.lines_waiting)
        } else {
            String::new()
        }
    };
    let unknown_note = if unknown > 0 {
        format!(" · ⚠ {unknown} unknown")
    } else {
        String::new()
    };
    let candidates = [
        format!("batches {}: {states}{}", s.total, waiting("lines waiting")),
        format!("batches {}: {states}{}", s.total, waiting("waiting")),
        format!(
            "batches {}: {open} open{unknown_note}{}",
            s.total,
            waiting("waiting")
        ),
        format!("batches {}{unknown_note}{}", s.total, waiting("waiting")),
    ];
    let fits = candidates
        .iter()
        .find(|c| c.chars().count() <= width)
        .cloned();
    Some(fits.unwrap_or_else(|| docket_model::sanitize::truncate(&candidates[3], width.max(1))))
}
