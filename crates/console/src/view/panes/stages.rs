//! The stages pane: a bar and counts per stage, on two rows each or, when
//! the pane is short, on one row each with a legend.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;

use super::{bar, percent};
use crate::app::{App, Pane};
use crate::theme::Theme;
use crate::view::{pane_block, styled};
use docket_ledger::watch::{SessionView, ShownState, StageProgress, stage_word};
use docket_model::sanitize::truncate;

/// A stage's state word: its own (`done`, `pending`) or, for the stage
/// being worked, the session's (see `session_state::stage_word`); None when
/// the ledger has no checkpoint for it.
fn stage_state(s: &StageProgress, session: ShownState) -> Option<&'static str> {
    s.state.as_deref().map(|st| {
        // Requests out for a stage its checkpoint still calls pending (a
        // provider batch submitted before the checkpoint moved): it is
        // being worked.
        let open = s.in_flight > 0 || s.at_provider > 0;
        stage_word(
            if st == "pending" && open {
                "running"
            } else {
                st
            },
            session,
        )
    })
}

/// A stage's state as a glyph (the session's glyph for its words); empty
/// when the ledger has no checkpoint for it.
fn stage_glyph(s: &StageProgress, session: ShownState) -> String {
    match stage_state(s, session) {
        None => String::new(),
        Some("done") => "✓ ".into(),
        Some("pending") => "· ".into(),
        Some(_) => format!("{} ", session.glyph()),
    }
}

/// Done (finished with the stage in any way) as the bar and the percentage
/// show it: never all of it while anything is pending or in flight.
fn shown_done(s: &StageProgress) -> (u64, u64) {
    let finished = s.is_finished();
    let done = if finished {
        s.done
    } else {
        s.done.min(s.total.saturating_sub(1))
    };
    (done, u64::from(!finished).max(s.in_flight))
}

/// The counts line of a stage on two rows: the most detailed that fits.
fn stage_counts(s: &StageProgress, session: ShownState, width: usize) -> String {
    if s.state.is_none() && !s.is_critic() && s.skipped == 0 {
        // A session without a checkpoint: its one stage, as always.
        let counts = format!(
            "{}/{} done · {} failed · {} in flight{}",
            s.done,
            s.total,
            s.failed,
            s.in_flight,
            at_provider(s)
        );
        // On a narrow pane "done" goes first, so "in flight" stays whole.
        return if counts.chars().count() > width {
            counts.replacen(" done", "", 1)
        } else {
            counts
        };
    }
    let all = format!(
        "{}/{} done · {} failed · {} skipped · {} in flight{}",
        s.done,
        s.total,
        s.failed,
        s.skipped,
        s.in_flight,
        at_provider(s)
    );
    let state = stage_state(s, session).map(str::to_uppercase);
    let with_state = match &state {
        Some(st) => format!("{all} · {st}"),
        None => all.clone(),
    };
    let of = s
        .critic_of
        .as_deref()
        .map(|of| format!(" · critic of {}", truncate(of, 20)))
        .unwrap_or_default();
    // Narrow: what is zero goes, then the words shorten.
    let some = |long: bool| {
        let mut parts = vec![format!("{}/{}", s.done, s.total)];
        for (n, word, short) in [
            (s.failed, "failed", "fail"),
            (s.skipped, "skipped", "skip"),
            (s.in_flight, "in flight", "in flight"),
            (s.at_provider, "at provider", "at prov"),
        ] {
            if n > 0 {
                parts.push(format!("{n} {}", if long { word } else { short }));
            }
        }
        parts
    };
    // The state word outlives the zero counts: it is what the header says.
    let stated = |parts: Vec<String>| match &state {
        Some(st) => format!("{} · {st}", parts.join(" · ")),
        None => parts.join(" · "),
    };
    let candidates = [
        format!("{with_state}{of}"),
        with_state,
        stated(some(true)),
        stated(some(false)),
        all,
        some(true).join(" · "),
        some(false).join(" · "),
        some(false).join(" "),
    ];
    candidates
        .iter()
        .find(|c| c.chars().count() <= width)
        .cloned()
        .unwrap_or_else(|| truncate(&candidates[7], width.max(1)))
}

