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

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use serde_json::{Map, Value};

use docket_ledger::LedgerError;
use docket_ledger::import::{Added, Import, ItemBatch};

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
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            id_field: "id".to_string(),
            format: None,
            strict: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRow {
    /// 1-based physical line number in the file (for CSV: where the record starts).
    pub line: u64,
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
    /// The first `MAX_BAD_ROW_DETAILS` bad rows, in file order.
    pub bad_rows: Vec<BadRow>,
    /// Every bad row, including those beyond `bad_rows`.
    pub bad_count: u64,
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
            bad_rows: Vec::new(),
            bad_count: 0,
            committed: true,
        }
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
    let mut sink = Sink { batch: &mut *batch };
    match format {
        ImportFormat::Jsonl => import_jsonl(reader, path, &opts.id_field, &mut sink, &mut report)?,
        ImportFormat::Csv => import_csv(reader, path, &opts.id_field, &mut sink, &mut report)?,
    }
    if opts.strict && report.bad_count > 0 {
        batch.rollback().map_err(ledger_err)?;
        report.imported = 0;
        report.already_present = 0;
        report.differing = 0;
        report.differing_rows.clear();
        report.committed = false;
        let (first_line, first_reason) = report
            .bad_rows
            .first()
            .map(|b| (b.line, b.reason.clone()))
            .unwrap_or((0, String::new()));
        return Err(ImportError::StrictRejected {
            file: path.to_path_buf(),
            bad_count: report.bad_count,
            first_line,
            first_reason,
            report: Box::new(report),
        });
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

fn format_from_extension(path: &Path) -> Option<ImportFormat> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "jsonl" | "ndjson" | "json" => Some(ImportFormat::Jsonl),
        "csv" => Some(ImportFormat::Csv),
        _ => None,
    }
}

/// Where good rows go: the ledger's open import, counted in the report.
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
    let mut sink = Sink { batch };
    match format {
        ImportFormat::Jsonl => import_jsonl(reader, path, "id", &mut sink, &mut report)?,
        ImportFormat::Csv => import_csv(reader, path, "id", &mut sink, &mut report)?,
    }
    Ok(report)
}

struct Sink<'a, 'b> {
    batch: &'a mut (dyn ItemBatch + 'b),
}

