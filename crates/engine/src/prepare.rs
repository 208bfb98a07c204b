//! `prepare`: the job loaded and checked before a request is sent (config,
//! templates, gates, thresholds, keys), so that anything that can be wrong
//! stops the run before it costs anything.

use std::path::{Path, PathBuf};

use crate::{EngineError, Prepared, RunOptions, stages};
use docket_ledger::LedgerLocation;
use docket_model::config::LoadedConfig;
use docket_model::routing::Thresholds;

pub fn config_path(workspace: &Path) -> PathBuf {
    workspace.join(docket_model::config::CONFIG_FILE)
}

/// Load and check config, templates, gates and thresholds. Nothing is sent.
pub fn prepare(opts: &RunOptions) -> Result<Prepared, EngineError> {
    let cfg_path = config_path(&opts.workspace);
    if !cfg_path.exists() {
        return Err(EngineError::Usage(format!(
            "{}: no docket.toml here (create a workspace with `docket init {}`, or pass --workspace)",
            cfg_path.display(),
            opts.workspace.display()
        )));
    }
    let config = LoadedConfig::load(&cfg_path)?;
    if !config.config.job.enabled && !opts.force {
        return Err(EngineError::Usage(format!(
            "{}: job.enabled = false: LLM adjudication is disabled for this workspace (pass --force to run anyway)",
            cfg_path.display()
        )));
    }
    let routing = &config.config.routing;
    let thresholds = Thresholds::new(
        opts.auto_accept_threshold
            .unwrap_or(*routing.auto_accept_threshold.get_ref()),
        opts.review_threshold
            .unwrap_or(*routing.review_threshold.get_ref()),
        opts.min_confidence,
    )?;
    if let Some(m) = opts.max_cost
        && !(m.is_finite() && m >= 0.0)
    {
        return Err(EngineError::Usage(format!(
            "--max-cost {m}: must be a non-negative amount of USD"
        )));
    }
    let mut stages = stages::load_stages(&config, &cfg_path, opts)?;
    let ledger = LedgerLocation::for_workspace(&opts.workspace).map_err(EngineError::opening)?;
    let profile = crate::profile::resolve(opts, &ledger)?;
    if let Some(p) = &profile {
        crate::profile::apply(p, &mut stages, opts.rate_limit)?;
    }
    let answer_name = config.answer_stage().name.clone();
    let answer = stages
        .iter()
        .position(|s| s.name == answer_name)
        .unwrap_or(0);
    let rerun_from = match &opts.rerun_stage {
        None => None,
        Some(name) => Some(stages.iter().position(|s| &s.name == name).ok_or_else(|| {
            EngineError::Usage(format!(
                "--rerun-stage {name}: no such stage in {} (stages: {})",
                cfg_path.display(),
                stages
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?),
    };
    let stand_ins = crate::renders::stand_ins_for(&stages);
    Ok(Prepared {
        stand_ins,
        ledger,
        thresholds,
        critic: stages::critic_routing(&config),
        flag_injection: config.config.routing.flag_injection,
        completion_mode: opts
            .completion_mode
            .unwrap_or(config.config.job.completion_mode),
        stages,
        answer,
        rerun_from,
        config,
        profile,
    })
}
