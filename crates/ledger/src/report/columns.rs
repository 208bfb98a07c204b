//! Typed cells and the streaming CSV / JSON writers shared by the reports.
//!
//! Each report is a ledger read plus a fixed list of (column, kind). The
//! ledger reads a row into a reused `Vec<Cell>` ([`crate::report::reads`])
//! and it is written at once, so memory stays flat.
//! Kinds keep types stable across runs: timestamps are ISO-8601 UTC strings,
//! floats always print as floats (`1.0`, never `1`), JSON-valued columns are
//! strings in CSV and nested values in JSON, missing values are empty / null.

use std::io::{self, Write};

use chrono::{DateTime, Utc};
use serde_json::Value;

use super::ReportError;

/// The type of a report column, which says how the ledger reads its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Text,
    Int,
    Float,
    /// Unix seconds in the ledger; ISO-8601 UTC outside.
    Ts,
    /// JSON text in the ledger; a string in CSV, a nested value in JSON.
    Json,
    /// 0/1 in SQL; `true`/`false` everywhere outside.
    Bool,
}

/// One value of a report row.
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    Json(String),
    Bool(bool),
}

impl Cell {
    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Cell::Text(s) | Cell::Json(s) => Some(s),
            _ => None,
        }
    }

    pub(crate) fn as_i64(&self) -> Option<i64> {
        match self {
            Cell::Int(i) => Some(*i),
            Cell::Float(f) if f.fract() == 0.0 => Some(*f as i64),
            _ => None,
        }
    }

    pub(crate) fn as_f64(&self) -> Option<f64> {
        match self {
            Cell::Int(i) => Some(*i as f64),
            Cell::Float(f) => Some(*f),
            _ => None,
        }
    }

    /// The CSV field text.
    pub(crate) fn csv_text(&self) -> String {
        match self {
            Cell::Null => String::new(),
            Cell::Int(i) => i.to_string(),
            Cell::Float(f) => float_text(*f),
            Cell::Text(s) | Cell::Json(s) => s.clone(),
            Cell::Bool(b) => b.to_string(),
        }
    }

    /// The CSV field text, made safe for a spreadsheet (fault-matrix row
    /// I2): text that a spreadsheet would run as a formula (starting with
    /// `=`, `+`, `-`, `@`, a tab or a carriage return) gets a leading `'`,
    /// as OWASP advises; numbers, and text that reads as one ("-0.5"), stay
    /// as they are.
    pub(crate) fn csv_field(&self) -> String {
        let text = self.csv_text();
        match self {
            Cell::Text(s) | Cell::Json(s) if formula_like(s) => format!("'{text}"),
            _ => text,
        }
    }

    /// The JSON value.
    pub(crate) fn json_value(&self) -> Value {
        match self {
            Cell::Null => Value::Null,
            Cell::Int(i) => Value::from(*i),
            Cell::Float(f) => serde_json::Number::from_f64(*f)
                .map(Value::Number)
                .unwrap_or(Value::Null),
            Cell::Text(s) => Value::String(s.clone()),
            // Stored JSON that does not parse is passed on as a string rather than lost.
            Cell::Json(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
            Cell::Bool(b) => Value::Bool(*b),
        }
    }
}

/// A float that always reads back as a float (`1.0`, `0.25`); empty if not finite.
pub(crate) fn float_text(f: f64) -> String {
    if !f.is_finite() {
        return String::new();
    }
    let s = f.to_string();
    if s.contains('.') { s } else { format!("{s}.0") }
}

pub(crate) fn datetime(ts: f64) -> Option<DateTime<Utc>> {
    if !ts.is_finite() {
        return None;
    }
    let secs = ts.floor();
    if secs < i64::MIN as f64 || secs > i64::MAX as f64 {
        return None;
    }
    DateTime::<Utc>::from_timestamp(secs as i64, 0)
}

impl Cell {
    /// A `Kind::Ts` value: Unix seconds as ISO-8601 UTC text, null when
    /// they are no time at all.
    pub(crate) fn ts(ts: f64) -> Cell {
        match super::iso_time(ts) {
            Some(s) => Cell::Text(s),
            None => Cell::Null,
        }
    }
}

/// Write one JSON object with keys in the given order (serde_json's `Map`
/// may sort keys; column order is part of the contract, so write by hand).
pub(crate) fn write_json_object(
    out: &mut dyn Write,
    keys: &[&str],
    cells: &[Cell],
) -> Result<(), ReportError> {
    out.write_all(b"{")?;
    for (i, (key, cell)) in keys.iter().zip(cells).enumerate() {
        if i > 0 {
            out.write_all(b",")?;
        }
        serde_json::to_writer(&mut *out, key)?;
        out.write_all(b":")?;
        serde_json::to_writer(&mut *out, &cell.json_value())?;
    }
    out.write_all(b"}")?;
    Ok(())
}

