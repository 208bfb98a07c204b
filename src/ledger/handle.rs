//! The ledger as the rest of docket sees it: one handle, opened on a
//! workspace's ledger, on which the ledger's traits are implemented (the
//! console's reads, review decisions, run controls, reports and exports,
//! import, and the engine's work queue, sessions and provider batches).
//! Callers outside `ledger` hold a `Ledger` and call those traits;
//! they never see the SQLite connection behind it, so a second backend
//! (PostgreSQL) can implement the same traits without touching them.

use crate::ledger::db::Connection;

use super::LedgerError;
use super::db::PgConnection;
use super::location::LedgerLocation;

/// An open ledger: a SQLite file or a PostgreSQL database.
pub struct Ledger {
    conn: Connection,
    location: LedgerLocation,
    /// The last "has anything changed" answer's marker.
    seen_version: Option<i64>,
}

impl Ledger {
    /// Open (creating if needed) and migrate the ledger at `at`.
    pub fn open(at: impl Into<LedgerLocation>) -> Result<Ledger, LedgerError> {
        let location = at.into();
        let conn = match &location {
            LedgerLocation::File(path) => Connection::Sqlite(super::open(path)?),
            LedgerLocation::Postgres(url) => Connection::Postgres(Box::new(PgConnection::new(
                super::postgres::open(url)?,
                (**url).clone(),
            ))),
        };
        Ok(Ledger::wrap(conn, location))
    }

    /// Open an existing ledger for reading only; fails when there is none.
    pub fn open_read_only(at: impl Into<LedgerLocation>) -> Result<Ledger, LedgerError> {
        let location = at.into();
        let conn = match &location {
            LedgerLocation::File(path) => Connection::Sqlite(super::open_read_only(path)?),
            LedgerLocation::Postgres(url) => Connection::Postgres(Box::new(PgConnection::new(
                super::postgres::open_existing(url)?,
                (**url).clone(),
            ))),
        };
        Ok(Ledger::wrap(conn, location))
    }

    fn wrap(conn: Connection, location: LedgerLocation) -> Ledger {
        Ledger {
            conn,
            location,
            seen_version: None,
        }
    }

    /// Where the ledger lives (shown as a path, or a URL without its
    /// password).
    pub fn location(&self) -> &LedgerLocation {
        &self.location
    }

    /// Whether another connection committed anything since the last call
    /// (true on the first call). Cheap: no table is read.
    pub fn has_changed(&mut self) -> Result<bool, LedgerError> {
        // SQLite's data_version moves when another connection commits.
        let Some(conn) = self.conn.sqlite() else {
            // PostgreSQL has no such counter: a reader reads again.
            return Ok(true);
        };
        let v: i64 = conn.pragma_query_value(None, "data_version", |r| r.get(0))?;
        let changed = self.seen_version != Some(v);
        self.seen_version = Some(v);
        Ok(changed)
    }

    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}
