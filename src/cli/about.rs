//! What `docket --help` and `docket --version` say beyond the commands:
//! the exit codes, the environment variables docket reads, where its
//! config, data and logs are, and the commit it was built from. The paths
//! depend on the user's environment, so the command is completed here at
//! run time, not in the derive attributes.

use clap::CommandFactory;

use super::{Cli, EXIT_CODES};

/// Every environment variable docket itself reads (the tests' and
/// benchmarks' own are left out), for `--help`.
pub const ENVIRONMENT: &str = "Environment:
  DOCKET_WORKSPACE   the workspace folder (as --workspace)
  DOCKET_LEDGER_URL  a PostgreSQL ledger, postgres://USER@HOST/DB (as --ledger)
  PGPASSWORD         its password; PGSSLMODE and PGSSLROOTCERT set its TLS as for libpq
  DOCKET_LOG         what the log file records: a level or filter (default warn;
                     e.g. debug, or docket_engine=debug)
  NO_COLOR           no colour in the console (as --no-color)
  DOCKET_CONFIG_DIR  where keymap.toml and console.toml are read (default: the
                     config dir `docket --version` prints)
  XDG_STATE_HOME     the logs go to $XDG_STATE_HOME/docket/logs (default ~/.local/state)
  A provider's key   the variable docket.toml's api_key_env names (e.g. OPENAI_API_KEY)
  Tuning (README):   DOCKET_BUSY_TIMEOUT_MS, DOCKET_MIN_FREE_MB, DOCKET_LEASE_SECS,
                     DOCKET_CLOCK_SKEW_SECS, DOCKET_UNREACHABLE_GIVE_UP_SECS,
                     DOCKET_GEMINI_INLINE_LIMIT_BYTES";

/// The commit docket was built from (`build.rs`; "unknown" outside a git checkout).
pub const GIT_COMMIT: &str = env!("DOCKET_GIT_COMMIT");

/// The top-level `--help` footer: exit codes, environment, the log files.
pub fn after_help() -> String {
    format!(
        "{EXIT_CODES}\n\n{ENVIRONMENT}\n\nLog files:\n  {}",
        docket::workspace::log_files_described()
    )
}

/// `docket --version`: the version, the commit, and docket's directories.
pub fn long_version() -> String {
    let shown = |p: Option<std::path::PathBuf>| {
        p.map_or_else(
            || "(none: no home directory)".to_string(),
            |p| p.display().to_string(),
        )
    };
    format!(
        "{}\ncommit: {GIT_COMMIT}\nconfig: {}\ndata:   {}\nlogs:   {}",
        env!("CARGO_PKG_VERSION"),
        shown(docket::workspace::config_dir()),
        shown(docket::workspace::data_dir()),
        docket::workspace::log_files_described(),
    )
}

/// The whole command line, as `docket` parses it and as the completions and
/// man pages describe it.
pub fn command() -> clap::Command {
    // clap keeps a version as a &'static str: this string lives as long as
    // the process, built once per run.
    let long_version: &'static str = Box::leak(long_version().into_boxed_str());
    Cli::command()
        .long_version(long_version)
        .after_help(after_help())
}
