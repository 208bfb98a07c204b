//! Named rate-limit profiles (`docket profile`): a set of a provider's
//! client-side limits kept in the ledger under a name, versioned (every
//! `set` is a new version, the old ones stay as history), and chosen per
//! run with `batch-adjudicate --profile NAME`. A profile's limits override
//! the provider section's of `docket.toml` for that run only; the session
//! records which profile and version it ran with.

use serde::{Deserialize, Serialize};

use crate::config::ProviderConfig;

/// The limits a profile may set: the same keys, with the same meaning, as a
/// `[providers.NAME]` section's. `None` leaves the section's value.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrency: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_timeout_secs: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_transport_attempts: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rate_limit_retries: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_wait_secs: Option<f64>,
}

/// Why a profile's limits are refused (checked when it is set).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    #[error(
        "a profile needs at least one limit (--rpm, --tpm, --concurrency, --timeout-secs, --transport-attempts, --rate-limit-retries or --retry-wait-secs)"
    )]
    Empty,
    #[error("{key} = {value}: {why}")]
    Bad {
        key: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("profile name {0:?}: use letters, digits, '-', '_' or '.' (at most 64)")]
    BadName(String),
}

impl ProfileLimits {
    /// Whether no limit is set.
    pub fn is_empty(&self) -> bool {
        *self == ProfileLimits::default()
    }

    /// Refuse what a provider section would refuse too: a concurrency of
    /// 0, a timeout or wait that is not a positive (non-negative) number,
    /// no transport attempt at all.
    pub fn validate(&self) -> Result<(), ProfileError> {
        if self.is_empty() {
            return Err(ProfileError::Empty);
        }
        let bad = |key, value: String, why| Err(ProfileError::Bad { key, value, why });
        if self.max_concurrency == Some(0) {
            return bad("max_concurrency", "0".into(), "must be at least 1");
        }
        if self.max_transport_attempts == Some(0) {
            return bad("max_transport_attempts", "0".into(), "must be at least 1");
        }
        if let Some(t) = self.request_timeout_secs
            && !(t.is_finite() && t > 0.0)
        {
            return bad(
                "request_timeout_secs",
                t.to_string(),
                "must be a positive number of seconds",
            );
        }
        if let Some(w) = self.retry_wait_secs
            && !(w.is_finite() && w >= 0.0)
        {
            return bad(
                "retry_wait_secs",
                w.to_string(),
                "must be a non-negative number of seconds",
            );
        }
        Ok(())
    }

    /// Put the profile's limits over a provider section's; the section's
    /// spans stay, so an error about a value still points at its key.
    pub fn apply(&self, p: &mut ProviderConfig) {
        if let Some(v) = self.requests_per_minute {
            *p.requests_per_minute.get_mut() = v;
        }
        if let Some(v) = self.tokens_per_minute {
            *p.tokens_per_minute.get_mut() = v;
        }
        if let Some(v) = self.max_concurrency {
            *p.max_concurrency.get_mut() = v;
        }
        if let Some(v) = self.request_timeout_secs {
            *p.request_timeout_secs.get_mut() = v;
        }
        if let Some(v) = self.max_transport_attempts {
            *p.max_transport_attempts.get_mut() = v;
        }
        if let Some(v) = self.max_rate_limit_retries {
            *p.max_rate_limit_retries.get_mut() = v;
        }
        if let Some(v) = self.retry_wait_secs {
            *p.retry_wait_secs.get_mut() = v;
        }
    }

    /// `rpm=60 concurrency=1 ...`: the limits set, in the sections' order.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        let mut add = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        };
        add("rpm", self.requests_per_minute.map(|v| v.to_string()));
        add("tpm", self.tokens_per_minute.map(|v| v.to_string()));
        add("concurrency", self.max_concurrency.map(|v| v.to_string()));
        add(
            "timeout_secs",
            self.request_timeout_secs.map(|v| v.to_string()),
        );
        add(
            "transport_attempts",
            self.max_transport_attempts.map(|v| v.to_string()),
        );
        add(
            "rate_limit_retries",
            self.max_rate_limit_retries.map(|v| v.to_string()),
        );
        add(
            "retry_wait_secs",
            self.retry_wait_secs.map(|v| v.to_string()),
        );
        parts.join(" ")
    }
}

/// A profile name: what a shell and a table can show without quoting.
pub fn check_name(name: &str) -> Result<(), ProfileError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ProfileError::BadName(name.to_string()))
    }
}

/// One stored version of a profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    pub name: String,
    pub version: i64,
    /// The provider's name in `docket.toml` (`[providers.NAME]`).
    pub provider: String,
    /// When set, the profile applies only to a provider with this model.
    pub model: Option<String>,
    pub limits: ProfileLimits,
    /// Unix seconds.
    pub created_at: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_round_trip_and_refuse_nonsense() {
        let l = ProfileLimits {
            requests_per_minute: Some(60),
            max_concurrency: Some(1),
            ..Default::default()
        };
        let json = serde_json::to_string(&l).unwrap();
        assert_eq!(json, r#"{"requests_per_minute":60,"max_concurrency":1}"#);
        assert_eq!(serde_json::from_str::<ProfileLimits>(&json).unwrap(), l);
        assert_eq!(l.describe(), "rpm=60 concurrency=1");
        assert!(l.validate().is_ok());
        assert_eq!(
            ProfileLimits::default().validate(),
            Err(ProfileError::Empty)
        );
        let zero = ProfileLimits {
            max_concurrency: Some(0),
            ..Default::default()
        };
        assert!(zero.validate().is_err());
        assert!(check_name("fast-1.x").is_ok());
        assert!(check_name("no spaces").is_err());
        assert!(check_name("").is_err());
    }
}
