//! A review card's evidence and answer as fields people read: aligned
//! `key  value` rows, nested objects indented under their key, lists of
//! objects as small tables. The candidate an answer picks is marked in its
//! table, and the fields where it differs from the item are named.
//! Every text is sanitized ([`truncate`] / [`for_terminal`]): it is item or
//! model text.

use ratatui::text::{Line, Span};
use serde_json::Value;

use crate::theme::Theme;
use crate::view::styled;
use crate::view::wrap::cells;
use docket_model::review_card::{Chosen, FieldDiff, differing_fields, scalar_text};
use docket_model::sanitize::{for_terminal, truncate};

/// Keys are padded to the longest of their object, up to this.
const KEY_MAX: usize = 20;
/// A table column is never cut narrower than this.
const COLUMN_MIN: usize = 5;
/// Nesting deeper than this shows as compact JSON.
const DEPTH_MAX: usize = 4;

/// What the fields of one card mark: the chosen candidate (list and row)
/// and its fields that differ from the item's.
#[derive(Default)]
pub(super) struct Marks<'a> {
    pub chosen: Option<Chosen<'a>>,
    pub diffs: Vec<FieldDiff>,
}

impl<'a> Marks<'a> {
    pub(super) fn new(evidence: &'a Value, answer: &'a Value) -> Self {
        let chosen = docket_model::review_card::chosen_candidate(evidence, answer);
        let diffs = chosen
            .as_ref()
            .map(|c| differing_fields(evidence, c.candidate))
            .unwrap_or_default();
        Marks { chosen, diffs }
    }

    fn chosen_row(&self, list: &str) -> Option<usize> {
        self.chosen
            .as_ref()
            .filter(|c| c.list == list)
            .map(|c| c.index)
    }
}

/// `value` as field lines, each at most `width` cells (long scalars are
/// wrapped by the caller), indented by `indent` spaces.
pub(super) fn field_lines<'a>(
    value: &Value,
    indent: usize,
    width: usize,
    marks: &Marks<'_>,
    theme: Theme,
) -> Vec<Line<'a>> {
    let mut lines = Vec::new();
    object_lines(&mut lines, value, indent, width, marks, 0, theme);
    lines
}

fn object_lines<'a>(
    out: &mut Vec<Line<'a>>,
    value: &Value,
    indent: usize,
    width: usize,
    marks: &Marks<'_>,
    depth: usize,
    theme: Theme,
) {
    let pad = " ".repeat(indent);
    let Value::Object(map) = value else {
        out.push(Line::from(format!("{pad}{}", scalar(value))));
        return;
    };
    if map.is_empty() {
        out.push(Line::from(styled(format!("{pad}(no fields)"), theme.dim())));
        return;
    }
    let key_w = map
        .keys()
        .map(|k| cells(&for_terminal(k)).min(KEY_MAX))
        .max()
        .unwrap_or(0);
    for (k, v) in map {
        let key = truncate(k, KEY_MAX);
        let gap = " ".repeat(key_w.saturating_sub(cells(&key)) + 2);
        let key_span = styled(format!("{pad}{key}"), theme.dim());
        match v {
            Value::Object(_) if depth < DEPTH_MAX => {
                out.push(Line::from(key_span));
                object_lines(out, v, indent + 2, width, marks, depth + 1, theme);
            }
            Value::Array(items)
                if depth < DEPTH_MAX && !items.is_empty() && items.iter().all(Value::is_object) =>
            {
                let chosen = if depth == 0 {
                    marks.chosen_row(k)
                } else {
                    None
                };
                out.push(Line::from(key_span));
                out.extend(table_lines(items, indent + 2, width, chosen, marks, theme));
            }
            _ => out.push(Line::from(vec![
                key_span,
                Span::raw(gap),
                Span::raw(scalar(v)),
            ])),
        }
    }
}

