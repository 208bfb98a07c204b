//! An Anthropic batch's requests in (the create body's check) and its
//! result lines out.
//!
//! Contract: `parse` checks a create body as the API does at once
//! (1..=100,000 requests, each `custom_id` `^[a-zA-Z0-9_-]{1,64}$` and
//! unique, `params` an object) and names the first bad request
//! (`requests.N.…`). `answer_line` runs one request's params with the sync
//! route's rules and deterministic answer: a `succeeded` line whose
//! `message` is the sync route's Message body, or an `errored` line whose
//! `error` is a full ErrorResponse (`invalid_request_error` for params the
//! sync route would refuse, a refused `output_config` among them, `api_error` for a drawn failure). `plain` gives
//! the `canceled` / `expired` lines.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::answer::Damage;
use crate::chat::anthropic::render_answer;
use crate::chat::infer;
use crate::chat::pipeline::Answer;
use crate::json::Json;
use crate::state::Shared;
use crate::wire::{self, Content, MessageText, Prompt, id_hex};

const MAX_REQUESTS: usize = 100_000;

fn custom_id_ok(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The requests of a create body, or the 400 message.
pub(crate) fn parse(body: &[u8]) -> Result<Vec<(String, Value)>, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|_| "There was an issue with your request body: it is not valid JSON.")?;
    let Some(requests) = v.get("requests") else {
        return Err("requests: Field required".into());
    };
    let Some(requests) = requests.as_array() else {
        return Err("requests: Input should be a valid list".into());
    };
    let n = requests.len();
    if n == 0 {
        return Err("requests: List should have at least 1 item after validation, not 0".into());
    }
    if n > MAX_REQUESTS {
        return Err(format!(
            "requests: List should have at most {MAX_REQUESTS} items after validation, not {n}"
        ));
    }
    let mut seen = std::collections::HashSet::with_capacity(n);
    let mut out = Vec::with_capacity(n);
    for (i, r) in requests.iter().enumerate() {
        let id = match r.get("custom_id") {
            None => return Err(format!("requests.{i}.custom_id: Field required")),
            Some(Value::String(s)) => s.clone(),
            Some(_) => {
                return Err(format!(
                    "requests.{i}.custom_id: Input should be a valid string"
                ));
            }
        };
        if id.len() > 64 {
            return Err(format!(
                "requests.{i}.custom_id: String should have at most 64 characters"
            ));
        }
        if !custom_id_ok(&id) {
            return Err(format!(
                "requests.{i}.custom_id: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
            ));
        }
        if !seen.insert(id.clone()) {
            return Err(format!(
                "requests.{i}.custom_id: Duplicate custom_id {id:?}; each custom_id must be unique within the batch"
            ));
        }
        match r.get("params") {
            Some(p @ Value::Object(_)) => out.push((id, p.clone())),
            None => return Err(format!("requests.{i}.params: Field required")),
            Some(_) => return Err(format!("requests.{i}.params: Input should be an object")),
        }
    }
    Ok(out)
}

/// Params, as far as the mock reads them (the sync route's rules).
#[derive(Deserialize)]
struct Params {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<i64>,
    #[serde(default)]
    system: Option<Content>,
    #[serde(default)]
    messages: Option<Vec<Msg>>,
    #[serde(default)]
    output_config: Option<Value>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Deserialize)]
struct Msg {
    #[serde(default)]
    content: Option<Content>,
}

fn text_of(c: &Option<Content>) -> MessageText<'_> {
    match c {
        None => MessageText::Parts(Vec::new()),
        Some(Content::Text(s)) => MessageText::Whole(s),
        Some(Content::Parts(p)) => {
            MessageText::Parts(p.iter().filter_map(|p| p.text.as_deref()).collect())
        }
    }
}

/// Estimated prompt tokens of one request's params (0 when unreadable).
pub(crate) fn prompt_tokens(params: &Value) -> u64 {
    let Ok(p) = Params::deserialize(params) else {
        return 0;
    };
    let texts: Vec<MessageText<'_>> = std::iter::once(&p.system)
        .filter(|s| s.is_some())
        .chain(p.messages.iter().flatten().map(|m| &m.content))
        .map(text_of)
        .collect();
    Prompt {
        model: "",
        messages: texts,
        format: wire::Format::Text,
        max_tokens: None,
        thinking_tokens: 0,
    }
    .prompt_tokens()
}

