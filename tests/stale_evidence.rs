//! Stale evidence (issue 13): `docket import --update` replaces the
//! evidence of ids whose content hash changed, reports new / changed /
//! unchanged, marks the answers and review items made on the old evidence
//! stale (queue, exports), and the next run asks again for those items
//! alone, as a new request version: counted at the mock, not in docket's
//! own counters. Without `--update` the import says how many differ and
//! changes nothing. The same on PostgreSQL is in tests/postgres_commands.rs.

#[path = "stale_evidence/scenario.rs"]
mod scenario;

use docket_testkit::procs::Mock;
use scenario::{items, json, ok, query, update_then_run, workspace};
use serde_json::Value;

#[test]
fn import_update_marks_stale_and_the_next_run_asks_only_those_again() {
    update_then_run(None);
}

#[test]
fn import_without_update_reports_the_changed_items_and_changes_nothing() {
    let mock = Mock::start(&[]);
    let (ws, home) = workspace(&mock);
    let home = home.path();
    let first = items(&ws, "first.jsonl", false);
    ok(&ws, home, None, &["import", &first]);
    ok(
        &ws,
        home,
        None,
        &["batch-adjudicate", "--yes", "--headless"],
    );
    let before = query(
        &ws,
        None,
        "SELECT group_concat(evidence_json, '|') FROM decision",
    );
    let edited = items(&ws, "edited.jsonl", true);
    let said = ok(&ws, home, None, &["import", &edited]);
    assert!(
        said.contains("(3 of them with different content: the ledger keeps what it has)"),
        "{said}"
    );
    assert!(
        said.contains("`docket import --update` replaces their evidence"),
        "{said}"
    );
    let report = json(
        &ws,
        home,
        None,
        &["import", &edited, "--output-format", "json"],
    );
    assert_eq!(
        (
            report["new"].as_u64(),
            report["changed"].as_u64(),
            report["unchanged"].as_u64()
        ),
        (Some(0), Some(3), Some(17))
    );
    assert_eq!(report["updated"], Value::Bool(false));
    // Nothing changed but the two new items.
    let now = query(
        &ws,
        None,
        "SELECT group_concat(evidence_json, '|') FROM decision WHERE item_id NOT IN ('chart-000021', 'chart-000022')",
    );
    assert_eq!(before, now);
    assert_eq!(
        query(
            &ws,
            None,
            "SELECT COUNT(*) FROM llm_batch_result WHERE stale = 1"
        ),
        "0"
    );
    assert_eq!(
        query(
            &ws,
            None,
            "SELECT COUNT(*) FROM review_item WHERE stale = 1"
        ),
        "0"
    );
}
