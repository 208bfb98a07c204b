//! Views over the panes: the review item detail, the generated help, the
//! provider batches and the confirmation dialogs.

use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph, Wrap};

use super::{batch_summary_text, human_secs, styled};
use crate::action::Action;
use crate::app::{App, Dialog};
use crate::keymap::Section;
use crate::theme::Theme;
use docket_ledger::watch::{ProviderBatchRow, StageVerdict, is_terminal_state};
use docket_model::sanitize::{for_terminal, truncate};

/// Long model outputs are cut here in the detail view (the ledger and the
/// exports keep them whole).
const FIELD_LIMIT: usize = 20_000;

/// Text from an item or a model as safe lines: each source line sanitized.
fn safe_lines<'a>(text: &str, indent: &str) -> Vec<Line<'a>> {
    let text: String = text.chars().take(FIELD_LIMIT).collect();
    text.lines()
        .map(|l| Line::from(format!("{indent}{}", for_terminal(l))))
        .collect()
}

fn heading<'a>(text: &str, theme: Theme) -> Line<'a> {
    Line::from(styled(format!("── {text} "), theme.title(true)))
}

pub(super) fn draw_detail(frame: &mut Frame, area: Rect, app: &App, scroll: u16, theme: Theme) {
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
            let inner = usize::from(area.width.saturating_sub(2));
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
                lines.extend(safe_lines(&d.suggestion_json, "  "));
            }
            lines.push(heading("Rationale", theme));
            lines.extend(safe_lines(d.rationale.as_deref().unwrap_or("(none)"), "  "));
        }
    }
    lines.push(heading("Evidence", theme));
    lines.extend(safe_lines(&d.evidence_json, "  "));
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
            lines.extend(safe_lines(p, "    "));
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
    let p = Paragraph::new(lines)
        .block(block)
        .wrap(Wrap { trim: false });
    let scroll = clamp_scroll(app, &p, area, scroll);
    frame.render_widget(p.scroll((scroll, 0)), area);
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
        for row in wrap(&text, width) {
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
                lines.extend(wrap(&text, width).into_iter().map(Line::from));
            }
        }
        (_, Some(raw)) => {
            let raw: String = raw.chars().take(COLUMN_LIMIT).collect();
            for l in raw.lines() {
                lines.extend(wrap(&for_terminal(l), width).into_iter().map(Line::from));
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

/// `text` (already safe) in rows of at most `width` cells: at spaces where
/// it can, inside a word longer than a row where it must.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let cells = |s: &str| Span::raw(s).width();
    let mut rows = Vec::new();
    let mut row = String::new();
    for word in text.split(' ') {
        let sep = usize::from(!row.is_empty());
        if cells(&row) + sep + cells(word) <= width {
            if sep == 1 {
                row.push(' ');
            }
            row.push_str(word);
            continue;
        }
        if !row.is_empty() {
            rows.push(std::mem::take(&mut row));
        }
        // A word longer than a row: cut it by cells.
        let mut rest = word;
        while cells(rest) > width {
            let mut cut = 0;
            let mut used = 0;
            for (i, c) in rest.char_indices() {
                let w = cells(&rest[i..i + c.len_utf8()]);
                if used + w > width {
                    break;
                }
                used += w;
                cut = i + c.len_utf8();
            }
            if cut == 0 {
                // One character wider than the row: keep it whole.
                cut = rest.chars().next().map_or(rest.len(), char::len_utf8);
            }
            rows.push(rest[..cut].to_string());
            rest = &rest[cut..];
        }
        row.push_str(rest);
    }
    if !row.is_empty() || rows.is_empty() {
        rows.push(row);
    }
    rows
}

/// Record how far this overlay can scroll (its wrapped lines past one
/// screenful) for the keys, and the scroll to draw with now.
pub(super) fn clamp_scroll(app: &App, p: &Paragraph, area: Rect, scroll: u16) -> u16 {
    let rows = p.line_count(area.width.saturating_sub(2)).saturating_sub(2);
    let shown = usize::from(area.height.saturating_sub(2));
    let max = u16::try_from(rows.saturating_sub(shown)).unwrap_or(u16::MAX);
    app.scroll_max.set(max);
    scroll.min(max)
}

pub(super) fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let [row] = Layout::vertical([Constraint::Length(height.min(area.height))])
        .flex(Flex::Center)
        .areas(area);
    let [cell] = Layout::horizontal([Constraint::Length(width.min(area.width))])
        .flex(Flex::Center)
        .areas(row);
    cell
}

