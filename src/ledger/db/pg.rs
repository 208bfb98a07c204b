//! The PostgreSQL side of the SQL surface: one client, its statements
//! translated and prepared once, transactions that take docket's write lock.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use postgres::types::ToSql;

use super::value::{ToDb, Value};
use super::{Error, Result, translate};
use crate::ledger::postgres::{PgUrl, blocking};

/// A prepared statement and the names of its `:name` parameters.
#[derive(Clone)]
pub struct PgStatement {
    statement: postgres::Statement,
    names: std::sync::Arc<[String]>,
}

impl PgStatement {
    pub(super) fn columns(&self) -> usize {
        self.statement.columns().len()
    }

    /// Named parameters in the order the statement numbers them; a name
    /// not given is NULL.
    pub(super) fn order<'p>(&self, named: &[(&str, &'p dyn ToDb)]) -> Vec<&'p dyn ToDb> {
        self.names
            .iter()
            .map(|n| {
                named
                    .iter()
                    .find(|(k, _)| k == n)
                    .map_or(&Value::Null as &dyn ToDb, |(_, v)| *v)
            })
            .collect()
    }
}

/// The key of the advisory lock every docket write transaction takes on
/// PostgreSQL ("docketw" in ASCII): writes serialize as SQLite's `BEGIN
/// IMMEDIATE` makes them, so a check and the write it allows see no other
/// writer between them. Claims do not take it: they lock rows with
/// `FOR UPDATE SKIP LOCKED`, so workers claim side by side.
const WRITE_LOCK: i64 = 0x0064_6f63_6b65_7477;

/// A connection to a PostgreSQL ledger.
pub struct PgConnection {
    /// Taken out only when dropped (see `Drop`).
    client: RefCell<Option<postgres::Client>>,
    /// Prepared statements by their SQLite-dialect text.
    statements: RefCell<HashMap<String, PgStatement>>,
    in_transaction: Cell<bool>,
    url: PgUrl,
}

/// The server's message for a failed statement, without the URL.
pub(super) fn describe(e: &postgres::Error) -> String {
    crate::ledger::postgres::detail(e)
}

fn pg_error(e: postgres::Error) -> Error {
    Error::Postgres(describe(&e))
}

impl PgConnection {
    pub fn new(client: postgres::Client, url: PgUrl) -> PgConnection {
        PgConnection {
            client: RefCell::new(Some(client)),
            statements: RefCell::new(HashMap::new()),
            in_transaction: Cell::new(false),
            url,
        }
    }

    /// The ledger's URL, its password hidden.
    pub fn url(&self) -> &PgUrl {
        &self.url
    }

    /// Whether the connection to the server is gone (the server stopped or
    /// the link was cut): a new connection is needed.
    pub fn is_closed(&self) -> bool {
        self.client().is_closed()
    }

    fn client(&self) -> std::cell::RefMut<'_, postgres::Client> {
        std::cell::RefMut::map(self.client.borrow_mut(), |c| {
            c.as_mut()
                .expect("the client is there until the connection is dropped")
        })
    }

    pub(super) fn prepare(&self, sql: &str) -> Result<PgStatement> {
        if let Some(s) = self.statements.borrow().get(sql) {
            return Ok(s.clone());
        }
        let (translated, names) = translate::translate(sql);
        let statement = blocking(|| self.client().prepare(&translated)).map_err(|e| {
            Error::Postgres(format!("{} in: {}", describe(&e), one_line(&translated)))
        })?;
        let prepared = PgStatement {
            statement,
            names: names.into(),
        };
        self.statements
            .borrow_mut()
            .insert(sql.to_string(), prepared.clone());
        Ok(prepared)
    }

    pub(super) fn execute(&self, s: &PgStatement, params: &[&dyn ToDb]) -> Result<usize> {
        let values = values(params);
        let refs = refs(&values);
        let n = blocking(|| self.client().execute(&s.statement, &refs)).map_err(pg_error)?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    pub(super) fn query(
        &self,
        s: &PgStatement,
        params: &[&dyn ToDb],
    ) -> Result<Vec<postgres::Row>> {
        let values = values(params);
        let refs = refs(&values);
        blocking(|| self.client().query(&s.statement, &refs)).map_err(pg_error)
    }

    pub(super) fn batch_execute(&self, sql: &str) -> Result<()> {
        blocking(|| self.client().batch_execute(sql)).map_err(pg_error)
    }

    pub(super) fn in_transaction(&self) -> bool {
        self.in_transaction.get()
    }

    pub(super) fn begin(&self, write_lock: bool) -> Result<()> {
        let sql = if write_lock {
            format!("BEGIN; SELECT pg_advisory_xact_lock({WRITE_LOCK})")
        } else {
            "BEGIN".to_string()
        };
        self.batch_execute(&sql)?;
        self.in_transaction.set(true);
        Ok(())
    }

    pub(super) fn end(&self, commit: bool) -> Result<()> {
        self.in_transaction.set(false);
        self.batch_execute(if commit { "COMMIT" } else { "ROLLBACK" })
    }
}

fn values(params: &[&dyn ToDb]) -> Vec<Value> {
    params.iter().map(|p| p.to_value()).collect()
}

fn refs(values: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    values.iter().map(|v| v as &(dyn ToSql + Sync)).collect()
}

fn one_line(sql: &str) -> String {
    sql.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Drop for PgConnection {
    /// Closing the client blocks on its runtime too: off the async threads.
    fn drop(&mut self) {
        if let Some(client) = self.client.get_mut().take() {
            blocking(move || drop(client));
        }
    }
}
