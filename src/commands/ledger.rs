//! Opening the workspace's ledger for a command (read-only places too),
//! warnings about the place before a run, and `docket ledger copy`.

use std::path::Path;

use docket::ledger::{LEDGER_FILE, Ledger, LedgerLocation};

use super::{fail, say_error};

pub(super) fn with_ledger(ws: &Path, f: impl FnOnce(&Ledger) -> Result<(), String>) -> i32 {
    with_ledger_as(ws, Access::Write, f)
}

/// A command that only reads the ledger: it works in a read-only folder.
pub(super) fn with_ledger_reading(ws: &Path, f: impl FnOnce(&Ledger) -> Result<(), String>) -> i32 {
    with_ledger_as(ws, Access::Read, f)
}

#[derive(Clone, Copy, PartialEq)]
enum Access {
    Read,
    Write,
}

fn with_ledger_as(ws: &Path, access: Access, f: impl FnOnce(&Ledger) -> Result<(), String>) -> i32 {
    let path = match LedgerLocation::for_workspace(ws) {
        Ok(l) => l,
        Err(e) => return fail(e),
    };
    if !path.exists() {
        return fail(format!(
            "{path}: no ledger here yet (import items with `docket import FILE`)"
        ));
    }
    let ledger = match Ledger::open(&path) {
        Ok(l) => l,
        Err(e) => match path.file().filter(|f| !writable_place(f)) {
            // Reading needs no write: open it as it is.
            Some(file) if access == Access::Read => match open_unwritable(file) {
                Ok(l) => l,
                Err(e) => return fail(e),
            },
            Some(file) => {
                return fail(format!(
                    "{e}: {} or its folder is read-only, and this command writes to the ledger \
                     (read-only commands such as `sessions`, `export` and `batch-results` still work)",
                    file.display()
                ));
            }
            None => return fail(e),
        },
    };
    match f(&ledger) {
        Ok(()) => 0,
        Err(e) => fail(e),
    }
}

/// A ledger in a place docket cannot write, for reading. With every
/// change in the file itself (no `-wal` left, or an empty one) it is read
/// as immutable; changes still in a `-wal` file need SQLite's own
/// read-only WAL access, which needs its `-shm` file there too.
fn open_unwritable(file: &Path) -> Result<Ledger, String> {
    let mut wal = file.as_os_str().to_owned();
    wal.push("-wal");
    let pending = std::fs::metadata(Path::new(&wal)).is_ok_and(|m| m.len() > 0);
    if !pending {
        return Ledger::open_immutable(file).map_err(|e| e.to_string());
    }
    Ledger::open_read_only(file)
        .and_then(|l| docket::ledger::work::RunSessions::latest_session(&l).map(|_| l))
        .map_err(|e| {
            format!(
                "{e}: {} is in a read-only place and has changes not yet written into it (its -wal file); \
                 open it once where it can be written (any docket command there merges them), or copy the folder",
                file.display()
            )
        })
}

/// Before a run: a workspace others may write to (row X2), and a SQLite
/// ledger on a network filesystem (row D4).
pub(super) fn warn_about_the_place(ws: &Path) {
    warn_if_others_can_write(ws);
    if let Ok(docket::ledger::location::LedgerLocation::File(file)) =
        docket::ledger::location::LedgerLocation::for_workspace(ws)
    {
        let dir = file
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if let Some(w) = docket::ledger::place::network_warning(dir) {
            eprintln!("docket: warning: {}", docket::sanitize::for_terminal(&w));
        }
    }
}

/// A workspace others may write to can have its prompts, schemas or
/// ledger changed under a run (fault-matrix row X2): say so before a run.
fn warn_if_others_can_write(ws: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut shared = Vec::new();
    for p in [ws.to_path_buf(), ws.join(LEDGER_FILE)] {
        if let Ok(m) = std::fs::metadata(&p)
            && m.permissions().mode() & 0o022 != 0
        {
            shared.push(format!(
                "{} (mode {:04o})",
                p.display(),
                m.permissions().mode() & 0o7777
            ));
        }
    }
    if !shared.is_empty() {
        eprintln!(
            "docket: warning: others can write to {}: they could change the prompts, schemas or ledger under this run (chmod go-w to stop it)",
            shared.join(" and ")
        );
    }
}

/// Whether docket may write the ledger file `file` and its folder (SQLite
/// writes `-wal` and `-shm` files beside it). The file itself is never
/// opened here: closing a second descriptor would drop SQLite's locks.
fn writable_place(file: &Path) -> bool {
    let file_ok = docket::ledger::place::writable(file);
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".docket-write-probe-{}", std::process::id()));
    // not a ledger file: a probe of its own, removed at once.
    let dir_ok = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .map(|_| std::fs::remove_file(&probe))
        .is_ok();
    file_ok && dir_ok
}

/// `docket ledger copy --to URL | --from URL`.
pub(super) fn ledger_copy(ws: &Path, to: Option<String>, from: Option<String>) -> i32 {
    use docket::ledger::copy;
    use docket::ledger::postgres::PgUrl;
    let file = ws.join(LEDGER_FILE);
    let (written, to_postgres) = match (to, from) {
        (Some(to), None) => (to, true),
        (None, Some(from)) => (from, false),
        _ => return fail("give one of --to URL or --from URL"),
    };
    if to_postgres && !file.exists() {
        return fail(format!("{}: no ledger here to copy", file.display()));
    }
    let url = match PgUrl::parse(&written) {
        Ok(u) => u,
        Err(e) => return fail(e),
    };
    let (file_name, url_name) = (file.display().to_string(), url.to_string());
    let (source, target, result) = if to_postgres {
        (file_name, url_name, copy::sqlite_to_postgres(&file, &url))
    } else {
        (url_name, file_name, copy::postgres_to_sqlite(&url, &file))
    };
    match result {
        Ok(report) => {
            println!("copied {} rows from {source} to {target}", report.rows());
            for (table, rows) in &report.tables {
                println!("  {table:<26} {rows:>10}");
            }
            0
        }
        Err(e) => {
            say_error(&e);
            1
        }
    }
}
