//! The gauges pane on a wide screen: two columns, the limits on the left
//! with a bar of how much of each is in use, the run's counts, time, cost
//! and status on the right. A narrow pane keeps one column.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use super::bar;
use crate::theme::Theme;
use crate::view::styled;
use docket_ledger::watch::{LiveGauges, SessionView};

/// From this inner width the pane has two columns.
pub(in crate::view) const TWO_COLUMNS_MIN: u16 = 80;

/// The text of a limit line takes this many cells before its bar.
const LIMIT_TEXT: usize = 34;

/// One column or two, as the pane's inner area allows.
pub(super) struct Columns {
    inner: Rect,
}

impl Columns {
    pub(super) fn for_pane(inner: Rect) -> Columns {
        Columns { inner }
    }

    fn two(&self) -> bool {
        self.inner.width >= TWO_COLUMNS_MIN
    }

    /// The width a line of the pane has.
    pub(super) fn width(&self) -> usize {
        let w = if self.two() {
            self.inner.width / 2 - 1
        } else {
            self.inner.width
        };
        usize::from(w)
    }

    /// Draw `lines` (the first `limits` of them the limit lines).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn draw(
        &self,
        frame: &mut Frame,
        area: Rect,
        block: Block,
        mut lines: Vec<Line>,
        limits: usize,
        (v, g): (&SessionView, &LiveGauges),
        theme: Theme,
    ) {
        if !self.two() {
            frame.render_widget(Paragraph::new(lines).block(block), area);
            return;
        }
        frame.render_widget(block, area);
        let [left, right] =
            Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)])
                .spacing(1)
                .areas(self.inner);
        let rest = lines.split_off(limits.min(lines.len()));
        if v.live {
            let used = [
                (g.rpm_used, g.rpm_limit as f64),
                (g.tpm_used, g.tpm_limit as f64),
                (v.in_flight as f64, g.concurrency_limit as f64),
            ];
            let bar_w = usize::from(left.width).saturating_sub(LIMIT_TEXT + 1);
            for (line, (n, limit)) in lines.iter_mut().zip(used) {
                with_bar(line, n, limit, bar_w, theme);
            }
        }
        frame.render_widget(Paragraph::new(lines), left);
        frame.render_widget(Paragraph::new(rest), right);
    }
}

/// Pad a limit line to [`LIMIT_TEXT`] cells and add a bar of `n` against
/// `limit` (none without a limit, or before the rate means anything).
fn with_bar(line: &mut Line, n: f64, limit: f64, width: usize, theme: Theme) {
    if limit <= 0.0 || width < 4 {
        return;
    }
    let pad = LIMIT_TEXT.saturating_sub(line.width());
    line.spans.push(Span::raw(" ".repeat(pad + 1)));
    let filled = bar(n.max(0.0).round() as u64, limit.round() as u64, width);
    line.spans.push(styled(filled, theme.dim()));
}
