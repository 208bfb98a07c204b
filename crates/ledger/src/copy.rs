//! `docket ledger copy`: a workspace's ledger moved between its SQLite file
//! and a PostgreSQL database, so a job started on a laptop continues on a
//! fleet and a finished one is archived as a file.
//!
//! Every table of the ledger's data is copied whole, column for column (the
//! two schemas have the same numbered migrations, so the same columns);
//! generated columns are left to the target to compute, and search indexes
//! to rebuild themselves. The source is read in one snapshot (a read
//! transaction), the target written in one transaction with foreign keys
//! checked at its commit (requests and their result messages point at each
//! other), so a copy is all or nothing. The target must hold no items and
//! no sessions: a copy never merges two ledgers.

use std::io::Write;
use std::path::Path;

use postgres::fallible_iterator::FallibleIterator;
use rusqlite::types::{Value, ValueRef};

use super::LedgerError;
use super::postgres::{PgUrl, detail};

/// The ledger's data tables, parents before children.
pub const TABLES: &[&str] = &[
    "decision",
    "llm_batch_session",
    "llm_requests",
    "llm_messages",
    "session_item",
    "session_request",
    "provider_batch",
    "provider_batch_item",
    "provider_batch_quarantine",
    "run_stages",
    "llm_batch_result",
    "llm_batch_result_history",
    "review_item",
    "review_log",
    "session_event",
    "session_worker",
    "rate_limit_profile",
];

/// How many rows went over, table by table (in `TABLES` order).
#[derive(Debug, Default)]
pub struct CopyReport {
    pub tables: Vec<(&'static str, u64)>,
}

impl CopyReport {
    pub fn rows(&self) -> u64 {
        self.tables.iter().map(|(_, n)| n).sum()
    }
}

/// A column's type as the PostgreSQL schema declares it: how its values are
/// read and written on both sides.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Int,
    Float,
    Text,
}

struct Column {
    name: String,
    kind: Kind,
}

/// Copy the SQLite ledger at `sqlite` into the (empty) PostgreSQL ledger at
/// `url`.
pub fn sqlite_to_postgres(sqlite: &Path, url: &PgUrl) -> Result<CopyReport, LedgerError> {
    let mut source = super::open(sqlite)?;
    let mut target = super::postgres::open(url)?;
    let pg = |e: postgres::Error| url.db_error(&e);
    let read = source.transaction()?;
    let mut tx = target.transaction().map_err(pg)?;
    // Nobody may add a ledger between the check and the copy.
    tx.batch_execute("LOCK TABLE decision, llm_batch_session IN EXCLUSIVE MODE")
        .map_err(pg)?;
    refuse_unless_empty_pg(&mut tx, url)?;
    tx.batch_execute("SET CONSTRAINTS ALL DEFERRED")
        .map_err(pg)?;
    let mut report = CopyReport::default();
    for &table in TABLES {
        let columns = pg_columns(&mut tx, url, table)?;
        check_sqlite_columns(&read, sqlite, table, &columns)?;
        let names = column_list(&columns);
        let mut stmt = read.prepare(&format!(
            "SELECT {names} FROM {table}{}",
            sqlite_order(table)
        ))?;
        let mut rows = stmt.query([])?;
        let mut sink = tx
            .copy_in(&format!("COPY {table} ({names}) FROM STDIN"))
            .map_err(pg)?;
        let mut line = String::new();
        let mut count = 0u64;
        while let Some(row) = rows.next()? {
            line.clear();
            for (i, column) in columns.iter().enumerate() {
                if i > 0 {
                    line.push('\t');
                }
                copy_text(&mut line, row.get_ref(i)?, table, column).map_err(|detail| {
                    LedgerError::Refused {
                        ledger: sqlite.display().to_string(),
                        detail,
                    }
                })?;
            }
            line.push('\n');
            sink.write_all(line.as_bytes())
                .map_err(|e| url.error(format!("copying {table}: {e}")))?;
            count += 1;
        }
        sink.finish()
            .map_err(|e| url.error(format!("copying {table}: {}", detail(&e))))?;
        report.tables.push((table, count));
    }
    // Identity columns go on from the highest id copied, not from 1.
    for &table in TABLES {
        let identities = tx
            .query(
                "SELECT column_name FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = $1 AND is_identity = 'YES'",
                &[&table],
            )
            .map_err(pg)?;
        for row in identities {
            let column: String = row.get(0);
            tx.execute(
                &format!(
                    "SELECT setval(pg_get_serial_sequence('{table}', '{column}'),
                                   COALESCE(MAX({column}), 0) + 1, false) FROM {table}"
                ),
                &[],
            )
            .map_err(pg)?;
        }
    }
    tx.commit()
        .map_err(|e| url.error(format!("the copy did not commit: {}", detail(&e))))?;
    drop(read);
    Ok(report)
}

