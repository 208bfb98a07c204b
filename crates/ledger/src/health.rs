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
            let conn = super::open_read_only(path)?;
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
