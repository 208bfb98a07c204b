//! OpenAI Chat Completions wire format: the request fields the mock reads and
//! the exact response, error and model-list bodies it writes; plus what every
//! wire shares: `Route` (which provider's wire a request came in), the parsed
//! `Prompt` and `Format`, ids and token counts.
//!
//! Contract: parsing ignores unknown fields and accepts `content` as a string,
//! an array of parts (only `text` parts count) or null; anything else that
//! does not fit is a 400 `invalid_request_error`. Bodies serialize with the
//! field names and order of the OpenAI spec (reference section 1).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::json::Json;

/// Which provider's wire format a request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    OpenAi,
    Azure,
    OpenRouter,
    Anthropic,
    Gemini,
    Ollama,
}

impl Route {
    /// Provider name in the log.
    pub(crate) fn provider(self) -> &'static str {
        match self {
            Route::OpenAi => "openai",
            Route::Azure => "azure",
            Route::OpenRouter => "openrouter",
            Route::Anthropic => "anthropic",
            Route::Gemini => "gemini",
            Route::Ollama => "ollama",
        }
    }

    /// Path template in the log.
    pub(crate) fn path(self) -> &'static str {
        match self {
            Route::OpenAi => "/v1/chat/completions",
            Route::Azure => "/openai/deployments/{deployment}/chat/completions",
            Route::OpenRouter => "/api/v1/chat/completions",
            Route::Anthropic => "/v1/messages",
            Route::Gemini => "/v1beta/models/{model}:generateContent",
            Route::Ollama => "/api/chat",
        }
    }
}

#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub messages: Option<Vec<Message>>,
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Message {
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub(crate) struct Part {
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ResponseFormat {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub json_schema: Option<JsonSchemaSpec>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct JsonSchemaSpec {
    #[serde(default)]
    pub schema: Option<Json>,
}

/// What the answer should look like, after validation.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Format<'a> {
    Text,
    JsonObject,
    /// `None` when `json_schema` came without a `schema` (answer like json_object).
    JsonSchema(Option<&'a Json>),
}

/// A request that passed validation, borrowed from the parsed body.
pub(crate) struct Prompt<'a> {
    pub model: &'a str,
    /// one entry per message (its text parts; other parts are ignored)
    pub messages: Vec<MessageText<'a>>,
    pub format: Format<'a>,
    /// max_completion_tokens, else max_tokens
    pub max_tokens: Option<u64>,
    /// Thinking the model spends before answering, counted against
    /// `max_tokens` (Gemini 2.5; 0 on every other route).
    pub thinking_tokens: u64,
}

pub(crate) enum MessageText<'a> {
    Whole(&'a str),
    Parts(Vec<&'a str>),
}

impl MessageText<'_> {
    pub(crate) fn pieces(&self) -> impl Iterator<Item = &str> {
        let (one, many): (Option<&str>, &[&str]) = match self {
            MessageText::Whole(s) => (Some(s), &[]),
            MessageText::Parts(p) => (None, p),
        };
        one.into_iter().chain(many.iter().copied())
    }
}

impl<'a> Prompt<'a> {
    /// Validate a parsed body; `Err` carries the 400 message.
    pub(crate) fn from_request(req: &'a ChatRequest) -> Result<Prompt<'a>, String> {
        let model = match req.model.as_deref() {
            Some(m) if !m.is_empty() => m,
            _ => return Err("you must provide a model parameter".to_string()),
        };
        let messages = match &req.messages {
            None => return Err("Missing required parameter: 'messages'.".to_string()),
            Some(m) if m.is_empty() => {
                return Err("Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.".to_string());
            }
            Some(m) => m,
        };
        let format = match &req.response_format {
            None => Format::Text,
            Some(rf) => match rf.kind.as_str() {
                "text" => Format::Text,
                "json_object" => Format::JsonObject,
                "json_schema" => match &rf.json_schema {
                    Some(spec) => Format::JsonSchema(spec.schema.as_ref()),
                    None => {
                        return Err("Missing required parameter: 'response_format.json_schema'."
                            .to_string());
                    }
                },
                other => {
                    return Err(format!(
                        "Invalid value: '{other}'. Supported values are: 'json_object', 'json_schema', and 'text'."
                    ));
                }
            },
        };
        let messages = messages
            .iter()
            .map(|m| match &m.content {
                None => MessageText::Parts(Vec::new()),
                Some(Content::Text(s)) => MessageText::Whole(s),
                Some(Content::Parts(parts)) => {
                    MessageText::Parts(parts.iter().filter_map(|p| p.text.as_deref()).collect())
                }
            })
            .collect();
        Ok(Prompt {
            model,
            messages,
            format,
            max_tokens: req.max_completion_tokens.or(req.max_tokens),
            thinking_tokens: 0,
        })
    }

    pub(crate) fn pieces(&self) -> impl Iterator<Item = &str> {
        self.messages.iter().flat_map(MessageText::pieces)
    }

    /// Prompt tokens the way a tokenizer roughly counts them: ~4 chars per token,
    /// plus 4 per message of chat framing, plus 3 to prime the reply.
    pub(crate) fn prompt_tokens(&self) -> u64 {
        3 + self
            .messages
            .iter()
            .map(|m| {
                4 + m
                    .pieces()
                    .map(|p| p.chars().count() as u64)
                    .sum::<u64>()
                    .div_ceil(4)
            })
            .sum::<u64>()
    }

    /// (hex sha256 of the concatenated contents, sha256 of model + contents).
    pub(crate) fn hashes(&self) -> (String, [u8; 32]) {
        let mut contents = Sha256::new();
        for p in self.pieces() {
            contents.update(p.as_bytes());
        }
        let mut seeded = Sha256::new();
        seeded.update(self.model.as_bytes());
        for p in self.pieces() {
            seeded.update(p.as_bytes());
        }
        let mut seed = [0u8; 32];
        seed.copy_from_slice(seeded.finalize().as_slice());
        (hex(contents.finalize().as_slice()), seed)
    }
}

/// Completion tokens for generated content: ~4 chars per token, at least 1.
pub(crate) fn completion_tokens(content: &str) -> u64 {
    (content.chars().count() as u64).div_ceil(4).max(1)
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

/// 32 hex digits derived from a counter (ids only need to be unique per server).
pub(crate) fn id_hex(n: u64, salt: u64) -> String {
    let a = splitmix(n ^ salt);
    let b = splitmix(a ^ n.rotate_left(29));
    format!("{a:016x}{b:016x}")
}

pub(crate) fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Serialize)]
pub(crate) struct Completion<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
    pub choices: [Choice<'a>; 1],
    pub usage: Usage,
    pub service_tier: &'static str,
    pub system_fingerprint: &'static str,
}

#[derive(Serialize)]
pub(crate) struct Choice<'a> {
    pub index: u32,
    pub message: AssistantMessage<'a>,
    pub logprobs: Option<()>,
    pub finish_reason: &'static str,
}

#[derive(Serialize)]
pub(crate) struct AssistantMessage<'a> {
    pub role: &'static str,
    /// null when the model refused
    pub content: Option<&'a str>,
    pub refusal: Option<&'a str>,
    pub annotations: [(); 0],
}

