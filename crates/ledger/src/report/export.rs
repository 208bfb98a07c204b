//! `docket export [--session ID] [--what decisions|results|requests|items|attempts]
//! [--format csv|jsonl|parquet] [--output FILE]`.
//!
//! Stable snake_case columns in a fixed order (the `*_COLUMNS` constants; for
//! `items`, derived from the job's stages and gates), one row per record,
//! streamed. CSV has one header row and no index column; JSONL has one
//! object per line with the same keys in the same order; Parquet has the
//! same columns with the same types. Nothing that could hold a key (config
//! snapshots) is ever exported.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::ReportError;
use super::attempts::{ATTEMPT_COLUMNS, ATTEMPT_KINDS};
use super::columns::{Cell, Kind, RecordWriter};
use super::items::ItemTable;
use super::parquet::ParquetWriter;
use super::results::{RESULT_COLUMNS, RESULT_KINDS};
use crate::Ledger;
use crate::report::reads::Reports;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportWhat {
    #[default]
    Decisions,
    Results,
    Requests,
    /// One row per item of a session, every stage's output flattened.
    Items,
    /// One row per attempt (send), with the provider's raw answer.
    Attempts,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExportFormat {
    #[default]
    Csv,
    Jsonl,
    /// Needs a file ([`export_file`]); never a terminal or a pipe.
    Parquet,
}

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Only the records of this session: for decisions, the session's items;
    /// for results, its results; for requests, the requests it sent or set out to send.
    pub session: Option<String>,
    pub what: ExportWhat,
    pub format: ExportFormat,
}

/// `export --what decisions`, in order.
pub const DECISION_COLUMNS: &[&str] = &[
    "item_id",
    "state",
    "evidence_json",
    "decided_answer_json",
    "decided_by",
    "decided_at",
    "confidence",
    "model_id",
    "adjudication_id",
    "last_outcome",
    "last_session_id",
    "review_status",
    "review_audit",
    // When a reviewer corrected the suggestion (decided_answer_json is then
    // their answer): the fields they changed, comma-separated, and the
    // model's suggestion it replaced.
    "corrected_fields",
    "suggested_answer_json",
    // The hash of the evidence as it is now, and whether the newest
    // result was made on evidence `docket import --update` replaced since.
    "evidence_hash",
    "stale",
];

const DECISION_KINDS: &[Kind] = &[
    Kind::Text,
    Kind::Text,
    Kind::Json,
    Kind::Json,
    Kind::Text,
    Kind::Ts,
    Kind::Float,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    // The newest review item came from the audit sample.
    Kind::Bool,
    Kind::Text,
    Kind::Json,
    Kind::Text,
    Kind::Bool,
];

/// `export --what requests`, in order. `session_id`, `position` (the
/// stage's place in the job) and `state` (pending|passed|failed|skipped) are
/// the request's row in the session's pipeline: the exported session's, or
/// without `--session` the newest session that ran it.
pub const REQUEST_COLUMNS: &[&str] = &[
    "request_id",
    "session_id",
    "item_id",
    "stage",
    "position",
    "state",
    "provider",
    "model",
    "request_version",
    "status",
    "attempt",
    "transport_retries",
    "gate_failures",
    "last_error",
    "template_hash",
    "params_hash",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "ambiguous_attempts",
    "last_client_request_id",
    "last_provider_request_id",
    // The hash of the evidence the request was made on (migration 13).
    "evidence_hash",
];

const REQUEST_KINDS: &[Kind] = &[
    Kind::Int,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Int,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Int,
    Kind::Text,
    Kind::Int,
    Kind::Int,
    Kind::Int,
    Kind::Text,
    Kind::Text,
    Kind::Text,
    Kind::Int,
    Kind::Int,
    Kind::Float,
    Kind::Int,
    Kind::Text,
    Kind::Text,
    Kind::Text,
];

const _: () = assert!(DECISION_COLUMNS.len() == DECISION_KINDS.len());
const _: () = assert!(REQUEST_COLUMNS.len() == REQUEST_KINDS.len());

/// What to export, as columns and where the rows come from.
struct Plan {
    columns: Vec<String>,
    kinds: Vec<Kind>,
    source: Source,
}

/// Which ledger read gives the rows.
enum Source {
    Decisions,
    Results,
    Requests,
    Attempts,
    Items(ItemTable),
}

