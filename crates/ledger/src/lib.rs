//! The ledger: the source of truth every other part of docket reads and
//! writes through, on SQLite (embedded) or PostgreSQL (one ledger for many
//! machines).
//!
//! This crate owns every SQL statement and both databases' drivers (`db`,
//! `postgres`), the migrations, the writer actor (`writer`), the work queue
//! with its claims, leases and fencing tokens (`queue`, `work`), sessions
//! (`store`), the console's reads (`console`, `watch`), review decisions
//! (`review`), run controls (`control`), reports and exports (`report`) and
//! item import. It may not touch the engine, the providers' HTTP or the
//! terminal: it depends only on `docket-model`, and nothing outside it
//! names rusqlite or postgres.
//!
//! The ledger is the source of truth and the bus between processes. Every
//! connection uses WAL (many readers, one writer), foreign keys and a long busy
//! timeout; writers take `BEGIN IMMEDIATE` so two processes queue for the write
//! lock instead of failing with SQLITE_BUSY halfway through a transaction.

pub mod batches;
pub mod calibration;
pub mod console;
pub mod control;
pub mod copy;
pub mod db;
mod handle;
pub mod health;
pub mod import;
pub mod items;
pub mod location;
mod migrate;
pub mod place;
pub mod postgres;
pub mod profiles;
pub mod queue;
pub mod report;
pub mod rerun;
pub mod review;
pub mod search_index;
mod sqlite_memory;
pub mod store;
mod transaction;
pub mod watch;
pub mod work;
pub mod writer;

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

pub use handle::Ledger;
pub use location::LedgerLocation;
pub use migrate::{MIGRATIONS, migrate};

/// The ledger file name inside a workspace.
pub const LEDGER_FILE: &str = "docket.sqlite";

/// How long a connection waits for another process's write lock before it
/// gives up. Long on purpose: a console or second worker must never see BUSY.
/// A write transaction that still finds the lock held then backs off and
/// tries again, saying "ledger busy" (`db::busy`, fault-matrix row D1).
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment variable that sets the busy timeout in milliseconds
/// instead of [`BUSY_TIMEOUT`] (the D1 tests make it short).
pub const BUSY_TIMEOUT_ENV: &str = "DOCKET_BUSY_TIMEOUT_MS";

/// The busy timeout of every SQLite connection: `DOCKET_BUSY_TIMEOUT_MS`
/// when set to a whole number of milliseconds, else [`BUSY_TIMEOUT`].
pub fn busy_timeout() -> Duration {
    static TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *TIMEOUT.get_or_init(|| {
        std::env::var(BUSY_TIMEOUT_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(BUSY_TIMEOUT, Duration::from_millis)
    })
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("ledger {path} is not a docket ledger or is damaged: {detail}")]
    Corrupt { path: String, detail: String },
    /// SQLite found the file damaged (fault-matrix row D3). docket never
    /// repairs a ledger itself: the hints say how.
    #[error(
        "ledger {path} is damaged: {detail}. docket does not repair it and changes nothing in it: \
         restore it from a backup, or salvage what SQLite can still read into a new file with \
         `sqlite3 {path} .recover | sqlite3 recovered.sqlite` and put that in its place"
    )]
    Damaged { path: String, detail: String },
    #[error(
        "ledger {path} was written by a newer docket (schema version {found}, this build knows {known})"
    )]
    TooNew {
        path: String,
        found: i64,
        known: i64,
    },
    /// A ledger that cannot take what was asked of it (a copy into a
    /// ledger that already holds one, a value it cannot store).
    #[error("ledger {ledger}: {detail}")]
    Refused { ledger: String, detail: String },
    /// A PostgreSQL ledger's failure; `url` has no password in it.
    #[error("ledger {url}: {detail}")]
    Postgres { url: String, detail: String },
    #[error(transparent)]
    Sql(#[from] rusqlite::Error),
    #[error(transparent)]
    Db(#[from] db::Error),
}

/// Open (creating if needed) the ledger at `path` and bring its schema up to date.
pub fn open(path: &Path) -> Result<Connection, LedgerError> {
    refuse_non_file(path)?;
    sqlite_memory::configure();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| LedgerError::Open {
        path: path.display().to_string(),
        source,
    })?;
    configure(&conn).map_err(|e| classify_open_error(path, e))?;
    migrate(&conn, path)?;
    Ok(conn)
}

