//! The calibration page of the charts: how often humans agreed with the
//! model per confidence band (counts and a 95% interval), a reliability
//! chart of that agreement, the precision the session's auto-accept
//! threshold gives, and the threshold that would reach the target with how
//! many more or fewer reviews. The numbers are `docket calibrate`'s: the
//! same ledger read and `docket_model::calibration::Summary`.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::Line;
use ratatui::widgets::{Bar, BarChart, BarGroup, Paragraph, Row, Table, Wrap};

use super::{chart_block, note};
use crate::theme::Theme;
use crate::view::styled;
use docket_ledger::watch::ChartData;
use docket_model::calibration::{self as cal, Agreement, Band, Summary};

/// The table's width: band, reviewed, agreed, rate, interval, audit.
const TABLE_WIDTH: u16 = 50;

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// `93.3% (95% CI 78.7–98.2%) on 30`, or `none reviewed`.
fn agreement(a: &Agreement) -> String {
    match (a.rate, a.interval) {
        (Some(rate), Some(i)) => format!(
            "{} (95% CI {}–{}) on {}",
            pct(rate),
            pct(i.lo),
            pct(i.hi),
            a.reviewed
        ),
        _ => "none reviewed".into(),
    }
}

pub(super) fn draw(frame: &mut Frame, area: Rect, data: &ChartData, theme: Theme) {
    let Some(s) = data.calibration.as_ref().filter(|s| s.overall.reviewed > 0) else {
        let text = "No human decisions yet in this session. Accept, reject or correct items \
                    in the review queue (5); to measure the auto-accepted band too, send a \
                    share of it to review with [routing] audit_accept_share in docket.toml.";
        let p = Paragraph::new(styled(text, theme.dim())).wrap(Wrap { trim: true });
        frame.render_widget(p, area);
        return;
    };
    let [head, body] = Layout::vertical([Constraint::Length(3), Constraint::Min(4)]).areas(area);
    let lines: Vec<Line> = head_lines(s)
        .iter()
        .map(|t| note(t, head.width, theme))
        .collect();
    frame.render_widget(Paragraph::new(lines), head);
    let table_w = TABLE_WIDTH.min(body.width);
    let [left, right] =
        Layout::horizontal([Constraint::Length(table_w), Constraint::Min(0)]).areas(body);
    draw_table(frame, left, s, theme);
    if right.width >= 12 {
        draw_reliability(frame, right, s, theme);
    }
}

/// Overall agreement; the current threshold's precision; the suggestion.
fn head_lines(s: &Summary) -> [String; 3] {
    let overall = format!(
        "{} reviewed ({} from the audit sample) · agreed {}",
        s.overall.reviewed,
        s.audited,
        agreement(&s.overall)
    );
    let current = format!(
        "auto-accept ≥ {:.2} now: precision {}",
        s.accept,
        agreement(&s.current)
    );
    let target = pct(s.target);
    let suggestion = match (&s.suggestion, s.enough) {
        (_, false) => format!(
            "target {target}: at least {} reviewed items are needed to suggest a threshold",
            cal::MIN_REVIEWED
        ),
        (Some(g), true) => {
            let change = match g.review_change {
                0 => "as many reviews".to_string(),
                n if n < 0 => format!("{} fewer reviews", -n),
                n => format!("{n} more reviews"),
            };
            let lower = g.precision.interval.map_or(0.0, |i| i.lo);
            format!(
                "target {target}: accept ≥ {:.2} reaches it (lower bound {}) · {change}",
                g.threshold,
                pct(lower)
            )
        }
        (None, true) => {
            format!("target {target}: no threshold reaches it with these reviews yet")
        }
    };
    [overall, current, suggestion]
}

/// Where a band falls under the session's thresholds, as the histogram
/// marks it: ✗ reject, ? review, ✓ accept.
fn glyph(b: &Band, s: &Summary) -> &'static str {
    if b.lo + 1e-9 >= s.accept {
        "✓"
    } else if b.lo + 1e-9 >= s.review {
        "?"
    } else {
        "✗"
    }
}

/// The bands with reviewed items, the highest confidence first (the ones a
/// threshold is placed among).
fn draw_table(frame: &mut Frame, area: Rect, s: &Summary, theme: Theme) {
    let header =
        Row::new(["band", "", "n", "agree", "rate", "95% CI", "audit"]).style(theme.title(false));
    let rows: Vec<Row> = s
        .bands
        .iter()
        .rev()
        .filter(|b| b.agreement.reviewed > 0)
        .map(|b| {
            let a = &b.agreement;
            let ci = a.interval.map_or(String::new(), |i| {
                format!("{:.1}–{}", i.lo * 100.0, pct(i.hi))
            });
            Row::new([
                format!("{:.2}–{:.2}", b.lo, b.hi),
                glyph(b, s).to_string(),
                a.reviewed.to_string(),
                a.agreed.to_string(),
                a.rate.map_or(String::new(), pct),
                ci,
                b.audited.to_string(),
            ])
            .style(theme.text())
        })
        .collect();
    let widths = [
        Constraint::Length(9),
        Constraint::Length(1),
        Constraint::Length(4),
        Constraint::Length(5),
        Constraint::Length(6),
        Constraint::Length(11),
        Constraint::Length(5),
    ];
    let block = chart_block(
        " agreement per band (✓ accept ? review ✗ reject) ".into(),
        theme,
    );
    let table = Table::new(rows, widths).header(header).block(block);
    frame.render_widget(table, area);
}

/// Agreement per band as bars (0..100%), 0.00 on the left, 1.00 on the
/// right: a calibrated model's bars rise like a staircase.
fn draw_reliability(frame: &mut Frame, area: Rect, s: &Summary, theme: Theme) {
    let block = chart_block(" reliability: % agreed per band ".into(), theme);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [bars_area, axis] =
        Layout::vertical([Constraint::Min(2), Constraint::Length(1)]).areas(inner);
    let (bw, gap) = super::histogram::bar_geometry(inner.width);
    let bars: Vec<Bar> = s
        .bands
        .iter()
        .map(|b| {
            let rate = b.agreement.rate.map_or(0, |r| (r * 100.0).round() as u64);
            let style = match glyph(b, s) {
                "✓" => theme.accepted(),
                "?" => theme.review(),
                _ => theme.rejected(),
            };
            Bar::default()
                .value(rate)
                .style(style)
                .text_value(String::new())
        })
        .collect();
    let chart = BarChart::default()
        .data(BarGroup::default().bars(&bars))
        .bar_width(bw)
        .bar_gap(gap)
        .max(100);
    frame.render_widget(chart, bars_area);
    frame.render_widget(
        Paragraph::new(super::histogram::axis_line(inner.width, bw, gap, theme)),
        axis,
    );
}
