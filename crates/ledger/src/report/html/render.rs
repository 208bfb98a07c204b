//! The page: its head and style, then one `<section>` per part of the
//! report, in the order a reader asks: what ran and how it ended, what it
//! decided, how sure the model was, how the run went over time, what went
//! wrong, and the config it ran with.

use std::fmt::Write as _;

use super::esc;
use super::gather::{Gathered, Outcomes, StageLine};
use super::sections;
use crate::report::{group_thousands, table_time};

/// The page's whole style: no font, image or sheet is fetched.
const STYLE: &str = "\
:root{--fg:#1d2430;--muted:#5b6575;--line:#d5dae2;--bg:#fff;--head:#f3f5f8;\
--accept:#2f8f5b;--review:#c98a14;--reject:#b8433b;--error:#7a4fb0;--series:#2f6fb8}\
@media (prefers-color-scheme:dark){:root{--fg:#e4e8ee;--muted:#9aa4b2;--line:#394250;\
--bg:#161a20;--head:#20262e}}\
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;color:var(--fg);\
background:var(--bg);max-width:1100px;margin:2em auto;padding:0 1.2em}\
h1{font-size:1.5em;margin:0 0 .2em}h2{font-size:1.15em;margin:1.8em 0 .5em;\
border-bottom:1px solid var(--line);padding-bottom:.2em}h3{font-size:1em;margin:1em 0 .3em}\
table{border-collapse:collapse;margin:.3em 0 1em}th,td{padding:.25em .7em;\
border-bottom:1px solid var(--line);text-align:left;vertical-align:top}\
th{background:var(--head);font-weight:600}td.n,th.n{text-align:right;\
font-variant-numeric:tabular-nums}.muted{color:var(--muted)}code,pre{font:12.5px/1.4 ui-monospace,\
SFMono-Regular,Menlo,monospace}pre{background:var(--head);padding:.8em;overflow:auto;\
border-radius:4px}.chart{width:100%;max-width:760px;height:auto;display:block}\
.chart .axis{stroke:var(--muted);stroke-width:1}.chart text{fill:var(--muted);font-size:11px}\
.chart .tlabel{fill:var(--fg)}.bar.accept{fill:var(--accept)}.bar.review{fill:var(--review)}\
.bar.reject{fill:var(--reject)}.threshold{stroke-width:1.5;stroke-dasharray:5 3}\
.t-review{stroke:var(--review)}.t-accept{stroke:var(--accept)}.level{stroke:var(--muted)}\
.line{fill:none;stroke-width:1.8}.area{stroke:none;opacity:.15}.s-sent{stroke:var(--series)}\
.s-429{stroke:var(--review)}.s-err{stroke:var(--reject)}.s-cost{stroke:var(--accept)}\
.area.s-sent{fill:var(--series)}.area.s-cost{fill:var(--accept)}text.legend{stroke:none}\
text.s-sent{fill:var(--series)}text.s-429{fill:var(--review)}text.s-err{fill:var(--reject)}\
text.s-cost{fill:var(--accept)}.whisker{stroke:var(--fg);stroke-width:1.2}\
.o-accepted{color:var(--accept)}.o-review{color:var(--review)}.o-rejected{color:var(--reject)}\
.o-error{color:var(--error)}footer{margin:3em 0 1em;color:var(--muted);font-size:.9em}";

/// The whole page; `now` is when it was made.
pub(super) fn page(g: &Gathered, now: f64) -> String {
    let sid = esc(&g.head.session_id);
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"generator\" content=\"docket {}\">\
         <title>docket run report: {sid}</title><style>{STYLE}</style></head>\n<body>\n",
        env!("CARGO_PKG_VERSION")
    );
    head(&mut out, g);
    outcomes(&mut out, &g.outcomes, g.head.processed);
    stages(&mut out, &g.stages);
    sections::confidence(&mut out, g);
    super::calibration::section(&mut out, g.calibration.as_ref());
    sections::over_time(&mut out, g);
    sections::errors(&mut out, g);
    sections::batches(&mut out, g);
    sections::config(&mut out, g);
    let _ = write!(
        out,
        "<footer>Made by docket {} at {} UTC from the ledger's records of session \
         <code>{sid}</code>. The numbers are those of <code>docket batch-results {sid}</code> \
         and <code>docket export --session {sid}</code>.</footer>\n</body></html>\n",
        env!("CARGO_PKG_VERSION"),
        table_time(now)
    );
    out
}

/// A number cell that also carries its exact value under `key`.
pub(super) fn num(key: &str, value: impl std::fmt::Display, shown: &str) -> String {
    format!(
        "<td class=\"n\" data-key=\"{}\" data-value=\"{value}\">{}</td>",
        esc(key),
        esc(shown)
    )
}

pub(super) fn count(key: &str, n: i64) -> String {
    num(key, n, &group_thousands(n))
}