impl Sink<'_, '_> {
    fn insert(
        &mut self,
        item_id: &str,
        evidence_json: &str,
        line: u64,
        report: &mut ImportReport,
    ) -> Result<(), LedgerError> {
        match self.batch.add(item_id, evidence_json, line)? {
            Added::New => report.imported += 1,
            Added::AlreadyPresent {
                same_evidence: true,
            } => report.already_present += 1,
            // An edited row of an item the ledger has: the ledger keeps
            // what it has (a session works on its items as imported), and
            // the report says so.
            Added::AlreadyPresent {
                same_evidence: false,
            } => {
                report.already_present += 1;
                report.differing += 1;
                if report.differing_rows.len() < MAX_DIFFERING_DETAILS {
                    report.differing_rows.push((line, item_id.to_string()));
                }
            }
            // The first line's item stands; this one is a mistake in the
            // file unless it says exactly the same.
            Added::EarlierLine {
                line: first,
                same_evidence: true,
            } => {
                report.already_present += 1;
                tracing::debug!(item_id, line, first, "a repeated line of the same item");
            }
            Added::EarlierLine {
                line: first,
                same_evidence: false,
            } => report.bad(
                line,
                format!(
                    "duplicate id {:?}: line {first} has the same id with other evidence (line {first} was imported; this line was not)",
                    docket_model::sanitize::for_terminal(item_id)
                ),
            ),
        }
        Ok(())
    }
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

fn import_jsonl<R: Read>(
    mut reader: BufReader<R>,
    path: &Path,
    id_field: &str,
    sink: &mut Sink<'_, '_>,
    report: &mut ImportReport,
) -> Result<(), ImportError> {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut line_no: u64 = 0;
    let mut evidence = String::with_capacity(4096);
    loop {
        buf.clear();
        // One byte over the limit, and its line end, tell a line too large.
        let n = read_line_capped(&mut reader, &mut buf, MAX_ITEM_BYTES + 2).map_err(|source| {
            ImportError::Read {
                file: path.to_path_buf(),
                line: line_no + 1,
                source,
            }
        })?;
        if n == 0 {
            break;
        }
        line_no += 1;
        if strip_line_end(&buf).len() > MAX_ITEM_BYTES {
            report.rows_read += 1;
            report.bad(line_no, too_large(n));
            buf = Vec::with_capacity(4096);
            continue;
        }
        let mut line = strip_line_end(&buf);
        if line_no == 1 && line.starts_with(UTF8_BOM) {
            line = &line[UTF8_BOM.len()..];
        }
        if is_blank(line) {
            continue;
        }
        report.rows_read += 1;
        match parse_jsonl_row(line, id_field, &mut evidence) {
            Ok(id) => sink
                .insert(&id, &evidence, line_no, report)
                .map_err(|source| ImportError::Ledger {
                    file: path.to_path_buf(),
                    source,
                })?,
            Err(reason) => report.bad(line_no, reason),
        }
        // Do not keep a huge buffer around after one huge line.
        if buf.capacity() > 1 << 20 {
            buf = Vec::with_capacity(4096);
        }
    }
    Ok(())
}

/// Parse one JSONL line; on success return the id and leave the evidence JSON
/// (the object without the id field) in `evidence`.
fn parse_jsonl_row(line: &[u8], id_field: &str, evidence: &mut String) -> Result<String, String> {
    let text = std::str::from_utf8(line).map_err(|e| {
        format!(
            "invalid UTF-8 at column {} (byte offset {})",
            e.valid_up_to() + 1,
            e.valid_up_to()
        )
    })?;
    let mut map: Map<String, Value> = match serde_json::from_str(text) {
        Ok(m) => m,
        Err(e) => return Err(json_error_reason(text, &e)),
    };
    let id = match map.remove(id_field) {
        None => return Err(format!("missing id field {id_field:?}")),
        Some(Value::String(s)) => s,
        Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.to_string(),
        Some(other) => {
            return Err(format!(
                "id field {id_field:?} must be a string or an integer, found {}",
                describe_json(&other)
            ));
        }
    };
    check_id(&id, id_field)?;
    evidence.clear();
    // Writing a Map of Values into a String cannot fail.
    let bytes = serde_json::to_vec(&map).map_err(|e| format!("cannot re-encode evidence: {e}"))?;
    match String::from_utf8(bytes) {
        Ok(s) => *evidence = s,
        Err(e) => return Err(format!("cannot re-encode evidence: {e}")),
    }
    Ok(id)
}

fn describe_json(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(_) => "a string".to_string(),
        Value::Array(_) => "an array".to_string(),
        Value::Object(_) => "an object".to_string(),
    }
}

/// A precise reason for a line that did not parse as a JSON object.
fn json_error_reason(text: &str, e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    match e.classify() {
        // Valid JSON of the wrong shape: say what it is.
        Category::Data => match serde_json::from_str::<Value>(text) {
            Ok(v) => format!("not a JSON object (found {})", describe_json(&v)),
            Err(e2) => format!("invalid JSON: {}", strip_position(&e2)),
        },
        Category::Eof | Category::Syntax | Category::Io => {
            format!("invalid JSON: {}", strip_position(e))
        }
    }
}

/// serde_json says "expected `,` or `}` at line 1 column 41"; a JSONL row is one
/// line, so keep the column only, and quote with plain quotes.
fn strip_position(e: &serde_json::Error) -> String {
    let full = e.to_string();
    let msg = match full.rfind(" at line ") {
        Some(i) => &full[..i],
        None => full.as_str(),
    };
    let msg = msg.replace('`', "'");
    if e.column() > 0 {
        format!("{msg} at column {}", e.column())
    } else {
        msg
    }
}

