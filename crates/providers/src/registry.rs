//! The registry: why a provider could not be set up, and the chat adapter
//! a config names. Adding a provider adds an arm here and a file beside
//! this one; orchestration never changes.

use crate::{
    AnthropicChat, ApiKey, AzureChat, ChatProvider, ClientError, GeminiChat, OllamaChat,
    OpenAiChat, OpenRouterChat, read_key,
};
use docket_model::config::{ProviderConfig, ProviderKind};

#[derive(Debug, thiserror::Error)]
pub enum ProviderSetupError {
    #[error(
        "providers.{provider}.api_key_env names {var}, which is not set in the environment (export {var}=... and run again)"
    )]
    MissingKey { provider: String, var: String },
    #[error("providers.{provider}: {message}")]
    Other { provider: String, message: String },
    /// The adapter itself could not be made (its HTTP client).
    #[error("providers.{provider}: {source}")]
    Client {
        provider: String,
        source: ClientError,
    },
}

/// Build the provider a config names. `base_url_override` is used for the
/// in-process mock, whose port is only known at run time.
pub fn build(
    name: &str,
    cfg: &ProviderConfig,
    base_url_override: Option<&str>,
) -> Result<Box<dyn ChatProvider>, ProviderSetupError> {
    let key = read_key(name, cfg)?;
    build_with_key(name, cfg, base_url_override, key)
}

/// The registry: one constructor per kind. Adding a provider adds an arm
/// here and a file beside this one; orchestration never changes.
pub(crate) fn build_with_key(
    name: &str,
    cfg: &ProviderConfig,
    base_url_override: Option<&str>,
    key: Option<ApiKey>,
) -> Result<Box<dyn ChatProvider>, ProviderSetupError> {
    let setup = |message: String| ProviderSetupError::Other {
        provider: name.into(),
        message,
    };
    let unbuilt = |source: ClientError| ProviderSetupError::Client {
        provider: name.into(),
        source,
    };
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
    let need_key = |key: Option<ApiKey>| {
        key.ok_or_else(|| {
            setup(format!(
                "api_key_env is required for kind = \"{}\"",
                cfg.kind.as_str()
            ))
        })
    };
    let chat: Box<dyn ChatProvider> = match cfg.kind {
        // The built-in mock speaks OpenAI's wire format (and reads either name
        // for the output limit); compatible servers often read only
        // `max_tokens`.
        ProviderKind::Openai | ProviderKind::Mock => {
            Box::new(OpenAiChat::new(cfg.kind.as_str(), &base, key).map_err(unbuilt)?)
        }
        ProviderKind::OpenaiCompatible => Box::new(
            OpenAiChat::new(cfg.kind.as_str(), &base, key)
                .map_err(unbuilt)?
                .sending_max_tokens(),
        ),
        ProviderKind::Azure => {
            let version = cfg
                .api_version
                .as_ref()
                .map(|v| v.get_ref().clone())
                .ok_or_else(|| setup("api_version is required for kind = \"azure\"".into()))?;
            Box::new(AzureChat::new(&base, &version, need_key(key)?).map_err(unbuilt)?)
        }
        ProviderKind::Anthropic => {
            Box::new(AnthropicChat::new(&base, need_key(key)?).map_err(unbuilt)?)
        }
        ProviderKind::Gemini => Box::new(GeminiChat::new(&base, need_key(key)?).map_err(unbuilt)?),
        ProviderKind::Ollama => Box::new(OllamaChat::new(&base, key).map_err(unbuilt)?),
        ProviderKind::Openrouter => Box::new(
            OpenRouterChat::new(&base, need_key(key)?)
                .map_err(unbuilt)?
                .with_attribution(None, Some("docket")),
        ),
    };
    Ok(chat)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorClass;

    fn cfg(text: &str) -> ProviderConfig {
        toml::from_str(text).unwrap()
    }

    /// What a preflight answer means: a 404 (a compatible server without a
    /// models list) is a provider that is there; a 401 is a key refused,
    /// and the key is never shown; a closed port is no answer.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_preflight_fails_only_for_a_refused_key_or_no_answer() {
        use docket_mock::{MockConfig, MockServer};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        let normal = MockServer::start(MockConfig::default(), addr)
            .await
            .unwrap();
        let openai = |base: &str| {
            build_with_key(
                "main",
                &cfg("kind = \"openai\"\nmodel = \"gpt-4o-mini\""),
                Some(base),
                Some(ApiKey::new("canaryKEY0451preflight")),
            )
            .unwrap()
        };
        let listed = openai(&normal.base_url())
            .preflight()
            .await
            .expect("a models list")
            .expect("the list read");
        assert!(listed.iter().any(|m| m == "gpt-4o-mini"), "{listed:?}");
        // No models route under this prefix: 404, and still there (with
        // nothing listed).
        let root = normal.base_url().trim_end_matches("/v1").to_string();
        let none = openai(&format!("{root}/elsewhere"))
            .preflight()
            .await
            .expect("404 is there");
        assert_eq!(none, None);
        let refusing = MockServer::start(
            MockConfig {
                mode: "unauthorized".into(),
                ..Default::default()
            },
            addr,
        )
        .await
        .unwrap();
        let e = openai(&refusing.base_url()).preflight().await.unwrap_err();
        assert_eq!(
            (e.class, e.http_status),
            (ErrorClass::Auth, Some(401)),
            "{e}"
        );
        assert!(!e.to_string().contains("canaryKEY0451preflight"), "{e}");
        let closed = std::net::TcpListener::bind(addr).unwrap();
        let gone = format!("http://{}/v1", closed.local_addr().unwrap());
        drop(closed);
        let e = openai(&gone).preflight().await.unwrap_err();
        assert_eq!(e.class, ErrorClass::Transient, "{e}");
        normal.shutdown().await;
        refusing.shutdown().await;
    }

    #[test]
    fn the_registry_builds_one_adapter_per_kind() {
        let key = || Some(ApiKey::new("k-test"));
        for (kind, extra, label) in [
            ("openai", "", "openai"),
            (
                "openai_compatible",
                "base_url = \"http://x/v1\"",
                "openai_compatible",
            ),
            ("mock", "", "mock"),
            (
                "azure",
                "base_url = \"https://r.openai.azure.com\"\napi_version = \"2024-10-21\"",
                "azure",
            ),
            ("anthropic", "", "anthropic"),
            ("gemini", "", "gemini"),
            ("ollama", "", "ollama"),
            ("openrouter", "", "openrouter"),
        ] {
            let c = cfg(&format!("kind = \"{kind}\"\nmodel = \"m\"\n{extra}\n"));
            let p = build_with_key("p", &c, None, key()).unwrap();
            assert_eq!(p.name(), label);
        }
        let ollama = cfg("kind = \"ollama\"\nmodel = \"llama3.2\"\n");
        assert_eq!(
            build_with_key("p", &ollama, None, None).unwrap().name(),
            "ollama"
        );
        let anthropic = cfg("kind = \"anthropic\"\nmodel = \"claude-haiku-4-5\"\n");
        let e = build_with_key("p", &anthropic, None, None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("api_key_env"), "{e}");
        let azure = cfg("kind = \"azure\"\nmodel = \"dep\"\napi_version = \"2024-10-21\"\n");
        let e = build_with_key("p", &azure, None, key())
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("base_url"), "{e}");
    }
}
