//! One SQL surface over the ledger's two backends: a SQLite file or a
//! PostgreSQL server.
//!
//! The ledger's modules write their SQL once, in the dialect both engines
//! share (SQLite's `?N` parameters; `ON CONFLICT`, `RETURNING`, `COALESCE`),
//! and run it through a [`Connection`] whose surface is the part of
//! rusqlite's they use: `prepare_cached`, `execute`, `query_row`,
//! `query_map`, transactions. On SQLite each call goes straight to rusqlite;
//! on PostgreSQL the statement is translated once (`translate`), prepared
//! and cached, and values cross with SQLite's loose typing (an integer where
//! a float is expected, a boolean read as 0/1), so one module's code serves
//! both. What only one engine has (full-text search, `rowid`, pragmas) is a
//! [`Dialect`] branch at its call site.

pub mod busy;
mod pg;
mod stmt;
mod translate;
mod value;

use pg::WriteLock;
pub use pg::{PgConnection, unreachable};
pub use stmt::{MappedRows, Row, Rows, Statement};
pub use value::{FromDb, FromDbError, NUL_STAND_IN, ToDb, Value};

use std::cell::Cell;

/// Which engine a connection talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// A statement's failure, from either engine.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Sqlite(#[from] rusqlite::Error),
    /// PostgreSQL's error in words (the server's message and where); the
    /// URL is not in it, so no password can be.
    #[error("{0}")]
    Postgres(String),
    #[error("query returned no rows")]
    NoRows,
    /// The connection to the server was lost inside a transaction: the
    /// server rolled it back; nothing of it was applied.
    #[error("the connection to the ledger was lost ({0}); the transaction was rolled back")]
    ConnectionLost(String),
    /// A value that does not fit the type asked for (column or parameter).
    #[error("{0}")]
    Type(String),
}

impl Error {
    /// PostgreSQL ended the transaction to break a deadlock or a
    /// serialization conflict (SQLSTATE 40P01, 40001): nothing of it was
    /// applied, and the same transaction run again normally succeeds.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Postgres(m) if m.starts_with("40P01") || m.starts_with("40001"))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `.optional()` on a single-row answer: no row is `None`, not an error.
pub trait OptionalExtension<T> {
    fn optional(self) -> Result<Option<T>>;
}

impl<T> OptionalExtension<T> for Result<T> {
    fn optional(self) -> Result<Option<T>> {
        match self {
            Ok(v) => Ok(Some(v)),
            Err(Error::NoRows | Error::Sqlite(rusqlite::Error::QueryReturnedNoRows)) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// Parameters for a statement: `params![a, b, c]`, any mix of the types
/// that implement [`ToDb`].
macro_rules! db_params {
    () => {
        &[] as &[&dyn $crate::db::ToDb]
    };
    ($($p:expr),+ $(,)?) => {
        &[$(&$p as &dyn $crate::db::ToDb),+] as &[&dyn $crate::db::ToDb]
    };
}
pub(crate) use db_params as params;

/// An open connection to the ledger's database.
pub enum Connection {
    Sqlite(rusqlite::Connection),
    Postgres(Box<PgConnection>),
}

/// How a transaction starts. All write: `Immediate` takes the ledger's
/// write lock first (SQLite's `BEGIN IMMEDIATE`; on PostgreSQL one advisory
/// lock, exclusively), so check-then-write code sees no other writer
/// between its check and its write, on either engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionBehavior {
    Deferred,
    Immediate,
    /// A write transaction that may run beside other `Concurrent` ones:
    /// the workers' writers. SQLite has one writer at a time, so there it is
    /// `Immediate`; on PostgreSQL it takes the write lock shared, so it
    /// still never runs beside an `Immediate` one, and its own checks lock
    /// the rows they read (`FOR SHARE`, or an `UPDATE`) instead.
    Concurrent,
}

impl Connection {
    pub fn dialect(&self) -> Dialect {
        match self {
            Connection::Sqlite(_) => Dialect::Sqlite,
            Connection::Postgres(_) => Dialect::Postgres,
        }
    }

    /// The SQLite connection, for what only SQLite has (pragmas, its
    /// full-text index); `None` on PostgreSQL.
    pub fn sqlite(&self) -> Option<&rusqlite::Connection> {
        match self {
            Connection::Sqlite(c) => Some(c),
            Connection::Postgres(_) => None,
        }
    }

    pub fn prepare_cached(&self, sql: &str) -> Result<Statement<'_>> {
        match self {
            Connection::Sqlite(c) => Ok(Statement::SqliteCached(c.prepare_cached(sql)?)),
            Connection::Postgres(c) => Ok(Statement::Postgres(c, c.prepare(sql)?)),
        }
    }

    /// Like `prepare_cached` (on PostgreSQL every statement is cached).
    pub fn prepare(&self, sql: &str) -> Result<Statement<'_>> {
        match self {
            Connection::Sqlite(c) => Ok(Statement::Sqlite(c.prepare(sql)?)),
            Connection::Postgres(c) => Ok(Statement::Postgres(c, c.prepare(sql)?)),
        }
    }

    pub fn execute(&self, sql: &str, params: &[&dyn ToDb]) -> Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }

