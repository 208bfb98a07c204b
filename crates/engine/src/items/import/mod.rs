//! `docket import FILE`: stream JSONL or CSV rows into the `decision` table.
//!
//! One row becomes one undecided item: the id field is the item id, every other
//! field is kept as the item's evidence (a JSON object). Import is idempotent by
//! item id: an id already in the ledger (or seen earlier in the same file) is
//! left untouched and counted as already present.
//!
//! The whole file is imported in one write transaction of the ledger
//! ([`docket_ledger::import::Import`]), reading line by line through a
//! `BufReader`, so a million items import in a few seconds with flat memory.

mod check;
mod checking;
mod csv_rows;
mod jsonl;
mod report;
mod sink;

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

pub use check::{TemplateCheck, TemplateCheckError};
use checking::{Checking, Findings};
use csv_rows::import_csv;
use docket_ledger::LedgerError;
use docket_ledger::import::{Import, ItemBatch, Replaced};
use jsonl::import_jsonl;
use report::plural;
pub use report::render_import_report;
use sink::Sink;

/// At most this many bad rows are kept with their details; all are counted.
pub const MAX_BAD_ROW_DETAILS: usize = 1000;

/// The longest item id accepted, in characters.
pub const MAX_ID_CHARS: usize = 256;

/// How many bad rows `render_import_report` lists before summarising the rest.
const RENDERED_BAD_ROWS: usize = 20;

/// How many rows whose content differs from the ledger's are named.
pub const MAX_DIFFERING_DETAILS: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImportFormat {
    Jsonl,
    Csv,
}

impl fmt::Display for ImportFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ImportFormat::Jsonl => "jsonl",
            ImportFormat::Csv => "csv",
        })
    }
}

#[derive(Debug, Clone)]
pub struct ImportOptions {
    /// The field (JSONL) or header column (CSV) holding the item id.
    pub id_field: String,
    /// `None`: decided by the file extension.
    pub format: Option<ImportFormat>,
    /// Import nothing if any row is bad.
    pub strict: bool,
    /// Replace the evidence of ids the ledger has with other evidence
    /// (`--update`), marking what was made on the old one stale.
    pub update: bool,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            id_field: "id".to_string(),
            format: None,
            strict: false,
            update: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    /// 1-based physical line number in the file (for CSV: where the record starts).
    pub line: u64,
    pub reason: String,
}

/// A new row whose prompt cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnrenderableRow {
    pub line: u64,
    pub item_id: String,
    /// `FILE:LINE: undefined variable "..."` (with the stage, when not the first).
    pub reason: String,
}

#[derive(Debug, Clone)]
pub struct ImportReport {
    pub file: PathBuf,
    /// Non-blank rows read (good and bad; the CSV header is not a row).
    pub rows_read: u64,
    /// New items written to the ledger.
    pub imported: u64,
    /// Rows whose id was already in the ledger or earlier in the file.
    pub already_present: u64,
    /// Of `already_present`, the rows whose id the ledger had before this
    /// import with other evidence: the ledger keeps its own (row I4).
    pub differing: u64,
    /// The first `MAX_DIFFERING_DETAILS` of them: (line, item id).
    pub differing_rows: Vec<(u64, String)>,
    /// `--update`: the `differing` items had their evidence replaced.
    pub updated: bool,
    /// What replacing them marked stale (all zero without `--update`).
    pub stale: Replaced,
    /// The first `MAX_BAD_ROW_DETAILS` bad rows, in file order.
    pub bad_rows: Vec<BadRow>,
    /// Every bad row, including those beyond `bad_rows`.
    pub bad_count: u64,
    /// New rows whose prompt the job's templates cannot render, imported
    /// all the same (a run fails them alone): the first
    /// `MAX_BAD_ROW_DETAILS`, in file order.
    pub unrenderable: Vec<UnrenderableRow>,
    /// Every such row.
    pub unrenderable_count: u64,
    /// False when strict mode rolled the import back (then `imported` and
    /// `already_present` are 0: nothing was written).
    pub committed: bool,
}

impl ImportReport {
    fn new(file: &Path) -> Self {
        ImportReport {
            file: file.to_path_buf(),
            rows_read: 0,
            imported: 0,
            already_present: 0,
            differing: 0,
            differing_rows: Vec::new(),
            updated: false,
            stale: Replaced::default(),
            bad_rows: Vec::new(),
            bad_count: 0,
            unrenderable: Vec::new(),
            unrenderable_count: 0,
            committed: true,
        }
    }

    /// The template check's findings: rows imported all the same, or in
    /// strict mode bad rows, merged with the others in file order.
    fn unrenderable_found(&mut self, found: Findings, strict: bool) {
        if !strict {
            self.unrenderable_count = found.count;
            self.unrenderable = found.first;
            return;
        }
        self.bad_count += found.count;
        self.bad_rows
            .extend(found.first.into_iter().map(|row| BadRow {
                line: row.line,
                reason: format!(
                    "item {:?}: its prompt cannot be rendered: {}",
                    docket_model::sanitize::for_terminal(&row.item_id),
                    row.reason
                ),
            }));
        // Each side kept its first rows: the first of both are among them.
        self.bad_rows.sort_by_key(|b| b.line);
        self.bad_rows.truncate(MAX_BAD_ROW_DETAILS);
    }

