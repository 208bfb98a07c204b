//! The confidence histogram of each stage: 20 bars of 0.05, each marked
//! with its routing band (✗ reject, ? review, ✓ accept) under it, and the
//! thresholds pointed at by name and value on the line below.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Bar, BarChart, BarGroup, Paragraph};

use super::{chart_block, note};
use crate::app::App;
use crate::theme::Theme;
use crate::view::{compact, styled};
use docket_ledger::watch::{CONFIDENCE_BINS, ChartData, StageHistogram, confidence_bin};
use docket_model::sanitize::{for_terminal, truncate};

/// Rows a histogram needs: its border, 3 of bars, the axis, the threshold
/// marks and the legend.
const MIN_ROWS: u16 = 8;

/// The routing thresholds the watched session ran with.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Thresholds {
    /// Review at or above this, reject below.
    pub review: Option<f64>,
    /// Auto-accept at or above this (already raised to `--min-confidence`).
    pub accept: Option<f64>,
}

impl Thresholds {
    /// From the session's config snapshot: the flags the run used, else
    /// docket.toml's `[routing]`.
    pub fn of(app: &App) -> Thresholds {
        let Some(v) = app.snap.view.as_ref().and_then(|v| {
            serde_json::from_str::<serde_json::Value>(&v.row.config_snapshot_json).ok()
        }) else {
            return Thresholds::default();
        };
        let (review, accept) = docket_model::routing::session_thresholds(&v);
        Thresholds { review, accept }
    }
}

#[derive(Clone, Copy)]
enum Band {
    Reject,
    Review,
    Accept,
}

/// A bin's band, by its lower edge (a bin a threshold cuts counts below it).
fn band(bin: usize, t: &Thresholds) -> Band {
    let lo = bin as f64 / CONFIDENCE_BINS as f64 + 1e-9;
    if t.accept.is_some_and(|a| lo >= a) {
        Band::Accept
    } else if t.review.is_none_or(|r| lo >= r) {
        Band::Review
    } else {
        Band::Reject
    }
}

fn band_look(b: Band, theme: Theme) -> (&'static str, ratatui::style::Style) {
    match b {
        Band::Reject => ("✗", theme.rejected()),
        Band::Review => ("?", theme.review()),
        Band::Accept => ("✓", theme.accepted()),
    }
}

/// Every stage's histogram, stacked; those that do not fit are named.
pub(super) fn draw_all(
    frame: &mut Frame,
    area: Rect,
    data: &ChartData,
    t: &Thresholds,
    theme: Theme,
) {
    let stages = &data.confidence;
    if stages.is_empty() {
        let p = Paragraph::new(note("no answers with a confidence yet", area.width, theme));
        frame.render_widget(p, area);
        return;
    }
    let fit = usize::from((area.height / MIN_ROWS).max(1));
    let shown = stages.len().min(fit);
    let mut rows: Vec<Constraint> = (0..shown).map(|_| Constraint::Fill(1)).collect();
    if shown < stages.len() {
        rows.push(Constraint::Length(1));
    }
    let areas = Layout::vertical(rows).split(area);
    for (h, a) in stages.iter().zip(areas.iter()) {
        draw_histogram(frame, *a, h, t, theme);
    }
    if shown < stages.len() {
        let names: Vec<String> = stages[shown..]
            .iter()
            .map(|h| for_terminal(&h.stage))
            .collect();
        let text = format!("… not shown (a taller terminal): {}", names.join(", "));
        frame.render_widget(Paragraph::new(note(&text, area.width, theme)), areas[shown]);
    }
}

/// Bar width and gap for `width` columns of 20 bars: a gap when the bars
/// can still be 2 wide, else touching bars 2 wide, else 1 wide with gaps.
pub(super) fn bar_geometry(width: u16) -> (u16, u16) {
    let n = CONFIDENCE_BINS as u16;
    let gaps = n - 1;
    if width >= 2 * n + gaps {
        ((width - gaps) / n, 1)
    } else if width >= 2 * n {
        (2, 0)
    } else {
        (1, u16::from(width >= n + gaps))
    }
}

