//! The results of a `--requests` job in the OpenAI Batch API's output
//! format, one line per request in the file's order:
//! `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`.
//!
//! An answer's `body` is the provider's whole answer as the ledger kept it.
//! A request the provider refused with an HTTP status has that status and an
//! error body (`{"error": {"message", "type", "param", "code"}}`) and
//! `"error": null`, as the Batch API writes it; one that got no HTTP answer
//! (a network failure, never sent) has `"response": null` and
//! `"error": {"code", "message"}`. An answer that failed `--schema` keeps its
//! response, and says why in `error` (code `gate_failed`).

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use docket::ledger::report::reads::AttemptReports;
use docket::ledger::report::{ATTEMPT_COLUMNS, ATTEMPT_KINDS, Cell};
use docket::ledger::{Ledger, LedgerLocation};
use serde_json::{Value, json};

use super::lines::Request;

/// The last attempt of one request, as far as the output needs it.
#[derive(Debug, Clone, Default)]
struct Last {
    state: String,
    http_status: Option<i64>,
    output: Option<String>,
    error_kind: Option<String>,
    error_message: Option<String>,
    client_request_id: Option<String>,
    provider_request_id: Option<String>,
}

fn text(c: Option<&Cell>) -> Option<String> {
    match c {
        Some(Cell::Text(s)) | Some(Cell::Json(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int(c: Option<&Cell>) -> Option<i64> {
    match c {
        Some(Cell::Int(i)) => Some(*i),
        _ => None,
    }
}

/// The cell of the attempts export's column `name` in `row` (by name, so
/// a column added to the export moves nothing here).
fn cell<'r>(row: &'r [Cell], name: &str) -> Option<&'r Cell> {
    let at = ATTEMPT_COLUMNS.iter().position(|c| *c == name)?;
    row.get(at)
}

/// Every item's last attempt in the job's ledger (the ledger holds this
/// file's job only), by item id.
fn last_attempts(ws: &Path) -> Result<HashMap<String, Last>, String> {
    let ledger = LedgerLocation::for_workspace(ws)
        .and_then(Ledger::open_read_only)
        .map_err(|e| e.to_string())?;
    let mut last = HashMap::new();
    ledger
        .for_each_attempt(None, ATTEMPT_KINDS, &mut |row: &[Cell]| {
            let Some(item) = text(cell(row, "item_id")) else {
                return Ok(());
            };
            last.insert(
                item,
                Last {
                    state: text(cell(row, "state")).unwrap_or_default(),
                    http_status: int(cell(row, "http_status")),
                    output: text(cell(row, "raw_output")),
                    error_kind: text(cell(row, "error_kind")),
                    error_message: text(cell(row, "error_message")),
                    client_request_id: text(cell(row, "client_request_id")),
                    provider_request_id: text(cell(row, "provider_request_id")),
                },
            );
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    Ok(last)
}

/// How many of `requests` nothing was ever sent for (a session run with
/// `--limit` left them).
pub(super) fn never_sent(ws: &Path, requests: &[Request]) -> Result<usize, String> {
    let last = last_attempts(ws)?;
    Ok(requests
        .iter()
        .filter(|r| !last.contains_key(&r.custom_id))
        .count())
}

/// How many lines were answered, and how many ended otherwise.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub answered: u64,
    pub failed: u64,
}

/// Write the output of `requests` to `out`, whole: a temporary file beside
/// it, renamed over it once complete.
pub(super) fn write(ws: &Path, requests: &[Request], out: &Path) -> Result<Written, String> {
    let last = last_attempts(ws)?;
    let mut tmp_name = out.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".partial");
    let tmp = out.with_file_name(tmp_name);
    let io = |e: std::io::Error| format!("{}: {e}", out.display());
    let mut w = std::io::BufWriter::new(std::fs::File::create(&tmp).map_err(io)?);
    let mut written = Written::default();
    for r in requests {
        let line = output_line(&r.custom_id, last.get(&r.custom_id));
        if line["error"].is_null() && line["response"]["status_code"] == 200 {
            written.answered += 1;
        } else {
            written.failed += 1;
        }
        writeln!(w, "{line}").map_err(io)?;
    }
    w.flush().map_err(io)?;
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    std::fs::rename(&tmp, out).map_err(io)?;
    Ok(written)
}

/// One output line.
fn output_line(custom_id: &str, last: Option<&Last>) -> Value {
    let Some(a) = last else {
        return json!({
            "id": format!("batch_req_{custom_id}"),
            "custom_id": custom_id,
            "response": null,
            "error": {"code": "not_sent", "message": "the request was not sent (the run stopped before it)"},
        });
    };
    let id = format!(
        "batch_req_{}",
        a.client_request_id.as_deref().unwrap_or(custom_id)
    );
    let request_id = a
        .provider_request_id
        .clone()
        .or_else(|| a.client_request_id.clone());
    let message = a.error_message.clone().unwrap_or_default();
    let answer = (a.state == "answered")
        .then_some(a.output.as_deref())
        .flatten()
        .and_then(|o| serde_json::from_str::<Value>(o).ok())
        .filter(Value::is_object);
    match (answer, a.http_status) {
        (Some(body), status) => {
            let error = match a.error_kind.as_deref() {
                Some(kind) => {
                    json!({"code": "gate_failed", "message": format!("{kind}: {message}")})
                }
                None => Value::Null,
            };
            json!({
                "id": id, "custom_id": custom_id,
                "response": {"status_code": status.unwrap_or(200), "request_id": request_id, "body": body},
                "error": error,
            })
        }
        (None, Some(status)) if status != 200 => json!({
            "id": id, "custom_id": custom_id,
            "response": {"status_code": status, "request_id": request_id, "body": {"error": {
                "message": message, "type": a.error_kind, "param": null, "code": null,
            }}},
            "error": null,
        }),
        // An answer kept as text only (an Anthropic or Gemini answer that
        // did not translate back) is not a body to hand on.
        (None, _) if a.state == "answered" => json!({
            "id": id, "custom_id": custom_id,
            "response": null,
            "error": {
                "code": "unreadable_answer",
                "message": "the provider's answer could not be kept as a chat completion body",
            },
        }),
        (None, _) => json!({
            "id": id, "custom_id": custom_id,
            "response": null,
            "error": {"code": a.error_kind.clone().unwrap_or_else(|| a.state.clone()), "message": message},
        }),
    }
}
