//! The review item detail: who holds it, the suggested answer (beside its
//! critic's verdict when there is one), the evidence and every stage's
//! outputs.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Paragraph};

use super::clamp_scroll;
use super::fields::{Marks, chosen_lines, field_lines};
use crate::app::App;
use crate::theme::Theme;
use crate::view::lists::summarize;
use crate::view::styled;
use crate::view::wrap::{wrap, wrap_indented, wrap_line};
use docket_ledger::watch::{ReviewDetail, StageVerdict};
use docket_model::sanitize::{for_terminal, truncate};
use serde_json::Value;

/// Long model outputs are cut here in the detail view (the ledger and the
/// exports keep them whole).
const FIELD_LIMIT: usize = 20_000;

/// Text from an item or a model as safe lines: each source line sanitized.
/// Long lines are wrapped when drawn ([`wrap_line`]), indented past their
/// own indent.
fn safe_lines<'a>(text: &str, indent: &str) -> Vec<Line<'a>> {
    let text: String = text.chars().take(FIELD_LIMIT).collect();
    text.lines()
        .map(|l| Line::from(format!("{indent}{}", for_terminal(l))))
        .collect()
}

/// JSON from an item or a model as fields ([`field_lines`]): aligned keys,
/// nested objects indented, lists of objects as tables; text that is not a
/// JSON object as it is.
fn safe_json_lines<'a>(text: &str, indent: usize, inner: usize, theme: Theme) -> Vec<Line<'a>> {
    match serde_json::from_str::<Value>(text) {
        Ok(v @ Value::Object(_)) => field_lines(&v, indent, inner, &Marks::default(), theme),
        _ => safe_lines(text, &" ".repeat(indent)),
    }
}

fn heading<'a>(text: &str, theme: Theme) -> Line<'a> {
    Line::from(styled(format!("── {text} "), theme.title(true)))
}

pub(in crate::view) fn draw_detail(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    scroll: u16,
    theme: Theme,
) {
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(" Review item (Esc back) ", theme.title(true)));
    let Some(d) = &app.snap.detail else {
        let msg = if app.cursor_row().is_none() {
            "the review queue is empty"
        } else {
            "loading..."
        };
        frame.render_widget(Paragraph::new(styled(msg, theme.dim())).block(block), area);
        return;
    };
    let lines = card_lines(app, d, usize::from(area.width.saturating_sub(2)), theme);
    let p = Paragraph::new(lines).block(block);
    let scroll = clamp_scroll(app, &p, area, scroll);
    frame.render_widget(p.scroll((scroll, 0)), area);
}

/// A review item's card, every line at most `inner` cells: who it belongs
/// to, why it is in review, the answer, the evidence, each stage's output.
/// The detail view and the queue's preview both draw it.
pub(in crate::view) fn card_lines<'a>(
    app: &App,
    d: &ReviewDetail,
    inner: usize,
    theme: Theme,
) -> Vec<Line<'a>> {
    let evidence = serde_json::from_str::<Value>(&d.evidence_json).unwrap_or(Value::Null);
    let answer = serde_json::from_str::<Value>(&d.suggestion_json).unwrap_or(Value::Null);
    let marks = Marks::new(&evidence, &answer);
    let mut lines = summary_lines(app, d, theme);
    lines.extend(templated_summary(app, d, &evidence, &answer, theme));
    lines.extend(answer_lines(d, inner, theme));
    lines.extend(evidence_lines(
        app,
        d,
        (&evidence, &answer),
        &marks,
        inner,
        theme,
    ));
    lines.extend(stage_lines(d, inner, theme));
    // Wrapped here, not by the paragraph: a long JSON value or model line
    // continues indented under itself, never back at column 0.
    lines
        .into_iter()
        .flat_map(|l| wrap_line(l, inner))
        .collect()
}

