//! The ledger as the rest of docket sees it: one handle, opened on a
//! workspace's ledger, on which the ledger's traits are implemented (the
//! console's reads, review decisions, run controls, reports and exports,
//! import, and the engine's work queue, sessions and provider batches).
//! Callers outside `ledger` hold a `Ledger` and call those traits;
//! they never see the SQLite connection behind it, so a second backend
//! (PostgreSQL) can implement the same traits without touching them.

use crate::db::Connection;

use super::LedgerError;
use super::location::LedgerLocation;

/// An open ledger: a SQLite file or a PostgreSQL database.
pub struct Ledger {
    conn: Connection,
    location: LedgerLocation,
    /// The last "has anything changed" answer's marker.
    seen_version: Option<i64>,
    /// PostgreSQL: what the listener heard since `has_changed` last asked.
    changes: Option<Changes>,
}

/// A PostgreSQL ledger's change notifications, for `has_changed`.
struct Changes {
    _listener: super::postgres::Listener,
    notified: std::sync::Arc<std::sync::atomic::AtomicBool>,
    last_poll: std::time::Instant,
}

/// With notifications, a reader still reads this often (a notification
/// lost while the listener reconnects).
const POLL_FALLBACK: std::time::Duration = std::time::Duration::from_secs(1);

impl Ledger {
    /// Open (creating if needed) and migrate the ledger at `at`.
    pub fn open(at: impl Into<LedgerLocation>) -> Result<Ledger, LedgerError> {
        let location = at.into();
        Ok(Ledger::wrap(location.connect(false)?, location))
    }

    /// Open an existing ledger for reading only; fails when there is none.
    pub fn open_read_only(at: impl Into<LedgerLocation>) -> Result<Ledger, LedgerError> {
        let location = at.into();
        Ok(Ledger::wrap(location.connect(true)?, location))
    }

    /// Open a SQLite ledger in a folder docket cannot write, for reading
    /// (see [`super::open_immutable`]).
    pub fn open_immutable(file: &std::path::Path) -> Result<Ledger, LedgerError> {
        let conn = Connection::Sqlite(super::open_immutable(file)?);
        Ok(Ledger::wrap(conn, LedgerLocation::File(file.to_path_buf())))
    }

    fn wrap(conn: Connection, location: LedgerLocation) -> Ledger {
        Ledger {
            conn,
            location,
            seen_version: None,
            changes: None,
        }
    }

    /// Call `on` for each change notified on this ledger (PostgreSQL's
    /// LISTEN, on a thread and a connection of its own) until the listener
    /// is dropped. `None` on SQLite, whose readers poll.
    pub fn listen(
        &self,
        on: impl Fn(super::postgres::Notice) + Send + 'static,
    ) -> Option<super::postgres::Listener> {
        match &self.location {
            LedgerLocation::Postgres(url) => Some(super::postgres::listen((**url).clone(), on)),
            LedgerLocation::File(_) => None,
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
            // PostgreSQL: a change notified (LISTEN), or the fallback poll.
            if self.changes.is_none() {
                let notified = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
                let heard = notified.clone();
                if let Some(listener) = self.listen(move |n| {
                    if n.channel == super::postgres::CHANGE_CHANNEL
                        || n.channel == super::postgres::CONTROL_CHANNEL
                    {
                        heard.store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                }) {
                    self.changes = Some(Changes {
                        _listener: listener,
                        notified,
                        last_poll: std::time::Instant::now(),
                    });
                }
            }
            let Some(c) = self.changes.as_mut() else {
                return Ok(true);
            };
            let heard = c.notified.swap(false, std::sync::atomic::Ordering::Relaxed);
            if heard || c.last_poll.elapsed() >= POLL_FALLBACK {
                c.last_poll = std::time::Instant::now();
                return Ok(true);
            }
            return Ok(false);
        };
        let v: i64 = conn.pragma_query_value(None, "data_version", |r| r.get(0))?;
        let changed = self.seen_version != Some(v);
        self.seen_version = Some(v);
        Ok(changed)
    }

    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Check the whole ledger file before a run writes to it (a SQLite
    /// ledger: `PRAGMA quick_check`; PostgreSQL checks its own pages).
    pub fn quick_check(&self) -> Result<(), LedgerError> {
        match (self.conn.sqlite(), self.location.file()) {
            (Some(conn), Some(path)) => super::quick_check(conn, path),
            _ => Ok(()),
        }
    }

    pub(crate) fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }
}
