//! Reading SQLite rows as report cells, one row at a time.

use crate::db::{Connection, Row, ToDb, Value};

use super::EachRow;
use crate::report::{Cell, Kind, ReportError};

/// Read column `idx` of `row` as `kind`, tolerating SQLite's loose typing
/// (an integer in a float column, a number stored as text).
pub(super) fn read_cell(row: &Row<'_>, idx: usize, kind: Kind) -> crate::db::Result<Cell> {
    let cell = match (row.get_value(idx)?, kind) {
        (Value::Null, _) => Cell::Null,
        (Value::Integer(i), Kind::Int) => Cell::Int(i),
        (Value::Integer(i), Kind::Float) => Cell::Float(i as f64),
        (Value::Integer(i), Kind::Ts) => Cell::ts(i as f64),
        (Value::Integer(i), Kind::Bool) => Cell::Bool(i != 0),
        (Value::Integer(i), Kind::Text | Kind::Json) => Cell::Text(i.to_string()),
        (Value::Real(f), Kind::Int) if f.fract() == 0.0 => Cell::Int(f as i64),
        (Value::Real(f), Kind::Int | Kind::Float) => Cell::Float(f),
        (Value::Real(f), Kind::Ts) => Cell::ts(f),
        (Value::Real(f), Kind::Bool) => Cell::Bool(f != 0.0),
        (Value::Real(f), Kind::Text | Kind::Json) => Cell::Text(f.to_string()),
        (Value::Text(t), Kind::Json) => Cell::Json(t),
        (Value::Text(t), Kind::Ts) => match t.trim().parse::<f64>() {
            Ok(f) => Cell::ts(f),
            Err(_) => Cell::Text(t),
        },
        (Value::Text(t), _) => Cell::Text(t),
        (Value::Blob(b), _) => Cell::Text(String::from_utf8_lossy(&b).into_owned()),
    };
    Ok(cell)
}

/// Read the first `kinds.len()` columns of `row` into `cells` (cleared first).
pub(super) fn read_cells(
    row: &Row<'_>,
    kinds: &[Kind],
    cells: &mut Vec<Cell>,
) -> crate::db::Result<()> {
    cells.clear();
    for (i, kind) in kinds.iter().enumerate() {
        cells.push(read_cell(row, i, *kind)?);
    }
    Ok(())
}

/// Run `sql` and call `each` with every row read as `kinds`; returns the
/// row count. One reused buffer: memory stays flat however many rows.
pub(super) fn stream_rows(
    conn: &Connection,
    sql: &str,
    params: &[&dyn ToDb],
    kinds: &[Kind],
    each: EachRow<'_>,
) -> Result<u64, ReportError> {
    let mut stmt = conn.prepare(sql)?;
    let mut rows = stmt.query_large(params)?;
    let mut cells: Vec<Cell> = Vec::with_capacity(kinds.len());
    let mut count = 0u64;
    while let Some(row) = rows.next()? {
        read_cells(&row, kinds, &mut cells)?;
        each(&cells)?;
        count += 1;
    }
    Ok(count)
}
