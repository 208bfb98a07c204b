//! Bulk import of items into the SQLite ledger: one write transaction for a
//! whole file and one cached insert statement, so a million items import in
//! a few seconds with flat memory. Idempotent by item id: an id the ledger
//! already has is left untouched, unless the import replaces changed
//! evidence ([`ItemBatch::replace`], `docket import --update`).
//!
//! Evidence is compared by its content hash (`docket_model::evidence`).
//! Items imported before migration 13 have none: theirs is computed and
//! stored when an import next meets their id (their requests' hashes too:
//! they were made on that evidence).

use docket_model::evidence::Evidence;

use crate::db::{Connection, Statement, params};

use super::{Ledger, LedgerError, now_ts};

/// Page cache during an import, as SQLite's negative KiB: 64 MiB.
const IMPORT_CACHE_KIB: i64 = -64 * 1024;

const INSERT_SQL: &str = "INSERT INTO decision \
     (item_id, state, evidence_json, source_file, source_line, imported_at, updated_at, evidence_hash) \
     VALUES (?1, 'indeterminate', ?2, ?3, ?4, ?5, ?5, ?6) \
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
    /// Add one undecided item with its evidence (a JSON object, and its
    /// hash) and the line of the source file it came from. Changes nothing
    /// when the ledger (or this batch) already has the id, and says where
    /// it came from.
    fn add(&mut self, item_id: &str, evidence: &Evidence, line: u64) -> Result<Added, LedgerError>;

    /// Replace the evidence of `item_id` (which the ledger has, with other
    /// evidence: `add` said `AlreadyPresent { same_evidence: false }`) and
    /// mark what was made on the old one stale: its outcomes, its review
    /// items (a decided one keeps its decision). An auto-accept made on it
    /// is undone, so the next run asks again; a human's decision stays.
    /// The item then says it came from this line of this import, so a
    /// later line of the same file with the id is a repeat (or a bad row).
    fn replace(
        &mut self,
        item_id: &str,
        evidence: &Evidence,
        line: u64,
    ) -> Result<Replaced, LedgerError>;

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
    /// the evidence this row has, by content hash (else the ledger keeps
    /// its own, unless the import replaces it: [`ItemBatch::replace`]).
    AlreadyPresent {
        same_evidence: bool,
    },
    /// An earlier line of this same import had the id.
    EarlierLine {
        line: u64,
        same_evidence: bool,
    },
}

/// Whether an answer asked on evidence hash `asked_on` was made on other
/// evidence than the item's as it is now (`now`): both known and
/// different. A request or item from before migration 13 without a hash
/// is not stale on that account (an import that meets the item fills both
/// in before it replaces anything).
pub fn other_evidence(asked_on: &Option<String>, now: &Option<String>) -> bool {
    matches!((asked_on, now), (Some(a), Some(b)) if a != b)
}

/// What replacing one item's evidence marked stale.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replaced {
    /// Outcomes (`llm_batch_result` rows) made on the old evidence.
    pub outcomes: u64,
    /// Pending review items made on it: they no longer keep the item out
    /// of the next run.
    pub pending_reviews: u64,
    /// Decided review items made on it (their decision stands).
    pub decided_reviews: u64,
    /// Auto-accepts made on it, undone (0 or 1 per item): the next run
    /// asks again.
    pub auto_accepts_undone: u64,
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
    fn add(&mut self, item_id: &str, evidence: &Evidence, line: u64) -> Result<Added, LedgerError> {
        let line = i64::try_from(line).unwrap_or(i64::MAX);
        let changed = self.insert.execute(params![
            item_id,
            evidence.json,
            self.source_file,
            line,
            self.now,
            evidence.hash
        ])?;
        if changed > 0 {
            return Ok(Added::New);
        }
        // Already there: from this import (the same file and import time),
        // or from before it.
        type Row = (Option<String>, Option<i64>, Option<f64>, Option<String>);
        let (file, first_line, at, stored): Row = self
            .conn
            .prepare_cached(
                "SELECT source_file, source_line, imported_at, evidence_hash FROM decision WHERE item_id = ?1",
            )?
            .query_row(params![item_id], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
            })?;
        let stored = match stored {
            Some(h) => h,
            None => self.backfill_hash(item_id)?,
        };
        let same_evidence = stored == evidence.hash;
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

    fn replace(
        &mut self,
        item_id: &str,
        evidence: &Evidence,
        line: u64,
    ) -> Result<Replaced, LedgerError> {
        let line = i64::try_from(line).unwrap_or(i64::MAX);
        let c = self.conn;
        c.prepare_cached(
            "UPDATE decision SET evidence_json = ?2, evidence_hash = ?3, updated_at = ?4, imported_at = ?4,
                 source_file = ?5, source_line = ?6
             WHERE item_id = ?1",
        )?
        .execute(params![
            item_id,
            evidence.json,
            evidence.hash,
            self.now,
            self.source_file,
            line
        ])?;
        // An auto-accept judged the old evidence: undone, so the next run
        // asks again. A human's decision stays (its review item is marked).
        let undone = c
            .prepare_cached(
                "UPDATE decision SET state = 'indeterminate', decided_answer_json = NULL, decided_by = NULL,
                     decided_at = NULL, confidence = NULL, model_id = NULL, adjudication_id = NULL
                 WHERE item_id = ?1 AND decided_by = 'llm_auto_accept'",
            )?
            .execute(params![item_id])?;
        let outcomes = c
            .prepare_cached(
                "UPDATE llm_batch_result SET stale = 1 WHERE item_id = ?1 AND stale = 0",
            )?
            .execute(params![item_id])?;
        let pending_reviews = c
            .prepare_cached(
                "UPDATE review_item SET stale = 1 WHERE item_id = ?1 AND stale = 0 AND status = 'pending'",
            )?
            .execute(params![item_id])?;
        let decided_reviews = c
            .prepare_cached(
                "UPDATE review_item SET stale = 1 WHERE item_id = ?1 AND stale = 0 AND status != 'pending'",
            )?
            .execute(params![item_id])?;
        Ok(Replaced {
            outcomes: outcomes as u64,
            pending_reviews: pending_reviews as u64,
            decided_reviews: decided_reviews as u64,
            auto_accepts_undone: undone as u64,
        })
    }

    fn commit(mut self: Box<Self>) -> Result<(), LedgerError> {
        self.end("COMMIT")
    }

    fn rollback(mut self: Box<Self>) -> Result<(), LedgerError> {
        self.end("ROLLBACK")
    }
}

impl SqliteBatch<'_> {
    /// The hash of an item imported before migration 13, computed from the
    /// evidence it has and stored, with its requests' (they were made on
    /// that evidence).
    fn backfill_hash(&self, item_id: &str) -> Result<String, LedgerError> {
        let evidence: String = self
            .conn
            .prepare_cached("SELECT evidence_json FROM decision WHERE item_id = ?1")?
            .query_row(params![item_id], |r| r.get(0))?;
        let hash = docket_model::evidence::evidence_hash(&evidence);
        self.conn
            .prepare_cached("UPDATE decision SET evidence_hash = ?2 WHERE item_id = ?1")?
            .execute(params![item_id, hash])?;
        self.conn
            .prepare_cached(
                "UPDATE llm_requests SET evidence_hash = ?2 WHERE item_id = ?1 AND evidence_hash IS NULL",
            )?
            .execute(params![item_id, hash])?;
        Ok(hash)
    }
}

impl Drop for SqliteBatch<'_> {
    /// A batch abandoned halfway (a read error in the file) keeps nothing.
    fn drop(&mut self) {
        let _ = self.end("ROLLBACK");
    }
}