/// Open an existing ledger read-only (reports, the console). Fails if missing.
pub fn open_read_only(path: &Path) -> Result<Connection, LedgerError> {
    refuse_non_file(path)?;
    sqlite_memory::configure();
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| LedgerError::Open {
        path: path.display().to_string(),
        source,
    })?;
    compile_once(&conn)?;
    conn.busy_timeout(busy_timeout())?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    has_schema(&conn, path)?;
    Ok(conn)
}

/// Open a ledger in a place docket cannot write (a read-only folder or
/// mount) for reading: SQLite's WAL mode would need to create its `-shm`
/// file beside it, so the file is opened as immutable (no locks, no shared
/// memory), which is what it is while nobody can write there.
pub fn open_immutable(path: &Path) -> Result<Connection, LedgerError> {
    refuse_non_file(path)?;
    sqlite_memory::configure();
    let mut uri = String::from("file:");
    // Every byte SQLite's URI parser could misread, and every non-ASCII
    // one (the path's own bytes, not a re-encoding of them), as %XX.
    use std::os::unix::ffi::OsStrExt;
    for &b in path.as_os_str().as_bytes() {
        match b {
            b'?' | b'#' | b'%' => uri.push_str(&format!("%{b:02X}")),
            _ if !b.is_ascii() || b.is_ascii_control() => uri.push_str(&format!("%{b:02X}")),
            _ => uri.push(b as char),
        }
    }
    uri.push_str("?immutable=1");
    let conn = Connection::open_with_flags(
        &uri,
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|source| LedgerError::Open {
        path: path.display().to_string(),
        source,
    })?;
    compile_once(&conn)?;
    has_schema(&conn, path)?;
    Ok(conn)
}

/// A ledger opened without migrating it must already hold docket's schema.
fn has_schema(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| classify_open_error(path, e))?;
    if version == 0 {
        return Err(LedgerError::Corrupt {
            path: path.display().to_string(),
            detail: "no docket schema in it (run `docket init` or `docket import` first)".into(),
        });
    }
    Ok(())
}

/// SQLite's `quick_check` of a whole ledger file (every page's structure,
/// not the indexes' contents): Damaged with the first problems it names.
pub fn quick_check(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
    let mut st = conn
        .prepare("PRAGMA quick_check(5)")
        .map_err(|e| classify_open_error(path, e))?;
    let found: Vec<String> = st
        .query_map([], |r| r.get::<_, String>(0))
        .and_then(|rows| rows.collect())
        .map_err(|e| classify_open_error(path, e))?;
    if found.len() == 1 && found[0] == "ok" {
        return Ok(());
    }
    Err(LedgerError::Damaged {
        path: path.display().to_string(),
        detail: found.join("; ").replace('\n', " "),
    })
}

/// A ledger path that exists must be a regular file (or a link to one): a
/// link to /dev/null gave SQLite's bare "disk I/O error", naming nothing.
fn refuse_non_file(path: &Path) -> Result<(), LedgerError> {
    if let Some(frames) = place::lost_wal_frames(path) {
        let p = path.display();
        return Err(LedgerError::Corrupt {
            path: p.to_string(),
            detail: format!(
                "its write-ahead log {p}-wal is missing, but {p}-shm says it held {frames} page(s) of committed \
                 transactions not yet in {p} (was the -wal deleted after a crash?). Opening it would go on \
                 without them, so docket leaves it as it is: put the -wal back; or, to go on from the last \
                 checkpoint and lose those transactions, delete {p}-shm too"
            ),
        });
    }
    match std::fs::metadata(path) {
        Ok(m) if !m.is_file() => {
            let why = docket_model::files::read_text_file(path)
                .err()
                .map_or_else(|| "not a regular file".to_string(), |e| e.to_string());
            Err(LedgerError::Corrupt {
                path: path.display().to_string(),
                detail: why,
            })
        }
        _ => Ok(()),
    }
}

/// Prepared statements a connection keeps. rusqlite keeps 16 by default,
/// fewer than the writer alone runs per group (intents, attempts, stage
/// ends, outcomes, reviews, counters, claims): each one evicted was
/// compiled again, about 5% of a run's CPU.
const STATEMENT_CACHE: usize = 256;

