//! The report's calibration section: how often humans agreed with the
//! model per confidence band (with the Wilson interval), a reliability
//! chart, the precision the run's auto-accept threshold gave and the
//! threshold that would reach the target. The same `Summary` that
//! `docket calibrate` and the console's calibration page show.

use std::fmt::Write as _;

use docket_model::calibration::{Agreement, Summary};

use super::esc;
use super::render::{count, num};
use super::svg;

pub(super) fn section(out: &mut String, summary: Option<&Summary>) {
    out.push_str("<section id=\"calibration\"><h2>Calibration</h2>");
    let Some(s) = summary.filter(|s| s.overall.reviewed > 0) else {
        out.push_str(
            "<p class=\"muted\">No human decision on a suggestion yet: review some items \
             (an audit sample, <code>[routing] audit_accept_share</code>, sends auto-accepted \
             ones too) and make the report again.</p></section>\n",
        );
        return;
    };
    out.push_str(&svg::reliability(
        "Reliability: human agreement per confidence band",
        &s.bands,
        s.accept,
    ));
    let _ = write!(
        out,
        "<table><tbody><tr><th>Reviewed by a human</th>{}</tr>\
         <tr><th>Agreed with the model</th>{}</tr>\
         <tr><th>From the audit sample</th>{}</tr>\
         <tr><th>Precision at auto-accept ≥ {:.2}</th>{}</tr>\
         <tr><th>Target precision</th>{}</tr>\
         <tr><th>Suggested auto-accept threshold</th>{}</tr></tbody></table>",
        count("calibration.reviewed", s.overall.reviewed as i64),
        count("calibration.agreed", s.overall.agreed as i64),
        count("calibration.audited", s.audited as i64),
        s.accept,
        agreement_cell("calibration.current", &s.current),
        num("calibration.target", s.target, &format!("{:.2}", s.target)),
        suggestion_cell(s),
    );
    bands(out, s);
    out.push_str(
        "<p class=\"muted\">Agreement: the operator accepted the suggestion as it was (a \
         correction or a reject disagrees). Intervals are 95% Wilson intervals; a threshold \
         is suggested once its interval's lower bound reaches the target.</p></section>\n",
    );
}

/// A rate with its interval and counts, the rate under `key`.
fn agreement_cell(key: &str, a: &Agreement) -> String {
    let Some(rate) = a.rate else {
        return "<td class=\"n muted\">no reviewed item</td>".into();
    };
    let interval = a
        .interval
        .map(|i| format!(" [{:.1}–{:.1}%]", i.lo * 100.0, i.hi * 100.0))
        .unwrap_or_default();
    num(
        key,
        rate,
        &format!(
            "{:.1}%{interval} ({} of {})",
            rate * 100.0,
            a.agreed,
            a.reviewed
        ),
    )
}

fn suggestion_cell(s: &Summary) -> String {
    if !s.enough {
        return format!(
            "<td class=\"n muted\">too few reviews yet ({} of {} needed)</td>",
            s.overall.reviewed,
            docket_model::calibration::MIN_REVIEWED
        );
    }
    match &s.suggestion {
        None => "<td class=\"n muted\">none reaches the target with the reviews so far</td>".into(),
        Some(g) => {
            let change = match g.review_change {
                0 => "as many reviews".to_string(),
                n if n < 0 => format!("{} fewer reviews", -n),
                n => format!("{n} more reviews"),
            };
            num(
                "calibration.suggested",
                g.threshold,
                &format!("{:.2} ({change})", g.threshold),
            )
        }
    }
}

/// The bands with reviewed items, highest first.
fn bands(out: &mut String, s: &Summary) {
    out.push_str(
        "<table><thead><tr><th>Confidence</th><th class=\"n\">Reviewed</th>\
         <th class=\"n\">Audit</th><th class=\"n\">Agreed</th>\
         <th class=\"n\">Agreement (95% interval)</th></tr></thead><tbody>",
    );
    for b in s.bands.iter().rev().filter(|b| b.agreement.reviewed > 0) {
        let key = format!("calibration.band.{:.2}", b.lo);
        let _ = write!(
            out,
            "<tr><td>{}</td>{}{}{}{}</tr>",
            esc(&format!("{:.2}–{:.2}", b.lo, b.hi)),
            count(&format!("{key}.reviewed"), b.agreement.reviewed as i64),
            count(&format!("{key}.audited"), b.audited as i64),
            count(&format!("{key}.agreed"), b.agreement.agreed as i64),
            agreement_cell(&format!("{key}.rate"), &b.agreement),
        );
    }
    out.push_str("</tbody></table>");
}
