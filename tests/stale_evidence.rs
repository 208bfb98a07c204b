//! Stale evidence (issue 13): `docket import --update` replaces the
//! evidence of ids whose content hash changed, reports new / changed /
//! unchanged, marks the answers and review items made on the old evidence
//! stale (queue, exports), and the next run asks again for those items
//! alone, as a new request version: counted at the mock, not in docket's
//! own counters. Without `--update` the import says how many differ and
//! changes nothing. The same on PostgreSQL is in tests/postgres_commands.rs.

#[path = "stale_evidence/scenario.rs"]
mod scenario;

use docket::ledger::console::ConsoleReads;
use docket::ledger::review::ReviewDecisions;
use docket::ledger::{Ledger, LedgerLocation};
use docket::review::Operator;
use docket::watch::ReviewQuery;
use docket_testkit::procs::Mock;
use scenario::{items, json, ok, query, replaced_before_a_resume, update_then_run, workspace};
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

/// A review decided on the old evidence keeps its decision, marked stale
/// (on the card too), and its item is not asked again; the pending review
/// of a changed item shows stale on its card.
#[test]
fn a_decided_review_keeps_its_decision_marked_stale_and_is_not_asked_again() {
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
    let ledger = Ledger::open(LedgerLocation::File(ws.ledger())).unwrap();
    let pending: Vec<(i64, String)> = ledger
        .review_page(&ReviewQuery {
            limit: 100,
            ..ReviewQuery::default()
        })
        .unwrap()
        .rows
        .iter()
        .map(|r| (r.review_id, r.item_id.clone()))
        .collect();
    assert!(pending.len() >= 2, "{pending:?}");
    let (decided_id, decided_item) = pending[0].clone();
    let (open_id, open_item) = pending[1].clone();
    let op = Operator {
        user: "ann".into(),
        claimant: "ann@host:1".into(),
    };
    ledger.accept(&[decided_id], &op).unwrap();

    // Both items' evidence corrected.
    let text = std::fs::read_to_string(&first).unwrap();
    let mut edited = String::new();
    for line in text.lines() {
        let mut row: Value = serde_json::from_str(line).unwrap();
        if row["id"] == decided_item.as_str() || row["id"] == open_item.as_str() {
            row["week"] = Value::String("1999-01-01".into());
        }
        edited.push_str(&row.to_string());
        edited.push('\n');
    }
    let path = ws.path().join("items/edited.jsonl");
    std::fs::write(&path, edited).unwrap();
    let sent = mock.stat("requests");
    let said = ok(
        &ws,
        home,
        None,
        &["import", path.to_str().unwrap(), "--update"],
    );
    assert!(said.contains("0 new, 2 changed, 18 unchanged"), "{said}");
    assert!(
        said.contains("1 pending and 1 decided review items"),
        "{said}"
    );

    let decided = ledger.review_detail(decided_id).unwrap().expect("card");
    assert_eq!((decided.status.as_str(), decided.stale), ("accepted", true));
    let open = ledger.review_detail(open_id).unwrap().expect("card");
    assert_eq!((open.status.as_str(), open.stale), ("pending", true));
    assert_eq!(
        query(
            &ws,
            None,
            &format!(
                "SELECT state || ' ' || decided_by FROM decision WHERE item_id = '{decided_item}'"
            )
        ),
        "decided review:ann",
        "the decision stands"
    );
    let said = ok(
        &ws,
        home,
        None,
        &["batch-adjudicate", "--yes", "--headless"],
    );
    assert!(said.contains("1 item(s) with changed evidence"), "{said}");
    assert_eq!(mock.stat("requests") - sent, 1, "only the undecided one");
    assert_eq!(
        query(
            &ws,
            None,
            &format!(
                "SELECT MAX(request_version) FROM llm_requests WHERE item_id = '{decided_item}'"
            )
        ),
        "1"
    );
}

