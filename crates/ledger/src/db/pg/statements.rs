//! Statements on PostgreSQL: each translated from the SQLite dialect and
//! prepared once per connection, run with reconnects, and large answers
//! read a page at a time through a cursor.

use postgres::types::ToSql;

use super::super::value::{ToDb, Value};
use super::super::{Error, Result, translate};
use super::{PgConnection, PgStatement};
use crate::postgres::blocking;

impl PgConnection {
    pub(in crate::db) fn prepare(&self, sql: &str) -> Result<PgStatement> {
        if let Some(s) = self.statements.borrow().get(sql) {
            return Ok(s.clone());
        }
        let (translated, names) = translate::translate(sql);
        let statement = self.run(|c| c.prepare(&translated)).map_err(|e| match e {
            Error::Postgres(m) => Error::Postgres(format!("{m} in: {}", one_line(&translated))),
            e => e,
        })?;
        let prepared = PgStatement {
            statement,
            names: names.into(),
            sql: sql.into(),
            generation: self.generation.get(),
        };
        self.statements
            .borrow_mut()
            .insert(sql.to_string(), prepared.clone());
        Ok(prepared)
    }

    /// `s`, prepared again if the connection it was prepared on is gone.
    fn current(&self, s: &PgStatement) -> Result<postgres::Statement> {
        if s.generation == self.generation.get() {
            Ok(s.statement.clone())
        } else {
            Ok(self.prepare(&s.sql)?.statement)
        }
    }

    pub(in crate::db) fn execute(&self, s: &PgStatement, params: &[&dyn ToDb]) -> Result<usize> {
        let values = values(params);
        let refs = refs(&values);
        loop {
            let statement = self.current(s)?;
            if let Some(n) = self.attempt(|c| c.execute(&statement, &refs))? {
                return Ok(usize::try_from(n).unwrap_or(usize::MAX));
            }
        }
    }

    pub(in crate::db) fn query(
        &self,
        s: &PgStatement,
        params: &[&dyn ToDb],
    ) -> Result<Vec<postgres::Row>> {
        let values = values(params);
        let refs = refs(&values);
        loop {
            let statement = self.current(s)?;
            if let Some(rows) = self.attempt(|c| c.query(&statement, &refs))? {
                return Ok(rows);
            }
        }
    }

    /// Open a server-side cursor over `s` (see [`Cursor`]). Inside a
    /// transaction it lives until the transaction ends; outside one it is
    /// declared `WITH HOLD`, so the server keeps the answer (spilling to
    /// its own temporary files) and hands it out a page at a time.
    pub(in crate::db) fn open_cursor<'c>(
        &'c self,
        s: &PgStatement,
        params: &[&dyn ToDb],
    ) -> Result<Cursor<'c>> {
        let name = format!("docket_rows_{}", self.cursors.get());
        self.cursors.set(self.cursors.get() + 1);
        let hold = if self.in_transaction.get() {
            ""
        } else {
            " WITH HOLD"
        };
        let (translated, _) = translate::translate(&s.sql);
        let declare = format!("DECLARE {name} NO SCROLL CURSOR{hold} FOR {translated}");
        let values = values(params);
        let refs = refs(&values);
        self.run(|c| c.execute(declare.as_str(), &refs))
            .map_err(|e| match e {
                Error::Postgres(m) => Error::Postgres(format!("{m} in: {}", one_line(&translated))),
                e => e,
            })?;
        Ok(Cursor {
            conn: self,
            fetch: format!("FETCH FORWARD {CURSOR_PAGE} FROM {name}"),
            close: format!("CLOSE {name}"),
            generation: self.generation.get(),
            page: Vec::new().into_iter(),
            current: None,
            done: false,
        })
    }

    pub(in crate::db) fn batch_execute(&self, sql: &str) -> Result<()> {
        self.run(|c| c.batch_execute(sql))
    }
}

/// Rows a cursor fetches per round trip: a page's rows are all the client
/// holds of a large answer.
const CURSOR_PAGE: usize = 1_000;

/// A large answer read a page at a time from a server-side cursor, so an
/// export of a million rows holds a thousand. (A plain query's answer comes
/// whole.) Other statements may run on the connection between pages, as
/// SQLite allows while a statement steps. Closed when dropped.
pub struct Cursor<'c> {
    conn: &'c PgConnection,
    fetch: String,
    close: String,
    /// The connection it was declared on: a cursor does not survive a
    /// reconnect.
    generation: u64,
    page: std::vec::IntoIter<postgres::Row>,
    pub(in crate::db) current: Option<postgres::Row>,
    done: bool,
}

impl Cursor<'_> {
    /// Move to the next row (`current`); false at the end.
    pub(in crate::db) fn advance(&mut self) -> Result<bool> {
        self.current = self.page.next();
        if self.current.is_none() && !self.done {
            if self.conn.generation.get() != self.generation || self.conn.broken() {
                return Err(Error::ConnectionLost(
                    "the connection was lost while rows were being read".into(),
                ));
            }
            let rows = match self.conn.attempt(|c| c.query(self.fetch.as_str(), &[]))? {
                Some(rows) => rows,
                None => {
                    return Err(Error::ConnectionLost(
                        "the connection was lost while rows were being read".into(),
                    ));
                }
            };
            self.done = rows.len() < CURSOR_PAGE;
            self.page = rows.into_iter();
            self.current = self.page.next();
        }
        Ok(self.current.is_some())
    }
}

impl Drop for Cursor<'_> {
    fn drop(&mut self) {
        // A cursor of a lost connection went with it; inside a transaction
        // that failed, the transaction's end closes it.
        if self.conn.generation.get() == self.generation && !self.conn.broken() {
            let close = &self.close;
            let _ = blocking(|| self.conn.client().batch_execute(close));
        }
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