pub(super) fn money(key: &str, usd: f64) -> String {
    num(key, usd, &format!("${usd:.4}"))
}

fn head(out: &mut String, g: &Gathered) {
    let h = &g.head;
    let _ = write!(
        out,
        "<header><h1>Run report <code>{}</code></h1><p class=\"muted\">{}</p></header>\n\
         <table id=\"session\"><tbody>",
        esc(&h.session_id),
        esc(if g.job.is_empty() {
            "job not recorded"
        } else {
            &g.job
        })
    );
    let row = |out: &mut String, label: &str, cell: String| {
        let _ = write!(out, "<tr><th>{}</th>{cell}</tr>", esc(label));
    };
    let td = |s: &str| format!("<td>{}</td>", esc(s));
    row(out, "Job", td(&g.job));
    row(
        out,
        "State",
        format!(
            "<td data-key=\"head.state\" data-value=\"{0}\">{0}</td>",
            esc(h.shown.word())
        ),
    );
    let models: Vec<String> = g
        .stages
        .iter()
        .filter(|s| !s.model.is_empty())
        .map(|s| format!("{}: {} / {}", s.name, s.provider, s.model))
        .collect();
    row(out, "Provider / model", td(&models.join("; ")));
    row(
        out,
        "Started",
        td(&format!("{} UTC", table_time(h.started_at))),
    );
    let ended = match h.completed_at {
        Some(t) => format!("{} UTC ({})", table_time(t), duration(t - h.started_at)),
        None => "not finished".to_string(),
    };
    row(out, "Ended", td(&ended));
    row(out, "Config version", td(&g.config_version));
    head_numbers(out, g);
    out.push_str("</tbody></table>\n");
}

/// The header's counters and money, each with its exact value.
fn head_numbers(out: &mut String, g: &Gathered) {
    let h = &g.head;
    let row = |out: &mut String, label: &str, cell: String| {
        let _ = write!(out, "<tr><th>{}</th>{cell}</tr>", esc(label));
    };
    row(out, "Items", count("head.total", h.total));
    row(out, "Processed", count("head.processed", h.processed));
    row(out, "Retries", count("head.retries", h.retries));
    row(
        out,
        "429 answers",
        count("head.rate_limited", h.rate_limited),
    );
    row(
        out,
        "Ambiguous attempts",
        count("head.ambiguous", h.ambiguous),
    );
    row(
        out,
        "Input tokens",
        count("head.input_tokens", h.input_tokens),
    );
    row(
        out,
        "Output tokens",
        count("head.output_tokens", h.output_tokens),
    );
    row(out, "Cost", money("head.cost_usd", h.cost_usd));
    row(
        out,
        "Estimated cost",
        money("head.estimated_cost_usd", h.estimated_cost_usd),
    );
    if let Some(cap) = h.max_cost_usd {
        row(out, "Cost cap", money("head.max_cost_usd", cap));
    }
    if let Some(mode) = &h.completion_mode {
        row(out, "Completion mode", format!("<td>{}</td>", esc(mode)));
    }
    if let Some(profile) = &h.profile {
        row(
            out,
            "Rate-limit profile",
            format!("<td>{}</td>", esc(profile)),
        );
    }
    if let Some(reason) = h.stop_reason.as_deref().filter(|r| !r.trim().is_empty()) {
        row(out, "Stopped", format!("<td>{}</td>", esc(reason)));
    }
}