/// The job's `[review] summary` line for the item, when it has one (a
/// template that fails says why, naming the key and the variable).
fn templated_summary<'a>(
    app: &App,
    d: &ReviewDetail,
    evidence: &Value,
    answer: &Value,
    theme: Theme,
) -> Option<Line<'a>> {
    let t = app.review_templates.as_deref()?;
    Some(match t.summary(&d.item_id, evidence, answer)? {
        Ok(s) => Line::from(styled(s, theme.title(false))),
        Err(e) => Line::from(styled(for_terminal(&e.to_string()), theme.error())),
    })
}

/// The evidence: the job's `[review] card` when it has one, else its fields;
/// then the candidate the answer chose and how it differs from the item.
fn evidence_lines<'a>(
    app: &App,
    d: &ReviewDetail,
    (evidence, answer): (&Value, &Value),
    marks: &Marks<'_>,
    inner: usize,
    theme: Theme,
) -> Vec<Line<'a>> {
    let card = app
        .review_templates
        .as_deref()
        .and_then(|t| t.card(&d.item_id, evidence, answer));
    let mut lines = Vec::new();
    match card {
        Some(Ok(card)) => {
            lines.push(heading("Card", theme));
            lines.extend(card.into_iter().map(|l| Line::from(format!("  {l}"))));
        }
        Some(Err(e)) => {
            lines.push(heading("Card", theme));
            let why = for_terminal(&e.to_string());
            lines.push(Line::from(styled(format!("  {why}"), theme.error())));
            lines.push(heading("Evidence", theme));
            lines.extend(safe_json_lines(&d.evidence_json, 2, inner, theme));
        }
        None => {
            lines.push(heading("Evidence", theme));
            match evidence {
                Value::Object(_) => lines.extend(field_lines(evidence, 2, inner, marks, theme)),
                _ => lines.extend(safe_lines(&d.evidence_json, "  ")),
            }
        }
    }
    lines.extend(chosen_lines(marks, theme));
    lines
}

/// The item's id, confidence, model and status, then who it belongs to.
fn summary_lines<'a>(app: &App, d: &ReviewDetail, theme: Theme) -> Vec<Line<'a>> {
    let mut lines = vec![Line::from(vec![
        styled(truncate(&d.item_id, 40), theme.title(true)),
        Span::raw(format!(
            "  confidence {}  model {}  status {}",
            d.confidence.map_or("--".into(), |c| format!("{c:.2}")),
            truncate(d.model_id.as_deref().unwrap_or("?"), 30),
            d.status.to_uppercase(),
        )),
    ])];
    let mut who = Vec::new();
    if d.audit {
        // Its route was accept or reject: reviewed to measure the band.
        who.push("audit sample".to_string());
    }
    if d.stale {
        who.push("stale: made on evidence replaced since".to_string());
    }
    if let Some(s) = &d.session_id {
        who.push(format!("session {}", truncate(s, 30)));
    }
    if let Some(by) = &d.decided_by {
        who.push(format!("decided by {}", truncate(by, 30)));
    }
    match (app.held_by_other(d.claimed_by.as_deref()), &d.claimed_by) {
        (Some(other), _) => who.push(format!("held by {}", truncate(other, 40))),
        (None, Some(_)) => who.push("held by you".into()),
        (None, None) => {}
    }
    lines.push(Line::from(styled(who.join(" · "), theme.dim())));
    lines.extend(supersession_lines(d, theme));
    lines
}

/// The earlier suggestions this one replaced (asked again while they were
/// pending), or the newer one that replaced it.
fn supersession_lines<'a>(d: &ReviewDetail, theme: Theme) -> Vec<Line<'a>> {
    let session = |s: &Option<String>| truncate(s.as_deref().unwrap_or("?"), 30);
    let mut lines: Vec<Line<'a>> = d
        .replaced
        .iter()
        .map(|r| {
            Line::from(styled(
                format!(
                    "replaces an earlier suggestion: session {} · {} · {}",
                    session(&r.session_id),
                    r.confidence.map_or("--".into(), |c| format!("{c:.2}")),
                    truncate(&summarize(&r.suggestion), 60),
                ),
                theme.review(),
            ))
        })
        .collect();
    if let Some((_, by)) = &d.superseded_by {
        lines.push(Line::from(styled(
            format!(
                "superseded by a newer suggestion of session {}",
                session(by)
            ),
            theme.review(),
        )));
    }
    lines
}

