//! The lines of a batch's output and error files, and the files themselves.
//!
//! Contract: lines are exactly the reference's section 2.5 shape, fields in
//! that order: `{"id":"batch_req_…","custom_id",…,"response":{"status_code",
//! "request_id":"req_…","body"},"error":null}`. A 200 body is the sync route's
//! `chat.completion` for the same request (same deterministic content and
//! usage); a drawn failure is a 500 `server_error` body; a body the chat route
//! refuses is its 400 `invalid_request_error`. An expired line has
//! `"response":null` and `error.code = "batch_expired"`. `publish` shuffles
//! each list with the batch's RNG, stores it as a `batch_output` file named
//! `{batch_id}_output.jsonl` / `_error.jsonl`, and sets the batch's file ids
//! (None for an empty list); lines added after the shuffle (the anomalies)
//! go at the end of the output file, and a file may be hidden (its download
//! a 404) for a while.
//!
//! The anomalies of `batch_result_anomalies` (fault-matrix row B7), shared
//! by the OpenAI/Azure, Anthropic and Gemini runners: `Anomaly::of_line`
//! says what becomes of an input line, `second_copy` makes the duplicate
//! (more output tokens, so a reader that lets the second win is caught), and
//! `unknown_id` names the result of a request the batch never had.

use std::sync::atomic::Ordering::Relaxed;

use axum::body::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::answer::Damage;
use crate::files::openai::new_file_id;
use crate::state::Shared;
use crate::state::openai::{Api, Store, StoredFile, unix_now};
use crate::wire::{self, ChatRequest, Completion, Prompt, id_hex};

#[derive(Deserialize)]
struct RunLine {
    body: ChatRequest,
}

fn next_hex(shared: &Shared, salt: u64) -> String {
    id_hex(shared.ids.fetch_add(1, Relaxed), salt)
}

/// Run one input line: Ok(output line, prompt tokens, completion tokens) or Err(error line).
pub(crate) fn answer(
    shared: &Shared,
    custom_id: &str,
    raw: &[u8],
    fail: bool,
) -> Result<(String, u64, u64), String> {
    let custom_id = serde_json::to_string(custom_id).unwrap_or_default();
    let line_id = next_hex(shared, shared.salt);
    let request_id = next_hex(shared, !shared.salt);
    let response = |status: u16, body: &str| {
        format!(
            r#"{{"id":"batch_req_{line_id}","custom_id":{custom_id},"response":{{"status_code":{status},"request_id":"req_{request_id}","body":{body}}},"error":null}}"#
        )
    };
    if fail {
        let body = wire::error_body(wire::MSG_500, Some("server_error"), None);
        return Err(response(500, &String::from_utf8_lossy(&body)));
    }
    let bad = |msg: &str| {
        let body = wire::error_body(msg, Some("invalid_request_error"), None);
        response(400, &String::from_utf8_lossy(&body))
    };
    let parsed: RunLine = match serde_json::from_slice(raw) {
        Ok(r) => r,
        Err(e) => return Err(bad(&format!("Invalid request body: {e}"))),
    };
    let prompt = match Prompt::from_request(&parsed.body) {
        Ok(p) => p,
        Err(msg) => return Err(bad(&msg)),
    };
    let (_, seed) = prompt.hashes();
    let content = crate::steer::answer(shared, &shared.live(), &prompt, seed, Damage::None);
    let (pt, ct) = (prompt.prompt_tokens(), wire::completion_tokens(&content));
    let completion_id = format!("chatcmpl-{}", next_hex(shared, shared.salt));
    let completion = Completion::new(
        &completion_id,
        unix_now(),
        prompt.model,
        &content,
        "stop",
        pt,
        ct,
    );
    let body = serde_json::to_string(&completion).unwrap_or_default();
    Ok((response(200, &body), pt, ct))
}

/// The error line of a request the window closed on.
pub(crate) fn expired(shared: &Shared, custom_id: &str) -> String {
    let custom_id = serde_json::to_string(custom_id).unwrap_or_default();
    let line_id = next_hex(shared, shared.salt);
    format!(
        r#"{{"id":"batch_req_{line_id}","custom_id":{custom_id},"response":null,"error":{{"code":"batch_expired","message":"This request could not be executed before the completion window expired."}}}}"#
    )
}

/// The error line of a request refused as invalid (a 400 `invalid_request_error`).
pub(crate) fn refused(shared: &Shared, custom_id: &str, msg: &str) -> String {
    let custom_id = serde_json::to_string(custom_id).unwrap_or_default();
    let line_id = next_hex(shared, shared.salt);
    let request_id = next_hex(shared, !shared.salt);
    let body = wire::error_body(msg, Some("invalid_request_error"), None);
    let body = String::from_utf8_lossy(&body);
    format!(
        r#"{{"id":"batch_req_{line_id}","custom_id":{custom_id},"response":{{"status_code":400,"request_id":"req_{request_id}","body":{body}}},"error":null}}"#
    )
}

