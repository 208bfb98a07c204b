//! The report's charts as inline SVG: a confidence histogram with the
//! routing thresholds drawn on it, a reliability chart of human agreement
//! per band, and line charts over the run. Colours
//! are CSS classes of the page's own stylesheet (so a printed or dark page
//! restyles them); every label goes through `esc`.

use std::fmt::Write as _;

use docket_model::calibration::Band;

use super::esc;
use super::gather::BINS;

const W: f64 = 640.0;
const H: f64 = 220.0;
const LEFT: f64 = 48.0;
const RIGHT: f64 = 12.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 30.0;

fn plot_w() -> f64 {
    W - LEFT - RIGHT
}

fn plot_h() -> f64 {
    H - TOP - BOTTOM
}

fn open(out: &mut String, title: &str) {
    let _ = write!(
        out,
        // No xmlns: inline SVG in HTML needs none, and the page names no URL.
        "<svg class=\"chart\" viewBox=\"0 0 {W} {H}\" role=\"img\"><title>{}</title>",
        esc(title)
    );
    // Axes.
    let (x0, y0, x1) = (LEFT, TOP + plot_h(), LEFT + plot_w());
    let _ = write!(
        out,
        "<line class=\"axis\" x1=\"{x0}\" y1=\"{y0}\" x2=\"{x1}\" y2=\"{y0}\"/>\
         <line class=\"axis\" x1=\"{x0}\" y1=\"{TOP}\" x2=\"{x0}\" y2=\"{y0}\"/>"
    );
}

fn text(out: &mut String, x: f64, y: f64, anchor: &str, class: &str, s: &str) {
    let _ = write!(
        out,
        "<text class=\"{class}\" x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\">{}</text>",
        esc(s)
    );
}

/// The y axis' top label and scale for values up to `max`.
fn y_label(out: &mut String, max: f64, unit: &str) {
    text(
        out,
        LEFT - 4.0,
        TOP + 4.0,
        "end",
        "tick",
        &format!("{}{unit}", short(max)),
    );
    text(out, LEFT - 4.0, TOP + plot_h(), "end", "tick", "0");
}

/// A number short enough for an axis: 1234 -> "1.2k", 0.0123 -> "0.0123".
fn short(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 1000.0 {
        format!("{:.1}k", v / 1000.0)
    } else if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.4}")
    }
}

/// The band class of a confidence (`reject`, `review` or `accept`).
fn band(c: f64, review: Option<f64>, accept: Option<f64>) -> &'static str {
    match (review, accept) {
        (_, Some(a)) if c >= a => "accept",
        (Some(r), _) if c >= r => "review",
        (Some(_), _) | (None, Some(_)) => "reject",
        (None, None) => "review",
    }
}

/// A confidence histogram of `BINS` bins over [0, 1], with the review and
/// auto-accept thresholds drawn as labelled lines.
pub(super) fn histogram(
    title: &str,
    bins: &[u64; BINS],
    review: Option<f64>,
    accept: Option<f64>,
) -> String {
    let mut out = String::new();
    open(&mut out, title);
    let max = bins.iter().copied().max().unwrap_or(0).max(1) as f64;
    let bw = plot_w() / BINS as f64;
    for (i, &n) in bins.iter().enumerate() {
        let h = n as f64 / max * plot_h();
        let x = LEFT + i as f64 * bw;
        let centre = (i as f64 + 0.5) / BINS as f64;
        let lo = i as f64 / BINS as f64;
        let _ = write!(
            out,
            "<rect class=\"bar {}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{h:.1}\">\
             <title>{lo:.2}–{:.2}: {n}</title></rect>",
            band(centre, review, accept),
            x + 1.0,
            TOP + plot_h() - h,
            bw - 2.0,
            lo + 1.0 / BINS as f64,
        );
    }
    y_label(&mut out, max, "");
    for t in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let x = LEFT + t * plot_w();
        text(&mut out, x, H - 12.0, "middle", "tick", &format!("{t:.2}"));
    }
    for (label, value, class) in [
        ("review", review, "t-review"),
        ("accept", accept, "t-accept"),
    ] {
        let Some(v) = value.filter(|v| (0.0..=1.0).contains(v)) else {
            continue;
        };
        let x = LEFT + v * plot_w();
        let _ = write!(
            out,
            "<line class=\"threshold {class}\" x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\"/>",
            TOP + plot_h()
        );
        text(
            &mut out,
            x + 3.0,
            TOP + 10.0,
            "start",
            "tlabel",
            &format!("{label} {v:.2}"),
        );
    }
    out.push_str("</svg>");
    out
}

