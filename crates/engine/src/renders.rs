//! Whether an item's prompts render at every stage of the job, checked
//! before anything is sent for it: an item that lacks a field a template
//! needs ends in `error` alone, costing nothing, while the others run.
//!
//! The first stage renders with the item as it is; a later stage with
//! stand-ins for the earlier stages' outputs (shaped by their gates), as
//! planning measures it. A later stage that still fails on the real
//! outputs fails its item alone when it comes to it (see `attempt::Job`).

use serde_json::{Map, Value};

use crate::stages::Stage;
use crate::template::{Prompt, PromptTemplate, TemplateError};

/// One stage's prompt template with what its template sees besides the
/// item while it is checked.
pub struct StageCheck<'a> {
    pub name: &'a str,
    pub template: &'a PromptTemplate,
    pub stand_ins: &'a Map<String, Value>,
}

/// An item whose prompt cannot be rendered at `stage` (an index into the
/// job's stages).
#[derive(Debug)]
pub struct Unrenderable {
    pub stage: usize,
    pub stage_name: String,
    pub error: TemplateError,
}

impl Unrenderable {
    /// The item's error: the template's, with the stage named when it is
    /// not the first (the item's error is recorded on its first stage,
    /// which says so: "stage adjudicate: not sent, since ...").
    pub fn message(&self) -> String {
        if self.stage == 0 {
            self.error.to_string()
        } else {
            format!(
                "not sent, since its prompt for stage {} cannot be rendered: {}",
                self.stage_name, self.error
            )
        }
    }

    /// `message` without the item and the hint (for lists of many items).
    pub fn reason(&self) -> String {
        if self.stage == 0 {
            self.error.reason()
        } else {
            format!("stage {}: {}", self.stage_name, self.error.reason())
        }
    }
}

/// What stage `k`'s template sees besides the item while it is checked:
/// `stages` (stand-ins for the earlier stages' outputs), a critic's
/// `target`, the `criteria`. `outputs[j]` is stage j's stand-in.
pub fn stand_ins(
    names: &[&str],
    outputs: &[Value],
    k: usize,
    critic_of: Option<usize>,
    criteria: &[String],
) -> Map<String, Value> {
    let mut stages = Map::new();
    for j in 0..k {
        stages.insert(names[j].to_string(), outputs[j].clone());
    }
    let mut extra = Map::new();
    if let Some(c) = critic_of {
        extra.insert("target".into(), outputs[c].clone());
    }
    extra.insert("stages".into(), Value::Object(stages));
    extra.insert(
        "criteria".into(),
        Value::Array(criteria.iter().cloned().map(Value::String).collect()),
    );
    extra
}

/// Every stage's stand-in context for a job's loaded stages (empty for the
/// first, which sees only the item).
pub fn stand_ins_for(stages: &[Stage]) -> Vec<Map<String, Value>> {
    let names: Vec<&str> = stages.iter().map(|s| s.name.as_str()).collect();
    let outputs: Vec<Value> = stages.iter().map(Stage::placeholder_output).collect();
    (0..stages.len())
        .map(|k| {
            if k == 0 {
                Map::new()
            } else {
                let st = &stages[k];
                stand_ins(&names, &outputs, k, st.critic_of, &st.criteria)
            }
        })
        .collect()
}

/// Render the item's prompt at every stage, in order; the first stage's
/// prompt, or the first stage that cannot be rendered.
pub fn render_all<'a>(
    stages: impl IntoIterator<Item = StageCheck<'a>>,
    item_id: &str,
    evidence: &Value,
) -> Result<Option<Prompt>, Unrenderable> {
    let mut first = None;
    for (k, st) in stages.into_iter().enumerate() {
        let extra = if k == 0 {
            Map::new()
        } else {
            st.stand_ins.clone()
        };
        match st.template.render_with(item_id, evidence, extra) {
            Ok(prompt) if k == 0 => first = Some(prompt),
            Ok(_) => {}
            Err(error) => {
                return Err(Unrenderable {
                    stage: k,
                    stage_name: st.name.to_string(),
                    error,
                });
            }
        }
    }
    Ok(first)
}

/// `render_all` over a prepared job's stages.
pub(crate) fn render_job(
    p: &crate::Prepared,
    item_id: &str,
    evidence: &Value,
) -> Result<Option<Prompt>, Unrenderable> {
    render_all(p.stage_checks(), item_id, evidence)
}
