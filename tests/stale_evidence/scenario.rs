//! The stale-evidence scenario (issue 13), shared by tests/stale_evidence.rs
//! (SQLite) and tests/postgres_commands.rs (PostgreSQL, on the cluster that
//! file's tests share): import, run, import the edited file with
//! `--update`, run again, counting at the mock.

use std::path::Path;
use std::process::Output;

use docket::ledger::console::ConsoleReads;
use docket::ledger::{Ledger, LedgerLocation};
use docket::watch::ReviewQuery;
use docket_testkit as support;
use serde_json::Value;
use support::pg::PgServer;
use support::procs::{Mock, docket_at};
use support::{Job, Workspace};

/// Items first imported and run.
const FIRST: usize = 20;
/// Of them, the ones whose evidence the second file changes.
/// (With the mock's seeded answers one was rejected, one auto-accepted and
/// one sent to review; the test reads which from the ledger.)
const CHANGED: [&str; 3] = ["chart-000002", "chart-000005", "chart-000007"];

/// Of them, the ones the second file leaves out.
const LEFT_OUT: [&str; 2] = ["chart-000019", "chart-000020"];

/// A workspace whose provider is the mock process, and a private HOME.
pub fn workspace(mock: &Mock) -> (Workspace, tempfile::TempDir) {
    let ws = support::workspace(&Job::new(&format!("{}/v1", mock.base())));
    (ws, tempfile::tempdir().expect("home"))
}

fn docket(ws: &Workspace, home: &Path, url: Option<&str>, args: &[&str]) -> Output {
    let mut c = docket_at(ws.path(), home);
    c.args(args)
        .env("NO_COLOR", "1")
        // The key of a job on the OpenAI wire (Batch API): the mock takes any.
        .env("DOCKET_TEST_KEY", "sk-test")
        .env_remove("DOCKET_LEDGER_URL")
        .env_remove("PGPASSWORD");
    if let Some(u) = url {
        c.env("DOCKET_LEDGER_URL", u);
    }
    c.output().expect("run docket")
}

/// `docket ARGS`, checked to succeed; its stdout and stderr.
pub fn ok(ws: &Workspace, home: &Path, url: Option<&str>, args: &[&str]) -> String {
    let out = docket(ws, home, url, args);
    let said = support::said(&out);
    assert!(out.status.success(), "docket {}:\n{said}", args.join(" "));
    said
}

