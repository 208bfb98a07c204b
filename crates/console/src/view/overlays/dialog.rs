//! The yes/no dialogs: cancel a run, reject many, quit while live.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, BorderType, Borders, Clear, Paragraph};

use super::centered;
use crate::action::Action;
use crate::app::{App, Dialog};
use crate::keymap::Section;
use crate::theme::Theme;
use crate::view::styled;
use docket_model::sanitize::truncate;

pub(in crate::view) fn draw_dialog(
    frame: &mut Frame,
    area: Rect,
    app: &App,
    dialog: &Dialog,
    theme: Theme,
) {
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
                "Their decisions stay undecided; one u undoes them all.".into(),
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
