//! Numbered migrations, applied in order inside one immediate transaction.
//! `PRAGMA user_version` records the last one applied. Never edit a landed one.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::LedgerError;

/// (version, sql) in order.
pub const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("migrations/0001_init.sql")),
    (2, include_str!("migrations/0002_console.sql")),
    (3, include_str!("migrations/0003_review_search.sql")),
    (4, include_str!("migrations/0004_provider_batches.sql")),
    (5, include_str!("migrations/0005_stages.sql")),
    (6, include_str!("migrations/0006_work_queue.sql")),
    (7, include_str!("migrations/0007_search_catch_up.sql")),
    (8, include_str!("migrations/0008_superseded_reviews.sql")),
    (9, include_str!("migrations/0009_batch_progress.sql")),
    (10, include_str!("migrations/0010_audit_reviews.sql")),
    (11, include_str!("migrations/0011_review_corrections.sql")),
    (12, include_str!("migrations/0012_rate_limit_profiles.sql")),
    (13, include_str!("migrations/0013_stale_evidence.sql")),
];

pub fn migrate(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    let current = user_version(conn, path)?;
    if current > known {
        return Err(LedgerError::TooNew {
            path: path.display().to_string(),
            found: current,
            known,
        });
    }
    if current == known {
        return Ok(());
    }
    // A table rebuilt to change a CHECK (0008) is dropped and made again
    // while other tables point at it: SQLite's own procedure for that turns
    // foreign keys off around the transaction (the pragma does nothing
    // inside one) and checks them before the commit instead.
    conn.pragma_update(None, "foreign_keys", "OFF")?;
    let result = migrate_in_transaction(conn, path);
    let back_on = conn.pragma_update(None, "foreign_keys", "ON");
    result?;
    Ok(back_on?)
}

fn migrate_in_transaction(conn: &Connection, path: &Path) -> Result<(), LedgerError> {
    // A plain Connection has no `transaction_with_behavior` without &mut, so
    // drive the immediate transaction by hand.
    let _ = TransactionBehavior::Immediate;
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let result = (|| -> Result<(), LedgerError> {
        // Re-read under the write lock: another process may have migrated meanwhile.
        let current = user_version(conn, path)?;
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            conn.execute_batch(sql)?;
            docket_model::failpoint::hit("mid_migration");
            conn.pragma_update(None, "user_version", version)?;
        }
        let dangling: i64 = conn.query_row(
            "SELECT COUNT(*) FROM pragma_foreign_key_check('review_log')",
            [],
            |r| r.get(0),
        )?;
        if dangling > 0 {
            return Err(LedgerError::Corrupt {
                path: path.display().to_string(),
                detail: format!(
                    "{dangling} review_log row(s) point at review items the ledger does not have"
                ),
            });
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            conn.execute_batch("COMMIT")?;
            Ok(())
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn user_version(conn: &Connection, path: &Path) -> Result<i64, LedgerError> {
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(|e| LedgerError::Corrupt {
            path: path.display().to_string(),
            detail: e.to_string(),
        })
}