fn plan(ledger: &dyn Reports, opts: &ExportOptions, workspace: &Path) -> Result<Plan, ReportError> {
    if let Some(session) = &opts.session
        && !ledger.session_exists(session)?
    {
        return Err(ReportError::UnknownSession(session.clone()));
    }
    let fixed = |columns: &[&str], kinds: &[Kind], source: Source| Plan {
        columns: columns.iter().map(|c| c.to_string()).collect(),
        kinds: kinds.to_vec(),
        source,
    };
    Ok(match opts.what {
        ExportWhat::Decisions => fixed(DECISION_COLUMNS, DECISION_KINDS, Source::Decisions),
        ExportWhat::Results => fixed(RESULT_COLUMNS, RESULT_KINDS, Source::Results),
        ExportWhat::Requests => fixed(REQUEST_COLUMNS, REQUEST_KINDS, Source::Requests),
        ExportWhat::Attempts => fixed(ATTEMPT_COLUMNS, ATTEMPT_KINDS, Source::Attempts),
        ExportWhat::Items => {
            let Some(session) = &opts.session else {
                return Err(ReportError::ItemsNeedSession);
            };
            let table = ItemTable::load(ledger, session, workspace)?;
            Plan {
                columns: table.columns.clone(),
                kinds: table.kinds.clone(),
                source: Source::Items(table),
            }
        }
    })
}

impl Plan {
    fn stream(
        &self,
        ledger: &dyn Reports,
        session: Option<&str>,
        each: &mut dyn FnMut(&[Cell]) -> Result<(), ReportError>,
    ) -> Result<u64, ReportError> {
        match (&self.source, session) {
            (Source::Decisions, s) => ledger.for_each_decision(s, &self.kinds, each),
            (Source::Results, s) => ledger.for_each_result(s, &self.kinds, each),
            (Source::Requests, s) => ledger.for_each_request(s, &self.kinds, each),
            (Source::Attempts, s) => ledger.for_each_attempt(s, &self.kinds, each),
            (Source::Items(t), Some(s)) => t.stream(ledger, s, each),
            (Source::Items(_), None) => Err(ReportError::ItemsNeedSession),
        }
    }
}

