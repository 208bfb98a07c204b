//! The PostgreSQL ledger's migrations: the same numbers as SQLite's, in
//! PostgreSQL's dialect, applied in one transaction under an advisory lock,
//! so workers that start together on a new database never race (the second
//! waits, then finds the schema current). `docket_schema` holds the version.

use super::super::LedgerError;
use super::PgUrl;

/// (version, sql) in order; version for version the same as
/// `ledger::MIGRATIONS`.
pub const PG_MIGRATIONS: &[(i64, &str)] = &[
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

/// The schema version this docket writes.
fn known_version() -> i64 {
    PG_MIGRATIONS.last().map_or(0, |m| m.0)
}

/// The advisory lock's key: "docket" in ASCII. Any process migrating a
/// docket ledger takes it; nothing else in a shared database is likely to.
const MIGRATION_LOCK: i64 = 0x646f_636b_6574;

/// Bring the schema at `client` up to date (creating it on an empty
/// database); refuse a ledger from a newer docket.
pub fn migrate(client: &mut postgres::Client, url: &PgUrl) -> Result<(), LedgerError> {
    let known = known_version();
    let mut tx = client.transaction().map_err(|e| url.db_error(&e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(|e| url.db_error(&e))?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS docket_schema (version BIGINT NOT NULL)")
        .map_err(|e| url.db_error(&e))?;
    let current: i64 = match tx
        .query_opt("SELECT version FROM docket_schema", &[])
        .map_err(|e| url.db_error(&e))?
    {
        Some(row) => row.get(0),
        None => {
            tx.execute("INSERT INTO docket_schema (version) VALUES (0)", &[])
                .map_err(|e| url.db_error(&e))?;
            0
        }
    };
    if current > known {
        return Err(LedgerError::TooNew {
            path: url.redacted().to_string(),
            found: current,
            known,
        });
    }
    for (version, sql) in PG_MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.batch_execute(sql)
            .map_err(|e| url.error(format!("migration {version}: {}", detail(&e))))?;
        docket_model::failpoint::hit("mid_migration");
        tx.execute("UPDATE docket_schema SET version = $1", &[version])
            .map_err(|e| url.db_error(&e))?;
    }
    retry_search_index(&mut tx, url)?;
    tx.commit().map_err(|e| url.db_error(&e))
}

/// The review search's trigram index, when migration 3 could not make it
/// (pg_trgm missing, or not allowed, when the ledger was created): tried
/// again on every open, so installing the extension later is enough. The
/// migration's own block, which tolerates the extension still missing.
fn retry_search_index(tx: &mut postgres::Transaction<'_>, url: &PgUrl) -> Result<(), LedgerError> {
    const SEARCH_MIGRATION: i64 = 3;
    let missing: bool = tx
        .query_one("SELECT to_regclass('idx_review_item_search') IS NULL", &[])
        .map_err(|e| url.db_error(&e))?
        .get(0);
    if !missing {
        return Ok(());
    }
    let Some((_, sql)) = PG_MIGRATIONS.iter().find(|(v, _)| *v == SEARCH_MIGRATION) else {
        return Ok(());
    };
    tx.batch_execute(sql)
        .map_err(|e| url.error(format!("the review search index: {}", detail(&e))))
}

/// The server's own message for a failed statement (the driver's Display
/// says only "db error").
pub(crate) fn detail(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut text = format!("{}: {}", db.code().code(), db.message());
            // Where it happened ("COPY decision, line 12"): the row to look at.
            if let Some(place) = db.where_() {
                text.push_str(&format!(" ({place})"));
            }
            text
        }
        None => e.to_string(),
    }
}

/// For a ledger read from (the source of a copy): nothing is written when
/// its schema is current, so a read-only role can read it; an older one is
/// migrated (that needs write rights), a newer one refused, and a database
/// without a docket ledger in it is named as such.
pub fn check_existing(client: &mut postgres::Client, url: &PgUrl) -> Result<(), LedgerError> {
    let known = known_version();
    let has_schema: bool = client
        .query_one("SELECT to_regclass('docket_schema') IS NOT NULL", &[])
        .map_err(|e| url.db_error(&e))?
        .get(0);
    if !has_schema {
        return Err(url.error("it holds no docket ledger (no docket_schema table)"));
    }
    let version: Option<i64> = client
        .query_opt("SELECT version FROM docket_schema", &[])
        .map_err(|e| url.db_error(&e))?
        .map(|row| row.get(0));
    match version {
        Some(v) if v == known => Ok(()),
        Some(v) if v > known => Err(LedgerError::TooNew {
            path: url.redacted().to_string(),
            found: v,
            known,
        }),
        _ => migrate(client, url),
    }
}