/// `--update` through the import API: key order is the same evidence, a
/// changed id repeated on a later line of the same file is a repeat (the
/// same evidence) or a bad row (other evidence), as for a new id.
#[test]
fn update_compares_by_hash_and_treats_a_repeated_changed_line_as_a_repeat() {
    // Nothing is sent: no provider behind the URL.
    let ws = docket_testkit::workspace(&docket_testkit::Job::new("http://127.0.0.1:9/v1"));
    let write = |name: &str, text: &str| {
        let p = ws.path().join("items").join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let opts = docket::items::ImportOptions {
        update: true,
        ..Default::default()
    };
    let mut ledger = ws.handle();
    let a = write(
        "a.jsonl",
        "{\"id\":\"a\",\"x\":1,\"y\":2}\n{\"id\":\"b\",\"x\":1}\n",
    );
    let r = docket::items::import_file(&mut ledger, &a, &opts).unwrap();
    assert_eq!((r.imported, r.differing), (2, 0));
    let b = write(
        "b.jsonl",
        "{\"id\":\"a\",\"x\":1,\"y\":3}\n{\"y\":3,\"id\":\"a\",\"x\":1}\n{\"x\":1,\"id\":\"b\"}\n",
    );
    let r = docket::items::import_file(&mut ledger, &b, &opts).unwrap();
    assert_eq!(
        (r.imported, r.differing, r.already_present, r.bad_count),
        (0, 1, 3, 0)
    );
    let c = write(
        "c.jsonl",
        "{\"id\":\"a\",\"x\":1,\"y\":4}\n{\"id\":\"a\",\"x\":1,\"y\":5}\n",
    );
    let r = docket::items::import_file(&mut ledger, &c, &opts).unwrap();
    assert_eq!((r.differing, r.bad_count), (1, 1));
    assert!(
        r.bad_rows[0].reason.contains("duplicate id"),
        "{:?}",
        r.bad_rows
    );
    let kept: Value = serde_json::from_str(&query(
        &ws,
        None,
        "SELECT evidence_json FROM decision WHERE item_id = 'a'",
    ))
    .unwrap();
    assert_eq!(
        kept,
        serde_json::json!({"x": 1, "y": 4}),
        "line 1 replaced it"
    );
}

/// Items and requests from before migration 13 have no hash: the first
/// import that meets an id fills both in from the evidence the ledger has,
/// so a changed one is still asked again, and an unchanged one is not.
#[test]
fn items_from_before_the_hash_get_it_when_an_import_meets_them() {
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
    // As a ledger migrated from 12 has them.
    ws.conn()
        .execute_batch(
            "UPDATE decision SET evidence_hash = NULL; UPDATE llm_requests SET evidence_hash = NULL;",
        )
        .unwrap();
    let sent = mock.stat("requests");
    let edited = items(&ws, "edited.jsonl", true);
    let said = ok(&ws, home, None, &["import", &edited, "--update"]);
    assert!(said.contains("2 new, 3 changed, 15 unchanged"), "{said}");
    assert_eq!(
        query(
            &ws,
            None,
            "SELECT COUNT(*) FROM decision WHERE evidence_hash IS NULL"
        ),
        "2",
        "the two items the file left out keep none until an import meets them"
    );
    ok(
        &ws,
        home,
        None,
        &["batch-adjudicate", "--yes", "--headless"],
    );
    assert_eq!(mock.stat("requests") - sent, 5);
}

/// Evidence replaced while a session waits (paused before it sent
/// anything): the resume sends the new evidence, and its requests record
/// the hash of what they were sent with, not of what the session was made
/// on; so the next run finds nothing stale and pays for nothing twice.
#[test]
fn evidence_replaced_before_a_resume_is_what_its_answers_record() {
    replaced_before_a_resume(None, false);
}

/// The same through the Batch API: a batch line records the hash of the
/// evidence it was rendered from.
#[test]
fn evidence_replaced_before_a_resume_is_what_its_batch_lines_record() {
    replaced_before_a_resume(None, true);
}