/// Keep each prepared statement compiled once. Beside a bigger cache
/// (`STATEMENT_CACHE`), the query planner's stability guarantee: without
/// it SQLite marks a statement whose plan could depend on a bound value (a
/// `LIMIT ?`, an equality with `?` the chosen index does not use, as in a
/// join) to be compiled again when that value changes, and rusqlite clears
/// a statement's values each time it goes back to its cache, so such a
/// statement was compiled again on every use: a session's creation spent
/// 40% of its time compiling the one statement that finds an item's
/// request. Every plan is then the one chosen without values, which is
/// the plan a statement's first use gets anyway.
fn compile_once(conn: &Connection) -> rusqlite::Result<()> {
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )?;
    Ok(())
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    compile_once(conn)?;
    conn.busy_timeout(busy_timeout())?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // NORMAL in WAL mode is durable against process crashes (kill -9); only an
    // OS crash or power loss can drop the last commits, never corrupt the file.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    Ok(())
}

fn classify_open_error(path: &Path, e: rusqlite::Error) -> LedgerError {
    let detail = e.to_string();
    if detail.contains("not a database") || detail.contains("malformed") {
        LedgerError::Damaged {
            path: path.display().to_string(),
            detail,
        }
    } else {
        LedgerError::Open {
            path: path.display().to_string(),
            source: e,
        }
    }
}

/// Seconds since the Unix epoch, as stored in every `*_at` column: this
/// machine's clock, moved by `DOCKET_CLOCK_SKEW_SECS` when set (fault
/// injection: a host whose clock is off, fault-matrix row C2). On a
/// PostgreSQL ledger, leases use the server's clock instead
/// (`db::Connection::now`).
pub fn now_ts() -> f64 {
    static SKEW: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    let skew = *SKEW.get_or_init(|| {
        std::env::var("DOCKET_CLOCK_SKEW_SECS")
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite())
            .unwrap_or(0.0)
    });
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
        + skew
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A ledger under a path with non-ASCII and URI-special characters is
    /// read as immutable from exactly that path.
    #[test]
    fn an_immutable_open_reads_the_very_path_it_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("josé ?#%20 ünï");
        std::fs::create_dir(&folder).unwrap();
        let path = folder.join("docket.sqlite");
        {
            let conn = open(&path).unwrap();
            conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
                .unwrap();
        }
        let conn = open_immutable(&path).unwrap();
        let tables: i64 = conn
            .query_row("SELECT COUNT(*) FROM sqlite_master", [], |r| r.get(0))
            .unwrap();
        assert!(tables > 0);
        assert!(open_immutable(&folder.join("none.sqlite")).is_err());
    }

    /// A cached statement whose plan SQLite could tie to a bound value (a
    /// join with an equality on `?`, a `LIMIT ?`) is compiled once, not
    /// again on each use with new values, on every way a ledger opens.
    #[test]
    fn a_cached_statement_is_compiled_once_whatever_its_values() {
        const SQL: &str =
            "SELECT r.request_id FROM llm_requests r JOIN decision d ON d.item_id = r.item_id
             WHERE r.item_id = ?1 AND r.stage = ?2 ORDER BY r.request_version DESC LIMIT ?3";
        let uses = |conn: &Connection| {
            for (i, item) in ["a", "b", "c", "d"].iter().enumerate() {
                let mut stmt = conn.prepare_cached(SQL).unwrap();
                let mut rows = stmt
                    .query(rusqlite::params![item, "s", i as i64 + 1])
                    .unwrap();
                while rows.next().unwrap().is_some() {}
            }
            let stmt = conn.prepare_cached(SQL).unwrap();
            let compiled_again = stmt.get_status(rusqlite::StatementStatus::RePrepare);
            assert_eq!(stmt.get_status(rusqlite::StatementStatus::Run), 4);
            compiled_again
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docket.sqlite");
        let conn = open(&path).unwrap();
        assert_eq!(uses(&conn), 0, "writable");
        conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
            .unwrap();
        assert_eq!(uses(&open_read_only(&path).unwrap()), 0, "read-only");
        drop(conn);
        assert_eq!(uses(&open_immutable(&path).unwrap()), 0, "immutable");
        // The same statement without the guarantee is compiled again on
        // each use: what the test above would catch.
        let bare = rusqlite::Connection::open(&path).unwrap();
        assert!(
            uses(&bare) >= 3,
            "SQLite no longer recompiles: this test cannot fail"
        );
    }
}
