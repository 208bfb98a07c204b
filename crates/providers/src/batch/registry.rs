//! The batch registry: which kinds have a Batch API adapter, and the
//! adapter a config names.

use super::{BatchProvider, anthropic, gemini, openai};
use crate::{ApiKey, ClientError, ProviderSetupError};
use docket_model::config::{ProviderConfig, ProviderKind};

/// Whether docket has a Batch API adapter for `kind`. Ollama has no Batch
/// API; OpenRouter documents none (its requests go synchronously:
/// simulated batching).
pub fn has_batch_api(kind: ProviderKind) -> bool {
    matches!(
        kind,
        ProviderKind::Openai
            | ProviderKind::OpenaiCompatible
            | ProviderKind::Mock
            | ProviderKind::Azure
            | ProviderKind::Anthropic
            | ProviderKind::Gemini
    )
}

/// `DOCKET_GEMINI_INLINE_LIMIT_BYTES`: Gemini batch bodies above this many
/// bytes go up as a file (the Files API) instead of inline; the default is
/// the API's 20 MB. For trying the file path on small batches.
const GEMINI_INLINE_LIMIT_ENV: &str = "DOCKET_GEMINI_INLINE_LIMIT_BYTES";

fn gemini_inline_limit() -> Option<u64> {
    std::env::var(GEMINI_INLINE_LIMIT_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|n| n.min(gemini::INLINE_LIMIT))
}

/// The batch registry: the Batch API adapter for a config, `None` for kinds
/// with no Batch API adapter (yet): those run through the sync path.
/// `base_url_override` as for `provider::build`.
pub fn build_batch(
    name: &str,
    cfg: &ProviderConfig,
    base_url_override: Option<&str>,
) -> Result<Option<Box<dyn BatchProvider>>, ProviderSetupError> {
    let key = crate::read_key(name, cfg)?;
    build_batch_with_key(name, cfg, base_url_override, key)
}

pub(crate) fn build_batch_with_key(
    name: &str,
    cfg: &ProviderConfig,
    base_url_override: Option<&str>,
    key: Option<ApiKey>,
) -> Result<Option<Box<dyn BatchProvider>>, ProviderSetupError> {
    let setup = |message: String| ProviderSetupError::Other {
        provider: name.into(),
        message,
    };
    let unbuilt = |source: ClientError| ProviderSetupError::Client {
        provider: name.into(),
        source,
    };
    if !has_batch_api(cfg.kind) {
        return Ok(None);
    }
    let base = base_url_override
        .map(str::to_string)
        .or_else(|| cfg.base_url.clone())
        .or_else(|| cfg.kind.default_base_url().map(str::to_string))
        .ok_or_else(|| {
            setup(format!(
                "base_url is required for kind = \"{}\"",
                cfg.kind.as_str()
            ))
        })?;
    let batch: Box<dyn BatchProvider> = match cfg.kind {
        ProviderKind::Azure => {
            let version = cfg
                .api_version
                .as_ref()
                .map(|v| v.get_ref().clone())
                .ok_or_else(|| setup("api_version is required for kind = \"azure\"".into()))?;
            let key =
                key.ok_or_else(|| setup("api_key_env is required for kind = \"azure\"".into()))?;
            Box::new(openai::OpenAiBatch::azure(&base, &version, key).map_err(unbuilt)?)
        }
        ProviderKind::Anthropic => {
            let key = key
                .ok_or_else(|| setup("api_key_env is required for kind = \"anthropic\"".into()))?;
            Box::new(anthropic::AnthropicBatch::new(&base, key).map_err(unbuilt)?)
        }
        ProviderKind::Gemini => {
            let key =
                key.ok_or_else(|| setup("api_key_env is required for kind = \"gemini\"".into()))?;
            let g = gemini::GeminiBatch::new(&base, key).map_err(unbuilt)?;
            Box::new(match gemini_inline_limit() {
                Some(n) => g.with_inline_limit(n),
                None => g,
            })
        }
        _ => Box::new(openai::OpenAiBatch::openai(cfg.kind.as_str(), &base, key).map_err(unbuilt)?),
    };
    Ok(Some(batch))
}
