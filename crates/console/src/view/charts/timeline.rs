//! The run over time: sparklines of requests/s, 429s and errors (one
//! column a slice of the run, merged to the width), and the spend against
//! the estimate, as a gauge and as a sparkline of the running total.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::widgets::{LineGauge, Paragraph, Sparkline};

use super::{chart_block, note};
use crate::app::App;
use crate::theme::Theme;
use docket_ledger::watch::{ChartData, Timeline};

/// The slices column `j` of `width` covers: proportional, at least one
/// (so a run of fewer slices than columns repeats them).
fn span(j: usize, n: usize, width: usize) -> std::ops::Range<usize> {
    let start = (j * n / width).min(n.saturating_sub(1));
    let end = ((j + 1) * n / width).clamp(start + 1, n.max(start + 1));
    start..end
}

/// Counts fitted to `width` columns, each the mean per slice of the
/// slices it covers (x1000, so the uneven spans do not show as ripples).
fn fit(data: &[u64], width: u16) -> Vec<u64> {
    let w = usize::from(width).max(1);
    if data.is_empty() {
        return Vec::new();
    }
    (0..w)
        .map(|j| {
            let r = span(j, data.len(), w);
            let len = r.len() as u64;
            data[r].iter().sum::<u64>() * 1000 / len.max(1)
        })
        .collect()
}

/// The running total at the end of each of `width` columns.
fn fit_last(data: &[f64], width: u16) -> Vec<f64> {
    let w = usize::from(width).max(1);
    if data.is_empty() {
        return Vec::new();
    }
    (0..w)
        .map(|j| {
            let r = span(j, data.len(), w);
            data[r.end - 1]
        })
        .collect()
}

/// requests/s, 429s and errors, stacked.
pub(super) fn draw_rates(frame: &mut Frame, area: Rect, data: &ChartData, theme: Theme) {
    let t = &data.timeline;
    if t.sent.is_empty() {
        let p = Paragraph::new(note("nothing sent yet", area.width, theme));
        frame.render_widget(p, area);
        return;
    }
    let [sent, throttled, errors] = Layout::vertical([
        Constraint::Ratio(2, 4),
        Constraint::Ratio(1, 4),
        Constraint::Ratio(1, 4),
    ])
    .areas(area);
    let width = area.width.saturating_sub(2);
    let cols = fit(&t.sent, width);
    let total: u64 = t.sent.iter().sum();
    // A column's value is its mean per slice, x1000.
    let peak = cols.iter().copied().max().unwrap_or(0) as f64 / 1000.0 / t.slice_secs;
    let avg = total as f64 / (t.slice_secs * t.sent.len() as f64);
    let title = format!(" requests/s · avg {avg:.1} · peak {peak:.1} · {total} sent ");
    spark(frame, sent, title, &cols, theme.gauge(), theme);
    let cols = fit(&t.throttled, width);
    let n: u64 = t.throttled.iter().sum();
    spark(
        frame,
        throttled,
        count_title("429s", n, t),
        &cols,
        theme.warn(),
        theme,
    );
    let cols = fit(&t.errors, width);
    let n: u64 = t.errors.iter().sum();
    spark(
        frame,
        errors,
        count_title("errors (not 429)", n, t),
        &cols,
        theme.error(),
        theme,
    );
}

/// ` 429s · 12 in all · last at 3:04 ` (when in the run the last one was).
fn count_title(what: &str, n: u64, t: &Timeline) -> String {
    if n == 0 {
        return format!(" {what} · none ");
    }
    let last = match what {
        "429s" => &t.throttled,
        _ => &t.errors,
    };
    let at = last.iter().rposition(|&c| c > 0).unwrap_or(0) as f64 * t.slice_secs;
    format!(" {what} · {n} in all · last at {} ", crate::view::clock(at))
}

fn spark(
    frame: &mut Frame,
    area: Rect,
    title: String,
    cols: &[u64],
    style: ratatui::style::Style,
    theme: Theme,
) {
    let s = Sparkline::default()
        .block(chart_block(title, theme))
        .data(cols)
        .style(style);
    frame.render_widget(s, area);
}

/// The spend so far against the estimate, and its running total.
pub(super) fn draw_cost(frame: &mut Frame, area: Rect, app: &App, data: &ChartData, theme: Theme) {
    let Some(view) = app.snap.view.as_ref() else {
        return;
    };
    let (cost, est) = (view.row.cost_usd, view.row.estimated_cost_usd);
    let [gauge, line] = Layout::vertical([Constraint::Length(3), Constraint::Min(3)]).areas(area);
    let (ratio, label) = if est > 0.0 && est.is_finite() {
        let r = cost / est;
        let over = if r > 1.0 { " · OVER the estimate" } else { "" };
        (
            r.clamp(0.0, 1.0),
            format!(
                "${cost:.4} of ${est:.2} estimated ({:.0}%){over}",
                r * 100.0
            ),
        )
    } else {
        (0.0, format!("${cost:.4} (no estimate)"))
    };
    let max = match view.row.max_cost_usd {
        Some(m) => format!(" · budget ${m:.2}"),
        None => String::new(),
    };
    let g = LineGauge::default()
        .block(chart_block(format!(" cost so far{max} "), theme))
        .ratio(ratio)
        .label(label)
        .filled_style(theme.gauge())
        .unfilled_style(theme.dim());
    frame.render_widget(g, gauge);
    let cols = fit_last(&data.timeline.cost, line.width.saturating_sub(2));
    // Sparklines take whole numbers: the spend in hundredths of a cent.
    let cols: Vec<u64> = cols
        .iter()
        .map(|c| (c * 10_000.0).max(0.0) as u64)
        .collect();
    let title = if cols.is_empty() {
        " spend over the run · nothing spent yet ".to_string()
    } else {
        " spend over the run (running total) ".to_string()
    };
    spark(frame, line, title, &cols, theme.gauge(), theme);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_cover_every_slice_once_or_repeat_few() {
        let n = 240;
        let spans: Vec<_> = (0..76).map(|j| span(j, n, 76)).collect();
        assert_eq!(spans[0].start, 0);
        assert_eq!(spans[75].end, n);
        assert!(spans.windows(2).all(|w| w[0].end == w[1].start));
        // Fewer slices than columns: each column shows one, none is empty.
        assert!((0..10).all(|j| span(j, 3, 10).len() == 1));
        assert_eq!(fit(&[2, 4, 6, 8], 2), vec![3000, 7000]);
        assert_eq!(fit_last(&[1.0, 2.0, 3.0, 4.0], 2), vec![2.0, 4.0]);
    }
}
