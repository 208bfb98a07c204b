//! `docket items rm`: removing items nothing was sent for yet, chosen by id,
//! from a file of ids, by a field their evidence lacks, or because the
//! job's templates cannot render their prompt. Items are matched in docket
//! (a JSON path walked in Rust, the templates rendered), never by SQL the
//! operator writes.

use std::ops::ControlFlow;
use std::path::Path;

use docket::items::TemplateCheck;
use docket::ledger::Ledger;
use docket::ledger::items::ItemRemoval;
use docket::ledger::store::{Candidate, CandidateFilter};
use docket::ledger::work::RunSessions;
use docket::sanitize::for_terminal;
use serde_json::Value;

use super::ledger::with_ledger;
use super::{EXIT_USAGE, fail, say_error};
use crate::cli::ItemsRmArgs;

/// `docket items rm`. Exit 0 when every item asked for was removed (or
/// nothing matched a filter), 2 when an id is unknown or an item is kept.
pub(super) fn rm(ws: &Path, args: ItemsRmArgs) -> i32 {
    if args.ids.is_empty()
        && args.ids_from.is_none()
        && args.missing.is_none()
        && !args.unrenderable
    {
        return fail(
            "items rm: name the items: IDs, --ids-from FILE, --missing FIELD or --unrenderable (see `docket items rm --help`)",
        );
    }
    let config = ws.join(docket::config::CONFIG_FILE);
    if !config.exists() {
        return fail(format!(
            "{}: no docket.toml here, so this is not a docket workspace (create one with `docket init {}`, or pass --workspace DIR)",
            ws.display(),
            ws.display()
        ));
    }
    let mut ids = args.ids.clone();
    if let Some(file) = &args.ids_from {
        match read_ids(file) {
            Ok(more) => ids.extend(more),
            Err(e) => return fail(format!("{}: {e}", file.display())),
        }
    }
    let check = if args.unrenderable {
        match TemplateCheck::load(&config) {
            Ok(c) => Some(c),
            Err(e) => return fail(format!("--unrenderable: {e}")),
        }
    } else {
        None
    };
    let mut code = 0;
    let status = with_ledger(ws, |ledger| {
        if args.missing.is_some() || check.is_some() {
            ids.extend(matching(ledger, args.missing.as_deref(), check.as_ref())?);
        }
        code = remove(ledger, &ids, args.dry_run)?;
        Ok(())
    });
    if status != 0 { status } else { code }
}

/// Ids from a file: one a line; blank lines and `#` comments skipped.
fn read_ids(file: &Path) -> std::io::Result<Vec<String>> {
    let text = docket_model::files::read_text_file(file)?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect())
}

/// The undecided items whose evidence lacks `missing`, or whose prompt the
/// job's templates cannot render.
fn matching(
    ledger: &Ledger,
    missing: Option<&str>,
    check: Option<&TemplateCheck>,
) -> Result<Vec<String>, String> {
    let mut found = Vec::new();
    let filter = CandidateFilter {
        limit: None,
        // Every indeterminate item, those awaiting review too (rm names why
        // it keeps them).
        rereview_pending: true,
    };
    let mut each = |c: Candidate| {
        let lacks = missing.is_some_and(|path| {
            serde_json::from_str::<Value>(&c.evidence_json)
                .map(|v| lacks_field(&v, path))
                .unwrap_or(true)
        });
        let unrenderable = check.is_some_and(|t| t.check(&c.item_id, &c.evidence_json).is_err());
        if lacks || unrenderable {
            found.push(c.item_id);
        }
        ControlFlow::Continue(())
    };
    ledger
        .for_each_candidate(filter, &mut each)
        .map_err(|e| e.to_string())?;
    Ok(found)
}

/// Whether `evidence` has nothing (or null) at the dotted `path`.
fn lacks_field(evidence: &Value, path: &str) -> bool {
    let mut at = evidence;
    for key in path.split('.') {
        match at.get(key) {
            Some(v) => at = v,
            None => return true,
        }
    }
    at.is_null()
}

/// Remove `ids` and say what became of each; the exit code.
fn remove(ledger: &Ledger, ids: &[String], dry_run: bool) -> Result<i32, String> {
    if ids.is_empty() {
        println!("No item matched: nothing removed.");
        return Ok(0);
    }
    let done = ledger
        .remove_items(ids, dry_run)
        .map_err(|e| e.to_string())?;
    let verb = if dry_run { "would remove" } else { "removed" };
    for (id, sessions) in &done.removed {
        let from = if sessions.is_empty() {
            String::new()
        } else {
            format!(
                " (and its error outcome from session {}: nothing was ever sent for it; the session's counts drop by one)",
                sessions.join(", ")
            )
        };
        println!("{verb} {}{from}", for_terminal(id));
    }
    for (id, why) in &done.kept {
        say_error(format!("kept {}: {why}", for_terminal(id)));
    }
    for id in &done.unknown {
        say_error(format!("no item {} in this ledger", for_terminal(id)));
    }
    println!(
        "{} {} item{}{}{}",
        if dry_run { "Would remove" } else { "Removed" },
        done.removed.len(),
        if done.removed.len() == 1 { "" } else { "s" },
        if done.kept.is_empty() {
            String::new()
        } else {
            format!("; {} kept", done.kept.len())
        },
        if done.unknown.is_empty() {
            String::new()
        } else {
            format!("; {} unknown", done.unknown.len())
        },
    );
    Ok(if done.kept.is_empty() && done.unknown.is_empty() {
        0
    } else {
        EXIT_USAGE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_field_is_found_by_its_path() {
        let v = serde_json::json!({"title": "t", "meta": {"year": 1999, "none": null}});
        assert!(!lacks_field(&v, "title"));
        assert!(!lacks_field(&v, "meta.year"));
        assert!(lacks_field(&v, "meta.none"));
        assert!(lacks_field(&v, "meta.month"));
        assert!(lacks_field(&v, "artist"));
        assert!(lacks_field(&v, "title.x"));
    }
}