/// Streams records as CSV, JSON Lines or one JSON array.
pub(crate) enum RecordWriter<'a> {
    Csv {
        w: Box<csv::Writer<&'a mut dyn Write>>,
        buf: Vec<String>,
    },
    Jsonl {
        out: io::BufWriter<&'a mut dyn Write>,
        keys: &'a [&'a str],
    },
    JsonArray {
        out: io::BufWriter<&'a mut dyn Write>,
        keys: &'a [&'a str],
        first: bool,
    },
}

impl<'a> RecordWriter<'a> {
    pub(crate) fn csv(out: &'a mut dyn Write, header: &[&str]) -> Result<Self, ReportError> {
        let mut w = csv::WriterBuilder::new()
            .has_headers(false)
            .from_writer(out);
        w.write_record(header)?;
        Ok(RecordWriter::Csv {
            w: Box::new(w),
            buf: Vec::with_capacity(header.len()),
        })
    }

    pub(crate) fn jsonl(out: &'a mut dyn Write, keys: &'a [&'a str]) -> Self {
        RecordWriter::Jsonl {
            out: io::BufWriter::with_capacity(64 * 1024, out),
            keys,
        }
    }

    pub(crate) fn json_array(
        out: &'a mut dyn Write,
        keys: &'a [&'a str],
    ) -> Result<Self, ReportError> {
        let mut out = io::BufWriter::with_capacity(64 * 1024, out);
        out.write_all(b"[")?;
        Ok(RecordWriter::JsonArray {
            out,
            keys,
            first: true,
        })
    }

    pub(crate) fn write(&mut self, cells: &[Cell]) -> Result<(), ReportError> {
        match self {
            RecordWriter::Csv { w, buf } => {
                buf.clear();
                buf.extend(cells.iter().map(Cell::csv_field));
                w.write_record(buf.iter())?;
            }
            RecordWriter::Jsonl { out, keys } => {
                write_json_object(out, keys, cells)?;
                out.write_all(b"\n")?;
            }
            RecordWriter::JsonArray { out, keys, first } => {
                out.write_all(if *first { b"\n" } else { b",\n" })?;
                *first = false;
                write_json_object(out, keys, cells)?;
            }
        }
        Ok(())
    }

    pub(crate) fn finish(self) -> Result<(), ReportError> {
        match self {
            RecordWriter::Csv { mut w, .. } => w.flush()?,
            RecordWriter::Jsonl { mut out, .. } => out.flush()?,
            RecordWriter::JsonArray { mut out, first, .. } => {
                out.write_all(if first { b"]\n" } else { b"\n]\n" })?;
                out.flush()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_stay_floats() {
        assert_eq!(float_text(1.0), "1.0");
        assert_eq!(float_text(0.25), "0.25");
        assert_eq!(float_text(f64::NAN), "");
        assert_eq!(Cell::Float(1.0).json_value().to_string(), "1.0");
    }

    #[test]
    fn json_object_keeps_key_order() {
        let mut out = Vec::new();
        let cells = [
            Cell::Text("b".into()),
            Cell::Json(r#"{"x":1}"#.into()),
            Cell::Null,
        ];
        write_json_object(&mut out, &["zz", "aa", "mm"], &cells).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"zz":"b","aa":{"x":1},"mm":null}"#
        );
    }
}

/// Whether a spreadsheet opening the CSV would take `s` for a formula.
fn formula_like(s: &str) -> bool {
    s.starts_with(['=', '+', '-', '@', '\t', '\r']) && s.trim().parse::<f64>().is_err()
}

#[cfg(test)]
mod csv_safety_tests {
    use super::*;

    #[test]
    fn formula_cells_are_neutralised_and_numbers_kept() {
        for (cell, field) in [
            (
                Cell::Text("=HYPERLINK(\"http://x\")".into()),
                "'=HYPERLINK(\"http://x\")",
            ),
            (
                Cell::Text("+cmd|' /C calc'!A0".into()),
                "'+cmd|' /C calc'!A0",
            ),
            (Cell::Text("-2+3".into()), "'-2+3"),
            (Cell::Text("@SUM(A1)".into()), "'@SUM(A1)"),
            (Cell::Text("\t=1".into()), "'\t=1"),
            (Cell::Text("-0.5".into()), "-0.5"),
            (Cell::Float(-0.5), "-0.5"),
            (Cell::Int(-3), "-3"),
            (Cell::Text("plain".into()), "plain"),
        ] {
            assert_eq!(cell.csv_field(), field, "{cell:?}");
        }
    }
}
