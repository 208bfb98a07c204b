//! `docket items`: what it does to the workspace's items.

use std::path::PathBuf;

use clap::{Args, Subcommand};

#[derive(Debug, Subcommand)]
pub enum ItemsAction {
    /// Remove items nothing was sent for yet: by id, from a file of ids, by
    /// a field their evidence lacks, or because the job's templates cannot
    /// render their prompt.
    ///
    /// An item that ended in error without a request (its prompt could not
    /// be rendered) is taken out of the sessions that ran it too, their
    /// counts with it. An item anything was sent for, or that was reviewed
    /// or decided, is kept and named with its session (that is its
    /// history). Each removed id is printed; the exit code is 2 when an id
    /// is unknown or an item is kept. Items are matched in docket, not by
    /// SQL: --missing walks a dotted path into each undecided item's fields.
    #[command(after_help = "Examples:
  docket items rm ok-1 ok-7                remove two items by id
  docket items rm --unrenderable --dry-run list the items the templates cannot render
  docket items rm --missing title          remove undecided items without a title
  docket items rm --missing meta.year      ... without meta.year (a nested field)
  docket items rm --ids-from bad-ids.txt   remove the ids in a file (one a line)")]
    Rm(ItemsRmArgs),
}

#[derive(Debug, Args, Clone)]
pub struct ItemsRmArgs {
    /// Item ids to remove.
    pub ids: Vec<String>,
    /// Also the ids in this file, one a line (blank lines and lines
    /// starting with # are skipped).
    #[arg(long, value_name = "FILE")]
    pub ids_from: Option<PathBuf>,
    /// Also every undecided item whose evidence lacks this field (or holds
    /// null there): a dotted path into the item's fields, such as `title`
    /// or `meta.year`.
    #[arg(long, value_name = "FIELD")]
    pub missing: Option<String>,
    /// Also every undecided item whose prompt the job's templates
    /// (docket.toml) cannot render.
    #[arg(long)]
    pub unrenderable: bool,
    /// Say what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}
