//! The ledger as the rest of docket sees it: one handle, opened on a
//! workspace's ledger, on which the ledger's traits are implemented (the
//! console's reads, review decisions, run controls, reports and exports,
//! import, and the engine's work queue, sessions and provider batches).
//! Callers outside `ledger` hold a `Ledger` and call those traits;
//! they never see the SQLite connection behind it, so a second backend
//! (PostgreSQL) can implement the same traits without touching them.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::LedgerError;

/// An open ledger (today: a SQLite file).
pub struct Ledger {
    conn: Connection,
    path: PathBuf,
    /// The last "has anything changed" answer's marker.
    seen_version: Option<i64>,
}

impl Ledger {
    /// Open (creating if needed) and migrate the ledger at `path`.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        Ok(Ledger::wrap(super::open(path)?, path))
    }

    /// Open an existing ledger for reading only; fails when there is none.
    pub fn open_read_only(path: &Path) -> Result<Ledger, LedgerError> {
        Ok(Ledger::wrap(super::open_read_only(path)?, path))
    }

    fn wrap(conn: Connection, path: &Path) -> Ledger {
        Ledger {
            conn,
            path: path.to_path_buf(),
            seen_version: None,
        }
    }

    /// Where the ledger lives (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether another connection committed anything since the last call
    /// (true on the first call). Cheap: no table is read.
    pub fn has_changed(&mut self) -> Result<bool, LedgerError> {
        // SQLite's data_version moves when another connection commits.
        let v: i64 = self
            .conn
            .pragma_query_value(None, "data_version", |r| r.get(0))?;
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
