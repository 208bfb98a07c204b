//! `--workspace` and `--ledger` are global (every command that reads a
//! workspace takes them after its name), but `mock-provider`,
//! `completions` and `man` read none: they take these hidden copies, which
//! keep the global ones out of their `--help` (clap propagates a global
//! option only to a command without one of that name). Given there, they
//! are accepted and mean nothing, as before.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Args, Clone, Default)]
pub struct NoWorkspace {
    #[arg(long, hide = true, value_name = "DIR")]
    workspace: Option<PathBuf>,
    #[arg(long, hide = true, value_name = "URL")]
    ledger: Option<String>,
}
