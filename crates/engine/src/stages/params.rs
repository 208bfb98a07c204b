//! What a stage's config adds to its requests and to the session's record:
//! the response schema, the parameters a resume holds against the config,
//! and the output tokens a send may take beyond `max_tokens`.

use std::sync::Arc;

use docket_model::config::{ProviderKind, StageConfig};
use serde_json::Value;

use super::Repair;
use crate::gate::Gate;

/// The schema sent with a stage's requests (a body sent as written gets
/// none added: it asks for its own structured output).
pub(super) fn response_schema(stage: &StageConfig, gate: &Gate) -> Option<Arc<(String, Value)>> {
    gate.response_schema()
        .filter(|_| !stage.send_body)
        .map(|s| Arc::new((schema_name(&stage.name), s.clone())))
}

/// Output tokens a send may be billed beyond max_tokens: Gemini's thinking
/// budget, added to its output limit (none for the other kinds).
pub(super) fn thinking_allowance(kind: ProviderKind, model: &str, budget: Option<i64>) -> u64 {
    if kind == ProviderKind::Gemini {
        docket_providers::thinking_allowance(model, budget)
    } else {
        0
    }
}

/// The stage parameters whose change a resume must refuse, as hashed.
pub(super) fn stage_params(stage: &StageConfig, repair: Option<&Repair>) -> Value {
    let mut params = serde_json::json!({
        "max_tokens": stage.max_tokens.get_ref(),
        "temperature": stage.temperature.as_ref().map(|t| *t.get_ref()),
        "gate": &stage.gate,
        "criteria": &stage.criteria,
        "repair_after": stage.repair_after.as_ref().map(|r| *r.get_ref()),
        "repair_template": repair.map(|r| r.template.hash.clone()),
    });
    // Added only when set, so the hash of a stage without them is unchanged
    // (a session started before they existed resumes).
    if let Some(b) = &stage.thinking_budget {
        params["thinking_budget"] = serde_json::json!(b.get_ref());
    }
    if !stage.structured_output.is_auto() {
        params["structured_output"] = serde_json::json!(stage.structured_output.as_str());
    }
    if stage.send_body {
        params["send_body"] = Value::Bool(true);
        params["override_model"] = Value::Bool(stage.override_model);
    }
    params
}

/// The name a provider's structured-output mode gets for the stage's schema.
pub(super) fn schema_name(stage: &str) -> String {
    let s: String = stage
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(64)
        .collect();
    if s.is_empty() { "answer".into() } else { s }
}