/// The folder schema files are read from when none is given: the ledger's.
fn ledger_folder(ledger: &Ledger) -> PathBuf {
    ledger
        .location()
        .file()
        .and_then(Path::parent)
        .filter(|p| !p.as_os_str().is_empty())
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Stream the chosen records to `out` as CSV or JSONL; returns how many were
/// written. `--what items` reads gate schema files relative to the ledger's
/// folder (the workspace); see [`export_in`] to name another. Parquet needs
/// a file: [`export_file`] or [`export_parquet`].
pub fn export(
    ledger: &Ledger,
    opts: &ExportOptions,
    out: &mut dyn Write,
) -> Result<u64, ReportError> {
    export_in(ledger, opts, &ledger_folder(ledger), out)
}

/// [`export`], with gate schema files read relative to `workspace`.
pub fn export_in(
    ledger: &dyn Reports,
    opts: &ExportOptions,
    workspace: &Path,
    out: &mut dyn Write,
) -> Result<u64, ReportError> {
    if opts.format == ExportFormat::Parquet {
        return Err(ReportError::ParquetNeedsFile);
    }
    let plan = plan(ledger, opts, workspace)?;
    let keys: Vec<&str> = plan.columns.iter().map(String::as_str).collect();
    let mut w = match opts.format {
        ExportFormat::Jsonl => RecordWriter::jsonl(out, &keys),
        _ => RecordWriter::csv(out, &keys)?,
    };
    let rows = plan.stream(ledger, opts.session.as_deref(), &mut |c| {
        docket_model::failpoint::hit("mid_export");
        w.write(c)
    })?;
    w.finish()?;
    Ok(rows)
}

/// The chosen records as Parquet, written to `out` (a file, usually).
pub fn export_parquet<W: Write + Send>(
    ledger: &dyn Reports,
    opts: &ExportOptions,
    workspace: &Path,
    out: W,
) -> Result<u64, ReportError> {
    let plan = plan(ledger, opts, workspace)?;
    let keys: Vec<&str> = plan.columns.iter().map(String::as_str).collect();
    let mut w = ParquetWriter::new(out, &keys, &plan.kinds)?;
    let rows = plan.stream(ledger, opts.session.as_deref(), &mut |c| {
        docket_model::failpoint::hit("mid_export");
        w.write(c)
    })?;
    w.finish()?;
    Ok(rows)
}

/// Write the chosen records to the file `path` in `opts.format` (any of the
/// three); returns how many rows were written.
pub fn export_file(
    ledger: &dyn Reports,
    opts: &ExportOptions,
    workspace: &Path,
    path: &Path,
) -> Result<u64, ReportError> {
    refuse_the_ledger(workspace, path)?;
    // Plan first, so an unknown session leaves no empty file behind.
    plan(ledger, opts, workspace)?;
    // Written beside the target and renamed over it once whole: a crash or
    // an error mid-export never leaves a file that looks complete (nor
    // spoils an earlier export of the same name). Not for a FIFO, a device
    // or a symlink (`--out /dev/stdout`): those are written in place.
    let in_place = std::fs::symlink_metadata(path).is_ok_and(|m| !m.file_type().is_file());
    if in_place {
        return write_file(ledger, opts, workspace, path, false);
    }
    let partial = partial_path(path);
    let kept_mode = std::fs::metadata(path).ok().map(|m| m.permissions());
    let written = write_file(ledger, opts, workspace, &partial, true).and_then(|n| {
        // An export written over keeps the mode it had (a shared report
        // stays readable to those it was shared with).
        if let Some(mode) = &kept_mode {
            std::fs::set_permissions(&partial, mode.clone())?;
        }
        std::fs::rename(&partial, path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(n)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    written
}

/// An export over the workspace's SQLite ledger (or its `-wal`, `-shm`)
/// would destroy it (fault-matrix row D4): refused before anything is
/// written. Paths are compared as they resolve (a symlink, `./`).
pub(super) fn refuse_the_ledger(workspace: &Path, path: &Path) -> Result<(), ReportError> {
    let Ok(crate::location::LedgerLocation::File(ledger)) =
        crate::location::LedgerLocation::for_workspace(workspace)
    else {
        return Ok(());
    };
    let Some(out) = resolved(path) else {
        return Ok(());
    };
    // SQLite keeps `-wal` and `-shm` beside the file the ledger's name
    // leads to: both the name and where it leads are compared.
    let ledger_real = resolved(&ledger);
    for base in [Some(ledger.clone()), ledger_real].into_iter().flatten() {
        for suffix in ["", "-wal", "-shm"] {
            let mut name = base.as_os_str().to_owned();
            name.push(suffix);
            if resolved(Path::new(&name)).is_some_and(|l| l == out) {
                return Err(ReportError::OutputIsTheLedger(path.display().to_string()));
            }
        }
    }
    Ok(())
}

/// Where `p` leads: its symlinks followed (a dangling one too, to the
/// path it names), then made absolute through its existing folder.
fn resolved(p: &Path) -> Option<std::path::PathBuf> {
    let mut cur = p.to_path_buf();
    for _ in 0..16 {
        match std::fs::read_link(&cur) {
            Ok(target) if target.is_absolute() => cur = target,
            Ok(target) => cur = cur.parent().unwrap_or(Path::new(".")).join(target),
            Err(_) => break,
        }
    }
    if let Ok(c) = cur.canonicalize() {
        return Some(c);
    }
    let dir = match cur.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.canonicalize().ok()?,
        _ => std::env::current_dir().ok()?,
    };
    Some(dir.join(cur.file_name()?))
}

/// `.NAME.partial-PID` beside `path`.
pub(super) fn partial_path(path: &Path) -> std::path::PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "export".into());
    path.with_file_name(format!(".{name}.partial-{}", std::process::id()))
}

/// Write the export to `path`; `fresh`: a new file only (a partial file's
/// name is never one a link planted there could redirect).
fn write_file(
    ledger: &dyn Reports,
    opts: &ExportOptions,
    workspace: &Path,
    path: &Path,
    fresh: bool,
) -> Result<u64, ReportError> {
    // not a ledger file: `export_file` refused the ledger's paths first.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(!fresh)
        .create_new(fresh)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let n = if opts.format == ExportFormat::Parquet {
        export_parquet(ledger, opts, workspace, &file)?
    } else {
        let mut w = io::BufWriter::new(&file);
        let n = export_in(ledger, opts, workspace, &mut w)?;
        w.flush()?;
        n
    };
    // On disk before it is renamed into place. A FIFO or a terminal cannot
    // be synced; a file can.
    if file.metadata().is_ok_and(|m| m.is_file()) {
        file.sync_all()?;
    }
    Ok(n)
}
