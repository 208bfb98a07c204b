//! Workspaces: where one is, and `docket init`.
//!
//! A workspace is a folder with `docket.toml` (the job) and `docket.sqlite`
//! (the ledger). `--workspace DIR` or `DOCKET_WORKSPACE` pick it; the default
//! is the current folder. The demo workspace lives in the user data dir.

use std::path::{Path, PathBuf};

const TEMPLATE_FILES: &[(&str, &str)] = &[
    (
        "docket.toml",
        include_str!("../assets/workspace/docket.toml"),
    ),
    (
        "prompts/adjudicate.j2",
        include_str!("../assets/workspace/prompts/adjudicate.j2"),
    ),
    (
        "prompts/system.txt",
        include_str!("../assets/workspace/prompts/system.txt"),
    ),
    (
        "schemas/adjudicate.schema.json",
        include_str!("../assets/workspace/schemas/adjudicate.schema.json"),
    ),
];

/// A worked example of a staged pipeline (`docket init --example NAME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Example {
    /// Adjudicate, then a mandatory critic of every answer (JSON schemas,
    /// a repair prompt, the critic routing rule).
    Critic,
    /// The judge-gym shape: rubric_gen -> rubric_critic (a regex gate), then
    /// score_gen (structured batching, after every rubric) -> score_critic.
    JudgeGym,
}

const CRITIC_FILES: &[(&str, &str)] = &[
    (
        "docket.toml",
        include_str!("../assets/examples/critic/docket.toml"),
    ),
    (
        "prompts/adjudicate.j2",
        include_str!("../assets/examples/critic/prompts/adjudicate.j2"),
    ),
    (
        "prompts/system.txt",
        include_str!("../assets/examples/critic/prompts/system.txt"),
    ),
    (
        "prompts/repair.j2",
        include_str!("../assets/examples/critic/prompts/repair.j2"),
    ),
    (
        "prompts/critic.j2",
        include_str!("../assets/examples/critic/prompts/critic.j2"),
    ),
    (
        "schemas/adjudicate.schema.json",
        include_str!("../assets/examples/critic/schemas/adjudicate.schema.json"),
    ),
    (
        "schemas/critic.schema.json",
        include_str!("../assets/examples/critic/schemas/critic.schema.json"),
    ),
];

const JUDGE_GYM_FILES: &[(&str, &str)] = &[
    (
        "docket.toml",
        include_str!("../assets/examples/judge-gym/docket.toml"),
    ),
    (
        "prompts/rubric_gen.j2",
        include_str!("../assets/examples/judge-gym/prompts/rubric_gen.j2"),
    ),
    (
        "prompts/rubric_critic.j2",
        include_str!("../assets/examples/judge-gym/prompts/rubric_critic.j2"),
    ),
    (
        "prompts/score_gen.j2",
        include_str!("../assets/examples/judge-gym/prompts/score_gen.j2"),
    ),
    (
        "prompts/score_critic.j2",
        include_str!("../assets/examples/judge-gym/prompts/score_critic.j2"),
    ),
    (
        "schemas/rubric.schema.json",
        include_str!("../assets/examples/judge-gym/schemas/rubric.schema.json"),
    ),
    (
        "schemas/score.schema.json",
        include_str!("../assets/examples/judge-gym/schemas/score.schema.json"),
    ),
    (
        "schemas/score_critic.schema.json",
        include_str!("../assets/examples/judge-gym/schemas/score_critic.schema.json"),
    ),
];

mod demo;
mod provider;
pub use demo::{DEMO_MARKER, init_demo};
pub use provider::{RealProvider, point_at};

/// Sample items written by `docket init`.
pub const SAMPLE_ITEMS: &str = "items/sample.jsonl";
const SAMPLE_COUNT: usize = 50;

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error("{0}: a docket.toml is already there (pass --force to overwrite the scaffold files)")]
    Exists(String),
    #[error(
        "{0}: a docket.toml is already there and `docket demo` did not write it (the demo \
         wipes its folder's ledger); give the demo an empty or new folder with --workspace \
         (DOCKET_WORKSPACE counts as --workspace: unset it to use the demo's own folder)"
    )]
    NotDemo(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Write a working workspace into `dir`. Returns the files written.
pub fn init(dir: &Path, force: bool) -> Result<Vec<PathBuf>, WorkspaceError> {
    init_example(dir, force, None)
}

/// `init`, with a staged-pipeline example instead of the one-stage job.
pub fn init_example(
    dir: &Path,
    force: bool,
    example: Option<Example>,
) -> Result<Vec<PathBuf>, WorkspaceError> {
    init_for(dir, force, example, None)
}

/// `init_example`, its job pointed at a real provider instead of the mock
/// when `provider` is given.
pub fn init_for(
    dir: &Path,
    force: bool,
    example: Option<Example>,
    provider: Option<RealProvider>,
) -> Result<Vec<PathBuf>, WorkspaceError> {
    let files = match example {
        None => TEMPLATE_FILES,
        Some(Example::Critic) => CRITIC_FILES,
        Some(Example::JudgeGym) => JUDGE_GYM_FILES,
    };
    let io = |p: &Path| {
        let path = p.display().to_string();
        move |source| WorkspaceError::Io { path, source }
    };
    if dir.join("docket.toml").exists() && !force {
        return Err(WorkspaceError::Exists(dir.display().to_string()));
    }
    let mut written = Vec::new();
    for (rel, body) in files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let body = match provider {
            Some(p) if *rel == "docket.toml" => std::borrow::Cow::Owned(point_at(body, p)),
            _ => std::borrow::Cow::Borrowed(*body),
        };
        std::fs::write(&path, body.as_bytes()).map_err(io(&path))?;
        written.push(path);
    }
    let items = dir.join(SAMPLE_ITEMS);
    if let Some(parent) = items.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let mut f = std::io::BufWriter::new(std::fs::File::create(&items).map_err(io(&items))?);
    crate::demo::write_chart_items(&mut f, SAMPLE_COUNT, 1).map_err(io(&items))?;
    std::io::Write::flush(&mut f).map_err(io(&items))?;
    written.push(items);
    Ok(written)
}

