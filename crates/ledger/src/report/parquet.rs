//! `docket export --format parquet`: the same columns and types as CSV and
//! JSONL, through the `parquet` crate's low-level column writers (no arrow).
//!
//! Every column is OPTIONAL (null where the value is missing): ints are
//! INT64, floats DOUBLE, booleans BOOLEAN, everything else (text, ISO-8601
//! timestamps, JSON) BYTE_ARRAY annotated as a UTF-8 string. Rows are
//! buffered column by column and written as a row group every
//! `ROW_GROUP_ROWS` rows (or `ROW_GROUP_BYTES` of text), so memory stays
//! bounded on a large ledger.

use std::io::Write;
use std::sync::Arc;

use parquet::basic::{Compression, LogicalType, Repetition, Type as Physical};
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, DoubleType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::types::Type;

use super::ReportError;
use super::columns::{Cell, Kind};

const ROW_GROUP_ROWS: usize = 64 * 1024;
/// Or sooner, once the buffered text passes this (long rationales).
const ROW_GROUP_BYTES: usize = 64 * 1024 * 1024;

enum Values {
    Int(Vec<i64>),
    Float(Vec<f64>),
    Bool(Vec<bool>),
    Text(Vec<ByteArray>),
}

struct Column {
    values: Values,
    /// 1 where the row has a value, 0 where it is null.
    defs: Vec<i16>,
}

pub(crate) struct ParquetWriter<W: Write + Send> {
    writer: SerializedFileWriter<W>,
    columns: Vec<Column>,
    rows: usize,
    bytes: usize,
}

/// The Parquet physical type of a report column.
fn physical(kind: Kind) -> Physical {
    match kind {
        Kind::Int => Physical::INT64,
        Kind::Float => Physical::DOUBLE,
        Kind::Bool => Physical::BOOLEAN,
        Kind::Text | Kind::Ts | Kind::Json => Physical::BYTE_ARRAY,
    }
}

impl<W: Write + Send> ParquetWriter<W> {
    pub(crate) fn new(out: W, names: &[&str], kinds: &[Kind]) -> Result<Self, ReportError> {
        let mut fields = Vec::with_capacity(names.len());
        let mut columns = Vec::with_capacity(names.len());
        for (name, kind) in names.iter().zip(kinds) {
            let p = physical(*kind);
            let logical = (p == Physical::BYTE_ARRAY).then_some(LogicalType::String);
            fields.push(Arc::new(
                Type::primitive_type_builder(name, p)
                    .with_repetition(Repetition::OPTIONAL)
                    .with_logical_type(logical)
                    .build()?,
            ));
            let values = match p {
                Physical::INT64 => Values::Int(Vec::new()),
                Physical::DOUBLE => Values::Float(Vec::new()),
                Physical::BOOLEAN => Values::Bool(Vec::new()),
                _ => Values::Text(Vec::new()),
            };
            columns.push(Column {
                values,
                defs: Vec::new(),
            });
        }
        let schema = Arc::new(
            Type::group_type_builder("docket_export")
                .with_fields(fields)
                .build()?,
        );
        let props = Arc::new(
            WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_created_by(format!("docket {}", env!("CARGO_PKG_VERSION")))
                .build(),
        );
        Ok(ParquetWriter {
            writer: SerializedFileWriter::new(out, schema, props)?,
            columns,
            rows: 0,
            bytes: 0,
        })
    }

    pub(crate) fn write(&mut self, cells: &[Cell]) -> Result<(), ReportError> {
        for (col, cell) in self.columns.iter_mut().zip(cells) {
            let present = match (&mut col.values, cell) {
                (_, Cell::Null) => false,
                (Values::Int(v), c) => match c.as_i64() {
                    Some(i) => {
                        v.push(i);
                        true
                    }
                    None => false,
                },
                (Values::Float(v), c) => match c.as_f64().filter(|f| f.is_finite()) {
                    Some(f) => {
                        v.push(f);
                        true
                    }
                    None => false,
                },
                (Values::Bool(v), Cell::Bool(b)) => {
                    v.push(*b);
                    true
                }
                (Values::Bool(v), Cell::Int(i)) => {
                    v.push(*i != 0);
                    true
                }
                (Values::Bool(_), _) => false,
                (Values::Text(v), c) => {
                    let bytes = c.csv_text().into_bytes();
                    self.bytes += bytes.len();
                    v.push(ByteArray::from(bytes));
                    true
                }
            };
            col.defs.push(i16::from(present));
        }
        self.rows += 1;
        if self.rows >= ROW_GROUP_ROWS || self.bytes >= ROW_GROUP_BYTES {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), ReportError> {
        if self.rows == 0 {
            return Ok(());
        }
        let mut group = self.writer.next_row_group()?;
        let mut i = 0;
        while let Some(mut w) = group.next_column()? {
            let col = &mut self.columns[i];
            let defs = Some(col.defs.as_slice());
            match &mut col.values {
                Values::Int(v) => {
                    w.typed::<Int64Type>().write_batch(v, defs, None)?;
                    v.clear();
                }
                Values::Float(v) => {
                    w.typed::<DoubleType>().write_batch(v, defs, None)?;
                    v.clear();
                }
                Values::Bool(v) => {
                    w.typed::<BoolType>().write_batch(v, defs, None)?;
                    v.clear();
                }
                Values::Text(v) => {
                    w.typed::<ByteArrayType>().write_batch(v, defs, None)?;
                    v.clear();
                }
            }
            col.defs.clear();
            w.close()?;
            i += 1;
        }
        group.close()?;
        self.rows = 0;
        self.bytes = 0;
        Ok(())
    }

    pub(crate) fn finish(mut self) -> Result<(), ReportError> {
        self.flush()?;
        self.writer.close()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};
    use parquet::record::RowAccessor;

    #[test]
    fn several_row_groups_and_nulls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        let file = std::fs::File::create(&path).unwrap();
        let kinds = [Kind::Int, Kind::Text, Kind::Float, Kind::Bool];
        let mut w = ParquetWriter::new(file, &["n", "s", "f", "b"], &kinds).unwrap();
        let rows = ROW_GROUP_ROWS + 10;
        for i in 0..rows {
            let cells = if i % 2 == 0 {
                vec![
                    Cell::Int(i as i64),
                    Cell::Text(format!("r{i}")),
                    Cell::Float(0.5),
                    Cell::Bool(true),
                ]
            } else {
                vec![Cell::Null, Cell::Null, Cell::Null, Cell::Null]
            };
            w.write(&cells).unwrap();
        }
        w.finish().unwrap();
        let r = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let meta = r.metadata();
        assert_eq!(meta.num_row_groups(), 2);
        assert_eq!(meta.file_metadata().num_rows(), rows as i64);
        let tail: Vec<_> = r
            .get_row_iter(None)
            .unwrap()
            .skip(rows - 2)
            .map(|x| x.unwrap())
            .collect();
        // ROW_GROUP_ROWS + 8 is even: a value, in the second row group.
        assert_eq!(tail[0].get_long(0).unwrap(), (rows - 2) as i64);
        assert_eq!(tail[0].get_string(1).unwrap(), &format!("r{}", rows - 2));
        assert!(tail[1].is_null(0).unwrap());
    }
}
