//! Prepared statements, their rows and row iterators, on either engine.

use super::pg::{Cursor, PgConnection, PgStatement};
use super::value::{FromDb, PgAny, ToDb, Value};
use super::{Error, Result};

/// A prepared statement.
pub enum Statement<'c> {
    SqliteCached(rusqlite::CachedStatement<'c>),
    Sqlite(rusqlite::Statement<'c>),
    Postgres(&'c PgConnection, PgStatement),
}

fn sqlite_params<'p>(
    params: &'p [&'p dyn ToDb],
) -> rusqlite::ParamsFromIter<impl Iterator<Item = &'p dyn rusqlite::ToSql>> {
    rusqlite::params_from_iter(params.iter().map(|p| *p as &dyn rusqlite::ToSql))
}

impl<'c> Statement<'c> {
    fn sqlite(&mut self) -> Option<&mut rusqlite::Statement<'c>> {
        match self {
            Statement::SqliteCached(s) => Some(s),
            Statement::Sqlite(s) => Some(s),
            Statement::Postgres(..) => None,
        }
    }

    /// Run it; the number of rows changed.
    pub fn execute(&mut self, params: &[&dyn ToDb]) -> Result<usize> {
        if let Statement::Postgres(c, s) = self {
            return c.execute(s, params);
        }
        let s = self.sqlite().expect("a SQLite statement");
        Ok(s.execute(sqlite_params(params))?)
    }

    /// The first row through `f`; [`Error::NoRows`] when there is none.
    pub fn query_row<T>(
        &mut self,
        params: &[&dyn ToDb],
        f: impl FnOnce(&Row<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut rows = self.query(params)?;
        match rows.next()? {
            Some(row) => f(&row),
            None => Err(Error::NoRows),
        }
    }

    /// Whether it returns any row.
    pub fn exists(&mut self, params: &[&dyn ToDb]) -> Result<bool> {
        Ok(self.query(params)?.next()?.is_some())
    }

    /// Its rows, one at a time (SQLite streams them; PostgreSQL's come in
    /// one answer).
    pub fn query<'s>(&'s mut self, params: &[&dyn ToDb]) -> Result<Rows<'s>> {
        if let Statement::Postgres(c, s) = self {
            let rows = c.query(s, params)?;
            return Ok(Rows::Postgres {
                rows: rows.into_iter(),
                current: None,
            });
        }
        let s = self.sqlite().expect("a SQLite statement");
        Ok(Rows::Sqlite(s.query(sqlite_params(params))?))
    }

    /// Its rows for a large answer (an export): as `query` on SQLite; on
    /// PostgreSQL read a page at a time from a server-side cursor instead
    /// of arriving whole. A round trip more than `query`: for answers that
    /// may be large, not for the hot paths.
    pub fn query_large<'s>(&'s mut self, params: &[&dyn ToDb]) -> Result<Rows<'s>> {
        if let Statement::Postgres(c, s) = self {
            return Ok(Rows::PostgresCursor(c.open_cursor(s, params)?));
        }
        self.query(params)
    }

    /// Its rows, with parameters given by name (`:name`); a name the
    /// statement does not use is skipped, one it uses and is not given is
    /// NULL.
    pub fn query_named<'s>(&'s mut self, named: &[(&str, &dyn ToDb)]) -> Result<Rows<'s>> {
        if let Statement::Postgres(c, s) = self {
            let rows = c.query(s, &s.order(named))?;
            return Ok(Rows::Postgres {
                rows: rows.into_iter(),
                current: None,
            });
        }
        let s = self.sqlite().expect("a SQLite statement");
        for (name, value) in named {
            if let Some(i) = s.parameter_index(name)? {
                s.raw_bind_parameter(i, *value as &dyn rusqlite::ToSql)?;
            }
        }
        Ok(Rows::Sqlite(s.raw_query()))
    }

    /// Every row through `f`, as an iterator.
    pub fn query_map<'s, T, F>(
        &'s mut self,
        params: &[&dyn ToDb],
        f: F,
    ) -> Result<MappedRows<'s, F>>
    where
        F: FnMut(&Row<'_>) -> Result<T>,
    {
        Ok(MappedRows {
            rows: self.query(params)?,
            f,
        })
    }
}

/// Rows of a query.
pub enum Rows<'s> {
    Sqlite(rusqlite::Rows<'s>),
    Postgres {
        rows: std::vec::IntoIter<postgres::Row>,
        current: Option<postgres::Row>,
    },
    PostgresCursor(Cursor<'s>),
}

impl Rows<'_> {
    /// The next row (a lending iterator: the row borrows the rows).
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<Row<'_>>> {
        match self {
            Rows::Sqlite(r) => Ok(r.next()?.map(Row::Sqlite)),
            Rows::Postgres { rows, current } => {
                *current = rows.next();
                Ok(current.as_ref().map(Row::Postgres))
            }
            Rows::PostgresCursor(c) => {
                c.advance()?;
                Ok(c.current.as_ref().map(Row::Postgres))
            }
        }
    }
}

/// `query_map`'s iterator.
pub struct MappedRows<'s, F> {
    rows: Rows<'s>,
    f: F,
}

impl<T, F> Iterator for MappedRows<'_, F>
where
    F: FnMut(&Row<'_>) -> Result<T>,
{
    type Item = Result<T>;

    fn next(&mut self) -> Option<Result<T>> {
        match self.rows.next() {
            Ok(Some(row)) => Some((self.f)(&row)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// One row of an answer.
pub enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r postgres::Row),
}

impl Row<'_> {
    /// Column `idx` as `T` (SQLite's conversions on either engine).
    pub fn get<I: ColumnIndex, T: FromDb>(&self, idx: I) -> Result<T> {
        let idx = idx.index();
        match self {
            Row::Sqlite(r) => Ok(r.get(idx)?),
            Row::Postgres(r) => {
                let v = get_pg(r, idx)?;
                T::from_value(v).map_err(|e| Error::Type(format!("column {idx}: {e}")))
            }
        }
    }

    /// Column `idx` as whatever it holds.
    pub fn get_value(&self, idx: usize) -> Result<Value> {
        self.get(idx)
    }
}

/// A column's position: `usize`, or a literal (`i32`, never negative here).
pub trait ColumnIndex {
    fn index(self) -> usize;
}

impl ColumnIndex for usize {
    fn index(self) -> usize {
        self
    }
}

impl ColumnIndex for i32 {
    fn index(self) -> usize {
        usize::try_from(self).unwrap_or(usize::MAX)
    }
}

fn get_pg(r: &postgres::Row, idx: usize) -> Result<Value> {
    if idx >= r.len() {
        return Err(Error::Type(format!("no column {idx} (of {})", r.len())));
    }
    r.try_get::<_, PgAny>(idx)
        .map(|v| v.0)
        .map_err(|e| Error::Type(format!("column {idx}: {}", super::pg::describe(&e))))
}
