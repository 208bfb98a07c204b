//! What this ledger's schema has. A console may open, read-only, a ledger
//! written by an older docket that it must not migrate: a table or column
//! added since is then missing, and the reads that need it return nothing
//! rather than an error.

use crate::ledger::db::{Connection, OptionalExtension, params};

pub(super) fn has_table(conn: &Connection, name: &str) -> crate::ledger::db::Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1")?
        .query_row(params![name], |_| Ok(()))
        .optional()?
        .is_some())
}

pub(super) fn has_column(
    conn: &Connection,
    table: &str,
    column: &str,
) -> crate::ledger::db::Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM pragma_table_info(?1) WHERE name = ?2")?
        .query_row(params![table, column], |_| Ok(()))
        .optional()?
        .is_some())
}
