//! What this ledger's schema has. A console may open, read-only, a ledger
//! written by an older docket that it must not migrate: a table or column
//! added since is then missing, and the reads that need it return nothing
//! rather than an error.

use crate::db::Connection;

pub(super) fn has_table(conn: &Connection, name: &str) -> crate::db::Result<bool> {
    conn.has_table(name)
}

pub(super) fn has_column(conn: &Connection, table: &str, column: &str) -> crate::db::Result<bool> {
    conn.has_column(table, column)
}