fn import_csv<R: Read>(
    reader: BufReader<R>,
    path: &Path,
    id_field: &str,
    sink: &mut Sink<'_, '_>,
    report: &mut ImportReport,
) -> Result<(), ImportError> {
    let starts = Rc::new(RefCell::new(VecDeque::new()));
    let tracked = LineTracker::new(reader, Rc::clone(&starts));
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .buffer_capacity(256 * 1024)
        .from_reader(tracked);
    // The physical line where a record starts. The csv crate's own positions
    // do not count the blank lines it skips, so the tracker finds them.
    let record_line = |pos: Option<&csv::Position>| -> u64 {
        let (byte, fallback) = pos.map(|p| (p.byte(), p.line())).unwrap_or((0, 0));
        let mut q = starts.borrow_mut();
        // Drop starts of records already behind the reader (none in practice).
        while q.front().is_some_and(|s: &RecordStart| s.byte < byte) {
            q.pop_front();
        }
        q.pop_front().map(|s| s.line).unwrap_or(fallback)
    };
    let read_err = |line: u64, source: io::Error| ImportError::Read {
        file: path.to_path_buf(),
        line,
        source,
    };

    // Header: the first record (the csv crate skips empty lines).
    let mut record = csv::ByteRecord::new();
    let header_line;
    loop {
        match rdr.read_byte_record(&mut record) {
            Ok(false) => {
                return Err(ImportError::EmptyCsv {
                    file: path.to_path_buf(),
                });
            }
            Ok(true) => {
                let line = record_line(record.position());
                if record.iter().all(is_blank) {
                    continue;
                }
                header_line = line;
                break;
            }
            Err(e) => return Err(read_err(1, csv_io_error(e))),
        }
    }
    let mut header: Vec<String> = Vec::with_capacity(record.len());
    for (i, field) in record.iter().enumerate() {
        let mut field = field;
        if i == 0 && field.starts_with(UTF8_BOM) {
            field = &field[UTF8_BOM.len()..];
        }
        let name = std::str::from_utf8(field).map_err(|_| ImportError::HeaderNotUtf8 {
            file: path.to_path_buf(),
            line: header_line,
        })?;
        let name = name.trim().to_string();
        if header.contains(&name) {
            return Err(ImportError::DuplicateColumn {
                file: path.to_path_buf(),
                line: header_line,
                column: name,
            });
        }
        header.push(name);
    }
    let Some(id_index) = header.iter().position(|h| h == id_field) else {
        return Err(ImportError::MissingIdColumn {
            file: path.to_path_buf(),
            line: header_line,
            column: id_field.to_string(),
            hint: delimiter_hint(&header),
            header: header.join(", "),
        });
    };

    let mut evidence = String::with_capacity(4096);
    let mut last_line = header_line;
    loop {
        match rdr.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = record_line(e.position());
                if matches!(e.kind(), csv::ErrorKind::Io(_)) {
                    return Err(read_err(line.max(last_line), csv_io_error(e)));
                }
                // Anything but an I/O error is about this record only.
                report.rows_read += 1;
                report.bad(line, format!("unreadable CSV row: {e}"));
                continue;
            }
        }
        let line = record_line(record.position());
        last_line = line;
        if record.iter().all(is_blank) {
            continue;
        }
        report.rows_read += 1;
        if record.as_slice().len() > MAX_ITEM_BYTES {
            report.bad(line, too_large(record.as_slice().len() as u64));
            // Do not keep a huge buffer around after one huge record.
            record = csv::ByteRecord::new();
            continue;
        }
        match csv_row(&record, &header, id_index, id_field, &mut evidence) {
            Ok(id) => {
                sink.insert(id, &evidence, line, report)
                    .map_err(|source| ImportError::Ledger {
                        file: path.to_path_buf(),
                        source,
                    })?
            }
            Err(reason) => report.bad(line, reason),
        }
    }
    Ok(())
}

fn csv_io_error(e: csv::Error) -> io::Error {
    match e.into_kind() {
        csv::ErrorKind::Io(source) => source,
        other => io::Error::other(format!("{other:?}")),
    }
}

