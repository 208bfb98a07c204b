//! The list panes: review queue, events, sessions.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::panes::state_word;
use super::{pane_block, session_columns, styled};
use crate::app::{App, Overlay, Pane};
use crate::theme::Theme;
use docket_ledger::watch::{Level, ReviewRow};
use docket_model::sanitize::truncate;

/// The first row shown so that `cursor` is visible: whole pages, so the
/// view does not jitter as the cursor moves.
fn page_start(cursor: u64, rows: u64) -> u64 {
    cursor.checked_div(rows).map_or(0, |pages| pages * rows)
}

pub(super) fn draw_review(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let page = &app.snap.review;
    let mut extra = String::new();
    if page.total > 0 {
        extra.push_str(&format!(" {}/{}", app.review_cursor + 1, page.total));
    } else {
        extra.push_str(" 0");
    }
    if let Some(f) = &app.filter {
        extra.push_str(&format!(" · /{}", truncate(f, 20)));
    }
    if !app.marks.is_empty() {
        extra.push_str(&format!(" · {} marked", app.marks.len()));
    }
    let block = pane_block(app, Pane::Review, extra, theme);
    let rows_h = u64::from(area.height.saturating_sub(2));
    let width = area.width.saturating_sub(2) as usize;
    let start = page_start(app.review_cursor, rows_h);
    let focused =
        app.focus == Pane::Review && matches!(app.overlay, Overlay::None | Overlay::Filter(_));
    let mut lines = Vec::new();
    if page.total == 0 {
        let msg = if app.filter.is_some() {
            "nothing matches the filter (Esc clears it)"
        } else {
            "no suggestions waiting for review"
        };
        lines.push(Line::from(styled(msg, theme.dim())));
    }
    for abs in start..(start + rows_h).min(page.total) {
        let Some(r) = abs
            .checked_sub(page.offset)
            .and_then(|i| page.rows.get(usize::try_from(i).ok()?))
        else {
            lines.push(Line::from(styled("  ...", theme.dim())));
            continue;
        };
        let is_cursor = abs == app.review_cursor;
        let mut line = queue_row(app, r, page.several_sessions, is_cursor, width, theme);
        if is_cursor && focused {
            line = line.style(theme.selected());
        }
        lines.push(line);
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// One row of the queue: pointer, mark, confidence, item id, the session
/// (with several in the queue), the answer at a glance, and who holds it.
fn queue_row<'a>(
    app: &App,
    r: &ReviewRow,
    several_sessions: bool,
    is_cursor: bool,
    width: usize,
    theme: Theme,
) -> Line<'a> {
    let marked = app.marks.contains(&r.review_id);
    let pointer = if is_cursor { "›" } else { " " };
    let mark = if marked { "●" } else { " " };
    let conf = r
        .confidence
        .map_or("  -- ".to_string(), |c| format!("{c:.2} "));
    let held = match app.held_by_other(r.claimed_by.as_deref()) {
        Some(who) => format!(" [held: {}]", truncate(who, 24)),
        None => String::new(),
    };
    let id = truncate(&r.item_id, 18);
    // An audit sample's item: its route was accept or reject, not review.
    let audit = if r.audit { "audit " } else { "" };
    // Made on evidence `docket import --update` replaced since.
    let stale = if r.stale { "stale " } else { "" };
    // With items of several sessions in the queue, each row says whose
    // it is (the id's random tail, as the sessions pane ends it).
    let session = match (&r.session_id, several_sessions) {
        (Some(s), true) => format!("{} ", short_session(s)),
        _ => String::new(),
    };
    let fixed = 2
        + 2
        + conf.len()
        + id.chars().count()
        + 1
        + audit.len()
        + stale.len()
        + session.chars().count()
        + held.chars().count();
    let summary = truncate(&row_summary(app, r), width.saturating_sub(fixed).max(1));
    Line::from(vec![
        Span::raw(pointer),
        styled(format!("{mark} "), theme.marked()),
        styled(conf, theme.review()),
        styled(format!("{id} "), theme.title(false)),
        styled(audit, theme.warn()),
        styled(stale, theme.warn()),
        styled(session, theme.dim()),
        Span::raw(summary),
        styled(held, theme.warn()),
    ])
}

/// The row's text: the job's `[review] summary` rendered for the item when
/// it has one (a failing template says why), else the answer's fields.
fn row_summary(app: &App, r: &ReviewRow) -> String {
    let rendered = app.review_templates.as_deref().and_then(|t| {
        let evidence = serde_json::from_str(&r.evidence).unwrap_or(serde_json::Value::Null);
        let answer = serde_json::from_str(&r.suggestion).unwrap_or(serde_json::Value::Null);
        t.summary(&r.item_id, &evidence, &answer)
    });
    match rendered {
        Some(Ok(s)) => s,
        Some(Err(e)) => e.to_string(),
        None => summarize(&r.suggestion),
    }
}

/// A session id short enough for a queue row: `batch_20261120_ab12cd` →
/// `…ab12cd` (its random tail; the sessions pane shows it whole), a short
/// id as it is. Sanitized: ids come from the ledger.
pub(in crate::view) fn short_session(id: &str) -> String {
    const KEEP: usize = 8;
    let id = docket_model::sanitize::for_terminal(id);
    if id.chars().count() <= KEEP {
        return id;
    }
    let tail = id.rsplit('_').next().unwrap_or("");
    if !tail.is_empty() && tail.chars().count() < KEEP {
        return format!("…{tail}");
    }
    let skip = id.chars().count() - (KEEP - 1);
    format!("…{}", id.chars().skip(skip).collect::<String>())
}

