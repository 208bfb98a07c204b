//! Answers to the requests of a Gemini batch in the mock: a
//! GenerateContentRequest read as the sync route reads it (camelCase,
//! snake_case aliases), answered with the sync route's deterministic content
//! and usage in the GenerateContentResponse shape, or a google.rpc.Status
//! (`code` 3) for a request the sync route would refuse.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::answer::Damage;
use crate::chat::gemini::render_answer;
use crate::chat::infer;
use crate::chat::pipeline::Answer;
use crate::json::Json;
use crate::state::Shared;
use crate::wire::{MessageText, Prompt, completion_tokens, id_hex};

#[derive(Deserialize)]
struct GenerateRequest {
    #[serde(default)]
    contents: Option<Vec<GContent>>,
    #[serde(default, rename = "systemInstruction", alias = "system_instruction")]
    system_instruction: Option<GContent>,
    #[serde(default, rename = "generationConfig", alias = "generation_config")]
    generation_config: Option<GenerationConfig>,
}

#[derive(Deserialize)]
struct GContent {
    #[serde(default)]
    parts: Option<Vec<GPart>>,
}

#[derive(Deserialize)]
struct GPart {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thought: Option<bool>,
}

#[derive(Deserialize)]
struct GenerationConfig {
    #[serde(default, rename = "maxOutputTokens", alias = "max_output_tokens")]
    max_output_tokens: Option<i64>,
    #[serde(default, rename = "responseMimeType", alias = "response_mime_type")]
    response_mime_type: Option<String>,
    #[serde(default, rename = "responseJsonSchema", alias = "response_json_schema")]
    response_json_schema: Option<Json>,
    #[serde(default, rename = "responseSchema", alias = "response_schema")]
    response_schema: Option<Json>,
}

fn texts(c: &GContent) -> MessageText<'_> {
    MessageText::Parts(
        c.parts
            .iter()
            .flatten()
            .filter(|p| p.thought != Some(true))
            .filter_map(|p| p.text.as_deref())
            .collect(),
    )
}

/// Estimated prompt tokens of a request (the sync route's estimate).
pub(crate) fn prompt_tokens(request: &Value) -> u64 {
    let Ok(req) = GenerateRequest::deserialize(request) else {
        return 0;
    };
    let messages: Vec<MessageText<'_>> = req
        .system_instruction
        .iter()
        .chain(req.contents.iter().flatten())
        .map(texts)
        .collect();
    Prompt {
        model: "",
        messages,
        format: crate::wire::Format::Text,
        max_tokens: None,
        thinking_tokens: 0,
    }
    .prompt_tokens()
}

/// Answer one request: Ok(GenerateContentResponse, prompt, completion
/// tokens) or Err(a google.rpc.Status).
pub(crate) fn answer(
    shared: &Shared,
    model: &str,
    request: &Value,
) -> Result<(Value, u64, u64), Value> {
    let bad = |m: String| json!({"code": 3, "message": m});
    let req = GenerateRequest::deserialize(request)
        .map_err(|e| bad(format!("Invalid JSON payload received. {e}")))?;
    if req.contents.as_ref().is_none_or(Vec::is_empty) {
        return Err(bad(
            "* GenerateContentRequest.contents: contents is not specified\n".into(),
        ));
    }
    let config = req.generation_config.as_ref();
    let converted = config
        .and_then(|c| c.response_schema.as_ref())
        .map(infer::from_openapi);
    let explicit = config
        .and_then(|c| c.response_json_schema.as_ref())
        .or(converted.as_ref());
    let json_mode =
        config.and_then(|c| c.response_mime_type.as_deref()) == Some("application/json");
    let messages: Vec<MessageText<'_>> = req
        .system_instruction
        .iter()
        .chain(req.contents.iter().flatten())
        .map(texts)
        .collect();
    let pieces = || messages.iter().flat_map(MessageText::pieces);
    let found = explicit
        .is_none()
        .then(|| infer::schema_in_text(pieces()))
        .flatten();
    let format = infer::format(
        explicit,
        found.as_ref(),
        json_mode,
        infer::mentions_json(pieces()),
    );
    let prompt = Prompt {
        model,
        messages,
        format,
        max_tokens: config
            .and_then(|c| c.max_output_tokens)
            .filter(|n| *n > 0)
            .map(|n| n as u64),
        thinking_tokens: 0,
    };
    let (_, seed) = prompt.hashes();
    let content = crate::steer::answer(shared, &shared.live(), &prompt, seed, Damage::None);
    let (pt, ct) = (prompt.prompt_tokens(), completion_tokens(&content));
    let id = id_hex(
        shared
            .ids
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        shared.salt,
    );
    let a = Answer {
        id,
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
    let rendered = render_answer(&a).map_err(|e| json!({"code": 13, "message": e}))?;
    let body: Value = serde_json::from_slice(&rendered.body)
        .map_err(|e| json!({"code": 13, "message": e.to_string()}))?;
    Ok((body, pt, ct))
}
