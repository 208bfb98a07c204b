//! A ledger's health, read without changing it (`docket doctor`): it opens,
//! SQLite's `quick_check` finds its pages sound (on PostgreSQL: a
//! connection and a query answer), and the schema version it records
//! against the one this build writes. Nothing is migrated or written: a
//! SQLite file is opened read-only, a PostgreSQL ledger only read.

use super::postgres::{self, PgUrl};
use super::{LedgerError, LedgerLocation, MIGRATIONS};

/// What the ledger's health check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    /// The schema version the ledger records.
    pub version: i64,
    /// The schema version this build writes.
    pub known: i64,
}

impl Health {
    /// The ledger was written by a newer docket: this build refuses it.
    pub fn is_newer(&self) -> bool {
        self.version > self.known
    }

    /// The ledger is older than this build: the next run migrates it.
    pub fn is_older(&self) -> bool {
        self.version < self.known
    }

    /// A PostgreSQL database without a docket ledger in it yet.
    pub fn is_empty(&self) -> bool {
        self.version == 0
    }
}

/// The schema version this build of docket writes.
pub fn known_version() -> i64 {
    MIGRATIONS.last().map_or(0, |m| m.0)
}

/// Check the ledger at `at`, which must exist (a SQLite file that is not
/// there is the caller's case: it is created on first import). A damaged
/// file is `LedgerError::Damaged` (with the hints to restore it), a file
/// that is not a docket ledger `Corrupt`, a server that cannot be reached
/// `Postgres`. A database with no ledger in it yet is version 0, and a
/// version newer than this build's a `Health` the caller judges
/// (`is_newer`).
pub fn check(at: &LedgerLocation) -> Result<Health, LedgerError> {
    match at {
        LedgerLocation::File(path) => {
            let conn = match super::open_read_only(path) {
                Ok(conn) => conn,
                // A place this user cannot write (SQLite cannot make the
                // WAL's -shm there): read the file as immutable instead,
                // as the read-only commands do.
                Err(LedgerError::Open { .. }) => super::open_immutable(path)?,
                Err(e) => return Err(e),
            };
            super::quick_check(&conn, path)?;
            let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
            Ok(Health {
                version,
                known: known_version(),
            })
        }
        LedgerLocation::Postgres(url) => postgres_health(url),
    }
}

/// A connection (no migration), the schema table read, and a query on a
/// table every docket ledger has, so a half-made schema shows too.
fn postgres_health(url: &PgUrl) -> Result<Health, LedgerError> {
    let mut client = postgres::connect(url)?;
    // The client is dropped inside too: its own runtime may not be
    // dropped on one of tokio's worker threads.
    postgres::blocking(move || {
        let has_schema: bool = client
            .query_one("SELECT to_regclass('docket_schema') IS NOT NULL", &[])
            .map_err(|e| url.db_error(&e))?
            .get(0);
        // A database docket has not written yet: the first import or run
        // makes the ledger in it, as in a SQLite file not there yet.
        if !has_schema {
            return Ok(Health {
                version: 0,
                known: known_version(),
            });
        }
        let version: i64 = client
            .query_opt("SELECT version FROM docket_schema", &[])
            .map_err(|e| url.db_error(&e))?
            .map_or(0, |row| row.get(0));
        let known = known_version();
        if version > 0 && version <= known {
            client
                .query_one("SELECT COUNT(*) FROM decision", &[])
                .map_err(|e| url.db_error(&e))?;
        }
        Ok(Health { version, known })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ledger just made is current; one stamped newer is judged newer,
    /// and the check changes nothing in it; garbage is Damaged.
    #[test]
    fn the_check_reads_the_version_and_finds_damage_without_writing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docket.sqlite");
        drop(crate::open(&path).unwrap());
        let at = LedgerLocation::File(path.clone());
        let health = check(&at).unwrap();
        assert_eq!(health.version, known_version());
        assert!(!health.is_newer() && !health.is_older() && !health.is_empty());
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.pragma_update(None, "user_version", known_version() + 1)
            .unwrap();
        drop(conn);
        assert!(check(&at).unwrap().is_newer());
        let conn = rusqlite::Connection::open(&path).unwrap();
        let still: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(still, known_version() + 1, "the check migrated it");
        drop(conn);
        std::fs::write(&path, b"not a database ".repeat(500)).unwrap();
        let _ = std::fs::remove_file(dir.path().join("docket.sqlite-wal"));
        let _ = std::fs::remove_file(dir.path().join("docket.sqlite-shm"));
        assert!(
            matches!(check(&at), Err(LedgerError::Damaged { .. })),
            "{:?}",
            check(&at)
        );
    }
}