/// Where a CSV record starts: byte offset and 1-based physical line.
#[derive(Debug, Clone, Copy)]
struct RecordStart {
    byte: u64,
    line: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CsvState {
    StartRecord,
    StartField,
    InField,
    InQuoted,
    QuoteInQuoted,
}

/// A reader that watches the bytes the csv parser reads and notes where each
/// record starts, following the parser's rules (default dialect: `,`, `"`
/// doubled to escape, `\r`, `\n` or `\r\n` ending a record, empty lines skipped).
struct LineTracker<R> {
    inner: R,
    starts: Rc<RefCell<VecDeque<RecordStart>>>,
    state: CsvState,
    byte: u64,
    line: u64,
}

impl<R: Read> LineTracker<R> {
    fn new(inner: R, starts: Rc<RefCell<VecDeque<RecordStart>>>) -> Self {
        LineTracker {
            inner,
            starts,
            state: CsvState::StartRecord,
            byte: 0,
            line: 1,
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        let mut starts = self.starts.borrow_mut();
        for &b in bytes {
            use CsvState::*;
            self.state = match (self.state, b) {
                (StartRecord, b'\n') => {
                    self.line += 1;
                    StartRecord
                }
                (StartRecord, b'\r') => StartRecord,
                (StartRecord, b) => {
                    starts.push_back(RecordStart {
                        byte: self.byte,
                        line: self.line,
                    });
                    Self::field_start(b, &mut self.line)
                }
                (StartField, b) => Self::field_start(b, &mut self.line),
                (QuoteInQuoted, b'"') => InQuoted,
                (InField | QuoteInQuoted, b) => Self::in_field(b, &mut self.line),
                (InQuoted, b'"') => QuoteInQuoted,
                (InQuoted, b) => {
                    if b == b'\n' {
                        self.line += 1;
                    }
                    InQuoted
                }
            };
            self.byte += 1;
        }
    }

    fn field_start(b: u8, line: &mut u64) -> CsvState {
        if b == b'"' {
            CsvState::InQuoted
        } else {
            Self::in_field(b, line)
        }
    }

    fn in_field(b: u8, line: &mut u64) -> CsvState {
        match b {
            b',' => CsvState::StartField,
            b'\n' => {
                *line += 1;
                CsvState::StartRecord
            }
            b'\r' => CsvState::StartRecord,
            _ => CsvState::InField,
        }
    }
}

impl<R: Read> Read for LineTracker<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.scan(&buf[..n]);
        Ok(n)
    }
}

/// Check one CSV record and build its evidence; returns the id.
fn csv_row<'r>(
    record: &'r csv::ByteRecord,
    header: &[String],
    id_index: usize,
    id_field: &str,
    evidence: &mut String,
) -> Result<&'r str, String> {
    if record.len() != header.len() {
        return Err(format!(
            "row has {} {}, header has {}",
            record.len(),
            plural(record.len() as u64, "field", "fields"),
            header.len()
        ));
    }
    let mut id = "";
    let mut map = Map::new();
    for (i, (name, field)) in header.iter().zip(record.iter()).enumerate() {
        let value = std::str::from_utf8(field).map_err(|e| {
            format!(
                "invalid UTF-8 in column {name:?} at byte {} of the field",
                e.valid_up_to()
            )
        })?;
        if i == id_index {
            id = value;
        } else {
            map.insert(name.clone(), Value::String(value.to_string()));
        }
    }
    check_id(id, id_field)?;
    evidence.clear();
    let bytes = serde_json::to_vec(&map).map_err(|e| format!("cannot encode evidence: {e}"))?;
    *evidence = String::from_utf8(bytes).map_err(|e| format!("cannot encode evidence: {e}"))?;
    Ok(id)
}

fn plural(n: u64, one: &'static str, many: &'static str) -> &'static str {
    if n == 1 { one } else { many }
}

/// 1234567 -> "1,234,567".
pub(crate) fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// What `docket import` prints: one summary line, then up to 20 bad rows.
pub fn render_import_report(report: &ImportReport, out: &mut dyn io::Write) -> io::Result<()> {
    // A file's name is the operator's, but may hold anything (row X4).
    let file = docket_model::sanitize::for_terminal(&report.file.display().to_string());
    let read = format!(
        "{} {} read",
        group_thousands(report.rows_read),
        plural(report.rows_read, "row", "rows")
    );
    if report.committed {
        let differing = if report.differing > 0 {
            format!(
                " ({} of them with different content: the ledger keeps what it has)",
                group_thousands(report.differing)
            )
        } else {
            String::new()
        };
        writeln!(
            out,
            "Imported {} new {} from {file} ({read}; {} already present{differing}; {} bad {} skipped)",
            group_thousands(report.imported),
            plural(report.imported, "item", "items"),
            group_thousands(report.already_present),
            group_thousands(report.bad_count),
            plural(report.bad_count, "row", "rows"),
        )?;
        for (line, id) in &report.differing_rows {
            writeln!(
                out,
                "  {file}:{line}: {} differs from the ledger's copy (kept as first imported)",
                printable(&format!("{:?}", docket_model::sanitize::for_terminal(id)))
            )?;
        }
        if report.differing > report.differing_rows.len() as u64 {
            writeln!(
                out,
                "  … and {} more with different content",
                group_thousands(report.differing - report.differing_rows.len() as u64)
            )?;
        }
    } else {
        writeln!(
            out,
            "Imported nothing from {file} ({read}; {} bad {}; strict mode rolls back on any bad row)",
            group_thousands(report.bad_count),
            plural(report.bad_count, "row", "rows"),
        )?;
    }
    for bad in report.bad_rows.iter().take(RENDERED_BAD_ROWS) {
        writeln!(out, "  {file}:{}: {}", bad.line, printable(&bad.reason))?;
    }
    let shown = report.bad_rows.len().min(RENDERED_BAD_ROWS) as u64;
    if report.bad_count > shown {
        writeln!(
            out,
            "  … and {} more",
            group_thousands(report.bad_count - shown)
        )?;
    }
    Ok(())
}

