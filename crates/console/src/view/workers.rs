//! The workers overlay: every process that worked on the watched session
//! (`docket batch-adjudicate` and each `docket worker`), one row each: its
//! id, host, the items it holds, its request rate, how long ago it last
//! beat, and whether it is alive. Worker ids and hosts are written by other
//! processes, maybe on other machines: every text is sanitized before it
//! reaches a cell.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph, Wrap};

use super::overlays::{centered, clamp_scroll};
use super::{human_secs, styled};
use crate::app::App;
use crate::theme::Theme;
use docket_ledger::console::WorkerRow;
use docket_model::sanitize::truncate;

/// The state column (`● alive`, `✗ gone`).
const STATE_W: usize = 7;
/// The fixed-width columns (state, claims, requests/s, heartbeat age) and
/// the five spaces between the six columns.
const FIXED_W: usize = STATE_W + 6 + 7 + 9 + 5;

/// The worker id and host share what the fixed columns leave; the host
/// gets a third of it, within these bounds.
const HOST_MIN: usize = 8;
const HOST_MAX: usize = 24;

pub(super) fn draw_workers(frame: &mut Frame, area: Rect, app: &App, scroll: u16, theme: Theme) {
    let width = if area.width >= 100 {
        area.width.saturating_sub(6).min(120)
    } else {
        area.width
    };
    let popup = centered(area, width, area.height);
    frame.render_widget(Clear, popup);
    let inner = usize::from(popup.width.saturating_sub(2));
    let workers = &app.snap.workers;
    let mut lines = vec![summary_line(app, inner, theme)];
    if !workers.is_empty() {
        let rest = inner.saturating_sub(FIXED_W);
        let host_w = (rest / 3).clamp(HOST_MIN, HOST_MAX);
        let id_w = rest.saturating_sub(host_w).max(1);
        lines.push(Line::from(""));
        lines.push(Line::from(styled(
            format!(
                "{:<STATE_W$} {:<id_w$} {:<host_w$} {:>6} {:>7} {:>9}",
                "state", "worker", "host", "claims", "req/s", "heartbeat"
            ),
            theme.dim(),
        )));
        for w in workers {
            lines.push(row(w, id_w, host_w, theme));
            if w.orphaned > 0 {
                lines.push(Line::from(styled(
                    truncate(
                        &format!(
                            "  ⚠ {} answer(s) refused: it had lost their lease",
                            w.orphaned
                        ),
                        inner,
                    ),
                    theme.warn(),
                )));
            }
        }
    }
    let title = match app.session_id() {
        Some(id) => format!(" Workers · {} (Esc closes) ", truncate(id, 30)),
        None => " Workers (Esc closes) ".to_string(),
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

/// `workers 3: 2 alive · 1 gone · 240 claims held · 41.5 req/s`: the claims
/// and the rate of the live ones (a gone worker's last figures are history).
fn summary_line<'a>(app: &App, width: usize, theme: Theme) -> Line<'a> {
    let workers = &app.snap.workers;
    if workers.is_empty() {
        let text = if app.session_id().is_some() {
            "no worker has worked on this session yet (`docket worker --session ID` adds one)"
        } else {
            "no session yet"
        };
        return Line::from(styled(truncate(text, width), theme.dim()));
    }
    let alive: Vec<&WorkerRow> = workers.iter().filter(|w| w.alive).collect();
    let claims: u64 = alive.iter().map(|w| w.claims).fold(0, u64::saturating_add);
    let rate: f64 = alive.iter().map(|w| w.requests_per_sec).sum();
    let text = format!(
        "workers {}: {} alive · {} gone · {claims} claims held · {} req/s",
        workers.len(),
        alive.len(),
        workers.len() - alive.len(),
        per_sec(rate)
    );
    Line::from(styled(truncate(&text, width), theme.title(true)))
}

fn row<'a>(w: &WorkerRow, id_w: usize, host_w: usize, theme: Theme) -> Line<'a> {
    let (state, style) = if w.alive {
        ("● alive", theme.accepted())
    } else {
        ("✗ gone", theme.dim())
    };
    Line::from(vec![
        styled(format!("{state:<STATE_W$} "), style),
        styled(
            format!("{:<id_w$} ", truncate(&w.worker_id, id_w)),
            theme.title(false),
        ),
        Span::raw(format!(
            "{:<host_w$} {:>6} {:>7} {:>9}",
            truncate(&w.host, host_w),
            w.claims,
            per_sec(w.requests_per_sec),
            format!("{} ago", human_secs(w.heartbeat_age_secs)),
        )),
    ])
}

/// A rate with one decimal; `?` for what no rate can be (a hand edit).
fn per_sec(rate: f64) -> String {
    if rate.is_finite() && rate >= 0.0 {
        format!("{rate:.1}")
    } else {
        "?".into()
    }
}
