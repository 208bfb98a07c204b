//! API keys: held in memory only, read from the environment the config
//! names, fingerprinted for the session's snapshot, sent as sensitive
//! headers, and taken out of every error before it is stored or shown.

use std::fmt;

use reqwest::header::HeaderValue;

use crate::limiter::RateHeaders;
use crate::{ErrorClass, ProviderError, ProviderSetupError};
use docket_model::config::ProviderConfig;

/// An API key held in memory only; never printed, logged or serialized.
#[derive(Clone)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wrap a key read from elsewhere (tests, a secret store).
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(***)")
    }
}

/// A short fingerprint of the key the config names, if it is set: the
/// first 8 hex digits of its SHA-256 (32 bits: enough to tell two keys
/// apart, nothing to guess one from). A session's config snapshot keeps it
/// beside the variable's name (row X1), so a resume with another key is
/// told, never mistaken for a provider failure (row B8).
pub fn key_fingerprint(cfg: &ProviderConfig) -> Option<String> {
    let var = cfg.api_key_env.as_ref()?;
    let key = std::env::var(var).ok().filter(|k| !k.is_empty())?;
    Some(format!(
        "sha256:{}",
        &docket_model::ids::sha256_hex(key.as_bytes())[..8]
    ))
}

/// Check that the key the config names is in the environment (without
/// keeping it): run before anything is planned or created.
pub fn check_key(name: &str, cfg: &ProviderConfig) -> Result<(), ProviderSetupError> {
    read_key(name, cfg).map(|_| ())
}

pub(crate) fn read_key(
    name: &str,
    cfg: &ProviderConfig,
) -> Result<Option<ApiKey>, ProviderSetupError> {
    match &cfg.api_key_env {
        Some(var) => match std::env::var(var) {
            Ok(v) if !v.is_empty() => Ok(Some(ApiKey(v))),
            _ => Err(ProviderSetupError::MissingKey {
                provider: name.into(),
                var: var.clone(),
            }),
        },
        None => Ok(None),
    }
}

/// A header value that carries a secret (`api-key`, `x-api-key`,
/// `x-goog-api-key`): marked sensitive, so HTTP/2 never indexes it (HPACK) and
/// `Debug` output of the request or its headers prints `Sensitive`.
/// `bearer_auth` already does this for `Authorization`.
///
/// A key that is not a valid header value (a stray newline from a secret
/// file) can never succeed: `Auth`, which stops the session. The message never
/// holds the value.
// Errors are the rare path; ProviderError is returned unboxed as everywhere.
#[allow(clippy::result_large_err)]
pub(crate) fn secret_header(value: &str) -> Result<HeaderValue, ProviderError> {
    let mut v = HeaderValue::from_str(value).map_err(|_| ProviderError {
        class: ErrorClass::Auth,
        http_status: None,
        message: "the API key is not a valid HTTP header value (check it for stray whitespace, newlines or non-ASCII characters)".into(),
        headers: RateHeaders::default(),
    })?;
    v.set_sensitive(true);
    Ok(v)
}

/// Take the key (and anything key-shaped) out of an error before it is
/// stored or shown: providers echo keys in some messages.
pub(crate) fn scrub(mut err: ProviderError, key: Option<&ApiKey>) -> ProviderError {
    if let Some(k) = key
        && k.expose().len() >= 4
    {
        err.message = err.message.replace(k.expose(), "[redacted]");
        err.message = without_key_fragments(&err.message, k.expose());
    }
    err.message = crate::openai::redact(&err.message);
    err
}

/// The shortest piece of a key that is taken out of a message.
const KEY_FRAGMENT: usize = 6;

/// `text` with every run of at least [`KEY_FRAGMENT`] characters that is
/// also a piece of `key` replaced: providers echo a key's start and end
/// ("Incorrect API key provided: plainCANARYs*****887766"), and a key
/// without a known prefix is not caught by its shape (fault-matrix row X1).
fn without_key_fragments(text: &str, key: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        // The longest run from `i` that the key contains.
        let mut end = i;
        let mut piece = String::new();
        while end < chars.len() {
            piece.push(chars[end]);
            if !key.contains(piece.as_str()) {
                break;
            }
            end += 1;
        }
        if end - i >= KEY_FRAGMENT {
            out.push_str("[redacted]");
            i = end;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_headers_are_sensitive_and_never_show_the_key() {
        let v = secret_header("AIzaCanary123").unwrap();
        assert!(v.is_sensitive());
        assert_eq!(v.to_str().unwrap(), "AIzaCanary123");
        assert!(!format!("{v:?}").contains("Canary"));
        let e = secret_header("AIzaCanary123\n").unwrap_err();
        assert_eq!(e.class, ErrorClass::Auth);
        assert!(!format!("{e} {e:?}").contains("Canary"));
    }

    #[test]
    fn scrub_removes_pieces_of_the_key_whatever_its_shape() {
        let key = ApiKey::new("plainCANARYsecret0123887766");
        let e = ProviderError {
            class: ErrorClass::Auth,
            http_status: Some(401),
            message: "Incorrect API key provided: plainCANARYs*************887766. See docs."
                .into(),
            headers: RateHeaders::default(),
        };
        let e = scrub(e, Some(&key));
        assert_eq!(
            e.message,
            "Incorrect API key provided: [redacted]*************[redacted]. See docs."
        );
        // Fewer than six characters in a row from the key stay ("plain").
        assert_eq!(
            without_key_fragments("plain text, 0123 and CANAR", key.expose()),
            "plain text, 0123 and CANAR"
        );
    }

    #[test]
    fn scrub_removes_the_exact_key() {
        let e = ProviderError {
            class: ErrorClass::Auth,
            http_status: Some(401),
            message: "bad key AIzaCanary123 given".into(),
            headers: RateHeaders::default(),
        };
        let e = scrub(e, Some(&ApiKey::new("AIzaCanary123")));
        assert_eq!(e.message, "bad key [redacted] given");
    }
}