/// Reasons quote bits of the input; keep terminal escapes out of them.
fn printable(s: &str) -> String {
    s.chars()
        .filter_map(|c| match c {
            '\n' | '\t' | '\r' => Some(' '),
            c if c.is_control() => None,
            c => Some(c),
        })
        .collect()
}

/// A one-column header holding `;`, a tab or `|`: the file is most likely
/// delimited by that, where docket reads commas (row I2).
fn delimiter_hint(header: &[String]) -> String {
    let [only] = header else {
        return String::new();
    };
    [(';', "semicolons"), ('\t', "tabs"), ('|', "'|'")]
        .iter()
        .find(|(c, _)| only.contains(*c))
        .map(|(_, name)| {
            format!(
                ". The header looks delimited by {name}: docket reads comma-separated CSV (convert the file, or export it as JSONL)"
            )
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands() {
        assert_eq!(group_thousands(0), "0");
        assert_eq!(group_thousands(999), "999");
        assert_eq!(group_thousands(1000), "1,000");
        assert_eq!(group_thousands(1234567), "1,234,567");
    }

    #[test]
    fn csv_record_lines_count_skipped_blank_lines() {
        let data = "\n\nkey,name\nk1,\"a\nb\"\n\n\r\nk2,x\r\n\nk3,y\nk4,a\"b\nk5,\"x\"\"y\nz\"w\n\nk6,\"\"\n";
        let starts = Rc::new(RefCell::new(VecDeque::new()));
        let tracked = LineTracker::new(data.as_bytes(), Rc::clone(&starts));
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(tracked);
        let mut lines = Vec::new();
        let mut record = csv::ByteRecord::new();
        while rdr.read_byte_record(&mut record).unwrap() {
            let byte = record.position().unwrap().byte();
            let start = starts.borrow_mut().pop_front().unwrap();
            assert!(start.byte >= byte);
            lines.push((String::from_utf8_lossy(&record[0]).into_owned(), start.line));
        }
        let expect = [
            ("key", 3),
            ("k1", 4),
            ("k2", 8),
            ("k3", 10),
            ("k4", 11),
            ("k5", 12),
            ("k6", 15),
        ];
        let expect: Vec<(String, u64)> = expect.iter().map(|(k, l)| (k.to_string(), *l)).collect();
        assert_eq!(lines, expect);
    }

    #[test]
    fn json_reasons() {
        let mut ev = String::new();
        let r = parse_jsonl_row(br#"{"id": "a", "x": 1"#, "id", &mut ev).unwrap_err();
        assert!(r.starts_with("invalid JSON: "), "{r}");
        assert!(r.contains("column"), "{r}");
        let r = parse_jsonl_row(b"[1,2]", "id", &mut ev).unwrap_err();
        assert_eq!(r, "not a JSON object (found an array)");
        let r = parse_jsonl_row(br#"{"id": 1.5}"#, "id", &mut ev).unwrap_err();
        assert!(
            r.contains("must be a string or an integer, found number 1.5"),
            "{r}"
        );
        let id = parse_jsonl_row(br#"{"id": 7, "b": [1], "a": "x"}"#, "id", &mut ev).unwrap();
        assert_eq!(id, "7");
        let v: Value = serde_json::from_str(&ev).unwrap();
        assert_eq!(v, serde_json::json!({"a": "x", "b": [1]}));
    }
}