#[derive(Serialize)]
pub(crate) struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub prompt_tokens_details: PromptDetails,
    pub completion_tokens_details: CompletionDetails,
}

#[derive(Serialize, Default)]
pub(crate) struct PromptDetails {
    pub cached_tokens: u64,
    pub audio_tokens: u64,
}

#[derive(Serialize, Default)]
pub(crate) struct CompletionDetails {
    pub reasoning_tokens: u64,
    pub audio_tokens: u64,
    pub accepted_prediction_tokens: u64,
    pub rejected_prediction_tokens: u64,
}

impl<'a> Completion<'a> {
    pub(crate) fn new(
        id: &'a str,
        created: u64,
        model: &'a str,
        content: &'a str,
        finish_reason: &'static str,
        prompt_tokens: u64,
        completion_tokens: u64,
    ) -> Completion<'a> {
        Completion {
            id,
            object: "chat.completion",
            created,
            model,
            choices: [Choice {
                index: 0,
                message: AssistantMessage {
                    role: "assistant",
                    content: Some(content),
                    refusal: None,
                    annotations: [],
                },
                logprobs: None,
                finish_reason,
            }],
            usage: Usage {
                prompt_tokens,
                completion_tokens,
                total_tokens: prompt_tokens + completion_tokens,
                prompt_tokens_details: PromptDetails::default(),
                completion_tokens_details: CompletionDetails::default(),
            },
            service_tier: "default",
            system_fingerprint: "fp_mock",
        }
    }
}

