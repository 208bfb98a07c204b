//! JSONL rows: one JSON object a line, its id field the item id, the rest
//! its evidence; a bad line is told with a reason a person can act on.

use std::io::{BufReader, Read};
use std::path::Path;

use docket_model::evidence::Evidence;
use serde_json::{Map, Value};

use super::{
    ImportError, ImportReport, MAX_ITEM_BYTES, Sink, UTF8_BOM, check_id, is_blank,
    read_line_capped, strip_line_end, too_large,
};

pub(super) fn import_jsonl<R: Read>(
    mut reader: BufReader<R>,
    path: &Path,
    id_field: &str,
    sink: &mut Sink<'_, '_, '_>,
    report: &mut ImportReport,
) -> Result<(), ImportError> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut line_no: u64 = 0;
    let mut evidence = Evidence::default();
    loop {
        buf.clear();
        // One byte over the limit, and its line end, tell a line too large.
        let n = read_line_capped(&mut reader, &mut buf, MAX_ITEM_BYTES + 2).map_err(|source| {
            ImportError::Read {
                file: path.to_path_buf(),
                line: line_no + 1,
                source,
            }
        })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if strip_line_end(&buf).len() > MAX_ITEM_BYTES {
            report.rows_read += 1;
            report.bad(line_no, too_large(n));
            buf = Vec::with_capacity(4096);
            continue;
        }
        let mut line = strip_line_end(&buf);
        if line_no == 1 && line.starts_with(UTF8_BOM) {
            line = &line[UTF8_BOM.len()..];
        }
        if is_blank(line) {
            continue;
        }
        report.rows_read += 1;
        match parse_jsonl_row(line, id_field, &mut evidence) {
            Ok(id) => sink
                .insert(&id, &evidence, line_no, report)
                .map_err(|source| ImportError::Ledger {
                    file: path.to_path_buf(),
                    source,
                })?,
            Err(reason) => report.bad(line_no, reason),
        }
        // Do not keep a huge buffer around after one huge line.
        if buf.capacity() > 1 << 20 {
            buf = Vec::with_capacity(4096);
        }
    }
    Ok(())
}

/// Parse one JSONL line; on success return the id and leave the evidence
/// (the object without the id field, and its hash) in `evidence`.
pub(super) fn parse_jsonl_row(
    line: &[u8],
    id_field: &str,
    evidence: &mut Evidence,
) -> Result<String, String> {
    let text = std::str::from_utf8(line).map_err(|e| {
        format!(
            "invalid UTF-8 at column {} (byte offset {})",
            e.valid_up_to() + 1,
            e.valid_up_to()
        )
    })?;
    let mut map: Map<String, Value> = match serde_json::from_str(text) {
        Ok(m) => m,
        Err(e) => return Err(json_error_reason(text, &e)),
    };
    let id = match map.remove(id_field) {
        None => return Err(format!("missing id field {id_field:?}")),
        Some(Value::String(s)) => s,
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
        Some(other) => {
            return Err(format!(
                "id field {id_field:?} must be a string or an integer, found {}",
                describe_json(&other)
            ));
        }
    };
    check_id(&id, id_field)?;
    // Writing a Map of Values cannot fail.
    evidence
        .set_object(&map)
        .map_err(|e| format!("cannot re-encode evidence: {e}"))?;
    Ok(id)
}

fn describe_json(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(_) => "a string".to_string(),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

/// A precise reason for a line that did not parse as a JSON object.
fn json_error_reason(text: &str, e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        // Valid JSON of the wrong shape: say what it is.
        Category::Data => match serde_json::from_str::<Value>(text) {
            Ok(v) => format!("not a JSON object (found {})", describe_json(&v)),
            Err(e2) => format!("invalid JSON: {}", strip_position(&e2)),
        },
        Category::Eof | Category::Syntax | Category::Io => {
            format!("invalid JSON: {}", strip_position(e))
        }
    }
}

/// serde_json says "expected `,` or `}` at line 1 column 41"; a JSONL row is one
/// line, so keep the column only, and quote with plain quotes.
fn strip_position(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let msg = match full.rfind(" at line ") {
        Some(i) => &full[..i],
        None => full.as_str(),
    };
    let msg = msg.replace('`', "'");
    if e.column() > 0 {
        format!("{msg} at column {}", e.column())
    } else {
        msg
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_reasons() {
        let mut ev = Evidence::default();
        let r = parse_jsonl_row(br#"{"id": "a", "x": 1"#, "id", &mut ev).unwrap_err();
        assert!(r.starts_with("invalid JSON: "), "{r}");
        assert!(r.contains("column"), "{r}");
        let r = parse_jsonl_row(b"[1,2]", "id", &mut ev).unwrap_err();
        assert_eq!(r, "not a JSON object (found an array)");
        let r = parse_jsonl_row(br#"{"id": 1.5}"#, "id", &mut ev).unwrap_err();
        assert!(
            r.contains("must be a string or an integer, found number 1.5"),
            "{r}"
        );
        let id = parse_jsonl_row(br#"{"id": 7, "b": [1], "a": "x"}"#, "id", &mut ev).unwrap();
        assert_eq!(id, "7");
        let v: Value = serde_json::from_str(&ev.json).unwrap();
        assert_eq!(v, serde_json::json!({"a": "x", "b": [1]}));
        assert_eq!(ev.hash, docket_model::evidence::evidence_hash(&ev.json));
    }
}