/// Batch lines waiting at the provider, said apart from what is in flight.
fn at_provider(s: &StageProgress) -> String {
    if s.at_provider > 0 {
        format!(" · {} at provider", s.at_provider)
    } else {
        String::new()
    }
}

/// How many rows the stages pane wants for `n` stages: two each, or one
/// each and a legend (`compact`).
pub(in crate::view) fn stages_height(n: usize, compact: bool) -> u16 {
    let n = u16::try_from(n.max(1)).unwrap_or(u16::MAX / 4);
    if compact { 2 + n } else { 2 + n * 2 }
}

pub(in crate::view) fn draw_stages(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    compact: bool,
    theme: Theme,
) {
    let mut block = pane_block(app, Pane::Stages, String::new(), theme);
    let inner_w = area.width.saturating_sub(2) as usize;
    let mut lines = Vec::new();
    match &app.snap.view {
        Some(v) if compact => {
            let (rows, legend, total) = compact_stages(v, inner_w, theme);
            lines = rows;
            if let Some(total) = total {
                let extra = format!(" · of {total} each");
                block = pane_block(app, Pane::Stages, extra, theme);
            }
            if !legend.is_empty() {
                block = block.title_bottom(Line::from(styled(legend, theme.dim())));
            }
        }
        Some(v) => {
            for s in &v.stages {
                let glyph = stage_glyph(s, v.shown);
                let role = if s.is_critic() { "↳ " } else { "" };
                let mut label = truncate(&s.name, 16);
                let (done, pending) = shown_done(s);
                let mut pct = format!(" {}", percent(s.done, s.total, pending));
                // Asked to stop after this stage: said on the label line,
                // which is never cut, rather than at the end of the counts.
                let stopping = v.stop_after_stage.as_deref() == Some(s.name.as_str());
                let mark = if stopping { " ⏹ stop after" } else { "" };
                let width = |label: &str, pct: &str| {
                    glyph.chars().count()
                        + role.chars().count()
                        + label.chars().count()
                        + mark.chars().count()
                        + pct.chars().count()
                        + 2
                };
                // Too narrow for all of it: the percentage goes (the counts
                // say as much), then the name is cut.
                if inner_w.saturating_sub(width(&label, &pct)) < 4 {
                    pct.clear();
                }
                let over = (width(&label, &pct) + 4).saturating_sub(inner_w);
                if over > 0 {
                    label = truncate(&s.name, label.chars().count().saturating_sub(over).max(4));
                }
                // A critic names what it judges where the bar can spare it.
                let of = s
                    .critic_of
                    .as_deref()
                    .map(|of| format!("of {} ", truncate(of, 20)))
                    .filter(|of| {
                        inner_w.saturating_sub(width(&label, &pct) + of.chars().count()) >= 16
                    })
                    .unwrap_or_default();
                let bar_w = inner_w
                    .saturating_sub(width(&label, &pct) + of.chars().count())
                    .max(4);
                lines.push(Line::from(vec![
                    styled(glyph, theme.text()),
                    styled(role, theme.dim()),
                    styled(format!("{label} "), theme.title(false)),
                    styled(of, theme.dim()),
                    styled(bar(done, s.total, bar_w), theme.gauge()),
                    Span::raw(pct),
                    styled(mark, theme.warn()),
                ]));
                lines.push(Line::from(stage_counts(s, v.shown, inner_w)));
            }
        }
        None => lines.push(Line::from(styled("no session", theme.dim()))),
    }
    frame.render_widget(Paragraph::new(lines).block(block), area);
}