pub(super) fn draw_help(frame: &mut Frame, area: Rect, app: &App, scroll: u16, theme: Theme) {
    let popup = centered(area, area.width.saturating_sub(6).min(96), area.height);
    frame.render_widget(Clear, popup);
    let mut lines = Vec::new();
    let mut section = None;
    for (sec, action, keys, desc) in app.keymap.help_entries() {
        if section != Some(sec) {
            section = Some(sec);
            lines.push(Line::from(styled(
                format!("[{}]", sec.name()),
                theme.title(true),
            )));
        }
        lines.push(Line::from(vec![
            styled(format!("  {:<16}", truncate(&keys, 16)), theme.key()),
            Span::raw(format!("{:<16} {desc}", action.name())),
        ]));
    }
    lines.push(Line::from(styled("[: commands]", theme.title(true))));
    for (cmd, what) in [
        ("pause / resume", "pause or resume the watched session"),
        ("stop-at-stage", "finish the current stage, then stop"),
        ("cancel", "cancel the watched session (asks first)"),
        (
            "retune rpm=N tpm=N concurrency=N",
            "change a live run's limits",
        ),
        (
            "export [what] [csv|jsonl] [PATH]",
            "write decisions, results or requests",
        ),
        ("session ID", "watch another session"),
        ("any action name", "e.g. :accept, :focus_review"),
    ] {
        lines.push(Line::from(vec![
            styled(format!("  {cmd:<34}"), theme.key()),
            Span::raw(what),
        ]));
    }
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(
            " Help: keys from the live keymap (Esc closes) ",
            theme.title(true),
        ));
    let p = Paragraph::new(lines).block(block);
    let scroll = clamp_scroll(app, &p, popup, scroll);
    frame.render_widget(p.scroll((scroll, 0)), popup);
}

/// Provider error messages are cut here (the ledger keeps them whole).
const BATCH_ERROR_LIMIT: usize = 400;

/// A batch state as a glyph and its word, so it reads without colour.
fn batch_state<'a>(state: &str, theme: Theme) -> Span<'a> {
    let (glyph, style) = match state {
        "submitting" => ("↑", theme.dim()),
        "validating" | "in_progress" | "finalizing" => ("▶", theme.gauge()),
        "completed" => ("✓", theme.accepted()),
        "ingested" => ("✓", theme.dim()),
        "failed" | "expired" => ("✗", theme.error()),
        "cancelling" | "cancelled" => ("■", theme.warn()),
        "unknown" => ("⚠", theme.warn()),
        _ => ("·", theme.text()),
    };
    styled(format!("{glyph} {:<11}", truncate(state, 11)), style)
}

/// The stall window (`stages.batch.stall_after_secs`) of the watched
/// session's stage `stage`, from its config snapshot; None: the provider's
/// usual window.
fn stall_window(app: &App, stage: &str) -> Option<std::time::Duration> {
    let json = &app.snap.view.as_ref()?.row.config_snapshot_json;
    let v: serde_json::Value = serde_json::from_str(json).ok()?;
    let secs = v
        .pointer("/config/stages")?
        .as_array()?
        .iter()
        .find(|s| s.get("name").and_then(|n| n.as_str()) == Some(stage))?
        .pointer("/batch/stall_after_secs")?
        .as_f64()?;
    (secs.is_finite() && secs > 0.0).then(|| std::time::Duration::from_secs_f64(secs))
}

/// `in 12s`, `due`, or `—` when nothing will be polled.
fn next_poll(b: &ProviderBatchRow, now: f64) -> String {
    match b.next_poll_at {
        Some(_) if is_terminal_state(&b.state) => "—".into(),
        Some(at) if at - now >= 1.0 => format!("in {}", human_secs(at - now)),
        Some(_) => "due".into(),
        None => "—".into(),
    }
}