/// `docket ARGS`, checked to succeed; its stdout as JSON.
pub fn json(ws: &Workspace, home: &Path, url: Option<&str>, args: &[&str]) -> Value {
    let out = docket(ws, home, url, args);
    assert!(
        out.status.success(),
        "docket {}:\n{}",
        args.join(" "),
        support::said(&out)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The demo items: the first `FIRST` as generated, then (`edited`) the
/// `CHANGED` ones with corrected evidence, two new ones, one unchanged
/// item written with its keys in another order (the same evidence: its
/// hash does not change), and two old ones left out (an id the file does
/// not have is left as it is).
pub fn items(ws: &Workspace, name: &str, edited: bool) -> String {
    let mut buf = Vec::new();
    let n = if edited { FIRST + 2 } else { FIRST };
    docket::demo::write_chart_items(&mut buf, n, 99).unwrap();
    let mut out = String::new();
    for line in String::from_utf8(buf).unwrap().lines() {
        let mut row: Value = serde_json::from_str(line).unwrap();
        let id = row["id"].as_str().unwrap().to_string();
        if edited && LEFT_OUT.contains(&id.as_str()) {
            continue;
        }
        if edited && CHANGED.contains(&id.as_str()) {
            row["title"] = Value::String(format!("{} (corrected)", row["title"]));
        }
        if edited && id == "chart-000004" {
            // Keys reversed: the same evidence.
            let obj = row.as_object().unwrap();
            let reversed: serde_json::Map<String, Value> = obj
                .iter()
                .rev()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            row = Value::Object(reversed);
        }
        out.push_str(&row.to_string());
        out.push('\n');
    }
    let path = ws.path().join("items").join(name);
    std::fs::write(&path, out).unwrap();
    path.display().to_string()
}

/// The records of a JSONL export on stdout.
fn jsonl(said: &str) -> Vec<Value> {
    said.lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// The session a headless run created, from its output.
fn session_of(said: &str) -> String {
    said.lines()
        .find_map(|l| l.strip_prefix("Creating batch session: "))
        .unwrap_or_else(|| panic!("no session created:\n{said}"))
        .trim()
        .to_string()
}

/// One value of the ledger as text: SQLite's file, or psql on PostgreSQL.
pub fn query(ws: &Workspace, pg: Option<(&PgServer, &str)>, sql: &str) -> String {
    match pg {
        Some((server, url)) => server.psql(url, sql),
        None => ws
            .conn()
            .query_row(sql, [], |r| {
                Ok(match r.get::<_, rusqlite::types::Value>(0)? {
                    rusqlite::types::Value::Integer(i) => i.to_string(),
                    rusqlite::types::Value::Text(t) => t,
                    rusqlite::types::Value::Null => String::new(),
                    other => format!("{other:?}"),
                })
            })
            .unwrap_or_else(|e| panic!("{sql}: {e}")),
    }
}

fn in_changed() -> String {
    let ids: Vec<String> = CHANGED.iter().map(|c| format!("'{c}'")).collect();
    format!("({})", ids.join(", "))
}

/// Import, run, import the edited file with `--update`, run again: the
/// counts, the stale marks, and exactly the changed and new items asked
/// at the mock, the changed ones as request version 2 with the new hash.
pub fn update_then_run(pg: Option<&PgServer>) {
    let mock = Mock::start(&[]);
    let (ws, home) = workspace(&mock);
    let home = home.path();
    let url = pg.map(|p| p.url());
    let url = url.as_deref();
    let db = pg.zip(url);
    let first = items(&ws, "first.jsonl", false);
    ok(&ws, home, url, &["import", &first]);
    let s1 = session_of(&ok(
        &ws,
        home,
        url,
        &["batch-adjudicate", "--yes", "--headless"],
    ));
    let sent = mock.stat("requests");
    assert_eq!(sent, FIRST as u64, "the first run asks once per item");
    let pending_changed: i64 = query(
        &ws,
        db,
        &format!(
            "SELECT COUNT(*) FROM review_item WHERE status = 'pending' AND item_id IN {}",
            in_changed()
        ),
    )
    .parse()
    .unwrap();

    let accepted_changed = query(
        &ws,
        db,
        &format!(
            "SELECT COUNT(*) FROM decision WHERE decided_by = 'llm_auto_accept' AND item_id IN {}",
            in_changed()
        ),
    );
    let edited = items(&ws, "edited.jsonl", true);
    let said = ok(&ws, home, url, &["import", &edited, "--update"]);
    assert!(
        said.contains(&format!(
            "marked stale: 3 outcomes, {pending_changed} pending and 0 decided review"
        )) && said.contains(&format!("; {accepted_changed} auto-accept(s) undone.")),
        "{said}"
    );
    assert!(said.contains("2 new, 3 changed, 15 unchanged"), "{said}");
    for id in CHANGED {
        assert!(
            said.contains(&format!("\"{id}\" changed: evidence replaced")),
            "{said}"
        );
    }
    let stale_results = format!(
        "SELECT COUNT(*) FROM llm_batch_result WHERE stale = 1 AND session_id = '{s1}' AND item_id IN {}",
        in_changed()
    );
    assert_eq!(query(&ws, db, &stale_results), "3");
    assert_eq!(
        query(
            &ws,
            db,
            "SELECT COUNT(*) FROM llm_batch_result WHERE stale = 1"
        ),
        "3"
    );
    assert_eq!(
        query(
            &ws,
            db,
            "SELECT COUNT(*) FROM review_item WHERE stale = 1 AND status = 'pending'"
        ),
        pending_changed.to_string()
    );
    // The queue marks them (through the ledger API, on either backend).
    let location = match url {
        Some(u) => LedgerLocation::parse(u).unwrap(),
        None => LedgerLocation::File(ws.ledger()),
    };
    let page = Ledger::open(location)
        .unwrap()
        .review_page(&ReviewQuery {
            limit: 1000,
            ..ReviewQuery::default()
        })
        .unwrap();
    for row in &page.rows {
        assert_eq!(
            row.stale,
            CHANGED.contains(&row.item_id.as_str()),
            "{row:?}"
        );
    }
    assert_eq!(
        page.rows.iter().filter(|r| r.stale).count() as i64,
        pending_changed
    );
    // The exports carry the mark.
    let results = json(&ws, home, url, &["batch-results", &s1, "--format", "json"]);
    let rows = results.as_array().expect("result rows");
    assert_eq!(rows.len(), FIRST);
    for r in rows {
        let id = r["item_id"].as_str().unwrap();
        assert_eq!(r["stale"], Value::Bool(CHANGED.contains(&id)), "{r}");
    }

    for d in jsonl(&ok(
        &ws,
        home,
        url,
        &["export", "--what", "decisions", "--format", "jsonl"],
    )) {
        let id = d["item_id"].as_str().unwrap();
        // The new items have no outcome yet: nothing to be stale.
        let want = match d["last_outcome"] {
            Value::Null => Value::Null,
            _ => Value::Bool(CHANGED.contains(&id)),
        };
        assert_eq!(d["stale"], want, "{d}");
        assert_eq!(d["evidence_hash"].as_str().map(str::len), Some(64), "{d}");
    }
    let said = ok(&ws, home, url, &["batch-adjudicate", "--yes", "--headless"]);
    assert!(
        said.contains("3 item(s) with changed evidence (docket import --update) asked again"),
        "{said}"
    );
    assert_eq!(
        mock.stat("requests") - sent,
        5,
        "only the 3 changed and the 2 new items are asked again"
    );
    let versions = format!(
        "SELECT COUNT(*) FROM llm_requests r JOIN decision d ON d.item_id = r.item_id
         WHERE r.request_version = 2 AND r.status = 'completed' AND r.evidence_hash = d.evidence_hash
           AND r.item_id IN {}",
        in_changed()
    );
    assert_eq!(query(&ws, db, &versions), "3");
    let old = format!(
        "SELECT COUNT(*) FROM llm_requests r JOIN decision d ON d.item_id = r.item_id
         WHERE r.request_version = 1 AND r.evidence_hash != d.evidence_hash AND r.item_id IN {}",
        in_changed()
    );
    assert_eq!(
        query(&ws, db, &old),
        "3",
        "the old answers stay, on the old hash"
    );
    assert_eq!(
        query(
            &ws,
            db,
            "SELECT COUNT(*) FROM llm_requests WHERE request_version > 1"
        ),
        "3",
        "unchanged items are not asked again"
    );
    assert_eq!(
        query(
            &ws,
            db,
            "SELECT COUNT(*) FROM llm_requests WHERE evidence_hash IS NULL"
        ),
        "0",
        "every request records the hash of its evidence"
    );
}

/// Import, run with a budget too small for one request (the session waits,
/// nothing sent), import the edited file with `--update`, resume, run
/// again: what each request records, and what the mock was asked.
pub fn replaced_before_a_resume(pg: Option<&PgServer>, batch: bool) {
    let mock = Mock::start(&["--batch-validating-ms", "50", "--batch-running-ms", "100"]);
    let (ws, home) = workspace(&mock);
    let home = home.path();
    let url = pg.map(|p| p.url());
    let url = url.as_deref();
    let db = pg.zip(url);
    if batch {
        let toml = ws.path().join("docket.toml");
        let job = std::fs::read_to_string(&toml).unwrap();
        let job = job
            .replacen(
                "kind = \"openai_compatible\"",
                "kind = \"openai\"\napi_key_env = \"DOCKET_TEST_KEY\"",
                1,
            )
            .replacen(
                "[stages.gate]",
                "[stages.batch]\nmode = \"batch\"\nmax_wait_secs = 0.3\npoll_interval_secs = 0.1\n\n[stages.gate]",
                1,
            );
        assert!(job.contains("mode = \"batch\""), "{job}");
        std::fs::write(&toml, job).unwrap();
    }
    let first = items(&ws, "first.jsonl", false);
    ok(&ws, home, url, &["import", &first]);
    let run = |extra: &[&str]| {
        let mut args = vec!["batch-adjudicate", "--yes", "--headless"];
        args.extend_from_slice(extra);
        docket(&ws, home, url, &args)
    };
    // A budget too small for one request: the session is made, then waits.
    let out = run(&["--max-cost", "0.0000001"]);
    assert_eq!(out.status.code(), Some(4), "{}", support::said(&out));
    // Requests sent alone and lines answered through the Batch API.
    let chats =
        || mock.stat("requests") + mock.stat("batch_lines_ok") + mock.stat("batch_lines_failed");
    assert_eq!(chats(), 0, "nothing was sent before the pause");
    let session = query(&ws, db, "SELECT session_id FROM llm_batch_session");
    let edited = items(&ws, "edited.jsonl", true);
    ok(&ws, home, url, &["import", &edited, "--update"]);
    let out = run(&["--resume", &session, "--max-cost", "10"]);
    assert_eq!(out.status.code(), Some(0), "{}", support::said(&out));
    assert_eq!(chats(), 20);
    assert_eq!(
        mock.stat("batch_lines_ok") == 20,
        batch,
        "sent through the Batch API when the stage says so"
    );
    // The corrected evidence is what was sent, and what the requests record.
    assert_eq!(
        query(
            &ws,
            db,
            "SELECT COUNT(*) FROM llm_messages WHERE user_prompt LIKE '%(corrected)%'"
        ),
        "3"
    );
    assert_eq!(
        query(
            &ws,
            db,
            "SELECT COUNT(*) FROM llm_requests r JOIN decision d ON d.item_id = r.item_id
             WHERE r.evidence_hash IS DISTINCT FROM d.evidence_hash"
        ),
        "0",
        "every request records the hash of the evidence it was sent with"
    );
    // The next run asks only for the two new items.
    let out = run(&[]);
    let said = support::said(&out);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(!said.contains("changed evidence"), "{said}");
    assert_eq!(chats(), 22, "only the 2 new items are asked");
}
