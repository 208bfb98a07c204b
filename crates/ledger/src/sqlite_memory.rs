//! SQLite's memory statistics, turned off.
//!
//! By default SQLite takes a process-wide mutex around every allocation and
//! free to keep statistics that docket never reads; profiled at full speed,
//! that mutex was a few percent of the ledger writer's time. The setting is
//! accepted only before SQLite's first connection, so [`configure`] runs
//! once, before the ledger opens any; if something else opened a connection
//! first, SQLite refuses it and keeps its default, which is correct, only
//! slower. (Routing SQLite's allocations through mimalloc as well was tried:
//! no clear gain in time, 10 MB more peak memory.)

use std::ffi::c_int;
use std::sync::Once;

use rusqlite::ffi;

static CONFIGURE: Once = Once::new();

/// Turn SQLite's memory statistics off, once per process and before the
/// first connection.
pub(super) fn configure() {
    CONFIGURE.call_once(|| {
        // SAFETY: sets SQLite's process-wide configuration; once SQLite has
        // started it returns SQLITE_MISUSE and changes nothing.
        unsafe {
            ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int);
        }
    });
}
