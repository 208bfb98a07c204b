//! A resumed session's flags. A resume may pass other routing thresholds,
//! another rate limit, budget or completion mode than the session started
//! with (a worker joining may bring other thresholds from a docket.toml it
//! accepted the changes of), and the session then runs with them: its
//! record says so (the console's header, the report and `docket sessions`
//! read the flags from the session's snapshot), with an event naming each
//! change and who made it.

use serde_json::{Map, Value};

use crate::db::{Connection, OptionalExtension, params};
use crate::transaction::write_transaction;

/// A flag a resume changed: its name, what the session had (null when it
/// recorded none), and what it runs with now.
#[derive(Debug, Clone, PartialEq)]
pub struct FlagChange {
    pub name: String,
    pub was: Value,
    pub now: Value,
}

impl std::fmt::Display for FlagChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = |v: &Value| match v {
            Value::Null => "none".to_string(),
            Value::String(s) => s.clone(),
            // A rate-limit profile: by its name and version.
            Value::Object(o) => match (o.get("name").and_then(Value::as_str), o.get("version")) {
                (Some(name), Some(version)) => format!("{name} (version {version})"),
                _ => v.to_string(),
            },
            other => other.to_string(),
        };
        write!(
            f,
            "{} {} -> {}",
            self.name,
            shown(&self.was),
            shown(&self.now)
        )
    }
}

impl crate::Ledger {
    /// A resume (or a worker joining: `joined`) runs the session with
    /// `flags` (its thresholds, limits, budget, completion mode): those
    /// that differ from what the session recorded are written into its
    /// snapshot, with an event saying who changed what, and how. Returns
    /// the changes.
    pub fn record_flags(
        &self,
        session_id: &str,
        flags: &Map<String, Value>,
        actor: &str,
        joined: bool,
    ) -> Result<Vec<FlagChange>, crate::LedgerError> {
        Ok(record_flags(self.conn(), session_id, flags, actor, joined)?)
    }
}

/// Write `flags` into the session's snapshot where they differ from what it
/// recorded, with one `config` event listing the changes; returns them
/// (none: nothing is written). An unknown session changes nothing.
fn record_flags(
    conn: &Connection,
    session_id: &str,
    flags: &Map<String, Value>,
    actor: &str,
    joined: bool,
) -> crate::db::Result<Vec<FlagChange>> {
    write_transaction(conn, || {
        let Some(text) = conn
            .prepare_cached(
                "SELECT config_snapshot_json FROM llm_batch_session WHERE session_id = ?1",
            )?
            .query_row(params![session_id], |r| r.get::<_, String>(0))
            .optional()?
        else {
            return Ok(Vec::new());
        };
        // A snapshot that is not an object (never written so) is replaced
        // by one holding the flags, rather than the resume refused.
        let mut snapshot: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        if !snapshot.is_object() {
            snapshot = Value::Object(Map::new());
        }
        let recorded = snapshot.as_object_mut().map(|o| {
            o.entry("flags")
                .or_insert_with(|| Value::Object(Map::new()))
        });
        let Some(Value::Object(recorded)) = recorded else {
            return Ok(Vec::new());
        };
        let changes = changes(recorded, flags);
        if changes.is_empty() {
            return Ok(changes);
        }
        for c in &changes {
            recorded.insert(c.name.clone(), c.now.clone());
        }
        let now = crate::now_ts();
        conn.prepare_cached(
            "UPDATE llm_batch_session SET config_snapshot_json = ?2, updated_at = ?3 WHERE session_id = ?1",
        )?
        .execute(params![session_id, snapshot.to_string(), now])?;
        let listed: Vec<String> = changes.iter().map(FlagChange::to_string).collect();
        crate::calibration::config_event(
            conn,
            session_id,
            now,
            &format!(
                "{} with other flags: {} (by {actor})",
                if joined { "a worker joined" } else { "resumed" },
                listed.join(", ")
            ),
            actor,
        )?;
        Ok(changes)
    })
}

/// The flags of `now` whose value differs from `recorded`'s, in `now`'s
/// order.
fn changes(recorded: &Map<String, Value>, now: &Map<String, Value>) -> Vec<FlagChange> {
    now.iter()
        .filter(|(name, value)| recorded.get(*name).unwrap_or(&Value::Null) != *value)
        .map(|(name, value)| FlagChange {
            name: name.clone(),
            was: recorded.get(name).cloned().unwrap_or(Value::Null),
            now: value.clone(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::changes;
    use serde_json::{Map, Value, json};

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    #[test]
    fn only_flags_with_another_value_are_changes() {
        let recorded = map(json!({
            "completion_mode": "exact", "auto_accept_threshold": 0.9, "max_cost": null, "limit": 5
        }));
        let now = map(json!({
            "completion_mode": "throughput", "auto_accept_threshold": 0.9, "max_cost": 2.5,
            "review_threshold": 0.5
        }));
        let shown: Vec<String> = changes(&recorded, &now)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            shown,
            [
                "completion_mode exact -> throughput",
                "max_cost none -> 2.5",
                "review_threshold none -> 0.5"
            ]
        );
        assert!(changes(&recorded, &map(json!({"limit": 5, "max_cost": null}))).is_empty());
        let profile = map(json!({"profile": {"name": "tier2", "version": 3, "limits": {}}}));
        assert_eq!(
            changes(&recorded, &profile)[0].to_string(),
            "profile none -> tier2 (version 3)"
        );
    }
}
