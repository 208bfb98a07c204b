//! The workspace: docket.toml found, parsed and validated (the loader's own
//! errors, which name the file, line and key), then every stage's
//! template, system prompt and gate schema loaded and compiled, as a run
//! checks them before it sends anything (`engine::prepare`, as a dry run:
//! no key is needed here; `providers` checks the keys).

use std::path::Path;

use docket::config::ConfigError;
use docket::engine::{EngineError, Prepared, RunOptions};

use super::Check;

/// The config and template checks into `out`; the prepared job when both
/// passed (the provider checks need it).
pub(super) fn check(ws: &Path, out: &mut Vec<Check>) -> Option<Prepared> {
    let cfg_path = docket::engine::config_path(ws);
    if !cfg_path.is_file() {
        out.push(Check::fail(
            "config",
            format!("{}: no docket.toml here", cfg_path.display()),
            format!(
                "create a workspace with `docket init {}`, or point --workspace (DOCKET_WORKSPACE) at one",
                ws.display()
            ),
        ));
        return None;
    }
    let opts = RunOptions {
        workspace: ws.to_path_buf(),
        // A dry run's checks: everything but the keys, which have their
        // own lines; job.enabled is said below instead of refused.
        dry_run: true,
        force: true,
        ..Default::default()
    };
    match docket::engine::prepare(&opts) {
        Ok(prepared) => {
            out.push(config_ok(&prepared));
            out.push(Check::ok(
                "templates",
                "every stage's template, system prompt and gate schema load and compile",
            ));
            if !prepared.config.config.job.enabled {
                out.push(Check::warn(
                    "config.job.enabled",
                    "job.enabled = false: batch-adjudicate refuses to run this job",
                    format!(
                        "set job.enabled = true in {}, or run with --force",
                        cfg_path.display()
                    ),
                ));
            }
            Some(prepared)
        }
        Err(e) => {
            out.extend(failed(&cfg_path, e));
            None
        }
    }
}

fn config_ok(prepared: &Prepared) -> Check {
    let stages: Vec<&str> = prepared.stages.iter().map(|s| s.name.as_str()).collect();
    let providers: Vec<&str> = prepared
        .config
        .config
        .providers
        .keys()
        .map(String::as_str)
        .collect();
    Check::ok(
        "config",
        format!(
            "{} loads and validates (stages: {}; providers: {})",
            prepared.config.path.display(),
            stages.join(", "),
            providers.join(", ")
        ),
    )
}

/// What a failed `prepare` says, as the line(s) of the check it belongs to.
fn failed(cfg_path: &Path, e: EngineError) -> Vec<Check> {
    let detail = e.to_string();
    let config_fix = match &e {
        EngineError::Config(ConfigError::Invalid {
            path, line, key, ..
        }) => Some(format!("correct `{key}` at {path}:{line}")),
        EngineError::Config(ConfigError::ParseAt {
            path, line, text, ..
        }) => Some(format!("correct `{text}` at {path}:{line}")),
        EngineError::Config(ConfigError::Parse { path, .. }) => {
            Some(format!("correct {path} as the message says"))
        }
        EngineError::Config(ConfigError::Read { path, .. }) => {
            Some(format!("make {path} a readable UTF-8 text file"))
        }
        EngineError::Thresholds(_) => Some(format!(
            "correct [routing]'s thresholds in {}",
            cfg_path.display()
        )),
        EngineError::Template(_) | EngineError::Gate(_) => None,
        _ => Some(format!(
            "correct {} as the message says",
            cfg_path.display()
        )),
    };
    match config_fix {
        Some(fix) => vec![Check::fail("config", detail, fix)],
        None => vec![
            Check::ok(
                "config",
                format!("{} loads and validates", cfg_path.display()),
            ),
            Check::fail(
                "templates",
                detail,
                format!(
                    "correct the file named, or the stage's path to it (template, system_prompt, gate.schema) in {}",
                    cfg_path.display()
                ),
            ),
        ],
    }
}
