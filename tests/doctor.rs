//! `docket doctor` (issue 15), the real binary on real workspaces: a
//! healthy one against the built-in mock (every check ok, exit 0, JSON
//! that parses), and each failure it checks: a broken docket.toml, a key
//! variable not set, a provider that cannot be reached or refuses its key,
//! a damaged ledger, a ledger from a newer docket, a disk under the run's
//! floor, and the terminal's warnings. Doctor never writes the ledger.

use docket_testkit as support;

use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;
use support::*;

/// `docket doctor --format json` on `ws` in a healthy-terminal
/// environment (UTF-8, colour), with `env` on top.
fn doctor(ws: &Path, env: &[(&str, &str)], args: &[&str]) -> Output {
    let home = ws.join(".home");
    let mut c: Command = support::procs::docket_at(ws, &home);
    c.arg("doctor")
        .args(args)
        .stdin(Stdio::null())
        .env_remove("NO_COLOR")
        .env_remove("LC_ALL")
        .env_remove("LC_CTYPE")
        .env_remove("DOCKET_LEDGER_URL")
        .env_remove("DOCKET_MIN_FREE_MB")
        .env("LANG", "C.UTF-8")
        .env("TERM", "xterm-256color")
        .env("COLORTERM", "truecolor");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run docket doctor")
}

