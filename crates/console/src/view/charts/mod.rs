//! The charts overlay: each stage's confidence histogram with the review
//! and auto-accept thresholds marked, sparklines of requests/s, 429s and
//! errors over the run, the spend against the estimate, and the
//! calibration (human agreement per confidence band). On a big terminal
//! the first three show at once and tab switches to the calibration; on a
//! small one (80x24) one chart fills the pane and tab / backtab switch it.
//! Nothing is said by colour alone: bands carry a glyph, thresholds a label.

mod calibration;
mod histogram;
mod timeline;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};

use crate::app::App;
use crate::theme::Theme;
use crate::view::{clock, styled};
use docket_ledger::watch::ChartData;
use docket_model::sanitize::truncate;

pub(super) use histogram::Thresholds;

/// The charts of the one-chart layout: confidence, rates, cost,
/// calibration.
pub const CHART_PAGES: usize = 4;
const PAGE_NAMES: [&str; CHART_PAGES] = ["confidence", "rates", "cost", "calibration"];
/// The calibration's page: on a big terminal the one page apart from the
/// others (which show at once).
pub const CALIBRATION_PAGE: usize = 3;

/// Every chart at once from this body size (120x40 leaves 37 rows).
fn shows_all(area: Rect) -> bool {
    area.width >= 110 && area.height >= 30
}

pub(in crate::view) fn draw_charts(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    page: usize,
    theme: Theme,
) {
    frame.render_widget(Clear, area);
    let all = shows_all(area);
    // The keys need it: tab on a big terminal goes straight between the
    // charts and the calibration.
    app.screen.charts_all.set(all);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(title(app, all, page), theme.title(true)));
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let Some(data) = app.snap.charts.as_ref().filter(|_| app.snap.view.is_some()) else {
        let text = if app.snap.view.is_none() {
            "no session to chart"
        } else {
            "reading the charts…"
        };
        frame.render_widget(Paragraph::new(styled(text, theme.dim())), inner);
        return;
    };
    let thresholds = Thresholds::of(app);
    let page = page % CHART_PAGES;
    if page == CALIBRATION_PAGE {
        calibration::draw(frame, inner, data, theme);
        return;
    }
    if all {
        let [left, right] =
            Layout::horizontal([Constraint::Percentage(60), Constraint::Percentage(40)])
                .areas(inner);
        histogram::draw_all(frame, left, data, &thresholds, theme);
        let [rates, cost] =
            Layout::vertical([Constraint::Min(9), Constraint::Length(8)]).areas(right);
        timeline::draw_rates(frame, rates, data, theme);
        timeline::draw_cost(frame, cost, app, data, theme);
        return;
    }
    match page {
        0 => histogram::draw_all(frame, inner, data, &thresholds, theme),
        1 => timeline::draw_rates(frame, inner, data, theme),
        _ => timeline::draw_cost(frame, inner, app, data, theme),
    }
}

/// ` Charts · SESSION · 12:34 of run · 1/4 confidence (tab: next) · Esc closes `,
/// the parts that fit.
fn title(app: &App, all: bool, page: usize) -> String {
    let mut parts = vec!["Charts".to_string()];
    if let Some(id) = app.session_id() {
        parts.push(truncate(id, 30));
    }
    if let Some(span) = app.snap.charts.as_ref().and_then(run_span) {
        parts.push(format!("{} of run", clock(span)));
    }
    let p = page % CHART_PAGES;
    if all {
        parts.push(if p == CALIBRATION_PAGE {
            "calibration (tab: charts)".to_string()
        } else {
            "tab: calibration".to_string()
        });
    } else {
        parts.push(format!(
            "{}/{CHART_PAGES} {} (tab: next)",
            p + 1,
            PAGE_NAMES[p]
        ));
    }
    parts.push("Esc closes".into());
    format!(" {} ", parts.join(" · "))
}

/// The seconds the time line covers, when it has any.
fn run_span(data: &ChartData) -> Option<f64> {
    let t = &data.timeline;
    (t.slice_secs > 0.0 && !t.sent.is_empty()).then_some(t.slice_secs * t.sent.len() as f64)
}

/// A chart's frame: a plain border and its title.
fn chart_block<'a>(title: String, theme: Theme) -> Block<'a> {
    Block::default()
        .borders(Borders::ALL)
        .border_style(theme.border(false))
        .title(Span::styled(title, theme.title(false)))
}

/// A line of dim text, cut to `width`.
fn note<'a>(text: &str, width: u16, theme: Theme) -> Line<'a> {
    Line::from(styled(
        truncate(text, usize::from(width).max(1)),
        theme.dim(),
    ))
}
