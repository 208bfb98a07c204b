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
//! (None for an empty list).

use std::sync::atomic::Ordering::Relaxed;

use axum::body::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::Deserialize;

use super::answer::Damage;
use super::batch_store::{Api, Store, StoredFile, unix_now};
use super::files::new_file_id;
use super::server::Shared;
use super::wire::{self, ChatRequest, Completion, Prompt, id_hex};

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
    let content = super::steer::answer(shared, &shared.live(), &prompt, seed, Damage::None);
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

/// Shuffle the result lines, store the non-empty files, set the batch's file ids.
pub(crate) fn publish(
    shared: &Shared,
    store: &mut Store,
    api: Api,
    batch_id: &str,
    files: [(&mut Vec<String>, &str); 2],
    rng: &mut StdRng,
) {
    let mut ids = [None, None];
    for (slot, (lines, kind)) in files.into_iter().enumerate() {
        if lines.is_empty() {
            continue;
        }
        lines.shuffle(rng);
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
