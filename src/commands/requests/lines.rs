//! Reading a `--requests` file: each line an OpenAI Batch API line
//! (`{custom_id, method, url, body}`) or a bare chat-completions body
//! (`{model, messages, ...}`, its custom_id `line-N`). A bad line is said
//! as `FILE:LINE: reason`, like `docket import` says a bad row.

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use serde_json::{Map, Value};

/// The only endpoint a line may name: what docket's chat adapters send.
pub const CHAT_URL: &str = "/v1/chat/completions";

/// The longest custom_id accepted (docket's longest item id).
const MAX_ID_CHARS: usize = docket::items::MAX_ID_CHARS;

/// One good line: its custom_id (the item's id) and its evidence (the
/// Batch line as written, or `{"body": ...}` for a bare body).
#[derive(Debug, Clone)]
pub struct Request {
    pub line: u64,
    pub custom_id: String,
    pub evidence: Value,
}

/// A line that cannot be sent, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub line: u64,
    pub reason: String,
}

/// The file's lines, the good and the bad, and the sha256 of its bytes
/// (the same file is the same job).
#[derive(Debug, Default)]
pub struct RequestsFile {
    pub requests: Vec<Request>,
    pub bad: Vec<BadLine>,
    pub sha256: String,
}

/// Read every line of `path`. Err only when the file cannot be read.
pub(super) fn read(path: &Path) -> Result<RequestsFile, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = RequestsFile {
        sha256: docket::ids::sha256_hex(&bytes),
        ..RequestsFile::default()
    };
    let mut seen: HashMap<String, u64> = HashMap::new();
    for (n, line) in bytes.as_slice().lines().enumerate() {
        let number = n as u64 + 1;
        let text = match line {
            Ok(t) => t,
            Err(e) => {
                out.bad.push(BadLine {
                    line: number,
                    reason: format!("not UTF-8 text: {e}"),
                });
                continue;
            }
        };
        if text.trim().is_empty() {
            continue;
        }
        match parse_line(&text, number) {
            Ok(req) => match seen.get(&req.custom_id) {
                Some(first) => out.bad.push(BadLine {
                    line: number,
                    reason: format!(
                        "custom_id \"{}\" is already on line {first}: each custom_id must be unique",
                        req.custom_id
                    ),
                }),
                None => {
                    seen.insert(req.custom_id.clone(), number);
                    out.requests.push(req);
                }
            },
            Err(reason) => out.bad.push(BadLine {
                line: number,
                reason,
            }),
        }
    }
    Ok(out)
}

/// One line: a Batch line when it has any of custom_id, method, url or
/// body, else a bare chat-completions body.
pub(super) fn parse_line(text: &str, number: u64) -> Result<Request, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(obj) = value else {
        return Err("not a JSON object".into());
    };
    let batch_line = ["custom_id", "method", "url", "body"]
        .iter()
        .any(|k| obj.contains_key(*k));
    if !batch_line {
        check_body(&obj, "the line")?;
        return Ok(Request {
            line: number,
            custom_id: format!("line-{number}"),
            evidence: serde_json::json!({ "body": obj }),
        });
    }
    let custom_id = match obj.get("custom_id") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(Value::String(_)) => return Err("custom_id is empty".into()),
        Some(other) => return Err(format!("custom_id is not a string: {other}")),
        None => return Err("a Batch API line without custom_id".into()),
    };
    if custom_id.chars().count() > MAX_ID_CHARS {
        return Err(format!(
            "custom_id is longer than {MAX_ID_CHARS} characters"
        ));
    }
    match obj.get("method") {
        None => {}
        Some(Value::String(m)) if m.eq_ignore_ascii_case("POST") => {}
        Some(other) => return Err(format!("method {other}: only POST requests can be sent")),
    }
    match obj.get("url") {
        None => {}
        Some(Value::String(u)) if u == CHAT_URL => {}
        Some(other) => {
            return Err(format!(
                "url {other}: only {CHAT_URL} requests can be sent (embeddings, responses and other endpoints are not)"
            ));
        }
    }
    match obj.get("body") {
        Some(Value::Object(body)) => check_body(body, "body")?,
        Some(_) => return Err("body is not a JSON object".into()),
        None => return Err("a Batch API line without body".into()),
    }
    Ok(Request {
        line: number,
        custom_id,
        evidence: Value::Object(obj),
    })
}

/// A chat-completions body: a non-empty `messages` list, a string `model`
/// when there is one, and no streaming (one answer per request).
fn check_body(body: &Map<String, Value>, what: &str) -> Result<(), String> {
    match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => {}
        Some(Value::Array(_)) => return Err(format!("{what}: messages is empty")),
        Some(_) => return Err(format!("{what}: messages is not a list")),
        None => {
            return Err(format!(
                "{what} has no messages: not a chat-completions body (nor a Batch API line)"
            ));
        }
    }
    match body.get("model") {
        None | Some(Value::String(_)) => {}
        Some(other) => return Err(format!("{what}: model is not a string: {other}")),
    }
    if body.get("stream") == Some(&Value::Bool(true)) {
        return Err(format!(
            "{what}: stream is true: streamed answers cannot be sent"
        ));
    }
    Ok(())
}

/// The body of a request's evidence.
pub fn body_of(evidence: &Value) -> Option<&Map<String, Value>> {
    evidence.get("body").and_then(Value::as_object)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_lines_and_bare_bodies_are_read_and_bad_lines_named() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.jsonl");
        std::fs::write(
            &p,
            concat!(
                r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"hi"}]}}"#, "\n",
                r#"{"model":"m","messages":[{"role":"user","content":"bare"}]}"#, "\n",
                "\n",
                "{not json\n",
                r#"{"custom_id":"e","method":"POST","url":"/v1/embeddings","body":{"model":"m","input":"x"}}"#, "\n",
                r#"{"custom_id":"a","body":{"messages":[{"role":"user","content":"again"}]}}"#, "\n",
                r#"[1]"#, "\n",
            ),
        )
        .unwrap();
        let f = read(&p).unwrap();
        let ids: Vec<&str> = f.requests.iter().map(|r| r.custom_id.as_str()).collect();
        assert_eq!(ids, ["a", "line-2"]);
        assert_eq!(
            f.requests[1].evidence["body"]["messages"][0]["content"],
            "bare"
        );
        let lines: Vec<u64> = f.bad.iter().map(|b| b.line).collect();
        assert_eq!(lines, [4, 5, 6, 7]);
        assert!(f.bad[0].reason.starts_with("not JSON"), "{:?}", f.bad);
        assert!(f.bad[1].reason.contains("/v1/embeddings"), "{:?}", f.bad);
        assert!(f.bad[2].reason.contains("already on line 1"), "{:?}", f.bad);
        assert_eq!(f.bad[3].reason, "not a JSON object");
    }
}
