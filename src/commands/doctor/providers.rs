//! The providers the job's stages use: each one's key variable set (the
//! key itself is never shown, only the fingerprint a session records), and
//! each one answering the cheap request a run sends before it creates a
//! session (`ChatProvider::preflight`: its models list), with a shorter
//! wait than the run's. A refused key and no answer read as in a run.

use std::time::Duration;

use docket::config::{ProviderConfig, ProviderKind};
use docket::engine::Prepared;
use docket::provider::models::{self, ListSays};
use docket::provider::{ErrorClass, ProviderSetupError};

use super::Check;

/// How long doctor waits for a provider's answer (a run's preflight waits
/// 15 s: doctor is asked interactively).
const REACH_TIMEOUT: Duration = Duration::from_secs(8);

/// The stages' providers, each once, in job order, with their config.
fn used(prepared: &Prepared) -> Vec<(String, ProviderConfig)> {
    let mut out: Vec<(String, ProviderConfig)> = Vec::new();
    for stage in &prepared.stages {
        if out.iter().any(|(n, _)| n == &stage.provider_name) {
            continue;
        }
        if let Some(cfg) = prepared.config.config.providers.get(&stage.provider_name) {
            out.push((stage.provider_name.clone(), cfg.clone()));
        }
    }
    out
}

/// One line per provider: its key variable set or not.
pub(super) fn keys(prepared: &Prepared) -> Vec<Check> {
    used(prepared)
        .into_iter()
        .map(|(name, cfg)| {
            let check = format!("provider.{name}.key");
            if cfg.kind == ProviderKind::Mock {
                return Check::ok(check, "kind = \"mock\": the built-in mock needs no key");
            }
            let Some(var) = cfg.api_key_env.clone() else {
                return Check::ok(
                    check,
                    format!(
                        "no key configured (no api_key_env; kind = \"{}\" takes none)",
                        cfg.kind.as_str()
                    ),
                );
            };
            match docket::provider::key_fingerprint(&cfg) {
                Some(fingerprint) => Check::ok(check, format!("{var} is set ({fingerprint})")),
                None => Check::fail(
                    check,
                    format!("{var} is not set (providers.{name}.api_key_env names it)"),
                    format!("export {var}=<the key for providers.{name}> in this shell"),
                ),
            }
        })
        .collect()
}

/// One line per provider: it answered the preflight, all asked at once.
pub(super) async fn reach(prepared: &Prepared) -> Vec<Check> {
    let mut asked = tokio::task::JoinSet::new();
    for (index, (name, cfg)) in used(prepared).into_iter().enumerate() {
        asked.spawn(async move { (index, reach_one(&name, &cfg).await) });
    }
    let mut done = Vec::new();
    while let Some(joined) = asked.join_next().await {
        match joined {
            Ok(one) => done.push(one),
            Err(e) => done.push((
                usize::MAX,
                Check::fail(
                    "provider.reach",
                    format!("the check itself failed: {e}"),
                    "report this as a bug in docket",
                ),
            )),
        }
    }
    done.sort_by_key(|(index, _)| *index);
    done.into_iter().map(|(_, check)| check).collect()
}

async fn reach_one(name: &str, cfg: &ProviderConfig) -> Check {
    let check = format!("provider.{name}.reach");
    if cfg.kind == ProviderKind::Mock {
        return Check::ok(
            check,
            "kind = \"mock\": the built-in mock starts with each run, nothing to reach",
        );
    }
    let url = cfg
        .base_url
        .as_deref()
        .or(cfg.kind.default_base_url())
        .unwrap_or("(no base_url)")
        .to_string();
    let chat = match docket::provider::build(name, cfg, None) {
        Ok(chat) => chat,
        Err(ProviderSetupError::MissingKey { var, .. }) => {
            return Check::warn(
                check,
                format!("not asked: {var} is not set"),
                format!("export {var} (see provider.{name}.key), then run `docket doctor` again"),
            );
        }
        Err(e) => {
            return Check::fail(
                check,
                e.to_string(),
                format!("correct providers.{name} in docket.toml"),
            );
        }
    };
    let answer = match tokio::time::timeout(REACH_TIMEOUT, chat.preflight()).await {
        Ok(answer) => answer,
        Err(_) => {
            return Check::fail(
                check,
                format!(
                    "cannot reach {url}: no answer within {} s",
                    REACH_TIMEOUT.as_secs()
                ),
                unreachable_fix(name),
            );
        }
    };
    match answer {
        Err(e) if e.class == ErrorClass::Auth => {
            let fix = match &cfg.api_key_env {
                Some(var) => format!(
                    "put a key {url} accepts in {var} (it refused this one: revoked, mistyped or for another account)"
                ),
                None => format!(
                    "set providers.{name}.api_key_env to the variable holding a key {url} accepts"
                ),
            };
            Check::fail(check, format!("key rejected by {url}: {e}"), fix)
        }
        Err(e) => Check::fail(
            check,
            format!("cannot reach {url}: {e}"),
            unreachable_fix(name),
        ),
        Ok(listed) => listed_model(name, cfg, &url, check, listed.as_deref()),
    }
}

fn unreachable_fix(name: &str) -> String {
    format!(
        "check providers.{name}.base_url in docket.toml and the network (proxy, firewall, DNS), or use --offline"
    )
}

/// The provider answered: does its models list, when it sent a whole one,
/// name the configured model? As a run judges it: a provider's own list
/// leaving it out stops a run; a compatible server's list only warns.
fn listed_model(
    name: &str,
    cfg: &ProviderConfig,
    url: &str,
    check: String,
    listed: Option<&[String]>,
) -> Check {
    let Some(listed) = listed.filter(|l| !l.is_empty()) else {
        return Check::ok(check, format!("{url} answers"));
    };
    let mock_serves_a_set = cfg
        .mock
        .as_ref()
        .is_some_and(|m| !m.models.trim().is_empty());
    let says = models::list_says(cfg.kind, mock_serves_a_set);
    let model = docket::sanitize::for_terminal(&cfg.model);
    if says == ListSays::Unchecked || models::listed(cfg.kind, &cfg.model, listed) {
        return Check::ok(
            check,
            format!("{url} answers; its models list names {model}"),
        );
    }
    let detail = format!(
        "{url} answers, but its models list ({} models) does not name {model}",
        listed.len()
    );
    let fix = format!("set providers.{name}.model to a model {url} serves");
    if says == ListSays::Indicative {
        Check::warn(check, detail, fix)
    } else {
        Check::fail(check, detail, fix)
    }
}
