//! The config snapshot as the report shows it: the job's `docket.toml` as
//! the run recorded it (the snapshot is JSON; TOML has no null, so unset
//! keys are left out, as they were in the file), and the run's flags. The
//! snapshot holds the names of key variables, never a key; the keys'
//! fingerprints it also holds are not shown.

use serde_json::Value;

/// The config part of a snapshot as TOML; its JSON when it cannot be.
pub(super) fn as_toml(config: &Value) -> String {
    if config.is_null() {
        return String::new();
    }
    let json = serde_json::to_string_pretty(config).unwrap_or_default();
    without_nulls(config)
        .and_then(|v| toml::to_string_pretty(&v).ok())
        .unwrap_or(json)
}

/// The value with every null (and array element that is one) left out.
fn without_nulls(v: &Value) -> Option<Value> {
    match v {
        Value::Null => None,
        Value::Array(a) => Some(Value::Array(a.iter().filter_map(without_nulls).collect())),
        Value::Object(o) => Some(Value::Object(
            o.iter()
                .filter_map(|(k, v)| without_nulls(v).map(|v| (k.clone(), v)))
                .collect(),
        )),
        other => Some(other.clone()),
    }
}

/// A short fingerprint of the recorded config: the same config, the same
/// version (the first 12 hex digits of its JSON's SHA-256).
pub(super) fn version(config: &Value) -> String {
    if config.is_null() {
        return String::new();
    }
    let hex = docket_model::ids::sha256_hex(config.to_string().as_bytes());
    hex.chars().take(12).collect()
}

/// The run's flags that were set, as (name, value) pairs.
pub(super) fn flags(flags: &Value) -> Vec<(String, String)> {
    let Some(o) = flags.as_object() else {
        return Vec::new();
    };
    o.iter()
        .filter(|(_, v)| !v.is_null() && v != &&Value::Bool(false))
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (k.clone(), text)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_as_toml_without_its_nulls() {
        let c = serde_json::json!({"job": {"name": "charts", "description": null},
            "routing": {"auto_accept_threshold": 0.85}});
        let t = as_toml(&c);
        assert!(
            t.contains("[job]") && t.contains("name = \"charts\""),
            "{t}"
        );
        assert!(!t.contains("description"), "{t}");
        assert_eq!(as_toml(&Value::Null), "");
    }

    #[test]
    fn only_flags_that_were_set() {
        let f = serde_json::json!({"limit": null, "force": false, "max_cost": 2.5});
        assert_eq!(flags(&f), vec![("max_cost".to_string(), "2.5".to_string())]);
    }
}
