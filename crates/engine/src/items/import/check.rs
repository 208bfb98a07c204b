//! New rows checked against the job's templates at import (when the
//! workspace has a docket.toml): a row whose prompt cannot be rendered (a
//! field a template needs that the row lacks) is named with its line, id
//! and the missing variable. It is imported all the same (a run fails it
//! alone, costing nothing), unless `--strict`.

use std::path::Path;

use serde_json::{Map, Value};

use crate::gate::{Gate, GateBuildError};
use crate::renders::{StageCheck, Unrenderable, render_all, stand_ins};
use crate::stages::placeholder_output_of;
use crate::template::{PromptTemplate, TemplateError};
use docket_model::config::{ConfigError, LoadedConfig};

/// Why the job's templates could not be loaded for the check.
#[derive(Debug, thiserror::Error)]
pub enum TemplateCheckError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error(transparent)]
    Gate(#[from] GateBuildError),
}

/// One stage's template, with what it sees besides the item.
struct Checked {
    name: String,
    template: PromptTemplate,
    stand_ins: Map<String, Value>,
}

/// The job's templates, loaded to check rows against (no provider, key or
/// ledger needed).
pub struct TemplateCheck {
    stages: Vec<Checked>,
}

impl TemplateCheck {
    /// Load docket.toml's stages: templates, system prompts and gates (the
    /// gates shape the stand-ins a later stage's template sees).
    pub fn load(config_path: &Path) -> Result<Self, TemplateCheckError> {
        let config = LoadedConfig::load(config_path)?;
        let stage_configs = &config.config.stages;
        let mut templates = Vec::with_capacity(stage_configs.len());
        let mut outputs = Vec::with_capacity(stage_configs.len());
        for sc in stage_configs {
            let system = sc.system_prompt.as_ref().map(|p| config.resolve(p));
            templates.push(PromptTemplate::load(
                &config.resolve(&sc.template),
                system.as_deref(),
            )?);
            let gate = Gate::build_for(&sc.gate, &config.root, config_path, !sc.is_critic())?;
            outputs.push(placeholder_output_of(&gate, &sc.criteria));
        }
        let names: Vec<&str> = stage_configs.iter().map(|s| s.name.as_str()).collect();
        let stages = templates
            .into_iter()
            .enumerate()
            .map(|(k, template)| {
                let sc = &stage_configs[k];
                let critic_of = sc
                    .critic_of
                    .as_ref()
                    .and_then(|of| names.iter().position(|n| n == of));
                Checked {
                    name: sc.name.clone(),
                    template,
                    stand_ins: stand_ins(&names, &outputs, k, critic_of, &sc.criteria),
                }
            })
            .collect();
        Ok(TemplateCheck { stages })
    }

    /// Whether this row's prompts render at every stage.
    pub fn check(&self, item_id: &str, evidence_json: &str) -> Result<(), Unrenderable> {
        // The import wrote this JSON itself: it parses.
        let evidence: Value = serde_json::from_str(evidence_json).unwrap_or(Value::Null);
        let stages = self.stages.iter().map(|s| StageCheck {
            name: &s.name,
            template: &s.template,
            stand_ins: &s.stand_ins,
        });
        render_all(stages, item_id, &evidence).map(|_| ())
    }
}