pub(super) fn draw_batches(frame: &mut Frame, area: Rect, app: &App, scroll: u16, theme: Theme) {
    let width = if area.width >= 100 {
        area.width.saturating_sub(6).min(120)
    } else {
        area.width
    };
    let popup = centered(area, width, area.height);
    frame.render_widget(Clear, popup);
    let inner = usize::from(popup.width.saturating_sub(2));
    let now = app.snap.now;
    let mut lines = Vec::new();
    match batch_summary_text(&app.snap.batch_summary, inner) {
        Some(text) => lines.push(Line::from(styled(text, theme.title(true)))),
        None => lines.push(Line::from(styled(
            "no provider batches in this session (it does not use a Batch API)",
            theme.dim(),
        ))),
    }
    if !app.snap.batches.is_empty() {
        lines.push(Line::from(""));
        lines.push(Line::from(styled(
            format!(
                "{:<14} {:<13} {:>13} {:>6} {:>5}  {}",
                "provider", "state", "ingested/all", "failed", "age", "next poll"
            ),
            theme.dim(),
        )));
    }
    for b in &app.snap.batches {
        let age = b
            .created_at
            .filter(|at| at.is_finite())
            .map_or("?".to_string(), |at| human_secs(now - at));
        let row = vec![
            styled(
                format!("{:<14} ", truncate(&b.provider, 14)),
                theme.title(false),
            ),
            batch_state(&b.state, theme),
            Span::raw(format!(
                " {:>13} {:>6} {:>5}  {}",
                format!("{}/{}", b.ingested_count, b.request_count),
                b.failed_count,
                age,
                next_poll(b, now)
            )),
        ];
        lines.push(Line::from(row));
        let id = match &b.provider_batch_id {
            Some(id) => for_terminal(id),
            None if b.state == "submitting" => "creating…".into(),
            None => "—".into(),
        };
        let about = format!(
            "  id {id} · tag {} · {} {} · stage {}",
            for_terminal(&b.tag),
            for_terminal(&b.provider_kind),
            for_terminal(&b.model),
            for_terminal(&b.stage)
        );
        lines.push(Line::from(styled(truncate(&about, inner), theme.dim())));
        let window = stall_window(app, &b.stage);
        let since = b.submitted_at.or(b.created_at);
        if let Some(late) = docket_providers::batch::stalled_for(&b.state, since, now, window) {
            let human = docket_providers::batch::human_duration;
            let at = std::time::Duration::from_secs_f64((now - since.unwrap_or(now)).max(0.0));
            let text = format!(
                "  ⚠ stalled for {}: still {} {} after its submission (expected within {}); polling goes on, nothing is sent again",
                human(late),
                for_terminal(&b.state),
                human(at),
                human(window.unwrap_or(docket_providers::batch::USUAL_WINDOW)),
            );
            lines.push(Line::from(styled(truncate(&text, inner), theme.warn())));
        }
        if b.state == "unknown" {
            lines.push(Line::from(styled(
                truncate(
                    "  ⚠ cannot tell which provider batch is ours; check the provider console",
                    inner,
                ),
                theme.warn(),
            )));
        }
        if let Some(at) = b.cancel_requested_at {
            lines.push(Line::from(styled(
                format!("  ■ cancel requested {} ago", human_secs(now - at)),
                theme.warn(),
            )));
        }
        if b.quarantined_count > 0 {
            lines.push(Line::from(styled(
                format!(
                    "  ⚠ {} result line(s) quarantined (not applied)",
                    b.quarantined_count
                ),
                theme.warn(),
            )));
        }
        if let Some(e) = &b.error_message {
            lines.push(Line::from(styled(
                format!("  ✗ {}", truncate(e, BATCH_ERROR_LIMIT)),
                theme.error(),
            )));
        }
    }
    let shown = app.snap.batches.len() as u64;
    if app.snap.batch_summary.total > shown && shown > 0 {
        lines.push(Line::from(styled(
            format!(
                "… {} older batch(es) not shown",
                app.snap.batch_summary.total - shown
            ),
            theme.dim(),
        )));
    }
    let title = match app.session_id() {
        Some(id) => format!(" Provider batches · {} (Esc closes) ", truncate(id, 30)),
        None => " Provider batches (Esc closes) ".to_string(),
    };
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(title, theme.title(true)));
    let p = Paragraph::new(lines)
        .block(block)
        .wrap(Wrap { trim: false });
    let scroll = clamp_scroll(app, &p, popup, scroll);
    frame.render_widget(p.scroll((scroll, 0)), popup);
}

pub(super) fn draw_dialog(frame: &mut Frame, area: Rect, app: &App, dialog: &Dialog, theme: Theme) {
    let key = |a: Action| {
        app.keymap
            .first_key(Section::Confirm, a)
            .unwrap_or_else(|| a.name().to_string())
    };
    let (title, body, answer): (&str, Vec<String>, String) = match dialog {
        Dialog::CancelRun {
            session_id,
            pending,
        } => (
            " Cancel the run? ",
            vec![
                format!("Cancel session {}?", truncate(session_id, 40)),
                format!("{pending} item(s) not processed yet stop being sent."),
                "In-flight requests finish; the session stays resumable.".into(),
            ],
            format!(
                "{} yes   {} no (default)",
                key(Action::ConfirmYes),
                key(Action::ConfirmNo)
            ),
        ),
        Dialog::BulkReject { ids } => (
            " Reject many? ",
            vec![
                format!("Reject {} marked suggestions?", ids.len()),
                "Their decisions stay undecided; u undoes them one by one.".into(),
            ],
            format!(
                "{} yes   {} no (default)",
                key(Action::ConfirmYes),
                key(Action::ConfirmNo)
            ),
        ),
        Dialog::QuitLive => (
            " Quit while the run is live? ",
            vec![
                "This process is running the session.".into(),
                format!(
                    "{:<3}keep it running headless (line output)",
                    key(Action::QuitKeep)
                ),
                format!(
                    "{:<3}pause it (in-flight requests finish), save and exit",
                    key(Action::QuitPause)
                ),
                format!(
                    "{:<3}cancel it (resumable), save and exit",
                    key(Action::QuitCancel)
                ),
            ],
            format!("{} back", key(Action::ConfirmNo)),
        ),
    };
    let height = body.len() as u16 + 4;
    let popup = centered(area, 64, height);
    frame.render_widget(Clear, popup);
    let mut lines: Vec<Line> = body.into_iter().map(Line::from).collect();
    lines.push(Line::from(""));
    lines.push(Line::from(styled(answer, theme.key())));
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.warn())
        .title(Span::styled(title, theme.alert_badge()));
    frame.render_widget(Paragraph::new(lines).block(block), popup);
}
