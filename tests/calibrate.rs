//! `docket calibrate` and the audit sample, end to end: a real run against
//! the built-in mock with every accepted and rejected item audited, review
//! decisions scripted through the ledger's review API, then the real
//! binary's numbers (counts, Wilson bounds in closed form) and `--apply`
//! writing a docket.toml the loader accepts, byte for byte elsewhere.

use docket_testkit as support;

use std::path::Path;
use std::process::Output;

use docket::ledger::review::{Operator, ReviewDecisions};
use docket_model::calibration::Z95;
use serde_json::Value;
use support::Workspace;

fn docket(ws: &Path, args: &[&str]) -> Output {
    let home = ws.join(".home");
    support::procs::docket_at(ws, &home)
        .args(args)
        .output()
        .expect("docket runs")
}

fn json_of(out: &Output) -> Value {
    assert_eq!(out.status.code(), Some(0), "{}", support::said(out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", support::said(out)))
}

/// A workspace whose routing audits every accepted and rejected item, run
/// once over `items` demo items; its session id.
async fn audited_run(items: usize) -> (Workspace, String) {
    audited_run_with(items, "").await
}

/// The same with `routing` (lines of `[routing]`) added.
async fn audited_run_with(items: usize, routing: &str) -> (Workspace, String) {
    let m = support::mock(Default::default()).await;
    let ws = support::workspace(&support::Job::new(&m.base_url()));
    let toml = ws.path().join("docket.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    let text = text.replace(
        "review_threshold = 0.60\n",
        &format!(
            "review_threshold = 0.60\naudit_accept_share = 1.0\naudit_reject_share = 1.0\n{routing}"
        ),
    );
    std::fs::write(&toml, text).unwrap();
    support::import_demo_items(&ws, items);
    let (report, lines) = support::run(support::options(&ws)).await;
    let sid = report.session_id.expect("a session");
    support::check_invariants(&ws.conn(), &sid);
    drop(lines);
    (ws, sid)
}

/// (review_id, confidence, audit, outcome) of every review item.
fn review_items(ws: &Workspace, sid: &str) -> Vec<(i64, f64, bool, String)> {
    let conn = ws.conn();
    let mut stmt = conn
        .prepare(
            "SELECT r.review_id, r.confidence, r.audit, b.outcome FROM review_item r
             JOIN llm_batch_result b ON b.session_id = r.session_id AND b.item_id = r.item_id
             WHERE r.session_id = ?1 AND r.confidence IS NOT NULL ORDER BY r.review_id",
        )
        .unwrap();
    stmt.query_map([sid], |r| {
        Ok((r.get(0)?, r.get(1)?, r.get::<_, i64>(2)? != 0, r.get(3)?))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_items_go_to_review_and_calibrate_measures_and_applies() {
    let (ws, sid) = audited_run(60).await;
    let items = review_items(&ws, &sid);
    // Every accepted and rejected item is in review too, marked audit; a
    // review-routed one is not; the accepted ones stay decided.
    assert_eq!(items.len(), 60);
    for (_, _, audit, outcome) in &items {
        assert_eq!(*audit, outcome != "review", "{outcome}");
    }
    let conn = ws.conn();
    assert_eq!(
        support::count(
            &conn,
            "SELECT COUNT(*) FROM decision WHERE state = 'decided'",
            []
        ),
        items.iter().filter(|i| i.3 == "accepted").count() as i64
    );
    // Humans agree with every suggestion at or above 0.75, with none below.
    const CUT: f64 = 0.75;
    let (hi, lo): (Vec<_>, Vec<_>) = items.iter().partition(|i| i.1 >= CUT);
    let above = |t: f64| items.iter().filter(|i| i.1 >= t).count();
    assert!(
        above(0.85) >= 1 && hi.len() >= 16 && !lo.is_empty(),
        "{items:?}"
    );
    let ledger = ws.handle();
    let op = Operator::new("ana", "ana@test:1");
    let ids = |v: &[&(i64, f64, bool, String)]| v.iter().map(|i| i.0).collect::<Vec<_>>();
    assert_eq!(ledger.accept(&ids(&hi), &op).unwrap().done.len(), hi.len());
    assert_eq!(ledger.reject(&ids(&lo), &op).unwrap().done.len(), lo.len());

    let v = json_of(&docket(
        ws.path(),
        &["calibrate", "--target-precision", "0.8", "--format", "json"],
    ));
    assert_eq!(v["session_id"], sid.as_str());
    assert_eq!(v["enough"], true);
    assert_eq!(v["reviewed"], 60);
    assert_eq!(v["agreed"], hi.len() as u64);
    let hi_85 = above(0.85);
    assert_eq!(v["audited"], items.iter().filter(|i| i.2).count() as u64);
    // All agreed at or above 0.85: the Wilson bounds are n / (n + z²) and 1.
    let cur = &v["current_precision"];
    let n = hi_85 as f64;
    assert_eq!(cur["threshold"], 0.85);
    assert_eq!(cur["reviewed"], hi_85 as u64);
    assert!(
        (cur["ci_low"].as_f64().unwrap() - n / (n + Z95 * Z95)).abs() < 1e-9,
        "{cur}"
    );
    assert!(
        (cur["ci_high"].as_f64().unwrap() - 1.0).abs() < 1e-9,
        "{cur}"
    );
    // Each band: its items by confidence, all agreed from 0.75, none below;
    // a band with none agreed has the upper bound z² / (n + z²).
    for b in v["bands"].as_array().unwrap() {
        let (blo, bhi) = (b["lo"].as_f64().unwrap(), b["hi"].as_f64().unwrap());
        let last = bhi >= 1.0;
        let inside: Vec<_> = items
            .iter()
            .filter(|i| i.1 >= blo - 1e-9 && (i.1 < bhi - 1e-9 || last))
            .collect();
        assert_eq!(b["reviewed"], inside.len() as u64, "{b}");
        if !inside.is_empty() && blo < CUT - 1e-9 {
            let k = inside.len() as f64;
            assert_eq!(b["agreed"], 0, "{b}");
            assert!((b["ci_high"].as_f64().unwrap() - Z95 * Z95 / (k + Z95 * Z95)).abs() < 1e-9);
        }
    }
    // 0.75 reaches 0.8 (16 or more, all agreed), so the suggestion is 0.75
    // or lower, and the reviews it saves are the items between it and 0.85.
    let s = &v["suggestion"];
    let t = s["auto_accept_threshold"].as_f64().expect("a suggestion");
    assert!((0.6..=CUT).contains(&t), "{s}");
    assert!(s["ci_low"].as_f64().unwrap() >= 0.8, "{s}");
    let confs: Vec<f64> = conn
        .prepare("SELECT confidence FROM llm_batch_result WHERE session_id = ?1 AND confidence IS NOT NULL")
        .unwrap()
        .query_map([&sid], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let fewer = confs
        .iter()
        .filter(|&&c| c >= t - 1e-9 && c < 0.85 - 1e-9)
        .count() as i64;
    assert_eq!(s["review_change"], -fewer, "{s}");

    // The text report says the same, with the chart.
    let out = docket(ws.path(), &["calibrate", "--target-precision", "0.8"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let precision = format!("Precision at auto-accept >= 0.85: {hi_85} of {hi_85} agreed: 100.0%");
    assert!(text.contains(&precision), "{text}");
    assert!(
        text.contains(&format!(
            "lowest auto-accept threshold that reaches it: {t:.2}"
        )),
        "{text}"
    );
    assert!(text.contains('|') && text.contains('#'), "{text}");

    // The run report shows the same calibration as `docket calibrate` at
    // its default target.
    report_agrees_with_calibrate(&ws, &sid);

    // --apply: only the threshold's value changes; the loader accepts it.
    let toml = ws.path().join("docket.toml");
    let before = std::fs::read_to_string(&toml).unwrap();
    let v = json_of(&docket(
        ws.path(),
        &[
            "calibrate",
            "--target-precision",
            "0.8",
            "--apply",
            "--format",
            "json",
        ],
    ));
    assert_eq!(v["applied"]["after"].as_f64(), Some(t));
    let after = std::fs::read_to_string(&toml).unwrap();
    let expected = before.replace(
        "auto_accept_threshold = 0.85\n",
        &format!("auto_accept_threshold = {t}\n"),
    );
    assert_eq!(after, expected);
    let loaded = docket::config::LoadedConfig::load(&toml).unwrap();
    assert_eq!(*loaded.config.routing.auto_accept_threshold.get_ref(), t);
    let events = support::events_of(&ws.conn(), &sid, "config");
    assert_eq!(events.len(), 1, "the change is recorded on the session");
    // Applied again, the value is already there: nothing is written.
    let v = json_of(&docket(
        ws.path(),
        &[
            "calibrate",
            "--target-precision",
            "0.8",
            "--apply",
            "--format",
            "json",
        ],
    ));
    assert_eq!(v["applied"], Value::Null);
    assert_eq!(std::fs::read_to_string(&toml).unwrap(), after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_audit_reject_takes_back_the_auto_accept_and_undo_restores_it() {
    let (ws, sid) = audited_run(20).await;
    let items = review_items(&ws, &sid);
    let accepted: Vec<_> = items.iter().filter(|i| i.3 == "accepted").collect();
    assert!(accepted.len() >= 2, "{items:?}");
    let ledger = ws.handle();
    let op = Operator::new("ana", "ana@test:1");
    let state = |review_id: i64| -> (String, Option<String>) {
        ws.conn()
            .query_row(
                "SELECT d.state, d.decided_by FROM decision d JOIN review_item r ON r.item_id = d.item_id
                 WHERE r.review_id = ?1",
                [review_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap()
    };
    let (a, b) = (accepted[0].0, accepted[1].0);
    ledger.reject(&[a], &op).unwrap();
    assert_eq!(state(a), ("indeterminate".into(), None));
    ledger.undo_last(&op).unwrap().expect("an undo");
    assert_eq!(state(a), ("decided".into(), Some("llm_auto_accept".into())));
    // An accept confirms it as the operator's decision; undo gives it back.
    assert_eq!(ledger.accept(&[b], &op).unwrap().done, vec![b]);
    assert_eq!(state(b), ("decided".into(), Some("review:ana".into())));
    ledger.undo_last(&op).unwrap().expect("an undo");
    assert_eq!(state(b), ("decided".into(), Some("llm_auto_accept".into())));
    // The exports carry the mark.
    let out = docket(
        ws.path(),
        &[
            "export",
            "--what",
            "results",
            "--session",
            &sid,
            "--format",
            "jsonl",
        ],
    );
    let audited = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["audit"] == true)
        .count();
    assert_eq!(audited, items.iter().filter(|i| i.2).count());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_reviews_say_so_and_no_session_is_an_error() {
    let ws = support::workspace(&support::Job::new("http://127.0.0.1:9"));
    support::import_demo_items(&ws, 3);
    let out = docket(ws.path(), &["calibrate"]);
    assert_eq!(out.status.code(), Some(2), "{}", support::said(&out));
    assert!(
        support::said(&out).contains("no session"),
        "{}",
        support::said(&out)
    );
    let out = docket(ws.path(), &["calibrate", "--session", "batch_nope"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        support::said(&out).contains("unknown session"),
        "{}",
        support::said(&out)
    );
    let out = docket(ws.path(), &["calibrate", "--target-precision", "1.5"]);
    assert_eq!(out.status.code(), Some(2));

    let (ws, sid) = audited_run(5).await;
    let items = review_items(&ws, &sid);
    let op = Operator::new("ana", "ana@test:1");
    ws.handle().accept(&[items[0].0], &op).unwrap();
    let before = std::fs::read_to_string(ws.path().join("docket.toml")).unwrap();
    let out = docket(ws.path(), &["calibrate", "--apply"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("at least 10 are needed"), "{text}");
    assert!(!text.contains('%'), "no made-up numbers: {text}");
    let v = json_of(&docket(ws.path(), &["calibrate", "--format", "json"]));
    assert_eq!(v["enough"], false);
    assert_eq!(v["current_precision"]["rate"], Value::Null);
    assert_eq!(v["suggestion"], Value::Null);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("docket.toml")).unwrap(),
        before
    );
}

/// `[routing] target_precision` is recorded with the session and is the
/// target of `docket calibrate` and the report (and the console's page,
/// from the same read); `--target-precision` overrides it for one look; a
/// change of it in docket.toml does not stand in the way of a resume; a
/// target out of range is refused, naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_target_precision_is_what_calibrate_and_the_report_measure_against() {
    let (ws, sid) = audited_run_with(20, "target_precision = 0.9\n").await;
    let items = review_items(&ws, &sid);
    let op = Operator::new("ana", "ana@test:1");
    let ids: Vec<i64> = items.iter().map(|i| i.0).collect();
    ws.handle().accept(&ids, &op).unwrap();
    let v = json_of(&docket(ws.path(), &["calibrate", "--format", "json"]));
    assert_eq!(v["target_precision"].as_f64(), Some(0.9), "{v}");
    report_agrees_with_calibrate(&ws, &sid);
    let v = json_of(&docket(
        ws.path(),
        &[
            "calibrate",
            "--target-precision",
            "0.95",
            "--format",
            "json",
        ],
    ));
    assert_eq!(v["target_precision"].as_f64(), Some(0.95), "{v}");
    let toml = ws.path().join("docket.toml");
    let text = std::fs::read_to_string(&toml).unwrap();
    std::fs::write(
        &toml,
        text.replace("target_precision = 0.9", "target_precision = 0.8"),
    )
    .unwrap();
    let changes = docket::config::LoadedConfig::load(&toml)
        .unwrap()
        .changes_since(&ws.conn().query_row(
            "SELECT json_extract(config_snapshot_json, '$.config') FROM llm_batch_session WHERE session_id = ?1",
            [&sid],
            |r| r.get::<_, String>(0).map(|t| serde_json::from_str::<Value>(&t).unwrap()),
        ).unwrap());
    assert!(changes.is_empty(), "{changes:?}");
    let v = json_of(&docket(ws.path(), &["calibrate", "--format", "json"]));
    assert_eq!(
        v["target_precision"].as_f64(),
        Some(0.9),
        "the session's own"
    );
    std::fs::write(
        &toml,
        std::fs::read_to_string(&toml)
            .unwrap()
            .replace("target_precision = 0.8", "target_precision = 1.5"),
    )
    .unwrap();
    let err = docket::config::LoadedConfig::load(&toml)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("routing.target_precision") && err.contains("1.5 is out of range"),
        "{err}"
    );
}

/// The audit sample and calibrate on a PostgreSQL ledger (migration 0010 on
/// that backend): the audit marks, an audit reject taken back by undo, and
/// the reviewed counts calibrate reads.
#[test]
fn audit_and_calibrate_on_postgres() {
    use docket::ledger::console::ConsoleReads;
    use docket::ledger::{Ledger, LedgerLocation};

    let server = support::pg::PgServer::start();
    let url = server.fresh_database();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path();
    docket::workspace::init(ws, false).unwrap();
    let toml = ws.join("docket.toml");
    // The mock's injected faults off: every item answered.
    let mut text = std::fs::read_to_string(&toml).unwrap().replace(
        "[routing]\n",
        "[routing]\naudit_accept_share = 1.0\naudit_reject_share = 1.0\n",
    );
    for k in ["fail_500", "malformed", "truncated", "wrong_schema"] {
        text = text.replace(&format!("\n{k} = "), &format!("\n{k} = 0.0 # was "));
    }
    std::fs::write(&toml, text).unwrap();
    let items = ws.join("items/test.jsonl");
    let mut f = std::fs::File::create(&items).unwrap();
    docket::demo::write_chart_items(&mut f, 8, 99).unwrap();
    let items = items.to_string_lossy().into_owned();
    let on_pg = |args: &[&str]| {
        support::procs::docket_at(ws, &ws.join(".home"))
            .env("DOCKET_LEDGER_URL", &url)
            .args(args)
            .output()
            .unwrap()
    };
    for args in [
        &["import", items.as_str()][..],
        &["batch-adjudicate", "--yes", "--headless"][..],
    ] {
        let out = on_pg(args);
        assert!(out.status.success(), "{}", support::said(&out));
    }
    let ledger = Ledger::open(LedgerLocation::parse(&url).unwrap()).unwrap();
    let rows = ledger
        .review_page(&docket::watch::ReviewQuery {
            limit: 1_000,
            ..Default::default()
        })
        .unwrap()
        .rows;
    let audited: Vec<i64> = rows
        .iter()
        .filter(|r| r.audit)
        .map(|r| r.review_id)
        .collect();
    assert!(!audited.is_empty(), "{rows:?}");
    let op = Operator::new("ana", "ana@test:1");
    assert_eq!(
        ledger.reject(&audited[..1], &op).unwrap().done,
        audited[..1]
    );
    let undone = ledger.undo_last(&op).unwrap().expect("an undo");
    assert_eq!(undone.review_ids, audited[..1]);
    let ids: Vec<i64> = rows
        .iter()
        .filter(|r| r.confidence.is_some())
        .map(|r| r.review_id)
        .collect();
    assert_eq!(ledger.accept(&ids, &op).unwrap().done.len(), ids.len());
    let v = json_of(&on_pg(&["calibrate", "--format", "json"]));
    assert_eq!(v["reviewed"], ids.len() as u64);
    assert_eq!(v["agreed"], ids.len() as u64);
    assert_eq!(
        v["audited"],
        rows.iter()
            .filter(|r| r.audit && r.confidence.is_some())
            .count() as u64
    );
}

/// `docket report`'s calibration numbers (its `data-key` / `data-value`
/// pairs) equal `docket calibrate --format json`'s, band by band.
fn report_agrees_with_calibrate(ws: &Workspace, sid: &str) {
    let v = json_of(&docket(ws.path(), &["calibrate", "--format", "json"]));
    let html_path = ws.path().join("report.html");
    let out = docket(
        ws.path(),
        &["report", sid, "-o", html_path.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(0), "{}", support::said(&out));
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.contains("<section id=\"calibration\">") && html.contains("Reliability"));
    let re = regex::Regex::new(r#"data-key="(calibration[^"]*)" data-value="([^"]*)""#).unwrap();
    let n: std::collections::BTreeMap<String, f64> = re
        .captures_iter(&html)
        .map(|c| (c[1].to_string(), c[2].parse().unwrap()))
        .collect();
    let close = |key: &str, want: &Value| {
        let got = n
            .get(key)
            .unwrap_or_else(|| panic!("{key} not in the report: {n:?}"));
        assert!(
            (got - want.as_f64().unwrap()).abs() < 1e-9,
            "{key}: {got} vs {want}"
        );
    };
    close("calibration.reviewed", &v["reviewed"]);
    close("calibration.agreed", &v["agreed"]);
    close("calibration.audited", &v["audited"]);
    close("calibration.target", &v["target_precision"]);
    close("calibration.current", &v["current_precision"]["rate"]);
    match v["suggestion"]["auto_accept_threshold"].as_f64() {
        Some(_) => close(
            "calibration.suggested",
            &v["suggestion"]["auto_accept_threshold"],
        ),
        None => assert!(!n.contains_key("calibration.suggested")),
    }
    let mut bands = 0;
    for b in v["bands"].as_array().unwrap() {
        if b["reviewed"].as_u64() == Some(0) {
            continue;
        }
        bands += 1;
        let key = format!("calibration.band.{:.2}", b["lo"].as_f64().unwrap());
        close(&format!("{key}.reviewed"), &b["reviewed"]);
        close(&format!("{key}.agreed"), &b["agreed"]);
        close(&format!("{key}.audited"), &b["audited"]);
        close(&format!("{key}.rate"), &b["rate"]);
    }
    assert!(bands >= 2, "{v}");
    let in_report = n.keys().filter(|k| k.ends_with(".reviewed")).count() - 1;
    assert_eq!(
        in_report, bands,
        "the report lists the bands with reviews, no more"
    );
}