fn next_hex(shared: &Shared) -> String {
    id_hex(shared.ids.fetch_add(1, Relaxed), shared.salt)
}

/// An `errored` result line whose error is `kind` with `msg`.
pub(crate) fn errored(shared: &Shared, custom_id: &str, kind: &str, msg: &str) -> String {
    let line = serde_json::json!({
        "custom_id": custom_id,
        "result": {"type": "errored", "error": {
            "type": "error",
            "error": {"type": kind, "message": msg},
            "request_id": format!("req_{}", next_hex(shared)),
        }},
    });
    line.to_string()
}

/// Plain result lines: `canceled` / `expired`.
pub(crate) fn plain(custom_id: &str, kind: &str) -> String {
    serde_json::json!({"custom_id": custom_id, "result": {"type": kind}}).to_string()
}

/// The params a batch request must carry: its model and max_tokens (≥ 1),
/// at least one message, and no streaming; `Err` is the 400 message.
fn required(p: &Params) -> Result<(&str, u64), &'static str> {
    let model = match p.model.as_deref() {
        Some(m) if !m.is_empty() => m,
        _ => return Err("params.model: Field required"),
    };
    let max = match p.max_tokens {
        None => return Err("params.max_tokens: Field required"),
        Some(n) if n < 1 => {
            return Err("params.max_tokens: Input should be greater than or equal to 1");
        }
        Some(n) => n as u64,
    };
    if p.messages.as_ref().is_none_or(Vec::is_empty) {
        return Err("params.messages: at least one message is required");
    }
    if p.stream == Some(true) {
        return Err("params.stream: streaming is not supported in batches");
    }
    Ok((model, max))
}

/// Run one request: Ok(succeeded line, prompt, completion tokens) or Err(errored line).
pub(crate) fn answer_line(
    shared: &Shared,
    custom_id: &str,
    params: &Value,
    fail: bool,
) -> Result<(String, u64, u64), String> {
    if fail {
        return Err(errored(
            shared,
            custom_id,
            "api_error",
            "Internal server error",
        ));
    }
    let bad = |msg: &str| errored(shared, custom_id, "invalid_request_error", msg);
    let p = Params::deserialize(params).map_err(|e| bad(&format!("params: {e}")))?;
    let (model, max) = required(&p).map_err(bad)?;
    let checked = crate::chat::output_config::check(p.output_config.as_ref())
        .map_err(|e| bad(&format!("params.{e}")))?;
    let texts: Vec<MessageText<'_>> = std::iter::once(&p.system)
        .filter(|s| s.is_some())
        .chain(p.messages.iter().flatten().map(|m| &m.content))
        .map(text_of)
        .collect();
    let pieces = || texts.iter().flat_map(MessageText::pieces);
    let explicit: Option<Json> =
        checked.map(|s| crate::chat::output_config::with_stated(s, pieces()));
    let found = if explicit.is_none() {
        infer::schema_in_text(pieces())
    } else {
        None
    };
    let format = infer::format(
        explicit.as_ref(),
        found.as_ref(),
        false,
        infer::mentions_json(pieces()),
    );
    let prompt = Prompt {
        model,
        messages: texts,
        format,
        max_tokens: Some(max),
        thinking_tokens: 0,
    };
    let (_, seed) = prompt.hashes();
    let content = crate::steer::answer(shared, &shared.live(), &prompt, seed, Damage::None);
    let (pt, ct) = (prompt.prompt_tokens(), wire::completion_tokens(&content));
    let a = Answer {
        id: next_hex(shared),
        model,
        content: &content,
        truncated: false,
        refused: false,
        prompt_tokens: pt,
        completion_tokens: ct,
        thinking_tokens: 0,
        elapsed: Duration::ZERO,
        stream: false,
    };
    let message = render_answer(&a).map_err(|e| errored(shared, custom_id, "api_error", &e))?;
    let custom_id = serde_json::to_string(custom_id).unwrap_or_default();
    let message = String::from_utf8_lossy(&message.body);
    let line = format!(
        r#"{{"custom_id":{custom_id},"result":{{"type":"succeeded","message":{message}}}}}"#
    );
    Ok((line, pt, ct))
}
