//! The write transaction the ledger's decisions and controls run in.
//!
//! SQLite's `BEGIN IMMEDIATE` takes the write lock before the first read, so
//! two consoles (or a console and the CLI) deciding the same item cannot
//! both pass the checks: the second waits for the first to commit and then
//! sees its decision.

use crate::db::Connection;

/// Run `f` inside one write transaction, committed when `f` returns `Ok`
/// and rolled back otherwise.
///
/// A plain `&Connection` cannot open a rusqlite `Transaction` (that needs
/// `&mut`), so this drives it by hand, as the migrations do.
pub(crate) fn write_transaction<T, E>(
    conn: &Connection,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, E>
where
    E: From<crate::db::Error>,
{
    // Waits out another process's lock held past the busy timeout.
    conn.begin_write()?;
    match f() {
        Ok(v) => match conn.execute_batch("COMMIT") {
            Ok(()) => Ok(v),
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                Err(e.into())
            }
        },
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
