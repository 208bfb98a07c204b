//! `[providers.NAME]`: limits, the Azure api-version, the endpoint and the
//! key's variable name.

use super::super::{ConfigError, LoadedConfig, ProviderConfig, ProviderKind};
use super::range_u64;

impl LoadedConfig {
    pub(super) fn validate_providers(&self) -> Result<(), ConfigError> {
        let c = &self.config;
        if c.providers.is_empty() {
            return Err(self.invalid_at_text(
                "[providers",
                "providers",
                "at least one provider is required",
            ));
        }
        for (name, p) in &c.providers {
            self.validate_provider_limits(name, p)?;
            self.validate_api_version(name, p)?;
            self.validate_endpoint(name, p)?;
            self.validate_key_variable(name, p)?;
        }
        Ok(())
    }

    fn validate_provider_limits(&self, name: &str, p: &ProviderConfig) -> Result<(), ConfigError> {
        let key = |k: &str| format!("providers.{name}.{k}");
        if p.model.trim().is_empty() {
            return Err(self.invalid_at_text("model", &key("model"), "must not be empty"));
        }
        range_u64(self, &p.max_concurrency, &key("max_concurrency"), 1, 10_000)?;
        range_u64(
            self,
            &p.requests_per_minute,
            &key("requests_per_minute"),
            0,
            100_000_000,
        )?;
        range_u64(
            self,
            &p.tokens_per_minute,
            &key("tokens_per_minute"),
            0,
            10_000_000_000,
        )?;
        range_u64(
            self,
            &p.max_transport_attempts,
            &key("max_transport_attempts"),
            1,
            100,
        )?;
        range_u64(
            self,
            &p.max_rate_limit_retries,
            &key("max_rate_limit_retries"),
            1,
            1000,
        )?;
        let w = *p.retry_wait_secs.get_ref();
        if !(0.1..=86_400.0).contains(&w) {
            return Err(self.invalid(
                &p.retry_wait_secs,
                &key("retry_wait_secs"),
                format!("{w} is out of range (0.1 to 86400 seconds)"),
            ));
        }
        let t = *p.request_timeout_secs.get_ref();
        if !(0.05..=3600.0).contains(&t) {
            return Err(self.invalid(
                &p.request_timeout_secs,
                &key("request_timeout_secs"),
                format!("{t} is out of range (0.05 to 3600 seconds)"),
            ));
        }
        Ok(())
    }

    fn validate_api_version(&self, name: &str, p: &ProviderConfig) -> Result<(), ConfigError> {
        let key = |k: &str| format!("providers.{name}.{k}");
        let table = format!("[providers.{name}");
        let kind = p.kind.as_str();
        match (&p.api_version, p.kind) {
            (None, ProviderKind::Azure) => {
                return Err(self.invalid_at_text(
                    &table,
                    &key("api_version"),
                    "is required for kind = \"azure\" (Azure's api-version, e.g. \"2024-10-21\")",
                ));
            }
            (Some(v), ProviderKind::Azure) if v.get_ref().trim().is_empty() => {
                return Err(self.invalid(v, &key("api_version"), "must not be empty"));
            }
            (Some(v), k) if k != ProviderKind::Azure => {
                return Err(self.invalid(
                    v,
                    &key("api_version"),
                    format!("is only for kind = \"azure\" (this provider is kind = \"{kind}\")"),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Where requests go: `base_url` and the mock's own section.
    fn validate_endpoint(&self, name: &str, p: &ProviderConfig) -> Result<(), ConfigError> {
        let key = |k: &str| format!("providers.{name}.{k}");
        let table = format!("[providers.{name}");
        let kind = p.kind.as_str();
        // A setting that would have no effect is a mistake to name, not
        // to ignore: someone who moved from the mock to a real provider
        // (or back) believes it applies.
        if p.mock.is_some() && p.kind != ProviderKind::Mock {
            return Err(self.invalid_at_text(
                    &format!("[providers.{name}.mock]"),
                    &format!("providers.{name}.mock"),
                    format!(
                        "the built-in mock's settings are only for kind = \"mock\" (this provider is kind = \"{kind}\"): remove the section"
                    ),
                ));
        }
        if p.kind == ProviderKind::Mock && p.base_url.is_some() {
            return Err(self.invalid_at_text(
                    "base_url",
                    &key("base_url"),
                    "has no effect for kind = \"mock\" (the built-in mock listens on a free loopback port of its own): remove it, or use kind = \"openai_compatible\" for a server of your own",
                ));
        }
        if p.base_url.is_none()
            && matches!(p.kind, ProviderKind::OpenaiCompatible | ProviderKind::Azure)
        {
            let example = if p.kind == ProviderKind::Azure {
                " (https://RESOURCE.openai.azure.com)"
            } else {
                ""
            };
            return Err(self.invalid_at_text(
                &table,
                &key("base_url"),
                format!("is required for kind = \"{kind}\"{example}"),
            ));
        }
        if p.kind != ProviderKind::Mock
            && let Some(url) = &p.base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(self.invalid_at_text(
                "base_url",
                &key("base_url"),
                format!("\"{url}\" is not an http:// or https:// URL"),
            ));
        }
        // Secrets come from the environment only: a user or password in
        // the URL would go into the session's snapshot (row X1).
        if let Some(url) = &p.base_url
            && url::Url::parse(url)
                .is_ok_and(|u| !u.username().is_empty() || u.password().is_some())
        {
            return Err(self.invalid_at_text(
                    "base_url",
                    &key("base_url"),
                    "holds a user or password (user:pass@host): docket keeps base_url in the session's \
                     record, so credentials never go there; put the key in the variable api_key_env names",
                ));
        }
        Ok(())
    }

    fn validate_key_variable(&self, name: &str, p: &ProviderConfig) -> Result<(), ConfigError> {
        let key = |k: &str| format!("providers.{name}.{k}");
        let table = format!("[providers.{name}");
        let kind = p.kind.as_str();
        if p.kind.requires_key() && p.api_key_env.is_none() {
            return Err(self.invalid_at_text(
                    &table,
                    &key("api_key_env"),
                    format!(
                        "is required for kind = \"{kind}\": provider \"{name}\" needs the name of the environment variable holding its key"
                    ),
                ));
        }
        if let Some(env) = &p.api_key_env
            && !is_env_var_name(env)
        {
            return Err(self.invalid_at_text("api_key_env", &key("api_key_env"),
                    "is not an environment variable name such as OPENAI_API_KEY (it must name the variable that holds the key, never the key itself; the value is not repeated here)".to_string()));
        }
        Ok(())
    }
}

/// `OPENAI_API_KEY`-shaped: upper-case letters, digits and `_`, not starting
/// with a digit, at most 64 characters. Stricter than POSIX on purpose: a key
/// pasted here by mistake (they are mixed-case or contain `-`) is refused
/// instead of being stored in the session snapshot.
fn is_env_var_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}
