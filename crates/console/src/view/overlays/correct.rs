//! The correction form over the review card: the candidate picked (with
//! its fields), then one line per answer field with its edit box; the row
//! under the cursor is marked `›` (and shows the text cursor).

use ratatui::Frame;
use ratatui::layout::{Position, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};

use super::centered;
use crate::app::CorrectionForm;
use crate::theme::Theme;
use crate::view::styled;
use crate::view::wrap::cells;
use docket_model::review_card::scalar_text;
use docket_model::sanitize::{for_terminal, truncate};

pub(in crate::view) fn draw_correction(
    frame: &mut Frame,
    area: Rect,
    form: &CorrectionForm,
    theme: Theme,
) {
    let width = area.width.min(100);
    let inner = usize::from(width.saturating_sub(2));
    let mut lines = vec![Line::from(styled(
        format!("Correct {}", truncate(&form.item_id, 40)),
        theme.title(true),
    ))];
    let cand_rows = usize::from(!form.candidates.is_empty());
    if cand_rows == 1 {
        lines.push(candidate_line(form, inner, theme));
    }
    let key_w = form
        .fields
        .iter()
        .map(|f| cells(&for_terminal(&f.key)).min(20))
        .max()
        .unwrap_or(0);
    let mut cursor_at = None;
    for (i, f) in form.fields.iter().enumerate() {
        let here = form.row == i + cand_rows;
        let key = truncate(&f.key, 20);
        let lead = format!(
            "{} {key}{}  ",
            if here { "›" } else { " " },
            " ".repeat(key_w.saturating_sub(cells(&key)))
        );
        let room = inner.saturating_sub(cells(&lead) + 1).max(4);
        // The edit box being typed in scrolls so its text cursor stays
        // inside; the others show their start.
        let scroll = if here { f.input.visual_scroll(room) } else { 0 };
        let value: String = for_terminal(f.input.value())
            .chars()
            .skip(scroll)
            .take(room)
            .collect();
        if here {
            let x = cells(&lead) + f.input.visual_cursor().saturating_sub(scroll);
            cursor_at = Some((x, lines.len()));
        }
        let style = if here { theme.selected() } else { theme.text() };
        lines.push(Line::from(vec![
            styled(lead, theme.dim()),
            Span::styled(value, style),
        ]));
    }
    lines.push(Line::from(""));
    lines.push(Line::from(styled(
        "↑↓ field  ←→ candidate  enter accept this answer  esc back",
        theme.key(),
    )));
    let height = u16::try_from(lines.len() + 2).unwrap_or(u16::MAX);
    let popup = centered(area, width, height);
    frame.render_widget(Clear, popup);
    let block = Block::default()
        .borders(Borders::ALL)
        .border_type(BorderType::Double)
        .border_style(theme.border(true))
        .title(Span::styled(" Correct the answer ", theme.title(true)));
    frame.render_widget(Paragraph::new(lines).block(block), popup);
    if let Some((x, y)) = cursor_at {
        let x = popup.x + 1 + u16::try_from(x).unwrap_or(0);
        let y = popup.y + 1 + u16::try_from(y).unwrap_or(0);
        if x < popup.right() && y < popup.bottom() {
            frame.set_cursor_position(Position::new(x, y));
        }
    }
}

/// `‹ candidate 2/3 ›  title · artist · type` for the candidate picked.
fn candidate_line<'a>(form: &CorrectionForm, inner: usize, theme: Theme) -> Line<'a> {
    let here = form.on_candidates();
    let n = form.candidates.len();
    let (label, about) = match form.candidate {
        Some(i) => {
            let about = form
                .candidates
                .get(i)
                .and_then(|c| c.as_object())
                .map(|c| {
                    c.values()
                        .filter(|v| !v.is_array() && !v.is_object())
                        .map(|v| for_terminal(&scalar_text(v)))
                        .collect::<Vec<_>>()
                        .join(" · ")
                })
                .unwrap_or_default();
            (format!("‹ candidate {}/{n} ›", i + 1), about)
        }
        None => (
            format!("‹ candidate -/{n} ›"),
            "(the answer's own values)".into(),
        ),
    };
    let lead = format!("{} {label}  ", if here { "›" } else { " " });
    let about = truncate(&about, inner.saturating_sub(cells(&lead)).max(1));
    Line::from(vec![
        styled(
            lead,
            if here {
                theme.selected()
            } else {
                theme.accepted()
            },
        ),
        Span::raw(about),
    ])
}
