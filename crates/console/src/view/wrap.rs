//! Word wrap for text the console draws: rows break at spaces, inside a word
//! only when the word is longer than a row, and a wrapped line's rows after
//! the first are indented past the line's own indent, so wrapped text never
//! runs back to column 0 and a value is never cut off at the border.

use std::ops::Range;

use ratatui::text::{Line, Span};

/// Terminal cells `s` takes.
pub(crate) fn cells(s: &str) -> usize {
    Span::raw(s).width()
}

/// Byte ranges of `text`'s rows: the first at most `first` cells wide, the
/// others at most `rest`. A space at a break is dropped; spaces inside a
/// row (and the text's own leading indent) are kept.
pub(crate) fn wrap_ranges(text: &str, first: usize, rest: usize) -> Vec<Range<usize>> {
    let (first, rest) = (first.max(1), rest.max(1));
    let mut rows: Vec<Range<usize>> = Vec::new();
    let mut row: Option<Range<usize>> = None;
    let mut pos = 0;
    for word in text.split(' ') {
        let (mut start, end) = (pos, pos + word.len());
        pos = end + 1;
        let max = if rows.is_empty() { first } else { rest };
        if let Some(r) = &row {
            if cells(&text[r.start..end]) <= max {
                row = Some(r.start..end);
                continue;
            }
            rows.extend(row.take());
        }
        if word.is_empty() && !rows.is_empty() {
            // Spaces at a break: a continuation row starts at its text.
            continue;
        }
        // A word longer than a row: cut it by cells.
        loop {
            let max = if rows.is_empty() { first } else { rest };
            if cells(&text[start..end]) <= max {
                break;
            }
            let cut = cut_at(text, start, end, max);
            rows.push(start..cut);
            start = cut;
        }
        row = Some(start..end);
    }
    rows.extend(row);
    if rows.is_empty() {
        rows.push(0..0);
    }
    rows
}

/// The byte where `text[start..end]` is cut to fit `max` cells (at least
/// one character, even one wider than the row).
fn cut_at(text: &str, start: usize, end: usize, max: usize) -> usize {
    let mut used = 0;
    let mut cut = start;
    for (i, c) in text[start..end].char_indices() {
        let w = cells(&text[start + i..start + i + c.len_utf8()]);
        if used + w > max {
            break;
        }
        used += w;
        cut = start + i + c.len_utf8();
    }
    if cut == start {
        cut = start + text[start..end].chars().next().map_or(0, char::len_utf8);
    }
    cut
}

/// `text` (already safe) in rows of at most `width` cells.
pub(crate) fn wrap(text: &str, width: usize) -> Vec<String> {
    wrap_ranges(text, width, width)
        .into_iter()
        .map(|r| text[r].to_string())
        .collect()
}

/// `text` in rows of at most `width` cells, the rows after the first
/// indented by `indent` spaces (within the same width).
pub(crate) fn wrap_indented(text: &str, width: usize, indent: usize) -> Vec<String> {
    let indent = indent.min(width / 2);
    wrap_ranges(text, width, width - indent)
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let pad = if i == 0 { 0 } else { indent };
            format!("{}{}", " ".repeat(pad), &text[r])
        })
        .collect()
}

/// A styled line in rows of at most `width` cells, each span keeping its
/// style; the rows after the first start two cells past the line's own
/// indent. A line that fits comes back as it is.
pub(crate) fn wrap_line(line: Line<'_>, width: usize) -> Vec<Line<'_>> {
    let text: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
    if cells(&text) <= width || width == 0 {
        return vec![line];
    }
    let lead = text.len() - text.trim_start_matches(' ').len();
    let indent = (lead + 2).min(width / 2);
    let mut bounds = Vec::with_capacity(line.spans.len());
    let mut at = 0;
    for s in &line.spans {
        bounds.push((at..at + s.content.len(), s.style));
        at += s.content.len();
    }
    wrap_ranges(&text, width, width - indent)
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let mut spans = Vec::new();
            if i > 0 {
                spans.push(Span::raw(" ".repeat(indent)));
            }
            for (b, style) in &bounds {
                let (from, to) = (r.start.max(b.start), r.end.min(b.end));
                if from < to {
                    spans.push(Span::styled(text[from..to].to_string(), *style));
                }
            }
            Line::from(spans).style(line.style)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_stay_whole_and_long_ones_are_cut_by_cells() {
        assert_eq!(wrap("one two three", 7), vec!["one two", "three"]);
        assert_eq!(wrap("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
        assert_eq!(wrap("", 4), vec![""]);
        // Wide characters count two cells.
        assert_eq!(wrap("日本語です", 4), vec!["日本", "語で", "す"]);
    }

    #[test]
    fn continuation_rows_are_indented_past_the_lines_indent() {
        let line = Line::from("    key: alpha beta gamma delta");
        let rows: Vec<String> = wrap_line(line, 20)
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect();
        assert_eq!(
            rows,
            vec!["    key: alpha beta", "      gamma delta"],
            "{rows:?}"
        );
        for r in &rows {
            assert!(cells(r) <= 20, "{r:?}");
        }
    }

    #[test]
    fn a_wrapped_line_keeps_each_spans_style() {
        use ratatui::style::{Color, Style};
        let red = Style::default().fg(Color::Red);
        let line = Line::from(vec![Span::styled("alpha ", red), Span::raw("beta gamma")]);
        let rows = wrap_line(line, 11);
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].spans[0].style, red);
        assert_eq!(rows[0].spans[0].content, "alpha ");
        assert_eq!(rows[1].spans.last().unwrap().content, "gamma");
    }
}