    pub fn query_row<T>(
        &self,
        sql: &str,
        params: &[&dyn ToDb],
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    /// Statements without parameters, `;`-separated. A transaction begun
    /// or ended by hand (`BEGIN IMMEDIATE`, `COMMIT`, `ROLLBACK`) is one on
    /// either engine.
    pub fn execute_batch(&self, sql: &str) -> Result<()> {
        match self {
            Connection::Sqlite(c) => Ok(c.execute_batch(sql)?),
            Connection::Postgres(c) => match sql.trim().to_ascii_uppercase().as_str() {
                "BEGIN IMMEDIATE" => c.begin(WriteLock::Exclusive),
                "BEGIN" | "BEGIN DEFERRED" => c.begin(WriteLock::None),
                "COMMIT" => c.end(true),
                "ROLLBACK" => c.end(false),
                _ => c.batch_execute(&translate::to_postgres(sql)),
            },
        }
    }

    /// Where the database is, for messages and cache keys: the file's
    /// path, or the URL without its password. `None` for an in-memory one.
    pub fn location(&self) -> Option<String> {
        match self {
            Connection::Sqlite(c) => c.path().filter(|p| !p.is_empty()).map(String::from),
            Connection::Postgres(c) => Some(c.url().redacted().to_string()),
        }
    }

    /// Whether the ledger has table `name` (a ledger from an older docket
    /// opened read-only may lack one).
    pub fn has_table(&self, name: &str) -> Result<bool> {
        let sql = match self.dialect() {
            Dialect::Sqlite => "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1",
            Dialect::Postgres => {
                "SELECT 1 FROM information_schema.tables
                 WHERE table_schema = current_schema() AND table_name = ?1"
            }
        };
        self.prepare_cached(sql)?.exists(params![name])
    }

    /// Whether table `table` has column `column`.
    pub fn has_column(&self, table: &str, column: &str) -> Result<bool> {
        let sql = match self.dialect() {
            Dialect::Sqlite => "SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2",
            Dialect::Postgres => {
                "SELECT 1 FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = ?1 AND column_name = ?2"
            }
        };
        self.prepare_cached(sql)?.exists(params![table, column])
    }

    /// The time now, in unix seconds, by the database's clock: a lease
    /// written by one host and checked by another is measured on one clock
    /// (fault-matrix row C2). SQLite's is this machine's.
    pub fn now(&self) -> Result<f64> {
        match self {
            Connection::Sqlite(_) => Ok(crate::now_ts()),
            Connection::Postgres(c) => c.now(),
        }
    }

    /// Tell the listeners on `channel` (PostgreSQL's NOTIFY, delivered when
    /// the transaction commits); nothing on SQLite, whose readers poll.
    pub fn notify(&self, channel: &str, payload: &str) -> Result<()> {
        match self {
            Connection::Sqlite(_) => Ok(()),
            Connection::Postgres(_) => {
                self.prepare_cached("SELECT pg_notify(?1, ?2)")?
                    .execute(params![channel, payload])?;
                Ok(())
            }
        }
    }

    /// Whether the last transaction was lost with its connection (so
    /// nothing of it was applied, and it may be run again); cleared by the
    /// reading. Never on SQLite.
    pub fn take_lost(&self) -> bool {
        match self {
            Connection::Sqlite(_) => false,
            Connection::Postgres(c) => c.take_lost(),
        }
    }

    /// Whether no transaction is open.
    pub fn is_autocommit(&self) -> bool {
        match self {
            Connection::Sqlite(c) => c.is_autocommit(),
            Connection::Postgres(c) => !c.in_transaction(),
        }
    }

    /// Begin a transaction (see [`TransactionBehavior`]); rolled back when
    /// dropped uncommitted.
    pub fn transaction_with_behavior(
        &self,
        behavior: TransactionBehavior,
    ) -> Result<Transaction<'_>> {
        match behavior {
            TransactionBehavior::Immediate => self.begin_write()?,
            TransactionBehavior::Deferred => match self {
                Connection::Sqlite(c) => c.execute_batch("BEGIN DEFERRED")?,
                Connection::Postgres(c) => c.begin(WriteLock::None)?,
            },
            TransactionBehavior::Concurrent => match self {
                Connection::Sqlite(c) => busy::begin_immediate(c)?,
                Connection::Postgres(c) => c.begin(WriteLock::Shared)?,
            },
        }
        Ok(Transaction {
            conn: self,
            open: Cell::new(true),
        })
    }

    /// Begin a write transaction by hand (`BEGIN IMMEDIATE`, ended with
    /// `execute_batch("COMMIT")` or `"ROLLBACK"`). On SQLite a write lock
    /// another process holds past the busy timeout is waited out with a
    /// "ledger busy" status (`busy`, fault-matrix row D1), not failed.
    pub fn begin_write(&self) -> Result<()> {
        match self {
            Connection::Sqlite(c) => Ok(busy::begin_immediate(c)?),
            Connection::Postgres(c) => c.begin(WriteLock::Exclusive),
        }
    }

    pub fn transaction(&self) -> Result<Transaction<'_>> {
        self.transaction_with_behavior(TransactionBehavior::Deferred)
    }

    fn end(&self, commit: bool) -> Result<()> {
        match self {
            Connection::Sqlite(c) => {
                Ok(c.execute_batch(if commit { "COMMIT" } else { "ROLLBACK" })?)
            }
            Connection::Postgres(c) => c.end(commit),
        }
    }
}

/// An open transaction; it derefs to its connection, as rusqlite's does.
pub struct Transaction<'c> {
    conn: &'c Connection,
    open: Cell<bool>,
}

impl Transaction<'_> {
    pub fn commit(self) -> Result<()> {
        self.open.set(false);
        if let Err(e) = self.conn.end(true) {
            let _ = self.conn.end(false);
            return Err(e);
        }
        Ok(())
    }

    pub fn rollback(self) -> Result<()> {
        self.open.set(false);
        self.conn.end(false)
    }
}

impl std::ops::Deref for Transaction<'_> {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        self.conn
    }
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        if self.open.get() {
            let _ = self.conn.end(false);
        }
    }
}
