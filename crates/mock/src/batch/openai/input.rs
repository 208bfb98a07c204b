//! Validation of a batch input file (JSONL, one request per line), as the
//! Batch API does while a batch is `validating`.
//!
//! Contract: every non-blank line must be a JSON object with a string
//! `custom_id` unique in the file, `method: "POST"`, `url` equal to the batch's
//! endpoint and an object `body` with a `model`, the same model on every line,
//! and no `stream: true`. Each problem is one `errors.data[]` entry naming its
//! 1-based `line` (at most `MAX_ERRORS` are reported). An empty file, or more
//! lines than the API allows, fails the whole batch with `line: null`. What
//! the chat route itself would refuse in a body (no messages, ...) is not a
//! validation error: that line gets a 400 in the error file when it runs.
//! Error codes `invalid_json_line` and `duplicate_custom_id` follow OpenAI;
//! the others are the mock's own names.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::Value;

use crate::state::openai::BatchError;
use crate::wire::{ChatRequest, Prompt};

const MAX_ERRORS: usize = 100;

/// A valid input line: where it is in the file and what the run needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Line {
    pub start: usize,
    pub end: usize,
    pub custom_id: String,
}

#[derive(Debug)]
pub(crate) struct Parsed {
    pub lines: Vec<Line>,
    pub model: String,
    /// estimated prompt tokens of the whole file (the sync route's estimate per line)
    pub prompt_tokens: u64,
}

#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    custom_id: Option<Value>,
    #[serde(default)]
    method: Option<Value>,
    #[serde(default)]
    url: Option<Value>,
    #[serde(default)]
    body: Option<Value>,
}

fn error(code: &str, message: String, param: Option<&str>, line: Option<u64>) -> BatchError {
    BatchError {
        code: code.to_string(),
        message,
        param: param.map(str::to_string),
        line,
    }
}