/// Why the item is in review and the answer to judge: beside the critic's
/// verdict when a critic judged it, else the suggestion and its rationale.
fn answer_lines<'a>(d: &ReviewDetail, inner: usize, theme: Theme) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    match &d.critic {
        Some(critic) => {
            if let Some(note) = &d.routing_note {
                lines.push(heading("Why in review", theme));
                lines.extend(
                    safe_lines(note, "  ")
                        .into_iter()
                        .map(|l| l.style(theme.review())),
                );
            }
            let generator = d.generator.clone().unwrap_or_else(|| StageVerdict {
                stage: "answer".into(),
                output_json: Some(d.suggestion_json.clone()),
                confidence: d.confidence,
                rationale: d.rationale.clone(),
                verdict: None,
            });
            lines.extend(side_by_side(&generator, critic, inner, theme));
        }
        None => {
            if let Some(note) = &d.routing_note {
                lines.push(heading("Why in review", theme));
                lines.extend(safe_lines(note, "  "));
            }
            lines.push(heading("Suggested answer", theme));
            if d.suggestion_json.trim() == docket_ledger::review::NO_SUGGESTION {
                // Row S7: the stage's raw answers are under its heading below.
                lines.push(Line::from(styled(
                    "  none: no answer passed the gate (the raw answers are below)",
                    theme.review(),
                )));
            } else {
                lines.extend(safe_json_lines(&d.suggestion_json, 2, inner, theme));
            }
            lines.push(heading("Rationale", theme));
            lines.extend(safe_lines(d.rationale.as_deref().unwrap_or("(none)"), "  "));
        }
    }
    lines
}

/// Each stage's heading with its counts, then its parsed and raw outputs.
fn stage_lines<'a>(d: &ReviewDetail, inner: usize, theme: Theme) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    for s in &d.stages {
        lines.push(heading(
            &format!(
                "Stage {} · {}/{} · {} · {} attempt(s) · {} in / {} out tok · ${:.5}",
                truncate(&s.stage, 20),
                truncate(&s.provider, 20),
                truncate(&s.model, 30),
                s.status,
                s.attempts,
                s.input_tokens,
                s.output_tokens,
                s.cost_usd
            ),
            theme,
        ));
        if let Some(p) = &s.parsed_output_json {
            lines.push(Line::from(styled("  parsed:", theme.dim())));
            lines.extend(safe_json_lines(p, 4, inner, theme));
        }
        if let Some(raw) = &s.raw_output {
            let finish = s.finish_reason.as_deref().unwrap_or("?");
            lines.push(Line::from(styled(
                format!("  raw output (finish: {}):", for_terminal(finish)),
                theme.dim(),
            )));
            lines.extend(safe_lines(raw, "    "));
        }
    }
    lines
}

/// From this inner width the generator and its critic stand side by side;
/// below it (80 columns) one above the other.
pub const SIDE_BY_SIDE_MIN: usize = 96;

/// Model text in one column is cut here (the raw outputs below keep more).
const COLUMN_LIMIT: usize = 4_000;