/// A scalar (or a list of scalars, or anything too deep) as one text.
fn scalar(v: &Value) -> String {
    match v {
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => items
            .iter()
            .map(|i| for_terminal(&scalar_text(i)))
            .collect::<Vec<_>>()
            .join(", "),
        Value::Null => "—".to_string(),
        other => for_terminal(&scalar_text(other)),
    }
}

/// A list of objects as a table: one column per key (in the order first
/// seen), cut to fit `width`. The chosen row is marked `▶`, and its cells
/// that differ from the item's own fields are marked `*` (and coloured).
fn table_lines<'a>(
    items: &[Value],
    indent: usize,
    width: usize,
    chosen: Option<usize>,
    marks: &Marks<'_>,
    theme: Theme,
) -> Vec<Line<'a>> {
    let mut keys: Vec<&str> = Vec::new();
    for item in items {
        if let Value::Object(m) = item {
            for k in m.keys() {
                if !keys.contains(&k.as_str()) {
                    keys.push(k);
                }
            }
        }
    }
    let cell = |item: &Value, k: &str| item.get(k).map(scalar).unwrap_or_default();
    let mut widths: Vec<usize> = keys
        .iter()
        .map(|k| {
            items
                .iter()
                .map(|i| cells(&cell(i, k)) + 1)
                .chain([cells(&for_terminal(k))])
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Marker column (2) and one space between columns.
    let avail = width.saturating_sub(indent + 2);
    while widths.iter().sum::<usize>() + widths.len().saturating_sub(1) > avail {
        let Some((i, w)) = widths.iter().enumerate().max_by_key(|(_, w)| **w) else {
            break;
        };
        if *w <= COLUMN_MIN {
            break;
        }
        widths[i] -= 1;
    }
    let pad = " ".repeat(indent);
    let mut lines = Vec::with_capacity(items.len() + 1);
    let mut head = vec![Span::raw(format!("{pad}  "))];
    for (k, w) in keys.iter().zip(&widths) {
        head.push(styled(format!("{:<w$} ", truncate(k, *w)), theme.dim()));
    }
    lines.push(Line::from(head));
    for (row, item) in items.iter().enumerate() {
        let is_chosen = chosen == Some(row);
        let marker = if is_chosen { "▶ " } else { "  " };
        let mut spans = vec![Span::raw(pad.clone()), styled(marker, theme.accepted())];
        for (k, w) in keys.iter().zip(&widths) {
            let differs = is_chosen && marks.diffs.iter().any(|(f, _, _)| f == k);
            let text = if differs {
                format!("{}*", cell(item, k))
            } else {
                cell(item, k)
            };
            let text = format!("{:<w$} ", truncate(&text, *w));
            spans.push(match (differs, is_chosen) {
                (true, _) => styled(text, theme.warn()),
                (false, true) => styled(text, theme.accepted()),
                _ => Span::raw(text),
            });
        }
        lines.push(Line::from(spans));
    }
    lines
}

/// The chosen candidate in words: which, named by which answer fields, and
/// each field where it differs from the item (`title: "A" → "B"`).
pub(super) fn chosen_lines<'a>(marks: &Marks<'_>, theme: Theme) -> Vec<Line<'a>> {
    let Some(c) = &marks.chosen else {
        return Vec::new();
    };
    let mut lines = vec![Line::from(vec![
        styled("  ▶ chosen: ", theme.accepted()),
        Span::raw(format!(
            "{} #{} (the answer's {})",
            truncate(c.list, 20),
            c.index + 1,
            c.matched_by
                .iter()
                .map(|k| truncate(k, 20))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    ])];
    if marks.diffs.is_empty() {
        lines.push(Line::from(styled(
            "    same as the item in every field they share",
            theme.dim(),
        )));
    }
    for (field, item, cand) in &marks.diffs {
        lines.push(Line::from(vec![
            styled(
                format!("    * {} differs: ", truncate(field, 20)),
                theme.warn(),
            ),
            Span::raw(format!(
                "item \"{}\" → candidate \"{}\"",
                truncate(item, 60),
                truncate(cand, 60)
            )),
        ]));
    }
    lines
}