/// One line of a line chart.
pub(super) struct Line<'a> {
    pub label: &'a str,
    pub class: &'a str,
    pub values: &'a [f64],
}

/// Lines over the same bins, the first one filled below; `level` is a
/// horizontal reference line (an estimate) and its label; `x_ends` label
/// the first and last bin.
pub(super) fn lines(
    title: &str,
    lines: &[Line<'_>],
    level: Option<(&str, f64)>,
    x_ends: (&str, &str),
) -> String {
    let mut out = String::new();
    open(&mut out, title);
    let n = lines.iter().map(|l| l.values.len()).max().unwrap_or(0);
    let top = lines
        .iter()
        .flat_map(|l| l.values.iter().copied())
        .chain(level.map(|(_, v)| v))
        .filter(|v| v.is_finite())
        .fold(0.0_f64, f64::max);
    let max = if top > 0.0 { top * 1.05 } else { 1.0 };
    let x = |i: usize| LEFT + i as f64 * plot_w() / (n.max(2) - 1) as f64;
    let y = |v: f64| TOP + plot_h() - v.max(0.0) / max * plot_h();
    for (k, line) in lines.iter().enumerate() {
        let pts: Vec<String> = line
            .values
            .iter()
            .enumerate()
            .map(|(i, v)| format!("{:.1},{:.1}", x(i), y(*v)))
            .collect();
        if pts.is_empty() {
            continue;
        }
        if k == 0 {
            let _ = write!(
                out,
                "<polygon class=\"area {}\" points=\"{:.1},{:.1} {} {:.1},{:.1}\"/>",
                line.class,
                x(0),
                y(0.0),
                pts.join(" "),
                x(line.values.len() - 1),
                y(0.0)
            );
        }
        let _ = write!(
            out,
            "<polyline class=\"line {}\" points=\"{}\"><title>{}</title></polyline>",
            line.class,
            pts.join(" "),
            esc(line.label)
        );
        text(
            &mut out,
            LEFT + 6.0 + 150.0 * k as f64,
            TOP + 10.0,
            "start",
            &format!("legend {}", line.class),
            line.label,
        );
    }
    if let Some((label, v)) = level.filter(|(_, v)| v.is_finite() && *v > 0.0) {
        let _ = write!(
            out,
            "<line class=\"threshold level\" x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\"/>",
            y(v),
            LEFT + plot_w()
        );
        text(
            &mut out,
            LEFT + plot_w() - 4.0,
            y(v) - 4.0,
            "end",
            "tlabel",
            label,
        );
    }
    y_label(&mut out, max, "");
    text(&mut out, LEFT, H - 12.0, "start", "tick", x_ends.0);
    text(&mut out, LEFT + plot_w(), H - 12.0, "end", "tick", x_ends.1);
    out.push_str("</svg>");
    out
}

/// A reliability chart: per confidence band (x) the share of reviewed
/// items humans agreed with (y), as a bar with its 95% interval as a
/// whisker; the diagonal is a perfectly calibrated model, the dashed line
/// the auto-accept threshold.
pub(super) fn reliability(title: &str, bands: &[Band], accept: f64) -> String {
    let mut out = String::new();
    open(&mut out, title);
    let x = |c: f64| LEFT + c.clamp(0.0, 1.0) * plot_w();
    let y = |r: f64| TOP + plot_h() - r.clamp(0.0, 1.0) * plot_h();
    let _ = write!(
        out,
        "<line class=\"threshold level\" x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\"/>",
        x(0.0),
        y(0.0),
        x(1.0),
        y(1.0)
    );
    for b in bands {
        let (Some(rate), Some(iv)) = (b.agreement.rate, b.agreement.interval) else {
            continue;
        };
        let (x0, x1) = (x(b.lo), x(b.hi));
        let _ = write!(
            out,
            "<rect class=\"bar {}\" x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\">\
             <title>{:.2}–{:.2}: {} of {} agreed ({:.1}%, 95% interval {:.1}–{:.1}%)</title></rect>\
             <line class=\"whisker\" x1=\"{xm:.1}\" y1=\"{:.1}\" x2=\"{xm:.1}\" y2=\"{:.1}\"/>",
            if b.lo >= accept - 1e-9 {
                "accept"
            } else {
                "review"
            },
            x0 + 1.0,
            y(rate),
            (x1 - x0 - 2.0).max(1.0),
            y(0.0) - y(rate),
            b.lo,
            b.hi,
            b.agreement.agreed,
            b.agreement.reviewed,
            rate * 100.0,
            iv.lo * 100.0,
            iv.hi * 100.0,
            y(iv.lo),
            y(iv.hi),
            xm = (x0 + x1) / 2.0,
        );
    }
    text(&mut out, LEFT - 4.0, TOP + 4.0, "end", "tick", "100%");
    text(&mut out, LEFT - 4.0, TOP + plot_h(), "end", "tick", "0");
    for t in [0.0, 0.25, 0.5, 0.75, 1.0] {
        text(
            &mut out,
            x(t),
            H - 12.0,
            "middle",
            "tick",
            &format!("{t:.2}"),
        );
    }
    let _ = write!(
        out,
        "<line class=\"threshold t-accept\" x1=\"{0:.1}\" y1=\"{TOP}\" x2=\"{0:.1}\" y2=\"{1:.1}\"/>",
        x(accept),
        y(0.0)
    );
    text(
        &mut out,
        x(accept) + 3.0,
        TOP + 10.0,
        "start",
        "tlabel",
        &format!("accept {accept:.2}"),
    );
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_histogram_draws_its_bars_and_both_thresholds() {
        let mut bins = [0u64; BINS];
        bins[3] = 2;
        bins[19] = 5;
        let svg = histogram("adjudicate <x>", &bins, Some(0.6), Some(0.85));
        assert_eq!(svg.matches("<rect").count(), BINS);
        assert!(svg.contains("review 0.60") && svg.contains("accept 0.85"));
        assert!(svg.contains("class=\"bar accept\"") && svg.contains("class=\"bar reject\""));
        assert!(svg.contains("adjudicate &lt;x&gt;") && !svg.contains("<x>"));
    }

    #[test]
    fn the_reliability_chart_draws_the_reviewed_bands_with_their_intervals() {
        use docket_model::calibration::{Reviewed, bands};
        let r = |confidence, agreed| Reviewed {
            confidence,
            agreed,
            audit: false,
        };
        // 0.90-0.95: 3 of 4 agreed; 0.50-0.55: 0 of 1; the rest empty.
        let items = [
            r(0.91, true),
            r(0.92, true),
            r(0.93, true),
            r(0.94, false),
            r(0.5, false),
        ];
        let svg = reliability("reliability", &bands(&items), 0.85);
        assert_eq!(svg.matches("<rect").count(), 2, "{svg}");
        assert_eq!(svg.matches("class=\"whisker\"").count(), 2);
        assert!(svg.contains("0.90–0.95: 3 of 4 agreed (75.0%"), "{svg}");
        assert!(svg.contains("class=\"bar accept\"") && svg.contains("class=\"bar review\""));
        assert!(svg.contains("accept 0.85"));
    }

    #[test]
    fn short_numbers() {
        assert_eq!(short(12_345.0), "12k");
        assert_eq!(short(1_234.0), "1.2k");
        assert_eq!(short(0.5), "0.5000");
        assert_eq!(short(42.0), "42");
    }
}
