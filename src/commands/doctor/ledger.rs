//! The ledger: where it is, that it opens and is sound (SQLite's
//! `quick_check`; on PostgreSQL a connection and a query), and its schema
//! version against this build's. Read through `ledger::health`, which
//! opens it read-only and never migrates it; a SQLite ledger not made yet
//! is fine (the first import makes it).

use std::path::Path;

use docket::ledger::{LedgerError, LedgerLocation};

use super::Check;

/// The ledger's lines into `out`; its place when that could be named (the
/// disk check needs it).
pub(super) fn check(ws: &Path, out: &mut Vec<Check>) -> Option<LedgerLocation> {
    let location = match LedgerLocation::for_workspace(ws) {
        Ok(l) => l,
        Err(e) => {
            out.push(Check::fail(
                "ledger",
                e.to_string(),
                "correct the ledger's URL where it is given: --ledger, DOCKET_LEDGER_URL or [ledger] url in docket.toml",
            ));
            return None;
        }
    };
    // No workspace folder: the config's FAIL says so; nothing to add.
    if let Some(dir) = location.file().and_then(Path::parent)
        && !dir.as_os_str().is_empty()
        && !dir.is_dir()
    {
        return None;
    }
    if !location.exists() {
        out.push(Check::ok(
            "ledger",
            format!("{location}: not there yet (created on first import)"),
        ));
        return Some(location);
    }
    match docket::ledger::health::check(&location) {
        Ok(health) => {
            let how = match &location {
                LedgerLocation::File(_) => "opens read-only; quick_check finds it sound",
                LedgerLocation::Postgres(_) => "connects and answers a query",
            };
            out.push(Check::ok("ledger", format!("{location} {how}")));
            out.push(schema(&location, &health));
        }
        Err(e) => out.push(failed(&location, e)),
    }
    Some(location)
}

fn schema(location: &LedgerLocation, health: &docket::ledger::health::Health) -> Check {
    let (found, known) = (health.version, health.known);
    if health.is_empty() {
        Check::ok(
            "ledger.schema",
            "no docket ledger in it yet (created on first import)",
        )
    } else if health.is_newer() {
        Check::fail(
            "ledger.schema",
            format!(
                "{location} is at schema version {found}, written by a newer docket (this one, {}, knows {known})",
                env!("CARGO_PKG_VERSION")
            ),
            "upgrade docket to the release that wrote this ledger (this one will not open it)",
        )
    } else if health.is_older() {
        Check::ok(
            "ledger.schema",
            format!(
                "schema version {found}, older than this docket's {known}: migrated on the next run or import"
            ),
        )
    } else {
        Check::ok(
            "ledger.schema",
            format!("schema version {found} (this docket's)"),
        )
    }
}

/// A ledger that would not open or check, with what to do about it.
fn failed(location: &LedgerLocation, e: LedgerError) -> Check {
    let fix = match (&e, location) {
        (LedgerError::Damaged { path, .. }, _) => format!(
            "restore {path} from a backup, or salvage it with `sqlite3 {path} .recover | sqlite3 recovered.sqlite` and put that in its place"
        ),
        (LedgerError::Corrupt { path, .. }, _) => format!(
            "move {path} aside (it is not a usable docket ledger) or point --workspace at the folder of the right one"
        ),
        (_, LedgerLocation::Postgres(_)) => {
            "check that the server is up and the URL (--ledger, DOCKET_LEDGER_URL or [ledger] url) and PGPASSWORD are right".to_string()
        }
        (_, LedgerLocation::File(path)) => format!(
            "make {} readable by this user (its folder too)",
            path.display()
        ),
    };
    // The error's own hints are the fix line's: the detail keeps the finding.
    let detail = match &e {
        LedgerError::Damaged { path, detail } => format!("{path} is damaged: {detail}"),
        _ => e.to_string(),
    };
    Check::fail("ledger", detail, fix)
}
