//! `docket calibrate`'s output: a text report with a reliability chart, or
//! one JSON document (`--format json`, stable keys; see the README).

use std::fmt::Write as _;

use docket_model::calibration::{self as cal, Agreement, Band};
use serde_json::{Value, json};

use super::{Applied, Calibration};

/// Width of a reliability bar, in characters (0.05 of agreement each).
const BAR: usize = 20;

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// `28 of 30 agreed: 93.3% (95% CI 78.7%–98.2%)`.
fn agreement_text(a: &Agreement) -> String {
    match (a.rate, a.interval) {
        (Some(rate), Some(i)) => format!(
            "{} of {} agreed: {} (95% CI {}–{})",
            a.agreed,
            a.reviewed,
            pct(rate),
            pct(i.lo),
            pct(i.hi)
        ),
        _ => "no reviewed items".to_string(),
    }
}

/// The agreement as `#`, the rest as `.`, and a `|` where a calibrated
/// model would be (the band's middle confidence). ASCII: readable without
/// colour and in any font.
fn bar(b: &Band) -> String {
    let filled = b
        .agreement
        .rate
        .map_or(0, |r| (r * BAR as f64).round() as usize);
    let ideal = (((b.lo + b.hi) / 2.0) * BAR as f64).floor() as usize;
    (0..BAR)
        .map(|i| match (i == ideal.min(BAR - 1), i < filled) {
            (true, _) => '|',
            (false, true) => '#',
            (false, false) => '.',
        })
        .collect()
}

pub(super) fn text(c: &Calibration, applied: Option<&Applied>) -> String {
    let safe = docket::sanitize::for_terminal;
    let mut out = String::new();
    if !c.enough {
        let _ = writeln!(
            out,
            "Session {}: {} reviewed item(s); at least {} are needed to calibrate, so nothing is \
             estimated.\nReview more of its items, or send a sample of the auto-accepted ones to \
             review with [routing] audit_accept_share in docket.toml.",
            safe(&c.session),
            c.overall.reviewed,
            cal::MIN_REVIEWED
        );
        applied_text(&mut out, c, None);
        return out;
    }
    let _ = writeln!(
        out,
        "Session {}: {} reviewed items ({} from the audit sample); {}",
        safe(&c.session),
        c.overall.reviewed,
        c.audited,
        agreement_text(&c.overall)
    );
    let _ = writeln!(
        out,
        "\n{:<11} {:>8} {:>7} {:>7}  {:<15}  agreement (# = rate, | = calibrated)",
        "confidence", "reviewed", "agreed", "rate", "95% CI"
    );
    for b in c.bands.iter().filter(|b| b.agreement.reviewed > 0) {
        let (rate, ci) = match (b.agreement.rate, b.agreement.interval) {
            (Some(r), Some(i)) => (pct(r), format!("{}–{}", pct(i.lo), pct(i.hi))),
            _ => ("-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            "{:.2}–{:.2}   {:>8} {:>7} {:>7}  {:<15}  {}",
            b.lo,
            b.hi,
            b.agreement.reviewed,
            b.agreement.agreed,
            rate,
            ci,
            bar(b)
        );
    }
    let _ = writeln!(
        out,
        "\nThe session's thresholds: auto-accept {:.2}, review {:.2}",
        c.accept, c.review
    );
    if c.current.reviewed == 0 {
        let _ = writeln!(
            out,
            "Precision at auto-accept >= {:.2}: not measured (no reviewed item at or above it; \
             set [routing] audit_accept_share to review a sample of them)",
            c.accept
        );
    } else {
        let _ = writeln!(
            out,
            "Precision at auto-accept >= {:.2}: {}",
            c.accept,
            agreement_text(&c.current)
        );
    }
    suggestion_text(&mut out, c);
    applied_text(&mut out, c, applied);
    out
}

fn suggestion_text(out: &mut String, c: &Calibration) {
    let _ = writeln!(
        out,
        "Target precision {} (judged on the lower bound of the 95% interval):",
        c.target
    );
    match &c.suggestion {
        None => {
            let _ = writeln!(
                out,
                "  no threshold reaches it with the reviews so far (review more items, or \
                 raise [routing] audit_accept_share)"
            );
        }
        Some(s) => {
            let change = match s.review_change {
                0 => "the same number of reviews".to_string(),
                n if n < 0 => format!("{} fewer reviews", -n),
                n => format!("{n} more reviews"),
            };
            let _ = writeln!(
                out,
                "  lowest auto-accept threshold that reaches it: {:.2}: {}\n  on this session's \
                 items that means {change}",
                s.threshold,
                agreement_text(&s.precision)
            );
        }
    }
}

fn applied_text(out: &mut String, c: &Calibration, applied: Option<&Applied>) {
    match applied {
        Some(a) => {
            let _ = writeln!(
                out,
                "Wrote {}: routing.auto_accept_threshold {} -> {} (recorded on session {})",
                docket::sanitize::for_terminal(&a.path),
                a.before,
                a.after,
                docket::sanitize::for_terminal(&c.session)
            );
        }
        None if c.apply => {
            let _ = writeln!(out, "docket.toml not changed (nothing to write).");
        }
        None => {}
    }
}

fn agreement_json(a: &Agreement) -> Value {
    json!({
        "reviewed": a.reviewed,
        "agreed": a.agreed,
        "rate": a.rate,
        "ci_low": a.interval.map(|i| i.lo),
        "ci_high": a.interval.map(|i| i.hi),
    })
}

/// With too few reviewed items only the counts are given: every rate,
/// interval and suggestion is null.
pub(super) fn json(c: &Calibration, applied: Option<&Applied>) -> Value {
    let measured = |a: &Agreement| {
        let mut v = agreement_json(a);
        if !c.enough {
            for k in ["rate", "ci_low", "ci_high"] {
                v[k] = Value::Null;
            }
        }
        v
    };
    let bands: Vec<Value> = c
        .bands
        .iter()
        .map(|b| {
            let mut v = measured(&b.agreement);
            v["lo"] = json!(b.lo);
            v["hi"] = json!(b.hi);
            v["audited"] = json!(b.audited);
            v
        })
        .collect();
    let mut current = measured(&c.current);
    current["threshold"] = json!(c.accept);
    let suggestion = c.suggestion.as_ref().map(|s| {
        let mut v = agreement_json(&s.precision);
        v["auto_accept_threshold"] = json!(s.threshold);
        v["review_change"] = json!(s.review_change);
        v
    });
    json!({
        "session_id": c.session,
        "target_precision": c.target,
        "min_reviewed": cal::MIN_REVIEWED,
        "enough": c.enough,
        "reviewed": c.overall.reviewed,
        "agreed": c.overall.agreed,
        "audited": c.audited,
        "thresholds": {"auto_accept": c.accept, "review": c.review},
        "bands": bands,
        "current_precision": current,
        "suggestion": suggestion,
        "applied": applied.map(|a| json!({"path": a.path, "before": a.before, "after": a.after})),
    })
}