/// The workspace to use: the flag, else `DOCKET_WORKSPACE`, else the current
/// folder. (clap already folds the env var into the flag.)
pub fn resolve(flag: Option<&Path>) -> PathBuf {
    flag.map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// docket's per-user directories.
pub fn project_dirs() -> Option<directories::ProjectDirs> {
    directories::ProjectDirs::from("", "", "docket")
}

/// The demo workspace, in the user data dir (or a temp dir when there is no
/// home directory).
pub fn demo_dir() -> PathBuf {
    match project_dirs() {
        Some(d) => d.data_dir().join("demo"),
        None => std::env::temp_dir().join("docket-demo"),
    }
}

/// At most this many daily log files are kept, today's included: the
/// oldest are deleted as docket starts.
pub const LOG_FILES_KEPT: usize = 14;

/// The log files' names: `docket.YYYY-MM-DD.log` (the UTC date), one a day.
pub const LOG_FILE_PREFIX: &str = "docket";
pub const LOG_FILE_SUFFIX: &str = "log";

/// Where logs go: the XDG state dir (`$XDG_STATE_HOME/docket/logs`, by
/// default `~/.local/state/docket/logs`), state that is neither config nor
/// data. Platforms without one (macOS, Windows) use the local data dir.
pub fn log_dir() -> PathBuf {
    match project_dirs() {
        Some(d) => d
            .state_dir()
            .unwrap_or_else(|| d.data_local_dir())
            .join("logs"),
        None => std::env::temp_dir().join("docket-logs"),
    }
}

/// The log files, for `--help`, `--version` and the console's help screen.
pub fn log_files_described() -> String {
    format!(
        "{}/{LOG_FILE_PREFIX}.YYYY-MM-DD.{LOG_FILE_SUFFIX} (a new file each day, UTC; at most {LOG_FILES_KEPT} kept, the oldest deleted)",
        log_dir().display()
    )
}

/// Where the keymap and console.toml are read: `$DOCKET_CONFIG_DIR`, else
/// the platform config dir (`~/.config/docket` on Linux).
pub fn config_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKET_CONFIG_DIR").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir));
    }
    project_dirs().map(|d| d.config_dir().to_path_buf())
}

/// docket's data dir (the demo workspace lives in it).
pub fn data_dir() -> Option<PathBuf> {
    project_dirs().map(|d| d.data_dir().to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_writes_a_loadable_workspace_and_refuses_to_clobber() {
        let d = tempfile::tempdir().unwrap();
        let files = init(d.path(), false).unwrap();
        assert!(files.iter().any(|f| f.ends_with("docket.toml")));
        let cfg = crate::config::LoadedConfig::load(&d.path().join("docket.toml")).unwrap();
        assert_eq!(cfg.config.stages[0].name, "adjudicate");
        let text = std::fs::read_to_string(d.path().join(SAMPLE_ITEMS)).unwrap();
        assert_eq!(text.lines().count(), SAMPLE_COUNT);
        assert!(matches!(
            init(d.path(), false),
            Err(WorkspaceError::Exists(_))
        ));
        assert!(init(d.path(), true).is_ok());
    }

    /// `--provider`: every scaffold loads with the provider's kind, model
    /// and key variable, and without the mock's settings.
    #[test]
    fn init_for_a_real_provider_writes_a_loadable_job_without_the_mock() {
        use crate::config::ProviderKind;
        for example in [None, Some(Example::Critic), Some(Example::JudgeGym)] {
            for p in [
                RealProvider::Openai,
                RealProvider::Anthropic,
                RealProvider::Gemini,
                RealProvider::Openrouter,
                RealProvider::Ollama,
            ] {
                let d = tempfile::tempdir().unwrap();
                init_for(d.path(), false, example, Some(p)).unwrap();
                let toml = d.path().join("docket.toml");
                let text = std::fs::read_to_string(&toml).unwrap();
                assert!(!text.contains(".mock]"), "{p:?} {example:?}:\n{text}");
                let cfg = crate::config::LoadedConfig::load(&toml)
                    .unwrap_or_else(|e| panic!("{p:?} {example:?}: {e}\n{text}"));
                let main = &cfg.config.providers["main"];
                assert_ne!(main.kind, ProviderKind::Mock, "{p:?}");
                assert_eq!(main.kind.as_str(), p.kind());
                assert_eq!(main.model, p.model());
                assert_eq!(main.api_key_env.as_deref(), p.key_env(), "{p:?}");
            }
        }
    }
}