/// `{"error":{"message","type","param","code"}}`
pub(crate) fn error_body(message: &str, kind: Option<&str>, code: Option<&str>) -> Vec<u8> {
    #[derive(Serialize)]
    struct Body<'a> {
        error: Inner<'a>,
    }
    #[derive(Serialize)]
    struct Inner<'a> {
        message: &'a str,
        #[serde(rename = "type")]
        kind: Option<&'a str>,
        param: Option<&'a str>,
        code: Option<&'a str>,
    }
    let body = Body {
        error: Inner {
            message,
            kind,
            param: None,
            code,
        },
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

pub(crate) const MSG_NOT_JSON: &str = "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. If you have trouble figuring out how to fix this, please contact us through our help center at help.openai.com.)";
pub(crate) const MSG_BAD_KEY: &str = "Incorrect API key provided: sk-mock***. You can find your API key at https://platform.openai.com/account/api-keys.";
pub(crate) const MSG_QUOTA: &str =
    "You exceeded your current quota, please check your plan and billing details.";
pub(crate) const MSG_500: &str =
    "The server had an error while processing your request. Sorry about that!";
pub(crate) const MSG_503: &str = "The engine is currently overloaded, please try again later.";

pub(crate) const MODELS: [&str; 4] = ["gpt-4o-mini", "gpt-4o", "gpt-4.1-mini", "mock-1"];
/// What the other wires' lists show when the mock serves any model: the
/// ids a provider of that kind would list (Anthropic's dated ids, which
/// its aliases such as `claude-haiku-4-5` stand for).
const ANTHROPIC_MODELS: [&str; 4] = [
    "claude-haiku-4-5-20251001",
    "claude-sonnet-4-5-20250929",
    "claude-opus-4-1-20250805",
    "claude-3-5-haiku-20241022",
];
const GEMINI_MODELS: [&str; 3] = ["gemini-2.5-flash", "gemini-2.5-pro", "gemini-2.0-flash"];
const OLLAMA_MODELS: [&str; 3] = ["llama3.2:latest", "qwen2.5:7b", "mistral:latest"];

/// Which provider's models list a request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelsWire {
    /// `GET /v1/models` (also Azure's and OpenRouter's lists).
    OpenAi,
    /// `GET /v1/models` with an `anthropic-version` header.
    Anthropic,
    /// `GET /v1beta/models`.
    Gemini,
    /// `GET /api/tags`.
    Ollama,
}

/// A models list in `wire`'s shape, naming what the mock serves: the
/// `models` set when it has one (`served`, comma-separated), else (it
/// serves any model) a few ids of that provider.
pub(crate) fn models_body(served: &str, wire: ModelsWire) -> Vec<u8> {
    let set: Vec<&str> = served
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    let ids: Vec<&str> = if !set.is_empty() {
        set
    } else {
        match wire {
            ModelsWire::OpenAi => MODELS.to_vec(),
            ModelsWire::Anthropic => ANTHROPIC_MODELS.to_vec(),
            ModelsWire::Gemini => GEMINI_MODELS.to_vec(),
            ModelsWire::Ollama => OLLAMA_MODELS.to_vec(),
        }
    };
    let body = match wire {
        ModelsWire::OpenAi => serde_json::json!({
            "object": "list",
            "data": ids.iter().map(|id| serde_json::json!({
                "id": id,
                "object": "model",
                // a fixed date (2024-07-18) like OpenAI's per-model creation times
                "created": 1_721_260_800u64,
                "owned_by": "docket-mock",
            })).collect::<Vec<_>>(),
        }),
        ModelsWire::Anthropic => serde_json::json!({
            "data": ids.iter().map(|id| serde_json::json!({
                "type": "model",
                "id": id,
                "display_name": id,
                "created_at": "2024-07-18T00:00:00Z",
            })).collect::<Vec<_>>(),
            "has_more": false,
            "first_id": ids.first(),
            "last_id": ids.last(),
        }),
        ModelsWire::Gemini => serde_json::json!({
            "models": ids.iter().map(|id| {
                let name = if id.starts_with("models/") { id.to_string() } else { format!("models/{id}") };
                serde_json::json!({
                    "name": name,
                    "displayName": id,
                    "supportedGenerationMethods": ["generateContent", "countTokens"],
                })
            }).collect::<Vec<_>>(),
        }),
        ModelsWire::Ollama => serde_json::json!({
            "models": ids.iter().map(|id| serde_json::json!({
                "name": id,
                "model": id,
                "modified_at": "2024-07-18T00:00:00Z",
                "size": 2_019_393_189u64,
                "digest": "a80c4f17acd55265feec403c7aef86be0c25983ab279d83f3bcd3abbcb5b8b72",
            })).collect::<Vec<_>>(),
        }),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

#[cfg(test)]
mod tests;
