//! The keys a session was started with, as fingerprints (never the keys),
//! and the check on resume that the same keys are in use.

use crate::{EngineError, Prepared, Reporter};
use docket_ledger::store::SessionRow;

/// Each provider of the job that takes a key: its variable's name and the
/// key's fingerprint (`provider::key_fingerprint`), never the key.
pub(crate) fn key_fingerprints(p: &Prepared) -> serde_json::Value {
    let mut keys = serde_json::Map::new();
    for s in &p.stages {
        let Some(cfg) = p.config.config.providers.get(&s.provider_name) else {
            continue;
        };
        if let Some(var) = &cfg.api_key_env {
            keys.insert(
                s.provider_name.clone(),
                serde_json::json!({
                    "env": var,
                    "fingerprint": docket_providers::key_fingerprint(cfg),
                }),
            );
        }
    }
    serde_json::Value::Object(keys)
}

/// A resumed session with provider batches still open must poll them with
/// the key that created them: another key (another project or account)
/// would see a 404 and the batches look failed when they are not (row B8).
/// With no batch open, another key is only said.
pub(crate) fn check_same_keys(
    p: &Prepared,
    s: &SessionRow,
    open_batches: u64,
    reporter: &dyn Reporter,
) -> Result<(), EngineError> {
    let snap: serde_json::Value = serde_json::from_str(&s.config_snapshot_json).unwrap_or_default();
    let Some(was) = snap.get("keys").and_then(|k| k.as_object()) else {
        // A session from before fingerprints were kept.
        return Ok(());
    };
    let now = key_fingerprints(p);
    for (provider, then) in was {
        let (Some(then_fp), Some(now_fp)) = (
            then.get("fingerprint").and_then(|f| f.as_str()),
            now.get(provider)
                .and_then(|p| p.get("fingerprint"))
                .and_then(|f| f.as_str()),
        ) else {
            continue;
        };
        if then_fp == now_fp {
            continue;
        }
        let var = then.get("env").and_then(|v| v.as_str()).unwrap_or("?");
        let what = format!(
            "session {} was started with another key for provider {provider}: {var} was {then_fp}, it is {now_fp} now",
            s.session_id
        );
        if open_batches > 0 {
            return Err(EngineError::Usage(format!(
                "{what}. Its {open_batches} provider batch(es) still open were created with the first key and \
                 another key may not see them (they would look failed). Set {var} back to that key to resume."
            )));
        }
        reporter.line(&format!("Note: {what}."));
    }
    Ok(())
}