/// Check `data` against `endpoint`; at most `max_requests` lines.
pub(crate) fn validate(
    data: &[u8],
    endpoint: &str,
    max_requests: usize,
) -> Result<Parsed, Vec<BatchError>> {
    let mut errors = Vec::new();
    let mut lines = Vec::new();
    let mut seen = HashSet::new();
    let mut model: Option<String> = None;
    let mut prompt_tokens = 0u64;
    let mut start = 0usize;
    let mut number = 0u64;
    while start < data.len() && errors.len() < MAX_ERRORS {
        let end = data[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(data.len(), |p| start + p);
        number += 1;
        let raw = &data[start..end];
        let (line_start, next) = (start, end + 1);
        start = next;
        if raw.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = Some(number);
        let (custom_id, body) = match check_line(raw, at, endpoint, &mut seen, &mut model) {
            Ok(checked) => checked,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        prompt_tokens += estimate_tokens(&body, raw.len());
        lines.push(Line {
            start: line_start,
            end,
            custom_id,
        });
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let Some(model) = model else {
        let msg = "The batch input file is empty. Add at least one request.".to_string();
        return Err(vec![error("empty_file", msg, None, None)]);
    };
    if lines.len() > max_requests {
        let msg = format!(
            "The batch input file has {} requests; a batch may hold at most {max_requests}.",
            lines.len()
        );
        return Err(vec![error("too_many_requests", msg, None, None)]);
    }
    Ok(Parsed {
        lines,
        model,
        prompt_tokens,
    })
}

/// One non-blank line's checks, in the order OpenAI reports them: its
/// custom_id (unique in `seen`), method, url, body and model (the first
/// model seen is the batch's, kept in `model`); the first fault is its error.
fn check_line(
    raw: &[u8],
    at: Option<u64>,
    endpoint: &str,
    seen: &mut HashSet<String>,
    model: &mut Option<String>,
) -> Result<(String, Value), BatchError> {
    let head: Head = match serde_json::from_slice(raw) {
        Ok(h) if raw.trim_ascii_start().first() == Some(&b'{') => h,
        _ => {
            let msg = "This line is not parseable as valid JSON.".to_string();
            return Err(error("invalid_json_line", msg, None, at));
        }
    };
    let custom_id = match head.custom_id {
        Some(Value::String(s)) if !s.is_empty() => s,
        _ => {
            let msg = "Missing required parameter: 'custom_id'. It must be a non-empty string."
                .to_string();
            return Err(error(
                "missing_required_parameter",
                msg,
                Some("custom_id"),
                at,
            ));
        }
    };
    if !seen.insert(custom_id.clone()) {
        let msg = "The custom_id for this request is a duplicate of another request. The custom_id parameter must be unique for each request in a batch.".to_string();
        return Err(error("duplicate_custom_id", msg, Some("custom_id"), at));
    }
    if head.method.as_ref().and_then(Value::as_str) != Some("POST") {
        let msg = "Invalid value for 'method': only 'POST' is supported.".to_string();
        return Err(error("invalid_method", msg, Some("method"), at));
    }
    if head.url.as_ref().and_then(Value::as_str) != Some(endpoint) {
        let msg = format!(
            "The URL provided for this request does not match the batch endpoint '{endpoint}'."
        );
        return Err(error("invalid_url", msg, Some("url"), at));
    }
    let Some(body @ Value::Object(_)) = head.body else {
        let msg = "Missing required parameter: 'body'. It must be an object.".to_string();
        return Err(error("missing_required_parameter", msg, Some("body"), at));
    };
    let Some(m) = body
        .get("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
    else {
        let msg = "Missing required parameter: 'body.model'.".to_string();
        return Err(error(
            "missing_required_parameter",
            msg,
            Some("body.model"),
            at,
        ));
    };
    match model.as_deref() {
        None => *model = Some(m.to_string()),
        Some(first) if first != m => {
            let msg = format!(
                "The provided model '{m}' does not match the model '{first}' used in the other requests within this batch file. All requests in a batch file must use the same model."
            );
            return Err(error("mismatched_model", msg, Some("body.model"), at));
        }
        Some(_) => {}
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        let msg = "Streaming is not supported in the Batch API: 'body.stream' must not be true."
            .to_string();
        return Err(error("invalid_value", msg, Some("body.stream"), at));
    }
    Ok((custom_id, body))
}

/// Prompt tokens as the sync route counts them; a body it would refuse counts a byte per 4.
fn estimate_tokens(body: &Value, len: usize) -> u64 {
    match ChatRequest::deserialize(body) {
        Ok(req) => match Prompt::from_request(&req) {
            Ok(p) => p.prompt_tokens(),
            Err(_) => (len as u64).div_ceil(4),
        },
        Err(_) => (len as u64).div_ceil(4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, model: &str) -> String {
        format!(
            r#"{{"custom_id":"{id}","method":"POST","url":"/v1/chat/completions","body":{{"model":"{model}","messages":[{{"role":"user","content":"abcdefgh"}}]}}}}"#
        )
    }

    #[test]
    fn accepts_a_good_file_and_counts_tokens() {
        let data = format!("{}\n\n{}\n", line("a", "m"), line("b", "m"));
        let p = validate(data.as_bytes(), "/v1/chat/completions", 10).expect("valid");
        assert_eq!(p.model, "m");
        let ids: Vec<_> = p.lines.iter().map(|l| l.custom_id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(
            &data.as_bytes()[p.lines[1].start..p.lines[1].end],
            line("b", "m").as_bytes()
        );
        // 3 + (4 + 2) per line
        assert_eq!(p.prompt_tokens, 18);
    }

    #[test]
    fn names_the_line_of_each_problem() {
        let data = [
            line("a", "m"),
            "not json".to_string(),
            line("a", "m"),
            line("c", "other"),
            line("d", "m").replace("POST", "GET"),
            line("e", "m").replace("/v1/chat/completions", "/v1/embeddings"),
            line("f", "m").replace(r#""model":"m""#, r#""model":"m","stream":true"#),
            line("g", "m").replace(r#""custom_id":"g","#, ""),
        ]
        .join("\n");
        let errs = validate(data.as_bytes(), "/v1/chat/completions", 10).expect_err("invalid");
        let got: Vec<_> = errs
            .iter()
            .map(|e| (e.line, e.code.as_str(), e.param.as_deref()))
            .collect();
        assert_eq!(
            got,
            [
                (Some(2), "invalid_json_line", None),
                (Some(3), "duplicate_custom_id", Some("custom_id")),
                (Some(4), "mismatched_model", Some("body.model")),
                (Some(5), "invalid_method", Some("method")),
                (Some(6), "invalid_url", Some("url")),
                (Some(7), "invalid_value", Some("body.stream")),
                (Some(8), "missing_required_parameter", Some("custom_id")),
            ]
        );
    }

    #[test]
    fn empty_and_oversized_files_fail_as_a_whole() {
        let errs = validate(b"\n \n", "/v1/chat/completions", 10).expect_err("empty");
        assert_eq!((errs[0].code.as_str(), errs[0].line), ("empty_file", None));
        let data = format!("{}\n{}", line("a", "m"), line("b", "m"));
        let errs = validate(data.as_bytes(), "/v1/chat/completions", 1).expect_err("big");
        assert_eq!(errs[0].code, "too_many_requests");
    }
}
