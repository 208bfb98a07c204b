//! Which stage a session is in, from its config snapshot and its engine's
//! own word. Pure JSON reading, shared by the console's reads and the run
//! controls (`stop-at-stage` names the current stage).

/// The stage name when a session's config snapshot does not name one.
pub const DEFAULT_STAGE: &str = "adjudicate";

/// The first stage named in a session's config snapshot.
pub fn configured_stage(config_snapshot_json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(config_snapshot_json)
        .ok()
        .and_then(|v| {
            v.pointer("/config/stages/0/name")
                .and_then(serde_json::Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| DEFAULT_STAGE.to_string())
}

/// The stage a session is in now: the engine's own word (`live_json`'s
/// `stage`) when it has written one, else the configured first stage.
pub fn current_stage(config_snapshot_json: &str, live_json: Option<&str>) -> String {
    live_json
        .and_then(|j| serde_json::from_str::<serde_json::Value>(j).ok())
        .and_then(|v| {
            v.get("stage")
                .and_then(serde_json::Value::as_str)
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        })
        .unwrap_or_else(|| configured_stage(config_snapshot_json))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_names() {
        let snap = r#"{"config":{"stages":[{"name":"triage"},{"name":"critic"}]}}"#;
        assert_eq!(configured_stage(snap), "triage");
        assert_eq!(configured_stage("{}"), DEFAULT_STAGE);
        assert_eq!(configured_stage("not json"), DEFAULT_STAGE);
        assert_eq!(current_stage(snap, Some(r#"{"stage":"critic"}"#)), "critic");
        assert_eq!(current_stage(snap, Some(r#"{"stage":""}"#)), "triage");
        assert_eq!(current_stage(snap, Some("garbage")), "triage");
        assert_eq!(current_stage(snap, None), "triage");
    }
}
