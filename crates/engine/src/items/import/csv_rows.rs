//! CSV rows: a header names the fields, each record becomes an item; the
//! line each record starts on is tracked for the report (a quoted field
//! may span lines).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io::{self, BufReader, Read};
use std::path::Path;
use std::rc::Rc;

use docket_model::evidence::Evidence;
use serde_json::{Map, Value};

use super::{
    ImportError, ImportReport, MAX_ITEM_BYTES, Sink, UTF8_BOM, check_id, is_blank, plural,
    too_large,
};

pub(super) fn import_csv<R: Read>(
    reader: BufReader<R>,
    path: &Path,
    id_field: &str,
    sink: &mut Sink<'_, '_, '_>,
    report: &mut ImportReport,
) -> Result<(), ImportError> {
    let mut csv = Records::new(reader);
    let mut record = csv::ByteRecord::new();
    let header_line = csv.read_header(&mut record, path)?;
    let (header, id_index) = parse_header(&record, path, header_line, id_field)?;

    let mut evidence = Evidence::default();
    let mut last_line = header_line;
    loop {
        match csv.rdr.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let line = csv.record_line(e.position());
                if matches!(e.kind(), csv::ErrorKind::Io(_)) {
                    return Err(read_error(path, line.max(last_line), csv_io_error(e)));
                }
                // Anything but an I/O error is about this record only.
                report.rows_read += 1;
                report.bad(line, format!("unreadable CSV row: {e}"));
                continue;
            }
        }
        let line = csv.record_line(record.position());
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

/// The csv reader over the file, and where its records start.
struct Records<R: Read> {
    rdr: csv::Reader<LineTracker<BufReader<R>>>,
    starts: Rc<RefCell<VecDeque<RecordStart>>>,
}

impl<R: Read> Records<R> {
    fn new(reader: BufReader<R>) -> Self {
        let starts = Rc::new(RefCell::new(VecDeque::new()));
        let tracked = LineTracker::new(reader, Rc::clone(&starts));
        let rdr = csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .buffer_capacity(256 * 1024)
            .from_reader(tracked);
        Records { rdr, starts }
    }

    /// The physical line where a record starts. The csv crate's own positions
    /// do not count the blank lines it skips, so the tracker finds them.
    fn record_line(&self, pos: Option<&csv::Position>) -> u64 {
        let (byte, fallback) = pos.map(|p| (p.byte(), p.line())).unwrap_or((0, 0));
        let mut q = self.starts.borrow_mut();
        // Drop starts of records already behind the reader (none in practice).
        while q.front().is_some_and(|s: &RecordStart| s.byte < byte) {
            q.pop_front();
        }
        q.pop_front().map(|s| s.line).unwrap_or(fallback)
    }

    /// Header: the first record (the csv crate skips empty lines), read
    /// into `record`; the line it is on.
    fn read_header(
        &mut self,
        record: &mut csv::ByteRecord,
        path: &Path,
    ) -> Result<u64, ImportError> {
        loop {
            match self.rdr.read_byte_record(record) {
                Ok(false) => {
                    return Err(ImportError::EmptyCsv {
                        file: path.to_path_buf(),
                    });
                }
                Ok(true) => {
                    let line = self.record_line(record.position());
                    if record.iter().all(is_blank) {
                        continue;
                    }
                    return Ok(line);
                }
                Err(e) => return Err(read_error(path, 1, csv_io_error(e))),
            }
        }
    }
}

fn read_error(path: &Path, line: u64, source: io::Error) -> ImportError {
    ImportError::Read {
        file: path.to_path_buf(),
        line,
        source,
    }
}

/// The header's column names (trimmed, a byte-order mark dropped, none
/// twice) and the index of the id column.
fn parse_header(
    record: &csv::ByteRecord,
    path: &Path,
    header_line: u64,
    id_field: &str,
) -> Result<(Vec<String>, usize), ImportError> {
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
    Ok((header, id_index))
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
pub(super) struct LineTracker<R> {
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
    evidence: &mut Evidence,
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
    evidence
        .set_object(&map)
        .map_err(|e| format!("cannot encode evidence: {e}"))?;
    Ok(id)
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
}