/// What the `batch_result_anomalies` fault does to one input line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Anomaly {
    /// Run and billed, but its result line is left out.
    Dropped,
    /// Fails with a retryable error (a 500, `api_error`, code 13).
    Retryable,
    /// Fails as invalid (a 400, `invalid_request_error`, code 3): not retryable.
    Refused,
    /// Never run: an `expired` result (Anthropic only).
    Expired,
    /// Never run: a `canceled` result (Anthropic only).
    Canceled,
    /// Answered, and its result line comes twice (the second copy differs).
    Twice,
}

impl Anomaly {
    /// The anomaly of input line `i` (0-based) of a batch that gets them;
    /// `unrun_lines`: the API writes a line for a request never run
    /// (Anthropic's `expired` and `canceled`).
    pub(crate) fn of_line(i: usize, unrun_lines: bool) -> Option<Anomaly> {
        match i {
            0 => Some(Anomaly::Dropped),
            1 => Some(Anomaly::Retryable),
            2 => Some(Anomaly::Refused),
            3 if unrun_lines => Some(Anomaly::Expired),
            4 if unrun_lines => Some(Anomaly::Canceled),
            5 => Some(Anomaly::Twice),
            _ => None,
        }
    }
}

/// The custom_id (or key) of the extra result line of batch number `seq`:
/// a request no batch had.
pub(crate) fn unknown_id(seq: u64) -> String {
    format!("mock-unknown-{seq}")
}

/// A second result line for the same request: `line` (JSON) with 1000 more
/// output tokens at `usage` (a JSON pointer), in `out` and `total` when
/// present, and `id` (when the line has one) made new. None when `line` is
/// not JSON or has no usage there.
pub(crate) fn second_copy(
    shared: &Shared,
    line: &str,
    usage: &str,
    out: &str,
    total: &str,
) -> Option<String> {
    let mut v: Value = serde_json::from_str(line).ok()?;
    if v.get("id").is_some() {
        v["id"] = json!(format!("batch_req_{}", next_hex(shared, shared.salt)));
    }
    more_output(&mut v, usage, out, total).then(|| v.to_string())
}

/// 1000 more output tokens in `v` at `usage` (a JSON pointer), in `out` and
/// `total` when present; false when there is no usage there.
pub(crate) fn more_output(v: &mut Value, usage: &str, out: &str, total: &str) -> bool {
    let Some(u) = v.pointer_mut(usage) else {
        return false;
    };
    for field in [out, total] {
        if let Some(n) = u.get(field).and_then(Value::as_u64) {
            u[field] = json!(n + 1000);
        }
    }
    true
}

/// `line` (JSON) with its id at `field` replaced by `id`.
pub(crate) fn with_id(line: &str, field: &str, id: &str) -> Option<String> {
    let mut v: Value = serde_json::from_str(line).ok()?;
    *v.pointer_mut(field)? = json!(id);
    Some(v.to_string())
}

/// What a batch's files get besides their shuffled lines.
#[derive(Default)]
pub(crate) struct Extras {
    /// Lines at the end of the output file, after the shuffle (anomalies).
    pub lines: Vec<String>,
    /// Both files' downloads answer 404 until then.
    pub hidden_until: Option<std::time::Instant>,
}

/// Shuffle the result lines, store the non-empty files (with `extras`), set
/// the batch's file ids.
pub(crate) fn publish(
    shared: &Shared,
    store: &mut Store,
    api: Api,
    batch_id: &str,
    files: [(&mut Vec<String>, &str); 2],
    extras: Extras,
    rng: &mut StdRng,
) {
    let mut ids = [None, None];
    let hidden_until = extras.hidden_until;
    let mut extra = Some(extras.lines);
    for (slot, (lines, kind)) in files.into_iter().enumerate() {
        if lines.is_empty() {
            continue;
        }
        lines.shuffle(rng);
        if slot == 0 {
            lines.extend(extra.take().unwrap_or_default());
        }
        let mut bytes = lines.join("\n");
        bytes.push('\n');
        let file = StoredFile {
            api,
            id: new_file_id(shared),
            filename: format!("{batch_id}_{kind}.jsonl"),
            purpose: "batch_output".to_string(),
            created_at: unix_now(),
            bytes: Bytes::from(bytes),
            downloads: 0,
            hidden_until,
        };
        ids[slot] = Some(file.id.clone());
        store.files.insert(file.id.clone(), file);
    }
    let [out, err] = ids;
    if let Some(b) = store.batch_mut(api, batch_id) {
        b.output_file_id = out;
        b.error_file_id = err;
    }
}