/// `{"a":"x","b":1}` → `a=x b=1`: the answer at a glance.
pub(in crate::view) fn summarize(json: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => map
            .iter()
            .filter(|(k, _)| k.as_str() != "rationale" && k.as_str() != "confidence")
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        // Row S7: every answer failed the gate.
        Ok(serde_json::Value::Null) => "(no answer passed the gate)".to_string(),
        _ => json.to_string(),
    }
}

pub(super) fn draw_events(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let events = app.visible_events();
    let mut extra = match &app.events_filter {
        Some(_) => format!(" {}/{}", events.len(), app.snap.events.len()),
        None => format!(" {}", events.len()),
    };
    if let Some(f) = &app.events_filter {
        extra.push_str(&format!(" · /{}", truncate(f, 20)));
    }
    let block = pane_block(app, Pane::Events, extra, theme);
    let width = area.width.saturating_sub(2) as usize;
    let rows = area.height.saturating_sub(2) as usize;
    let focused =
        app.focus == Pane::Events && matches!(app.overlay, Overlay::None | Overlay::Filter(_));
    let mut lines = Vec::new();
    if app.snap.events.is_empty() {
        lines.push(Line::from(styled("no events yet", theme.dim())));
    } else if events.is_empty() {
        lines.push(Line::from(styled(
            "nothing matches the filter (Esc clears it)",
            theme.dim(),
        )));
    }
    let start = page_start(app.events_scroll as u64, rows as u64) as usize;
    for (i, e) in events.iter().enumerate().skip(start).take(rows) {
        let (tag, style) = match e.level {
            Level::Info => ("·", theme.dim()),
            Level::Warn => ("⚠", theme.warn()),
            Level::Error => ("✗", theme.error()),
        };
        let time = time_of_day(e.at);
        // The whole row is the message's: `HH:MM:SS ⚠ ` is 11 cells. What
        // does not fit is one Enter away (the event in full).
        let text = truncate(&e.message, width.saturating_sub(11).max(1));
        let mut line = Line::from(vec![
            styled(format!("{time} {tag} "), style),
            Span::raw(text),
        ]);
        if i == app.events_scroll && focused {
            line = line.style(theme.selected());
        }
        lines.push(line);
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// `HH:MM:SS` in UTC (the ledger's clock).
pub(super) fn time_of_day(ts: f64) -> String {
    chrono::DateTime::from_timestamp(ts as i64, 0)
        .map(|t| t.format("%H:%M:%S").to_string())
        .unwrap_or_else(|| "--:--:--".into())
}

pub(super) fn draw_sessions(frame: &mut Frame, area: Rect, app: &App, theme: Theme) {
    let sessions = app.visible_sessions();
    let extra = match &app.sessions_filter {
        Some(f) => format!(
            " {}/{} · /{}",
            sessions.len(),
            app.snap.sessions.len(),
            truncate(f, 20)
        ),
        None => format!(" {}", sessions.len()),
    };
    let block = pane_block(app, Pane::Sessions, extra, theme);
    let rows_h = u64::from(area.height.saturating_sub(3));
    let watched = app.session_id();
    let focused =
        app.focus == Pane::Sessions && matches!(app.overlay, Overlay::None | Overlay::Filter(_));
    let width = usize::from(area.width.saturating_sub(2));
    let mut lines = vec![Line::from(styled(
        session_columns::header(
            "  session               state               done/total   acc   rev   rej   err      cost  age",
            width,
        ),
        theme.dim(),
    ))];
    let start = page_start(app.sessions_cursor as u64, rows_h) as usize;
    let state_w = 2 + docket_model::session_state::LONGEST_WORD;
    for (i, s) in sessions
        .iter()
        .enumerate()
        .skip(start)
        .take(rows_h as usize)
    {
        let here = if Some(s.session_id.as_str()) == watched {
            "●"
        } else {
            " "
        };
        let pointer = if i == app.sessions_cursor { "›" } else { " " };
        // As wide as the longest state word with its glyph: never cut.
        let state = state_word(s.shown);
        let row = format!(
            "{pointer}{here}{:<21} {:<state_w$} {:>5}/{:<5} {:>5} {:>5} {:>5} {:>5} {:>9} {}",
            truncate(&s.session_id, 21),
            state,
            s.processed,
            s.total,
            s.accepted,
            s.review,
            s.rejected,
            s.errors,
            format!("${:.4}", s.cost_usd),
            age(app.snap.now - s.started_at),
        );
        let mut line = Line::from(session_columns::row(row, s, app.snap.now, width));
        if i == app.sessions_cursor && focused {
            line = line.style(theme.selected());
        }
        lines.push(line);
    }
    if app.snap.sessions.is_empty() {
        lines.push(Line::from(styled(
            "  no sessions in this workspace yet",
            theme.dim(),
        )));
    } else if sessions.is_empty() {
        lines.push(Line::from(styled(
            "  nothing matches the filter (Esc clears it)",
            theme.dim(),
        )));
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

fn age(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 60.0 {
        "<1m".to_string()
    } else if s < 3600.0 {
        format!("{:.0}m", s / 60.0)
    } else if s < 86_400.0 {
        format!("{:.0}h", s / 3600.0)
    } else {
        format!("{:.0}d", s / 86_400.0)
    }
}
