//! How today's docket.toml differs from the one a session recorded in its
//! snapshot, key by key.

use super::{Config, LoadedConfig};

/// One setting of docket.toml that differs from a session's snapshot of it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigChange {
    /// Its path: `routing.auto_accept_threshold`, `stages[0].max_tokens`.
    pub key: String,
    /// The value then and now (JSON; None: not set).
    pub before: Option<String>,
    pub after: Option<String>,
}

impl std::fmt::Display for ConfigChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = |x: &Option<String>| x.clone().unwrap_or_else(|| "(not set)".into());
        write!(f, "{} {} -> {}", self.key, v(&self.before), v(&self.after))
    }
}

impl LoadedConfig {
    /// What differs between this config and `snapshot`, the config a
    /// session recorded when it started (its snapshot's `config`), key by
    /// key. Comments, layout and the order of keys are not changes; nor is
    /// a setting left out then and given its default now (the snapshot is
    /// read back with today's defaults first). Nor is `[review]`: how items
    /// read in review is no part of the run, so a new card template never
    /// stands in the way of resuming a session; nor, for the same reason,
    /// `routing.target_precision` (what calibration measures against: the
    /// session keeps the one it recorded).
    pub fn changes_since(&self, snapshot: &serde_json::Value) -> Vec<ConfigChange> {
        let before = with_defaults(snapshot).unwrap_or_else(|| snapshot.clone());
        let mut out = Vec::new();
        diff_json("", &before, &self.snapshot_json(), &mut out);
        out.retain(|c| {
            c.key != "review"
                && !c.key.starts_with("review.")
                && c.key != "routing.target_precision"
        });
        out
    }
}

/// A config snapshot read back as a `Config` (taking today's defaults for
/// what it leaves out) and written again; None when it no longer reads.
fn with_defaults(snapshot: &serde_json::Value) -> Option<serde_json::Value> {
    fn drop_nulls(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => serde_json::Value::Object(
                m.iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k.clone(), drop_nulls(v)))
                    .collect(),
            ),
            serde_json::Value::Array(a) => {
                serde_json::Value::Array(a.iter().map(drop_nulls).collect())
            }
            v => v.clone(),
        }
    }
    let text = toml::to_string(&drop_nulls(snapshot)).ok()?;
    let config: Config = toml::from_str(&text).ok()?;
    serde_json::to_value(&config).ok()
}

fn diff_json(
    path: &str,
    before: &serde_json::Value,
    after: &serde_json::Value,
    out: &mut Vec<ConfigChange>,
) {
    use serde_json::Value;
    let show = |v: &Value| -> Option<String> {
        (!v.is_null()).then(|| crate::sanitize::truncate(&v.to_string(), 80))
    };
    match (before, after) {
        (Value::Object(a), Value::Object(b)) => {
            let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let null = Value::Null;
                diff_json(
                    &p,
                    a.get(k).unwrap_or(&null),
                    b.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        (Value::Array(a), Value::Array(b))
            if a.len() == b.len() && a.iter().chain(b).all(Value::is_object) =>
        {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                diff_json(&format!("{path}[{i}]"), x, y, out);
            }
        }
        (a, b) if a != b => out.push(ConfigChange {
            key: path.to_string(),
            before: show(a),
            after: show(b),
        }),
        _ => {}
    }
}
