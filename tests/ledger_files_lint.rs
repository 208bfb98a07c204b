//! Fault-matrix row D4: docket never opens a ledger file (the database,
//! its `-wal` or `-shm`) with `std::fs`. Closing such a descriptor drops
//! every POSIX lock the process holds on the file, SQLite's included, and
//! a copy read that way can be torn. Ledger files are reached through
//! SQLite only (`VACUUM INTO` and the backup API for copies); their place
//! is checked with access(2) and statfs(2) (`ledger::place`).
//!
//! This reads every source file's non-test code for a `std::fs` open, read,
//! write or copy whose statement (or the lines just before it, where a
//! function's doc says what its `file` is) names the ledger. An open there
//! that is of another file says so on the line above: `not a ledger file`.
//! One ledger file is read with `std::fs`, in `ledger::place` only: the
//! header of a `-shm` whose `-wal` is gone (a `-wal` deleted after a crash),
//! before SQLite opens the ledger; no connection holds a lock on it then.
//! It says so on the line above: `no connection holds it`.

use std::path::{Path, PathBuf};

const OPENS: &[&str] = &[
    "File::open(",
    "File::create(",
    "OpenOptions::new()",
    "fs::read(",
    "fs::read_to_string(",
    "fs::write(",
    "fs::copy(",
];

const LEDGER_WORDS: &[&str] = &["ledger", "sqlite", "LEDGER_FILE", "-wal", "-shm"];

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The lines of a file up to its unit tests.
fn product_code(text: &str) -> Vec<&str> {
    text.lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .collect()
}

#[test]
fn no_ledger_file_is_opened_with_std_fs() {
    // The binary's src/ and every product crate's (the test kit is test
    // code: it reads the logs a test's preloaded shim writes).
    let top = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&top.join("src"), &mut files);
    for e in std::fs::read_dir(top.join("crates")).unwrap().flatten() {
        if e.file_name() != "testkit" {
            sources(&e.path().join("src"), &mut files);
        }
    }
    assert!(files.len() > 50, "found {} source files", files.len());
    let mut found = Vec::new();
    let mut opens = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines = product_code(&text);
        for (i, line) in lines.iter().enumerate() {
            if line.trim_start().starts_with("//") || !OPENS.iter().any(|o| line.contains(o)) {
                continue;
            }
            opens += 1;
            // An open near ledger words that is not of a ledger file says
            // so just above it, with its reason.
            let above = &lines[i.saturating_sub(2)..i];
            if above.iter().any(|l| l.contains("not a ledger file")) {
                continue;
            }
            if f.ends_with("crates/ledger/src/place.rs")
                && above.iter().any(|l| l.contains("no connection holds it"))
            {
                continue;
            }
            // The statement (this line and the next few: a chained open) and
            // what comes just before it (the function's doc often says what
            // a variable like `file` is).
            let statement = lines[i.saturating_sub(6)..(i + 4).min(lines.len())].join(" ");
            if LEDGER_WORDS
                .iter()
                .any(|w| statement.to_lowercase().contains(&w.to_lowercase()))
            {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    // The check reads real code: there are std::fs opens to look at.
    assert!(
        opens > 5,
        "only {opens} std::fs opens found: the patterns are stale"
    );
    assert!(
        found.is_empty(),
        "ledger files opened with std::fs (use SQLite, or ledger::place):\n{}",
        found.join("\n")
    );
}