    fn bad(&mut self, line: u64, reason: String) {
        self.bad_count += 1;
        if self.bad_rows.len() < MAX_BAD_ROW_DETAILS {
            self.bad_rows.push(BadRow { line, reason });
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("cannot open {}: {source}", file.display())]
    Open {
        file: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}:{line}: read error: {source}", file.display())]
    Read {
        file: PathBuf,
        line: u64,
        #[source]
        source: io::Error,
    },
    #[error(
        "{}: cannot tell the format from the file name; use a .jsonl, .ndjson, .json or .csv file, or pass --format jsonl|csv",
        file.display()
    )]
    UnknownFormat { file: PathBuf },
    #[error("{}: empty CSV file; expected a header line naming the columns", file.display())]
    EmptyCsv { file: PathBuf },
    #[error("{}:{line}: CSV header is not valid UTF-8", file.display())]
    HeaderNotUtf8 { file: PathBuf, line: u64 },
    #[error(
        "{}:{line}: CSV header has no id column {column:?} (columns: {header}); pass --id-field to name the id column{hint}",
        file.display()
    )]
    MissingIdColumn {
        file: PathBuf,
        line: u64,
        column: String,
        header: String,
        /// A word on the delimiter when the header looks like another one's.
        hint: String,
    },
    #[error("{}:{line}: CSV header names column {column:?} twice", file.display())]
    DuplicateColumn {
        file: PathBuf,
        line: u64,
        column: String,
    },
    #[error("{}: the id field name is empty", file.display())]
    EmptyIdField { file: PathBuf },
    #[error("{}: writing to the ledger failed: {source}", file.display())]
    Ledger {
        file: PathBuf,
        #[source]
        source: LedgerError,
    },
    #[error(
        "{}: {bad_count} bad {} in strict mode, so nothing was imported; first: line {first_line}: {first_reason}",
        file.display(),
        plural(*bad_count, "row", "rows")
    )]
    StrictRejected {
        file: PathBuf,
        bad_count: u64,
        first_line: u64,
        first_reason: String,
        /// The full report (with `committed == false`), for listing the bad rows.
        report: Box<ImportReport>,
    },
}

/// Import `path` into `ledger`. See the module docs.
///
/// Row-level problems are reported in `ImportReport::bad_rows` and the row is
/// skipped; with `opts.strict` any bad row rolls everything back and returns
/// `ImportError::StrictRejected` (which carries the report).
pub fn import_file(
    ledger: &mut dyn Import,
    path: &Path,
    opts: &ImportOptions,
) -> Result<ImportReport, ImportError> {
    import_file_checked(ledger, path, opts, None)
}

/// `import_file`, with each new row checked against the job's templates:
/// one that cannot be rendered is listed in the report (and, with
/// `opts.strict`, is a bad row: nothing is imported).
pub fn import_file_checked(
    ledger: &mut dyn Import,
    path: &Path,
    opts: &ImportOptions,
    check: Option<&TemplateCheck>,
) -> Result<ImportReport, ImportError> {
    let format = match opts.format {
        Some(f) => f,
        None => format_from_extension(path).ok_or_else(|| ImportError::UnknownFormat {
            file: path.to_path_buf(),
        })?,
    };
    if opts.id_field.is_empty() {
        return Err(ImportError::EmptyIdField {
            file: path.to_path_buf(),
        });
    }
    let file = File::open(path).map_err(|source| ImportError::Open {
        file: path.to_path_buf(),
        source,
    })?;
    if let Ok(meta) = file.metadata()
        && meta.is_dir()
    {
        return Err(ImportError::Open {
            file: path.to_path_buf(),
            source: io::Error::other("is a directory"),
        });
    }
    let reader = BufReader::with_capacity(256 * 1024, file);
    let source_file = std::fs::canonicalize(path)
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| path.display().to_string());

    let ledger_err = |source| ImportError::Ledger {
        file: path.to_path_buf(),
        source,
    };
    let mut batch = ledger.begin_import(&source_file).map_err(ledger_err)?;
    let mut report = ImportReport::new(path);
    report.updated = opts.update;
    // The rows are read and written here while the template check runs
    // beside (`checking`); its findings join the report before the commit.
    let findings = std::thread::scope(|scope| {
        let mut checking = check.map(|c| Checking::start(scope, c));
        let mut sink = Sink {
            batch: &mut *batch,
            checking: checking.as_mut(),
            update: opts.update,
        };
        match format {
            ImportFormat::Jsonl => {
                import_jsonl(reader, path, &opts.id_field, &mut sink, &mut report)?
            }
            ImportFormat::Csv => import_csv(reader, path, &opts.id_field, &mut sink, &mut report)?,
        }
        Ok::<_, ImportError>(checking.map(Checking::finish))
    })?;
    if let Some(found) = findings {
        report.unrenderable_found(found, opts.strict);
    }
    if opts.strict && report.bad_count > 0 {
        batch.rollback().map_err(ledger_err)?;
        return Err(strict_rejection(path, report));
    }
    batch.commit().map_err(ledger_err)?;
    tracing::info!(
        file = %path.display(),
        rows_read = report.rows_read,
        imported = report.imported,
        already_present = report.already_present,
        differing = report.differing,
        bad = report.bad_count,
        "import finished"
    );
    Ok(report)
}