fn draw_histogram(frame: &mut Frame, area: Rect, h: &StageHistogram, t: &Thresholds, theme: Theme) {
    let title = format!(
        " {} · {} answers ",
        truncate(&for_terminal(&h.stage), 30),
        h.total()
    );
    let block = chart_block(title, theme);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [bars_area, axis, marks, legend] = Layout::vertical([
        Constraint::Min(2),
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(1),
    ])
    .areas(inner);
    let (bw, gap) = bar_geometry(inner.width);
    let bars: Vec<Bar> = h
        .bins
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let (glyph, style) = band_look(band(i, t), theme);
            let text = compact(n as f64);
            let shown = if n > 0 && text.chars().count() <= usize::from(bw) {
                text
            } else {
                String::new()
            };
            Bar::default()
                .value(n)
                .label(Line::from(glyph))
                .style(style)
                .value_style(theme.selected())
                .text_value(shown)
        })
        .collect();
    let chart = BarChart::default()
        .data(BarGroup::default().bars(&bars))
        .bar_width(bw)
        .bar_gap(gap);
    frame.render_widget(chart, bars_area);
    let step = bw + gap;
    frame.render_widget(Paragraph::new(axis_line(inner.width, bw, gap, theme)), axis);
    frame.render_widget(
        Paragraph::new(marks_line(inner.width, step, t, theme)),
        marks,
    );
    frame.render_widget(Paragraph::new(legend_line(inner.width, t, theme)), legend);
}

/// `0`, `0.5` and `1` under the bars where those confidences are.
pub(super) fn axis_line<'a>(width: u16, bar: u16, gap: u16, theme: Theme) -> Line<'a> {
    let n = CONFIDENCE_BINS;
    let step = usize::from(bar + gap);
    let mut row = vec![' '; usize::from(width)];
    put(&mut row, 0, "0");
    put(&mut row, step * n / 2, "0.5");
    // Under the last bar's right edge.
    put(
        &mut row,
        (step * (n - 1) + usize::from(bar)).saturating_sub(1),
        "1",
    );
    Line::from(styled(row.into_iter().collect::<String>(), theme.dim()))
}

/// `▲review 0.60` and `▲accept 0.85` under the bars the thresholds fall in.
fn marks_line<'a>(width: u16, step: u16, t: &Thresholds, theme: Theme) -> Line<'a> {
    let mut row = vec![' '; usize::from(width)];
    let at = |x: f64| confidence_bin(x).map(|b| b * usize::from(step));
    let review = t
        .review
        .and_then(|r| at(r).map(|x| (x, format!("▲review {r:.2}"))));
    let accept = t
        .accept
        .and_then(|a| at(a).map(|x| (x, format!("▲accept {a:.2}"))));
    let accept_x = accept.as_ref().map(|(x, _)| *x);
    if let Some((x, label)) = &review {
        let len = label.chars().count();
        if accept_x.is_some_and(|ax| x + len >= ax) {
            // Too close to the accept mark: the label goes to the left of its mark.
            let left = format!("review {:.2}▲", t.review.unwrap_or_default());
            let start = (x + 1).saturating_sub(left.chars().count());
            put(&mut row, start, &left);
        } else {
            put(&mut row, *x, label);
        }
    }
    if let Some((x, label)) = &accept {
        put(&mut row, *x, label);
    }
    Line::from(styled(
        row.into_iter().collect::<String>(),
        theme.title(false),
    ))
}

/// What the glyphs under the bars mean, with the thresholds in words.
fn legend_line<'a>(width: u16, t: &Thresholds, theme: Theme) -> Line<'a> {
    let text = match (t.review, t.accept) {
        (Some(r), Some(a)) => {
            format!("✗ reject < {r:.2} ≤ ? review < {a:.2} ≤ ✓ accept")
        }
        (Some(r), None) => format!("✗ reject < {r:.2} ≤ ? review"),
        (None, Some(a)) => format!("? review < {a:.2} ≤ ✓ accept"),
        (None, None) => "thresholds unknown (no config snapshot)".into(),
    };
    note(&text, width, theme)
}

/// Write `text` into `row` from column `x`, as far as the row goes.
fn put(row: &mut [char], x: usize, text: &str) {
    for (i, c) in text.chars().enumerate() {
        if let Some(cell) = row.get_mut(x + i) {
            *cell = c;
        }
    }
}
