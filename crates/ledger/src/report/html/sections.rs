//! The report's later sections: confidence histograms, the run over time,
//! errors, provider batches and the config.

use std::fmt::Write as _;

use super::esc;
use super::gather::Gathered;
use super::render::{count, money};
use super::svg::{self, Line};
use crate::report::{group_thousands, iso_time, table_time};

pub(super) fn confidence(out: &mut String, g: &Gathered) {
    out.push_str("<section id=\"confidence\"><h2>Confidence</h2>");
    let (review, accept) = g.thresholds;
    let mut any = false;
    for s in &g.stages {
        let Some(bins) = &s.histogram else { continue };
        any = true;
        let n: u64 = bins.iter().sum();
        let _ = write!(
            out,
            "<h3><code>{}</code> <span class=\"muted\">{} answers</span></h3>{}",
            esc(&s.name),
            group_thousands(n as i64),
            svg::histogram(
                &format!("Confidence of stage {}", s.name),
                bins,
                review,
                accept
            )
        );
    }
    if !any {
        out.push_str("<p class=\"muted\">No answer with a confidence yet.</p>");
    }
    let t = |v: Option<f64>| v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "–".into());
    let _ = writeln!(
        out,
        "<p class=\"muted\">Dashed lines: the thresholds the run routed with (review {}, \
         auto-accept {}). Bars are coloured by the band they fall in.</p></section>",
        t(review),
        t(accept)
    );
}

pub(super) fn over_time(out: &mut String, g: &Gathered) {
    out.push_str("<section id=\"over-time\"><h2>Over time</h2>");
    let s = &g.series;
    if s.is_empty() {
        out.push_str("<p class=\"muted\">No attempt was sent.</p></section>\n");
        return;
    }
    let end = s.start + s.width * s.sent.len() as f64;
    let ends = (
        iso_time(s.start).unwrap_or_default(),
        iso_time(end).unwrap_or_default(),
    );
    let (sent, limited, failed) = (
        s.per_minute(&s.sent),
        s.per_minute(&s.rate_limited),
        s.per_minute(&s.failed),
    );
    let _ = write!(
        out,
        "<h3>Requests per minute <span class=\"muted\">(bins of {} s)</span></h3>{}",
        s.width,
        svg::lines(
            "Requests, 429s and failed attempts per minute",
            &[
                Line {
                    label: "sent",
                    class: "s-sent",
                    values: &sent
                },
                Line {
                    label: "429s",
                    class: "s-429",
                    values: &limited
                },
                Line {
                    label: "failed",
                    class: "s-err",
                    values: &failed
                },
            ],
            None,
            (&ends.0, &ends.1),
        )
    );
    let _ = writeln!(
        out,
        "<h3>Cost so far <span class=\"muted\">against the estimate of ${:.4}</span></h3>{}\
         </section>",
        g.head.estimated_cost_usd,
        svg::lines(
            "Cost so far",
            &[Line {
                label: "cost (USD)",
                class: "s-cost",
                values: &s.cost_so_far
            }],
            Some(("estimate", g.head.estimated_cost_usd)),
            (&ends.0, &ends.1),
        )
    );
}

pub(super) fn errors(out: &mut String, g: &Gathered) {
    out.push_str("<section id=\"errors\"><h2>Errors</h2>");
    if g.attempt_errors.is_empty() {
        out.push_str("<p>No attempt failed.</p>");
    } else {
        out.push_str(
            "<h3>Failed attempts by kind</h3><table><thead><tr><th>Kind</th>\
             <th class=\"n\">Attempts</th><th>Latest message</th></tr></thead><tbody>",
        );
        for (kind, e) in &g.attempt_errors {
            let _ = write!(
                out,
                "<tr><td><code>{}</code></td>{}<td>{}</td></tr>",
                esc(kind),
                count(&format!("errors.{kind}"), e.count),
                esc(&crate::report::clip(&e.example, 300))
            );
        }
        out.push_str("</tbody></table>");
    }
    let n = g.outcomes.error;
    if n > 0 {
        let _ = write!(
            out,
            "<h3>Items that ended in error ({})</h3><table><thead><tr><th>Item</th>\
             <th>Error</th></tr></thead><tbody>",
            group_thousands(n)
        );
        for (item, message) in &g.item_errors {
            let _ = write!(
                out,
                "<tr><td><code>{}</code></td><td>{}</td></tr>",
                esc(item),
                esc(&crate::report::clip(message, 300))
            );
        }
        out.push_str("</tbody></table>");
        if n as usize > g.item_errors.len() {
            let _ = write!(
                out,
                "<p class=\"muted\">The first {} of {}; every one is in \
                 <code>docket batch-results {}</code>.</p>",
                g.item_errors.len(),
                group_thousands(n),
                esc(&g.head.session_id)
            );
        }
    }
    out.push_str("</section>\n");
}

pub(super) fn batches(out: &mut String, g: &Gathered) {
    out.push_str("<section id=\"batches\"><h2>Provider batches</h2>");
    if g.batches.is_empty() {
        out.push_str("<p>None: every request was sent on its own.</p></section>\n");
        return;
    }
    out.push_str(
        "<table><thead><tr><th>Batch</th><th>Provider id</th><th>Stage</th><th>State</th>\
         <th class=\"n\">Lines</th><th class=\"n\">Completed</th><th class=\"n\">Failed</th>\
         <th class=\"n\">Cost</th><th>Created</th></tr></thead><tbody>",
    );
    for (b, cost) in &g.batches {
        let _ = write!(
            out,
            "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>{}{}{}{}<td>{}</td></tr>",
            b.batch_id,
            esc(b.provider_batch_id.as_deref().unwrap_or("–")),
            esc(&b.stage),
            esc(&b.state),
            count(
                &format!("batch.{}.lines", b.batch_id),
                b.request_count as i64
            ),
            count(
                &format!("batch.{}.completed", b.batch_id),
                b.completed_count as i64
            ),
            count(
                &format!("batch.{}.failed", b.batch_id),
                b.failed_count as i64
            ),
            money(
                &format!("batch.{}.cost_usd", b.batch_id),
                cost.as_ref().map(|c| c.cost_usd).unwrap_or(0.0)
            ),
            b.created_at.map(table_time).unwrap_or_default(),
        );
    }
    out.push_str("</tbody></table></section>\n");
}

pub(super) fn config(out: &mut String, g: &Gathered) {
    out.push_str("<section id=\"config\"><h2>Config</h2>");
    if !g.flags.is_empty() {
        out.push_str("<h3>Run flags</h3><table><tbody>");
        for (k, v) in &g.flags {
            let _ = write!(out, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
        }
        out.push_str("</tbody></table>");
    }
    if g.config_toml.is_empty() {
        out.push_str("<p class=\"muted\">The session recorded no config.</p>");
    } else {
        let _ = write!(
            out,
            "<h3><code>docket.toml</code> as the run recorded it</h3><pre>{}</pre>",
            esc(&g.config_toml)
        );
    }
    out.push_str("</section>\n");
}