/// Strict mode met a bad row: the import was rolled back, and the report
/// says so.
fn strict_rejection(path: &Path, mut report: ImportReport) -> ImportError {
    report.imported = 0;
    report.already_present = 0;
    report.differing = 0;
    report.differing_rows.clear();
    report.stale = Replaced::default();
    report.unrenderable.clear();
    report.unrenderable_count = 0;
    report.committed = false;
    let (first_line, first_reason) = report
        .bad_rows
        .first()
        .map(|b| (b.line, b.reason.clone()))
        .unwrap_or((0, String::new()));
    ImportError::StrictRejected {
        file: path.to_path_buf(),
        bad_count: report.bad_count,
        first_line,
        first_reason,
        report: Box::new(report),
    }
}

fn format_from_extension(path: &Path) -> Option<ImportFormat> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "jsonl" | "ndjson" | "json" => Some(ImportFormat::Jsonl),
        "csv" => Some(ImportFormat::Csv),
        _ => None,
    }
}

/// Read items from `reader` into `batch` as `import_file` does, without a
/// file or a ledger (the fuzz targets use it: `crate::fuzzing`).
pub fn import_from<R: Read>(
    reader: R,
    format: ImportFormat,
    batch: &mut dyn ItemBatch,
) -> Result<ImportReport, ImportError> {
    let path = Path::new("input");
    let reader = BufReader::new(reader);
    let mut report = ImportReport::new(path);
    let mut sink = Sink {
        batch,
        checking: None,
        update: false,
    };
    match format {
        ImportFormat::Jsonl => import_jsonl(reader, path, "id", &mut sink, &mut report)?,
        ImportFormat::Csv => import_csv(reader, path, "id", &mut sink, &mut report)?,
    }
    Ok(report)
}

/// Checks shared by both formats. `Err` is the bad-row reason.
fn check_id(id: &str, id_field: &str) -> Result<(), String> {
    if id.trim().is_empty() {
        return Err(format!("id field {id_field:?} is empty"));
    }
    let chars = id.chars().count();
    if chars > MAX_ID_CHARS {
        return Err(format!(
            "id field {id_field:?} is {chars} characters long (at most {MAX_ID_CHARS} allowed)"
        ));
    }
    if let Some(c) = id.chars().find(|c| c.is_control()) {
        return Err(format!(
            "id field {id_field:?} contains a control character (U+{:04X})",
            c as u32
        ));
    }
    Ok(())
}

fn is_blank(bytes: &[u8]) -> bool {
    bytes.iter().all(|b| b.is_ascii_whitespace())
}

fn strip_line_end(buf: &[u8]) -> &[u8] {
    let mut end = buf.len();
    if end > 0 && buf[end - 1] == b'\n' {
        end -= 1;
        if end > 0 && buf[end - 1] == b'\r' {
            end -= 1;
        }
    }
    &buf[..end]
}

const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";

/// The most one item (a JSONL line, a CSV record) may hold: 8 MiB, about
/// two million tokens, past the largest context window. A larger one is a
/// bad row, read past without being held: a 50 MB field once took the
/// whole process to 3 GB (parsing, the ledger's search index, tokenizing).
pub const MAX_ITEM_BYTES: usize = 8 << 20;

fn too_large(bytes: u64) -> String {
    format!(
        "the row is {:.1} MB, over the {} MB limit for one item",
        bytes as f64 / (1 << 20) as f64,
        MAX_ITEM_BYTES >> 20
    )
}

/// `read_until(b'\n')` that keeps at most `cap` bytes of the line in `buf`
/// and reads the rest of it past. Returns the line's whole length (0 at the
/// end of the input).
fn read_line_capped<R: BufRead>(reader: &mut R, buf: &mut Vec<u8>, cap: usize) -> io::Result<u64> {
    let mut total: u64 = 0;
    loop {
        let available = match reader.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if available.is_empty() {
            return Ok(total);
        }
        let (piece, done) = match memchr_newline(available) {
            Some(i) => (&available[..=i], true),
            None => (available, false),
        };
        let room = cap.saturating_sub(buf.len());
        buf.extend_from_slice(&piece[..piece.len().min(room)]);
        let used = piece.len();
        total += used as u64;
        reader.consume(used);
        if done {
            return Ok(total);
        }
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|c| *c == b'\n')
}
