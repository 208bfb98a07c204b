//! Bulk import of items into the SQLite ledger: one write transaction for a
//! whole file and one cached insert statement, so a million items import in
//! a few seconds with flat memory. Idempotent by item id: an id the ledger
//! already has is left untouched.

use crate::db::{Connection, Statement, params};

use super::{Ledger, LedgerError, now_ts};

/// Page cache during an import, as SQLite's negative KiB: 64 MiB.
const IMPORT_CACHE_KIB: i64 = -64 * 1024;

const INSERT_SQL: &str = "INSERT INTO decision \
     (item_id, state, evidence_json, source_file, source_line, imported_at, updated_at) \
     VALUES (?1, 'indeterminate', ?2, ?3, ?4, ?5, ?5) \
     ON CONFLICT(item_id) DO NOTHING";

/// Adding items to the ledger.
pub trait Import {
    /// Start adding the items of `source_file` in one write transaction:
    /// nothing is visible to anyone else until [`ItemBatch::commit`], and a
    /// batch dropped without it keeps nothing.
    fn begin_import(&mut self, source_file: &str) -> Result<Box<dyn ItemBatch + '_>, LedgerError>;
}

/// The items of one import, not yet committed.
pub trait ItemBatch {
    /// Add one undecided item with its evidence (a JSON object) and the
    /// line of the source file it came from. Changes nothing when the
    /// ledger (or this batch) already has the id, and says where it came
    /// from.
    fn add(&mut self, item_id: &str, evidence_json: &str, line: u64) -> Result<Added, LedgerError>;

    /// Keep every item added.
    fn commit(self: Box<Self>) -> Result<(), LedgerError>;

    /// Keep none of them.
    fn rollback(self: Box<Self>) -> Result<(), LedgerError>;
}

impl Import for Ledger {
    fn begin_import(&mut self, source_file: &str) -> Result<Box<dyn ItemBatch + '_>, LedgerError> {
        Ok(Box::new(SqliteBatch::begin(self.conn(), source_file)?))
    }
}

/// What became of one item added to an import.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    New,
    /// The ledger had the id before this import; `same_evidence`: with
    /// the evidence this row has (else the ledger keeps its own).
    AlreadyPresent {
        same_evidence: bool,
    },
    /// An earlier line of this same import had the id.
    EarlierLine {
        line: u64,
        same_evidence: bool,
    },
}

/// An open `BEGIN IMMEDIATE` transaction with its insert statement.
struct SqliteBatch<'c> {
    conn: &'c Connection,
    insert: Statement<'c>,
    /// False once the transaction ended.
    open: bool,
    source_file: String,
    /// Every item of one import has the same `imported_at`.
    now: f64,
    /// The connection's page cache size before the import, restored after.
    cache_before: i64,
}

impl<'c> SqliteBatch<'c> {
    fn begin(conn: &'c Connection, source_file: &str) -> Result<Self, LedgerError> {
        // A larger page cache for the one big transaction keeps the item-id
        // index in memory (random ids would otherwise spill and re-read
        // pages). Bounded, so memory stays flat whatever the file size;
        // restored when the batch ends.
        let cache_before: i64 = match conn.sqlite() {
            Some(c) => {
                let before = c.pragma_query_value(None, "cache_size", |r| r.get(0))?;
                c.pragma_update(None, "cache_size", IMPORT_CACHE_KIB)?;
                before
            }
            None => 0,
        };
        let started = conn
            .execute_batch("BEGIN IMMEDIATE")
            .and_then(|()| conn.prepare_cached(INSERT_SQL));
        let insert = match started {
            Ok(stmt) => stmt,
            Err(e) => {
                if !conn.is_autocommit() {
                    let _ = conn.execute_batch("ROLLBACK");
                }
                if let Some(c) = conn.sqlite() {
                    let _ = c.pragma_update(None, "cache_size", cache_before);
                }
                return Err(e.into());
            }
        };
        Ok(SqliteBatch {
            conn,
            insert,
            open: true,
            source_file: source_file.to_string(),
            now: now_ts(),
            cache_before,
        })
    }

    /// End the transaction with `COMMIT` or `ROLLBACK` and restore the page
    /// cache; the transaction's error comes first.
    fn end(&mut self, sql: &str) -> Result<(), LedgerError> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let ended = self.conn.execute_batch(sql);
        // A COMMIT that failed (the disk is full) leaves the transaction
        // open: roll it back, as a rusqlite Transaction would when dropped.
        if ended.is_err() && !self.conn.is_autocommit() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        let restored = match self.conn.sqlite() {
            Some(c) => c.pragma_update(None, "cache_size", self.cache_before),
            None => Ok(()),
        };
        ended?;
        restored?;
        Ok(())
    }
}

impl ItemBatch for SqliteBatch<'_> {
    fn add(&mut self, item_id: &str, evidence_json: &str, line: u64) -> Result<Added, LedgerError> {
        let line = i64::try_from(line).unwrap_or(i64::MAX);
        let changed = self.insert.execute(params![
            item_id,
            evidence_json,
            self.source_file,
            line,
            self.now
        ])?;
        if changed > 0 {
            return Ok(Added::New);
        }
        // Already there: from this import (the same file and import time),
        // or from before it.
        let (file, first_line, at, evidence): (Option<String>, Option<i64>, Option<f64>, Option<String>) =
            self.conn
                .prepare_cached(
                    "SELECT source_file, source_line, imported_at, evidence_json FROM decision WHERE item_id = ?1",
                )?
                .query_row(params![item_id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })?;
        // The evidence is read with the row anyway: comparing it costs a
        // string compare, only for ids already there.
        let same_evidence = evidence.as_deref() == Some(evidence_json);
        Ok(match (file, first_line, at) {
            (Some(f), Some(l), Some(at)) if f == self.source_file && at == self.now => {
                Added::EarlierLine {
                    line: u64::try_from(l).unwrap_or(0),
                    same_evidence,
                }
            }
            _ => Added::AlreadyPresent { same_evidence },
        })
    }

    fn commit(mut self: Box<Self>) -> Result<(), LedgerError> {
        self.end("COMMIT")
    }

    fn rollback(mut self: Box<Self>) -> Result<(), LedgerError> {
        self.end("ROLLBACK")
    }
}

impl Drop for SqliteBatch<'_> {
    /// A batch abandoned halfway (a read error in the file) keeps nothing.
    fn drop(&mut self) {
        let _ = self.end("ROLLBACK");
    }
}