fn json_of(out: &Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not one JSON document ({e}): {text:?}; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// The check named `name` in a JSON report.
fn check<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {doc:#}"))
}

/// `name`'s status, detail and fix, asserting the status.
fn expect(doc: &Value, name: &str, status: &str) -> (String, String) {
    let c = check(doc, name);
    assert_eq!(c["status"], status, "{name}: {c:#}");
    let text = |k: &str| c[k].as_str().unwrap_or("").to_string();
    if status != "ok" {
        assert!(!text("fix").is_empty(), "{name} has no fix: {c:#}");
    }
    (text("detail"), text("fix"))
}

fn write_toml(ws: &Workspace, from: &str, to: &str) {
    let path = ws.path().join("docket.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{from:?} not in docket.toml");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// The provider made a real one's kind (`openai`) with its key in `var`,
/// still pointed at `base`.
fn openai_kind(ws: &Workspace, var: &str) {
    write_toml(
        ws,
        "kind = \"openai_compatible\"",
        &format!("kind = \"openai\"\napi_key_env = \"{var}\""),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_workspace_is_all_ok_and_exits_0() {
    let (_m, ws) = mocked(Default::default(), 3, |_| {}).await;
    let out = doctor(ws.path(), &[], &["--format", "json"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let doc = json_of(&out);
    assert_eq!(doc["ok"], true, "{doc:#}");
    // Not a terminal here: only the terminal's own two lines warn.
    for c in doc["checks"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        let expected = if ["terminal.tty", "terminal.size"].contains(&name) {
            "warn"
        } else {
            "ok"
        };
        assert_eq!(c["status"], expected, "{c:#}");
        for key in ["name", "status", "detail", "fix"] {
            assert!(c.get(key).is_some(), "{key} missing in {c:#}");
        }
    }
    let (reach, _) = expect(&doc, "provider.main.reach", "ok");
    assert!(reach.contains("answers"), "{reach}");
    let (schema, _) = expect(&doc, "ledger.schema", "ok");
    let known = docket::ledger::health::known_version();
    assert!(schema.contains(&format!("version {known}")), "{schema}");
    expect(&doc, "ledger", "ok");
    expect(&doc, "config", "ok");
    expect(&doc, "templates", "ok");
    expect(&doc, "terminal.utf8", "ok");
    expect(&doc, "terminal.colour", "ok");
    // The table says the same, with a summary line.
    let table = doctor(ws.path(), &[], &[]);
    assert_eq!(table.status.code(), Some(0), "{}", said(&table));
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("ok    provider.main.reach"), "{text}");
    assert!(text.contains("healthy: 0 failed"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_docket_toml_names_its_line_and_key() {
    let (_m, ws) = mocked(Default::default(), 0, |_| {}).await;
    write_toml(&ws, "max_tokens = 200", "max_tokens = \"lots\"");
    let line = std::fs::read_to_string(ws.path().join("docket.toml"))
        .unwrap()
        .lines()
        .position(|l| l.contains("\"lots\""))
        .unwrap()
        + 1;
    let out = doctor(ws.path(), &[], &["--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let doc = json_of(&out);
    assert_eq!(doc["ok"], false);
    let (detail, fix) = expect(&doc, "config", "fail");
    assert!(
        detail.contains(&format!("docket.toml:{line}:")) && detail.contains("max_tokens"),
        "{detail}"
    );
    assert!(fix.contains(&format!("docket.toml:{line}")), "{fix}");
    // A value out of range: the loader's key, named in the fix.
    write_toml(&ws, "max_tokens = \"lots\"", "max_tokens = 200");
    write_toml(&ws, "review_threshold = 0.60", "review_threshold = 1.7");
    let doc = json_of(&doctor(ws.path(), &[], &["--format", "json"]));
    let (detail, fix) = expect(&doc, "config", "fail");
    assert!(detail.contains("routing.review_threshold"), "{detail}");
    assert!(fix.contains("`routing.review_threshold`"), "{fix}");
    // A template the stage names that is not there.
    write_toml(&ws, "review_threshold = 1.7", "review_threshold = 0.60");
    std::fs::remove_file(ws.path().join("prompts/adjudicate.j2")).unwrap();
    let doc = json_of(&doctor(ws.path(), &[], &["--format", "json"]));
    expect(&doc, "config", "ok");
    let (detail, _) = expect(&doc, "templates", "fail");
    assert!(detail.contains("adjudicate.j2"), "{detail}");
}

#[test]
fn a_folder_without_a_workspace_says_docket_init() {
    let dir = tempfile::tempdir().unwrap();
    let out = doctor(dir.path(), &[], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FAIL  config"), "{text}");
    assert!(text.contains("docket init"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_variable_not_set_fails_and_a_set_one_is_never_shown() {
    let (_m, ws) = mocked(Default::default(), 0, |_| {}).await;
    openai_kind(&ws, "DOCKET_DOCTOR_TEST_KEY");
    let out = doctor(ws.path(), &[], &["--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, fix) = expect(&doc, "provider.main.key", "fail");
    assert!(
        detail.contains("DOCKET_DOCTOR_TEST_KEY is not set"),
        "{detail}"
    );
    assert!(fix.contains("export DOCKET_DOCTOR_TEST_KEY="), "{fix}");
    expect(&doc, "provider.main.reach", "warn");
    // Set: ok, with the fingerprint a session records, never the key.
    let key = "sk-doctorCANARY0123456789";
    let out = doctor(
        ws.path(),
        &[("DOCKET_DOCTOR_TEST_KEY", key)],
        &["--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, _) = expect(&doc, "provider.main.key", "ok");
    assert!(detail.contains("sha256:"), "{detail}");
    expect(&doc, "provider.main.reach", "ok");
    assert!(!said(&out).contains("doctorCANARY"), "{}", said(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_cannot_be_reached_fails_unless_offline() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let ws = workspace(&Job::new(&base));
    let out = doctor(ws.path(), &[], &["--format", "json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, fix) = expect(&doc, "provider.main.reach", "fail");
    assert!(detail.contains(&format!("cannot reach {base}")), "{detail}");
    assert!(fix.contains("providers.main.base_url"), "{fix}");
    // --offline asks nothing: healthy.
    let out = doctor(ws.path(), &[], &["--format", "json", "--offline"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, _) = expect(&doc, "providers.reach", "ok");
    assert!(detail.contains("--offline"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_provider_refuses_fails_as_rejected() {
    let (_m, ws) = mocked(mode("unauthorized"), 0, |_| {}).await;
    openai_kind(&ws, "DOCKET_DOCTOR_TEST_KEY");
    let key = "sk-refusedCANARY987654321";
    let out = doctor(
        ws.path(),
        &[("DOCKET_DOCTOR_TEST_KEY", key)],
        &["--format", "json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, fix) = expect(&doc, "provider.main.reach", "fail");
    assert!(
        detail.contains("key rejected") && detail.contains("401"),
        "{detail}"
    );
    assert!(fix.contains("DOCKET_DOCTOR_TEST_KEY"), "{fix}");
    expect(&doc, "provider.main.key", "ok");
    assert!(!said(&out).contains("refusedCANARY"), "{}", said(&out));
}

/// A ledger whose every change is in the file itself (no -wal), so bytes
/// written into it are what SQLite reads.
fn checkpointed(ws: &Workspace) -> std::path::PathBuf {
    ws.conn()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode=DELETE;")
        .unwrap();
    ws.ledger()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_ledger_fails_with_how_to_recover_it() {
    let (_m, ws) = mocked(Default::default(), 20, |_| {}).await;
    let ledger = checkpointed(&ws);
    // Garbage over the pages after the header's: the file still opens
    // as a database, quick_check finds it damaged.
    let mut bytes = std::fs::read(&ledger).unwrap();
    assert!(bytes.len() > 8192, "{} bytes", bytes.len());
    for (i, b) in bytes[4096..].iter_mut().enumerate() {
        *b = (i * 7 + 13) as u8;
    }
    std::fs::write(&ledger, &bytes).unwrap();
    let out = doctor(ws.path(), &[], &["--format", "json", "--offline"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, fix) = expect(&doc, "ledger", "fail");
    assert!(detail.contains("docket.sqlite is damaged"), "{detail}");
    assert!(fix.contains(".recover"), "{fix}");
    // Garbage from the first byte: not a database at all.
    std::fs::write(&ledger, b"this is not a database, only bytes ".repeat(200)).unwrap();
    let doc = json_of(&doctor(ws.path(), &[], &["--format", "json", "--offline"]));
    let (detail, _) = expect(&doc, "ledger", "fail");
    assert!(detail.contains("not a database"), "{detail}");
}

/// `PRAGMA user_version` of the ledger file, read as the test's own.
fn user_version(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_from_a_newer_docket_fails_and_an_older_one_is_left_as_it_is() {
    let (_m, ws) = mocked(Default::default(), 3, |_| {}).await;
    let ledger = checkpointed(&ws);
    let known = docket::ledger::health::known_version();
    let set = |v: i64| {
        let conn = rusqlite::Connection::open(&ledger).unwrap();
        conn.pragma_update(None, "user_version", v).unwrap();
    };
    set(known + 1);
    let out = doctor(ws.path(), &[], &["--format", "json", "--offline"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, fix) = expect(&doc, "ledger.schema", "fail");
    assert!(
        detail.contains(&format!("schema version {}", known + 1)) && detail.contains("newer"),
        "{detail}"
    );
    assert!(fix.contains("upgrade docket"), "{fix}");
    // Older: ok, migrated by the next run, not by doctor.
    set(known - 1);
    let before = std::fs::read(&ledger).unwrap();
    let out = doctor(ws.path(), &[], &["--format", "json", "--offline"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let (detail, _) = expect(&json_of(&out), "ledger.schema", "ok");
    assert!(detail.contains("migrated on the next run"), "{detail}");
    assert_eq!(
        user_version(&ledger),
        known - 1,
        "doctor migrated the ledger"
    );
    assert!(
        std::fs::read(&ledger).unwrap() == before,
        "doctor wrote the ledger"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_under_the_runs_floor_fails() {
    let (_m, ws) = mocked(Default::default(), 0, |_| {}).await;
    // DOCKET_MIN_FREE_MB is the run's disk guard's floor: 1 EB is more
    // than any test machine has free.
    let out = doctor(
        ws.path(),
        &[("DOCKET_MIN_FREE_MB", "1000000000000")],
        &["--format", "json", "--offline"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, fix) = expect(&doc, "disk", "fail");
    assert!(detail.contains("a run would send nothing"), "{detail}");
    assert!(fix.contains("DOCKET_MIN_FREE_MB"), "{fix}");
    let doc = json_of(&doctor(ws.path(), &[], &["--format", "json", "--offline"]));
    expect(&doc, "disk", "ok");
}

#[test]
fn the_terminals_shortcomings_warn_without_failing() {
    let ws = workspace(&Job::new("http://127.0.0.1:9/v1"));
    let run = |env: &[(&str, &str)]| {
        let out = doctor(ws.path(), env, &["--format", "json", "--offline"]);
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
        json_of(&out)
    };
    let doc = run(&[("LANG", "C")]);
    let (detail, fix) = expect(&doc, "terminal.utf8", "warn");
    assert!(
        detail.contains("LANG=C") && detail.contains("not UTF-8"),
        "{detail}"
    );
    assert!(fix.contains("LANG=C.UTF-8"), "{fix}");
    // LC_ALL wins over LANG, as in libc.
    let doc = run(&[("LANG", "C"), ("LC_ALL", "en_US.UTF-8")]);
    expect(&doc, "terminal.utf8", "ok");
    let doc = run(&[("NO_COLOR", "1")]);
    let (detail, fix) = expect(&doc, "terminal.colour", "warn");
    assert!(detail.contains("NO_COLOR"), "{detail}");
    assert!(fix.contains("unset NO_COLOR"), "{fix}");
    let doc = run(&[("TERM", "dumb")]);
    let (detail, fix) = expect(&doc, "terminal.colour", "warn");
    assert!(detail.contains("TERM=dumb"), "{detail}");
    assert!(fix.contains("TERM="), "{fix}");
    let (detail, _) = expect(&doc, "terminal.tty", "warn");
    assert!(detail.contains("not a terminal"), "{detail}");
    expect(&doc, "terminal.size", "warn");
}

/// A PostgreSQL ledger (a server the test starts): an empty database is
/// fine (the first import makes the ledger), a ledger is connected to and
/// queried, one from a newer docket fails, a wrong password fails; the
/// password is never shown and the disk line names the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgresql_ledger_is_checked_without_showing_its_password() {
    use support::pg::PgServer;
    let pg = PgServer::start();
    let url = pg.fresh_database();
    let (_m, ws) = mocked(Default::default(), 0, |_| {}).await;
    let items = ws.path().join("items/test.jsonl");
    let mut f = std::fs::File::create(&items).unwrap();
    docket::demo::write_chart_items(&mut f, 3, 99).unwrap();
    let on_pg = |u: &str| {
        let out = doctor(
            ws.path(),
            &[("DOCKET_LEDGER_URL", u)],
            &["--format", "json", "--offline"],
        );
        assert!(!said(&out).contains(PgServer::PASSWORD), "{}", said(&out));
        out
    };
    let out = on_pg(&url);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let doc = json_of(&out);
    let (detail, _) = expect(&doc, "ledger.schema", "ok");
    assert!(detail.contains("created on first import"), "{detail}");
    let (detail, _) = expect(&doc, "disk", "ok");
    assert!(detail.contains("PostgreSQL"), "{detail}");
    let import = support::procs::docket_at(ws.path(), &ws.path().join(".home"))
        .args(["import", "items/test.jsonl"])
        .current_dir(ws.path())
        .env("DOCKET_LEDGER_URL", &url)
        .output()
        .unwrap();
    assert_eq!(import.status.code(), Some(0), "{}", said(&import));
    let doc = json_of(&on_pg(&url));
    let (detail, _) = expect(&doc, "ledger", "ok");
    assert!(detail.contains("connects and answers a query"), "{detail}");
    let known = docket::ledger::health::known_version();
    let (detail, _) = expect(&doc, "ledger.schema", "ok");
    assert!(detail.contains(&format!("version {known}")), "{detail}");
    // Newer: fails, and doctor changed nothing.
    pg.psql(
        &url,
        &format!("UPDATE docket_schema SET version = {}", known + 1),
    );
    let out = on_pg(&url);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (_, fix) = expect(&json_of(&out), "ledger.schema", "fail");
    assert!(fix.contains("upgrade docket"), "{fix}");
    assert_eq!(
        pg.psql(&url, "SELECT version FROM docket_schema"),
        (known + 1).to_string()
    );
    // A wrong password: the ledger fails, naming what to check.
    let wrong = url.replace(PgServer::PASSWORD, "not-the-password");
    assert_ne!(wrong, url);
    let out = on_pg(&wrong);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let (_, fix) = expect(&json_of(&out), "ledger", "fail");
    assert!(fix.contains("PGPASSWORD"), "{fix}");
    assert!(!said(&out).contains("not-the-password"), "{}", said(&out));
}

/// In a real terminal (tmux): standard output is one, and its size is held
/// against the console's minimum (80x24).
#[test]
fn in_a_terminal_its_size_is_held_against_the_consoles_minimum() {
    use support::tmux::{Pane, env_line, sh_quote};
    let ws = workspace(&Job::new("http://127.0.0.1:9/v1"));
    let home = ws.path().join(".home");
    let cmd = format!(
        "{} {} --workspace {} doctor --offline",
        env_line([
            ("LANG", "C.UTF-8"),
            ("TERM", "xterm-256color"),
            ("HOME", &home.to_string_lossy()),
            ("XDG_STATE_HOME", &home.join("state").to_string_lossy()),
        ]),
        sh_quote(support::procs::bin()),
        sh_quote(&ws.path().to_string_lossy()),
    );
    let line_of = |text: &str, name: &str| -> String {
        text.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in:\n{text}"))
            .to_string()
    };
    let wait = std::time::Duration::from_secs(30);
    let big = Pane::start("doctor-big", &cmd, 120, 30);
    let (code, text) = big.wait_exit(wait);
    assert_eq!(code, 0, "{text}");
    assert!(line_of(&text, "terminal.tty").starts_with("ok"), "{text}");
    let size = line_of(&text, "terminal.size");
    assert!(size.starts_with("ok") && size.contains("120x"), "{text}");
    let small = Pane::start("doctor-small", &cmd, 100, 20);
    let (code, text) = small.wait_exit(wait);
    assert_eq!(code, 0, "{text}");
    let size = line_of(&text, "terminal.size");
    assert!(
        size.starts_with("warn") && size.contains("under the console's 80x24"),
        "{text}"
    );
}