/// Copy the PostgreSQL ledger at `url` into the SQLite ledger at `sqlite`
/// (created when missing; it must hold no items and no sessions).
pub fn postgres_to_sqlite(url: &PgUrl, sqlite: &Path) -> Result<CopyReport, LedgerError> {
    let mut source = super::postgres::open_existing(url)?;
    let mut target = super::open(sqlite)?;
    let pg = |e: postgres::Error| url.db_error(&e);
    let mut read = source
        .build_transaction()
        .isolation_level(postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .map_err(pg)?;
    // Foreign keys are checked once, over the whole copy, before it commits
    // (`foreign_key_check` below), not row by row: SQLite's deferred checks
    // look up a parent's children by scanning when no index covers them
    // (requests by their result message), which made a 100,000-item copy
    // quadratic. The pragma only changes outside a transaction.
    target.pragma_update(None, "foreign_keys", "OFF")?;
    let report = sqlite_rows_from_postgres(&mut read, url, &mut target, sqlite)?;
    // (The connection ends here; foreign keys are on in every other.)
    read.commit().map_err(pg)?;
    Ok(report)
}

/// The body of `postgres_to_sqlite`, with the target's foreign keys off:
/// every table in one transaction, committed only if no key dangles.
fn sqlite_rows_from_postgres(
    read: &mut postgres::Transaction<'_>,
    url: &PgUrl,
    target: &mut rusqlite::Connection,
    sqlite: &Path,
) -> Result<CopyReport, LedgerError> {
    let pg = |e: postgres::Error| url.db_error(&e);
    let tx = target.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    refuse_unless_empty_sqlite(&tx, sqlite)?;
    let mut report = CopyReport::default();
    for &table in TABLES {
        let columns = pg_columns(read, url, table)?;
        check_sqlite_columns(&tx, sqlite, table, &columns)?;
        let names = column_list(&columns);
        let marks = (1..=columns.len())
            .map(|i| format!("?{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let mut insert = tx.prepare(&format!("INSERT INTO {table} ({names}) VALUES ({marks})"))?;
        let no_params: [&(dyn postgres::types::ToSql + Sync); 0] = [];
        let mut rows = read
            .query_raw(
                &format!("SELECT {names} FROM {table}{}", pg_order(table)),
                no_params,
            )
            .map_err(pg)?;
        let mut values: Vec<Value> = Vec::with_capacity(columns.len());
        let mut count = 0u64;
        while let Some(row) = rows.next().map_err(pg)? {
            values.clear();
            for (i, column) in columns.iter().enumerate() {
                let value = match column.kind {
                    Kind::Int => row
                        .try_get::<_, Option<i64>>(i)
                        .map(|v| v.map(Value::Integer)),
                    Kind::Float => row.try_get::<_, Option<f64>>(i).map(|v| v.map(Value::Real)),
                    Kind::Text => row
                        .try_get::<_, Option<String>>(i)
                        .map(|v| v.map(Value::Text)),
                }
                .map_err(|e| url.error(format!("{table}.{}: {e}", column.name)))?;
                // SQLite would store NaN as NULL (or refuse it in a NOT NULL
                // column without saying where): refuse it by name.
                if let Some(Value::Real(f)) = &value
                    && f.is_nan()
                {
                    return Err(LedgerError::Refused {
                        ledger: url.redacted().to_string(),
                        detail: format!(
                            "{table}.{} holds NaN, which SQLite cannot store",
                            column.name
                        ),
                    });
                }
                values.push(value.unwrap_or(Value::Null));
            }
            insert.execute(rusqlite::params_from_iter(values.iter()))?;
            count += 1;
        }
        report.tables.push((table, count));
    }
    let dangling: i64 = tx.query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |r| {
        r.get(0)
    })?;
    if dangling > 0 {
        return Err(url.error(format!(
            "{dangling} rows point at rows the ledger does not have; nothing was copied"
        )));
    }
    tx.commit().map_err(|e| LedgerError::Corrupt {
        path: sqlite.display().to_string(),
        detail: format!("the copy did not commit: {e}"),
    })?;
    Ok(report)
}

/// The columns a copy moves: every column PostgreSQL does not generate, in
/// its order, with its type.
fn pg_columns(
    tx: &mut postgres::Transaction<'_>,
    url: &PgUrl,
    table: &str,
) -> Result<Vec<Column>, LedgerError> {
    let rows = tx
        .query(
            "SELECT column_name, data_type FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1 AND is_generated = 'NEVER'
               AND NOT (is_identity = 'YES' AND identity_generation = 'ALWAYS')
             ORDER BY ordinal_position",
            &[&table],
        )
        .map_err(|e| url.db_error(&e))?;
    if rows.is_empty() {
        return Err(url.error(format!("it has no table {table}")));
    }
    rows.iter()
        .map(|row| {
            let name: String = row.get(0);
            let kind = match row.get::<_, String>(1).as_str() {
                "bigint" => Kind::Int,
                "double precision" => Kind::Float,
                "text" => Kind::Text,
                other => return Err(url.error(format!("{table}.{name} has type {other}"))),
            };
            Ok(Column { name, kind })
        })
        .collect()
}

/// Refuse when the SQLite table's columns (generated ones aside) are not
/// the PostgreSQL table's: the two schemas drifted apart.
fn check_sqlite_columns(
    conn: &rusqlite::Connection,
    path: &Path,
    table: &str,
    columns: &[Column],
) -> Result<(), LedgerError> {
    let mut stmt = conn.prepare(&format!(
        "SELECT name, hidden FROM pragma_table_xinfo('{table}')"
    ))?;
    let mut mine: Vec<String> = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
        .filter_map(|r| match r {
            Ok((name, 0)) => Some(Ok(name)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        })
        .collect::<Result<_, _>>()?;
    let mut theirs: Vec<String> = columns.iter().map(|c| c.name.clone()).collect();
    mine.sort();
    theirs.sort();
    if mine != theirs {
        return Err(LedgerError::Corrupt {
            path: path.display().to_string(),
            detail: format!("table {table} has columns {mine:?} here and {theirs:?} in PostgreSQL"),
        });
    }
    Ok(())
}

fn column_list(columns: &[Column]) -> String {
    columns
        .iter()
        .map(|c| c.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Append `value` to a line of COPY's text format: `\N` for NULL, and the
/// four characters that would end a field or a line escaped. `Err` says
/// which value PostgreSQL could not take as it is.
fn copy_text(
    line: &mut String,
    value: ValueRef<'_>,
    table: &str,
    column: &Column,
) -> Result<(), String> {
    use std::fmt::Write as _;
    let at = || format!("{table}.{}", column.name);
    match value {
        ValueRef::Null => line.push_str("\\N"),
        ValueRef::Integer(i) => {
            let _ = write!(line, "{i}");
        }
        ValueRef::Real(f) if column.kind == Kind::Int => {
            return Err(format!("{} holds {f}, not an integer", at()));
        }
        ValueRef::Real(f) => {
            // Display prints the shortest text that reads back as the same
            // double; PostgreSQL spells the infinities its own way.
            if f == f64::INFINITY {
                line.push_str("Infinity");
            } else if f == f64::NEG_INFINITY {
                line.push_str("-Infinity");
            } else {
                let _ = write!(line, "{f}");
            }
        }
        ValueRef::Text(bytes) => {
            let text = std::str::from_utf8(bytes).map_err(|_| {
                format!("{} holds text that is not UTF-8: {}", at(), preview(bytes))
            })?;
            for c in text.chars() {
                match c {
                    // PostgreSQL text cannot hold a NUL: the same stand-in as
                    // every write to a PostgreSQL ledger (db::NUL_STAND_IN).
                    '\0' => line.push_str(crate::db::NUL_STAND_IN),
                    '\\' => line.push_str("\\\\"),
                    '\n' => line.push_str("\\n"),
                    '\r' => line.push_str("\\r"),
                    '\t' => line.push_str("\\t"),
                    c => line.push(c),
                }
            }
        }
        ValueRef::Blob(_) => {
            return Err(format!(
                "{} holds a blob, which no ledger column stores",
                at()
            ));
        }
    }
    Ok(())
}

/// The start of a refused value, safe to print.
fn preview(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(60)]);
    format!("{:?}", text)
}

/// Rows in the order SQLite keeps them where docket reads that order: items
/// are dispatched in import order (their rowid).
fn sqlite_order(table: &str) -> &'static str {
    if table == "decision" {
        " ORDER BY rowid"
    } else {
        ""
    }
}

/// The same order in PostgreSQL, which keeps it in `import_seq`.
fn pg_order(table: &str) -> &'static str {
    if table == "decision" {
        " ORDER BY import_seq"
    } else {
        ""
    }
}

/// Both counts a target ledger must have at zero.
const ITEMS_AND_SESSIONS: &str =
    "SELECT (SELECT COUNT(*) FROM decision), (SELECT COUNT(*) FROM llm_batch_session)";

/// Why a target holding `items` and `sessions` is refused, if it is.
fn not_empty(items: i64, sessions: i64) -> Option<String> {
    (items + sessions > 0).then(|| {
        format!(
            "it already holds {items} items and {sessions} sessions; a copy goes only into an empty ledger"
        )
    })
}

fn refuse_unless_empty_pg(
    tx: &mut postgres::Transaction<'_>,
    url: &PgUrl,
) -> Result<(), LedgerError> {
    let row = tx
        .query_one(ITEMS_AND_SESSIONS, &[])
        .map_err(|e| url.db_error(&e))?;
    match not_empty(row.get(0), row.get(1)) {
        Some(why) => Err(url.error(why)),
        None => Ok(()),
    }
}

fn refuse_unless_empty_sqlite(conn: &rusqlite::Connection, path: &Path) -> Result<(), LedgerError> {
    let (items, sessions) =
        conn.query_row(ITEMS_AND_SESSIONS, [], |r| Ok((r.get(0)?, r.get(1)?)))?;
    match not_empty(items, sessions) {
        Some(detail) => Err(LedgerError::Refused {
            ledger: path.display().to_string(),
            detail,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every table the SQLite schema has is copied, except the search
    /// index's own (rebuilt by the target).
    #[test]
    fn every_data_table_is_copied() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::open(&dir.path().join("docket.sqlite")).unwrap();
        let mut stmt = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table'
                 AND name NOT LIKE 'sqlite_%' AND name NOT LIKE 'review_search%' ORDER BY name",
            )
            .unwrap();
        let mut tables: Vec<String> = stmt
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        let mut copied: Vec<String> = TABLES.iter().map(|t| t.to_string()).collect();
        tables.sort();
        copied.sort();
        assert_eq!(tables, copied);
    }

    #[test]
    fn copy_text_escapes_what_would_end_a_field() {
        let column = Column {
            name: "c".into(),
            kind: Kind::Text,
        };
        let mut line = String::new();
        copy_text(&mut line, ValueRef::Text(b"a\tb\\c\nd\re"), "t", &column).unwrap();
        assert_eq!(line, "a\\tb\\\\c\\nd\\re");
        line.clear();
        copy_text(&mut line, ValueRef::Null, "t", &column).unwrap();
        assert_eq!(line, "\\N");
        let float = Column {
            name: "f".into(),
            kind: Kind::Float,
        };
        line.clear();
        copy_text(&mut line, ValueRef::Real(0.1 + 0.2), "t", &float).unwrap();
        assert_eq!(line.parse::<f64>().unwrap(), 0.1 + 0.2);
        // Text that is not UTF-8 is refused by name, not mangled.
        let e = copy_text(&mut line, ValueRef::Text(b"ok \xff"), "t", &column).unwrap_err();
        assert!(e.contains("t.c") && e.contains("not UTF-8"), "{e}");
        // A NUL, which PostgreSQL text cannot hold, becomes U+2400 as in
        // every write to a PostgreSQL ledger.
        line.clear();
        copy_text(&mut line, ValueRef::Text(b"a\0b"), "t", &column).unwrap();
        assert_eq!(line, "a\u{2400}b");
    }
}