/// One row per stage: `▶ ↳name ███░ done ✗f ⊘s ⇡n ⏹` (`done/total` when the
/// stages' totals differ; else the total is in the title), the bars and
/// counts aligned. Also the title's total and a legend of the glyphs shown,
/// for the pane's bottom border.
fn compact_stages<'a>(
    v: &SessionView,
    inner_w: usize,
    theme: Theme,
) -> (Vec<Line<'a>>, String, Option<u64>) {
    let same_total = v
        .stages
        .first()
        .map(|f| f.total)
        .filter(|t| v.stages.iter().all(|s| s.total == *t));
    let (tails, shown) = compact_tails(v, same_total);
    let tail_w = tails
        .iter()
        .map(|(t, stop)| t.chars().count() + stop.chars().count())
        .max()
        .unwrap_or(0);
    let longest = v
        .stages
        .iter()
        .map(|s| truncate(&s.name, 16).chars().count())
        .max()
        .unwrap_or(0);
    // glyph, space, role; the name and a space; a bar of 4 at least; counts.
    let name_w = longest.min(inner_w.saturating_sub(3 + 1 + 4 + tail_w).max(4));
    let bar_w = inner_w.saturating_sub(3 + name_w + 1 + tail_w).max(3);
    let mut rows = Vec::new();
    for (s, (tail, stop)) in v.stages.iter().zip(tails) {
        let glyph = match stage_glyph(s, v.shown) {
            g if g.is_empty() => "  ".to_string(),
            g => g,
        };
        let role = if s.is_critic() { "↳" } else { " " };
        let name = truncate(&s.name, name_w);
        let (done, _) = shown_done(s);
        rows.push(Line::from(vec![
            styled(glyph, theme.text()),
            styled(role, theme.dim()),
            styled(format!("{name:<name_w$} "), theme.title(false)),
            styled(bar(done, s.total, bar_w), theme.gauge()),
            Span::raw(tail),
            styled(stop, theme.warn()),
        ]));
    }
    (rows, legend(shown, inner_w), same_total)
}

/// Which glyphs the compact rows show, for the legend.
#[derive(Default)]
struct Shown {
    failed: bool,
    skipped: bool,
    in_flight: bool,
    at_provider: bool,
    critic: bool,
    stop: bool,
}

/// Each stage's counts after its bar (`done`, or `done/total` when the
/// stages' totals differ) and its stop mark.
fn compact_tails(v: &SessionView, same_total: Option<u64>) -> (Vec<(String, &'static str)>, Shown) {
    let mut shown = Shown::default();
    let tails = v
        .stages
        .iter()
        .map(|s| {
            let mut tail = match same_total {
                Some(_) => format!(" {}", s.done),
                None => format!(" {}/{}", s.done, s.total),
            };
            if s.failed > 0 {
                shown.failed = true;
                tail.push_str(&format!(" ✗{}", s.failed));
            }
            if s.skipped > 0 {
                shown.skipped = true;
                tail.push_str(&format!(" ⊘{}", s.skipped));
            }
            if s.in_flight > 0 {
                shown.in_flight = true;
                tail.push_str(&format!(" ⇡{}", s.in_flight));
            }
            if s.at_provider > 0 {
                shown.at_provider = true;
                tail.push_str(&format!(" ◷{}", s.at_provider));
            }
            let stopping = v.stop_after_stage.as_deref() == Some(s.name.as_str());
            shown.stop |= stopping;
            shown.critic |= s.is_critic();
            (tail, if stopping { " ⏹" } else { "" })
        })
        .collect();
    (tails, shown)
}

/// The glyphs shown, named, as far as `inner_w` allows.
fn legend(shown: Shown, inner_w: usize) -> String {
    let mut legend = String::new();
    for (shown, word) in [
        (shown.failed, "✗ failed"),
        (shown.skipped, "⊘ skipped"),
        (shown.in_flight, "⇡ in flight"),
        (shown.at_provider, "◷ at provider"),
        (shown.stop, "⏹ stop after"),
        (shown.critic, "↳ critic"),
    ] {
        if shown && legend.chars().count() + word.chars().count() + 3 <= inner_w {
            legend.push(' ');
            legend.push_str(word);
        }
    }
    if !legend.is_empty() {
        legend.push(' ');
    }
    legend
}