/// "1 h 02 min", "3 min 05 s", "12.3 s".
fn duration(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{} min {:02} s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{} h {:02} min",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

fn percent(part: i64, whole: i64) -> String {
    if whole <= 0 {
        return "–".into();
    }
    format!("{:.1}%", part as f64 * 100.0 / whole as f64)
}

fn outcomes(out: &mut String, o: &Outcomes, processed: i64) {
    out.push_str(
        "<section id=\"outcomes\"><h2>Outcomes</h2><table><thead><tr><th>Outcome</th>\
         <th class=\"n\">Items</th><th class=\"n\">Share</th></tr></thead><tbody>",
    );
    let whole = o.results().max(processed);
    for (word, label, n) in [
        ("accepted", "✓ Auto-accepted", o.accepted),
        ("review", "⚠ Needs review", o.review),
        ("rejected", "✗ Rejected", o.rejected),
        ("error", "⨯ Error", o.error),
    ] {
        let _ = write!(
            out,
            "<tr><td class=\"o-{word}\">{label}</td>{}<td class=\"n\">{}</td></tr>",
            count(&format!("outcome.{word}"), n),
            percent(n, whole)
        );
    }
    let _ = writeln!(
        out,
        "</tbody><tfoot><tr><th>Results</th>{}<th></th></tr></tfoot></table>\
         <p>Tokens of these results: {} in, {} out; their cost: {}</p></section>",
        count("outcome.results", o.results()),
        wrap_count("outcome.input_tokens", o.input_tokens),
        wrap_count("outcome.output_tokens", o.output_tokens),
        wrap_money("outcome.cost_usd", o.cost_usd),
    );
}

fn wrap_count(key: &str, n: i64) -> String {
    format!(
        "<span data-key=\"{}\" data-value=\"{n}\">{}</span>",
        esc(key),
        group_thousands(n)
    )
}

fn wrap_money(key: &str, usd: f64) -> String {
    format!(
        "<span data-key=\"{}\" data-value=\"{usd}\">${usd:.4}</span>",
        esc(key)
    )
}

fn stages(out: &mut String, stages: &[StageLine]) {
    out.push_str(
        "<section id=\"stages\"><h2>Stages</h2><table><thead><tr><th>Stage</th><th>Role</th>\
         <th>Model</th><th class=\"n\">Items</th><th class=\"n\">Answered</th>\
         <th class=\"n\">Failed</th><th class=\"n\">Skipped</th><th class=\"n\">Accepted</th>\
         <th class=\"n\">Review</th><th class=\"n\">Rejected</th><th class=\"n\">Error</th>\
         <th class=\"n\">Attempts</th><th class=\"n\">Tokens in / out</th>\
         <th class=\"n\">Cost</th></tr></thead><tbody>",
    );
    for s in stages {
        let k = |what: &str| format!("stage.{}.{what}", s.name);
        let p = s.progress.as_ref();
        let items = p.map(|p| p.total as i64).unwrap_or(0);
        let failed = p.map(|p| p.failed as i64).unwrap_or(0);
        let skipped = p.map(|p| p.skipped as i64).unwrap_or(0);
        let answered = p.map(|p| p.done as i64 - failed - skipped).unwrap_or(0);
        let o = &s.outcomes;
        let _ = write!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td>{}{}{}{}{}{}{}{}{}\
             <td class=\"n\">{} / {}</td>{}</tr>",
            esc(&s.name),
            esc(&s.role),
            esc(&s.model),
            count(&k("items"), items),
            count(&k("answered"), answered.max(0)),
            count(&k("failed"), failed),
            count(&k("skipped"), skipped),
            count(&k("accepted"), o.accepted),
            count(&k("review"), o.review),
            count(&k("rejected"), o.rejected),
            count(&k("error"), o.error),
            count(&k("attempts"), s.spend.attempts),
            group_thousands(s.spend.input_tokens),
            group_thousands(s.spend.output_tokens),
            money(&k("cost_usd"), s.spend.cost_usd),
        );
    }
    out.push_str(
        "</tbody></table><p class=\"muted\">Accepted / review / rejected / error: the items \
         whose routed answer the stage gave. Attempts, tokens and cost: every attempt the \
         stage sent.</p></section>\n",
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::html::series::Series;
    use crate::watch::ShownState;

    /// A session that has just started: no result, no attempt, no batch.
    fn fresh(session_id: &str) -> Gathered {
        Gathered {
            head: crate::report::SessionHead {
                session_id: session_id.into(),
                state: "running".into(),
                desired_state: "running".into(),
                started_at: 1_700_000_000.0,
                completed_at: None,
                total: 3,
                processed: 0,
                accepted: 0,
                review: 0,
                rejected: 0,
                errors: 0,
                retries: 0,
                rate_limited: 0,
                ambiguous: 0,
                input_tokens: 0,
                output_tokens: 0,
                cost_usd: 0.0,
                estimated_cost_usd: 0.01,
                max_cost_usd: Some(1.0),
                stop_reason: None,
                shown: ShownState::Running,
                completion_mode: None,
                profile: None,
            },
            job: String::new(),
            thresholds: (Some(0.6), Some(0.85)),
            config_toml: String::new(),
            config_version: String::new(),
            flags: Vec::new(),
            outcomes: Outcomes::default(),
            stages: Vec::new(),
            series: Series::default(),
            attempt_errors: Default::default(),
            item_errors: Vec::new(),
            batches: Vec::new(),
            calibration: None,
        }
    }

    #[test]
    fn a_session_with_nothing_yet_says_so_in_every_section() {
        let page = page(&fresh("batch_<x>"), 1_700_000_100.0);
        for said in [
            "not finished",
            "No answer with a confidence yet.",
            "No attempt was sent.",
            "No human decision on a suggestion yet",
            "No attempt failed.",
            "None: every request was sent on its own.",
            "The session recorded no config.",
            "data-key=\"head.max_cost_usd\" data-value=\"1\"",
            "data-key=\"outcome.results\" data-value=\"0\"",
        ] {
            assert!(page.contains(said), "{said}");
        }
        assert!(page.contains("batch_&lt;x&gt;") && !page.contains("batch_<x>"));
        assert!(!page.contains("<svg"), "no chart without data");
    }
}