/// The generator's answer and the critic's verdict: two columns when `inner`
/// allows ([`SIDE_BY_SIDE_MIN`]), else stacked.
fn side_by_side<'a>(
    generator: &StageVerdict,
    critic: &StageVerdict,
    inner: usize,
    theme: Theme,
) -> Vec<Line<'a>> {
    if inner < SIDE_BY_SIDE_MIN {
        let mut lines = vec![heading(
            &format!("generator: {}", truncate(&generator.stage, 30)),
            theme,
        )];
        lines.extend(verdict_column(generator, inner.saturating_sub(2), theme));
        lines.push(heading(
            &format!("critic: {}", truncate(&critic.stage, 30)),
            theme,
        ));
        lines.extend(verdict_column(critic, inner.saturating_sub(2), theme));
        return lines.into_iter().map(indent_unless_heading).collect();
    }
    // `left │ right`: each column wrapped to its width here, so the
    // paragraph never wraps a row again.
    let left_w = (inner - 5) / 2;
    let right_w = inner - 5 - left_w;
    let head = |who: &str, stage: &str, w: usize| {
        let text = format!("── {who}: {} ", truncate(stage, 30));
        let fill = w.saturating_sub(text.chars().count());
        styled(format!("{text}{}", "─".repeat(fill)), theme.title(true))
    };
    let mut lines = vec![Line::from(vec![
        head("generator", &generator.stage, left_w + 2),
        styled("─┬─", theme.title(true)),
        head("critic", &critic.stage, right_w),
    ])];
    let left = verdict_column(generator, left_w, theme);
    let right = verdict_column(critic, right_w, theme);
    for i in 0..left.len().max(right.len()) {
        let l = left.get(i).cloned().unwrap_or_default();
        let pad = left_w.saturating_sub(l.width());
        let mut spans = vec![Span::raw("  ")];
        spans.extend(l.spans);
        spans.push(Span::raw(" ".repeat(pad)));
        spans.push(styled(" │ ", theme.dim()));
        if let Some(r) = right.get(i) {
            spans.extend(r.spans.iter().cloned());
        }
        lines.push(Line::from(spans));
    }
    lines
}

/// A stacked column's body lines come indented by two.
fn indent_unless_heading(l: Line<'_>) -> Line<'_> {
    if l.spans
        .first()
        .is_some_and(|s| s.content.starts_with("── "))
    {
        return l;
    }
    let mut spans = vec![Span::raw("  ")];
    spans.extend(l.spans);
    Line::from(spans)
}

/// One stage's side: the critic's verdict first and loud, then the parsed
/// fields, the confidence and the rationale; every line at most `width`.
fn verdict_column<'a>(v: &StageVerdict, width: usize, theme: Theme) -> Vec<Line<'a>> {
    let width = width.max(8);
    let mut lines = Vec::new();
    if let Some(verdict) = &v.verdict {
        let text = format!(" VERDICT: {} ", for_terminal(verdict).to_uppercase());
        for row in wrap(text.trim_start(), width) {
            lines.push(Line::from(styled(row, theme.alert_badge())));
        }
    }
    let value = v
        .output_json
        .as_deref()
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok());
    let skip = ["confidence", "rationale", "verdict"];
    match (&value, &v.output_json) {
        (Some(serde_json::Value::Object(map)), _) => {
            for (k, val) in map {
                let shown_apart = match k.as_str() {
                    "confidence" => v.confidence.is_some(),
                    "rationale" => v.rationale.is_some(),
                    "verdict" => v.verdict.is_some(),
                    _ => false,
                };
                if skip.contains(&k.as_str()) && shown_apart {
                    continue;
                }
                let val = match val {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let text = format!("{}: {}", for_terminal(k), for_terminal(&val));
                lines.extend(wrap_indented(&text, width, 2).into_iter().map(Line::from));
            }
        }
        (_, Some(raw)) => {
            let raw: String = raw.chars().take(COLUMN_LIMIT).collect();
            for l in raw.lines() {
                lines.extend(
                    wrap_indented(&for_terminal(l), width, 2)
                        .into_iter()
                        .map(Line::from),
                );
            }
        }
        (_, None) => lines.push(Line::from(styled("(no output)", theme.dim()))),
    }
    lines.push(Line::from(vec![
        styled("confidence ", theme.dim()),
        Span::raw(v.confidence.map_or("--".into(), |c| format!("{c:.2}"))),
    ]));
    lines.push(Line::from(styled("rationale:", theme.dim())));
    let rationale = v.rationale.as_deref().unwrap_or("(none)");
    let rationale: String = rationale.chars().take(COLUMN_LIMIT).collect();
    for l in rationale.lines() {
        let rows = wrap(&for_terminal(l), width.saturating_sub(2));
        lines.extend(rows.into_iter().map(|r| Line::from(format!("  {r}"))));
    }
    lines
}
