//! The preflight every adapter sends before a session is created: what its
//! answer means (there, refused, not reachable), and the models a list
//! names.

use std::time::Duration;

use serde_json::Value;

use crate::limiter::RateHeaders;
use crate::{ApiKey, ErrorClass, Listed, ProviderError, exchange, scrub};

/// The base URL of an OpenAI-shaped chat URL (`{base}/chat/completions`),
/// where the preflight's `{base}/models` or `{base}/key` lives.
pub(crate) fn chat_base(chat_url: &str) -> &str {
    chat_url
        .strip_suffix("/chat/completions")
        .unwrap_or(chat_url)
}

/// How long a preflight waits for its answer.
const PREFLIGHT_TIMEOUT: Duration = Duration::from_secs(15);

/// Send a preflight request. The provider is there unless it cannot be
/// reached (connection refused, DNS, TLS, no answer in 15 s) or refuses
/// the key (401, 403). Any other answer counts as there: a compatible
/// server without a models list answers 404, a busy one 429 or 503, and
/// each of those will still take requests. The body of a 200, for the
/// adapter to read its models list from.
pub(crate) async fn probe(
    builder: reqwest::RequestBuilder,
    key: Option<&ApiKey>,
) -> Result<Option<Vec<u8>>, ProviderError> {
    let raw = exchange(builder.timeout(PREFLIGHT_TIMEOUT))
        .await
        .map_err(|e| scrub(e, key))?;
    if raw.status == 200 {
        return Ok(Some(raw.bytes));
    }
    if !matches!(raw.status, 401 | 403) {
        return Ok(None);
    }
    let body: String = String::from_utf8_lossy(&raw.bytes)
        .chars()
        .take(300)
        .collect();
    Err(scrub(
        ProviderError {
            class: ErrorClass::Auth,
            http_status: Some(raw.status),
            message: format!(
                "the key was refused: {}",
                docket_model::sanitize::for_terminal(&body)
            ),
            headers: RateHeaders::default(),
        },
        key,
    ))
}

/// The ids of an OpenAI- or Anthropic-shaped models list (`{"data": [{"id":
/// ...}]}`); None for another shape, or a page of a longer list
/// (`has_more`: Anthropic's).
pub(crate) fn listed_ids(body: &[u8]) -> Listed {
    let v: Value = serde_json::from_slice(body).ok()?;
    if v.get("has_more").and_then(Value::as_bool) == Some(true) {
        return None;
    }
    let data = v.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter_map(|m| m.get("id")?.as_str().map(str::to_string))
            .collect(),
    )
}
