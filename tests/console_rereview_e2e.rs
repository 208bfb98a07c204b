//! The duplicate-review case end to end (issue 16): the real binary
//! imports items and runs the mock job, imports more and runs again (by
//! default, then with `--rereview-pending`), and the console in tmux, at
//! 80x24, shows each item once in the review queue with its session, and
//! the card of a re-asked item names the suggestion it replaced.
//!
//! The test has its own tmux server (`tmux -L`) and its own data, config
//! and workspace folders; the pane guard kills only that server.

use docket_testkit as support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rusqlite::Connection;
use support::tmux::{Pane, env_line, sh_quote};

/// How long to wait for a screen state before failing.
const WAIT: Duration = Duration::from_secs(20);

/// A per-test home: data, config and workspace inside one tempdir.
struct Home {
    dir: tempfile::TempDir,
}

impl Home {
    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn vars(&self) -> Vec<(String, String)> {
        let p = |s: &str| self.path().join(s).display().to_string();
        vec![
            ("HOME".into(), p("home")),
            ("XDG_DATA_HOME".into(), p("data")),
            ("XDG_STATE_HOME".into(), p("state")),
            ("XDG_CONFIG_HOME".into(), p("config")),
            ("DOCKET_CONFIG_DIR".into(), p("config/docket")),
            ("USER".into(), "alice".into()),
        ]
    }

    /// Run docket to completion (no terminal); its output, after checking
    /// it succeeded.
    fn run(&self, args: &[&str]) -> String {
        let mut c = Command::new(support::procs::bin());
        c.env_remove("NO_COLOR")
            .env_remove("DOCKET_WORKSPACE")
            .env_remove("DOCKET_LOG")
            .env_remove("DOCKET_LEDGER_URL");
        for (k, v) in self.vars() {
            c.env(k, v);
        }
        let out = c.args(args).output().unwrap();
        let said = support::said(&out);
        assert!(out.status.success(), "docket {args:?}:\n{said}");
        said
    }

    /// A workspace from `docket init`, its mock made quick.
    fn init_workspace(&self) -> PathBuf {
        let ws = self.path().join("ws");
        self.run(&["init", &ws.display().to_string()]);
        let toml_path = ws.join("docket.toml");
        let toml = std::fs::read_to_string(&toml_path).unwrap();
        let quick = toml
            .replace("latency_median_ms = 150.0", "latency_median_ms = 20.0")
            .replace("latency_p99_ms = 600.0", "latency_p99_ms = 60.0");
        assert_ne!(toml, quick, "the scaffold's mock latency moved");
        std::fs::write(&toml_path, quick).unwrap();
        ws
    }

    /// Import the first `n` demo chart items (one seed: a longer file
    /// starts with a shorter one's items).
    fn import(&self, ws: &Path, name: &str, n: usize) {
        let items = ws.join("items").join(name);
        let mut f = std::fs::File::create(&items).unwrap();
        docket::demo::write_chart_items(&mut f, n, 7).unwrap();
        drop(f);
        let ws_s = ws.display().to_string();
        self.run(&["--workspace", &ws_s, "import", &items.display().to_string()]);
    }

    /// `batch-adjudicate --headless --yes` and `extra`; its session, and
    /// what it said.
    fn adjudicate(&self, ws: &Path, extra: &[&str]) -> (String, String) {
        let ws_s = ws.display().to_string();
        let mut args = vec![
            "--workspace",
            &ws_s,
            "batch-adjudicate",
            "--headless",
            "--yes",
        ];
        args.extend_from_slice(extra);
        let said = self.run(&args);
        let session = said
            .lines()
            .find_map(|l| l.strip_prefix("Creating batch session: "))
            .unwrap_or_else(|| panic!("no session:\n{said}"))
            .trim()
            .to_string();
        (session, said)
    }

    /// `docket review` on the workspace in tmux at 80x24.
    fn console(&self, ws: &Path, tag: &str) -> Pane {
        let cmd = format!(
            "{} {} --workspace {} review",
            env_line(self.vars()),
            sh_quote(support::procs::bin()),
            sh_quote(&ws.display().to_string())
        );
        Pane::start(tag, &cmd, 80, 24)
    }
}

fn count(conn: &Connection, sql: &str) -> i64 {
    conn.query_row(sql, [], |r| r.get(0))
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// `(cursor, total)` from the review pane title `5 Review queue CUR/TOTAL`.
fn review_title(screen: &str) -> Option<(u64, u64)> {
    let re = regex::Regex::new(r"5 Review queue (\d+)/(\d+)").unwrap();
    let c = re.captures(screen)?;
    Some((c[1].parse().ok()?, c[2].parse().ok()?))
}

/// The queue rows on the screen: (item id, the rest of the row).
fn queue_rows(screen: &str) -> Vec<(String, String)> {
    // pointer, mark, confidence, item id, then the session and the answer
    let re = regex::Regex::new(r"[› ][● ] (?:\d\.\d\d|  --) (chart-\d+) (.*)$").unwrap();
    screen
        .lines()
        .filter_map(|l| {
            let c = re.captures(l)?;
            Some((c[1].to_string(), c[2].to_string()))
        })
        .collect()
}

/// The session's tail as a queue row shows it: `…ab12cd`.
fn tail(session: &str) -> String {
    format!("…{}", session.rsplit('_').next().unwrap())
}

/// Pending review items and the sessions they belong to.
fn pending(conn: &Connection) -> (i64, BTreeSet<String>) {
    assert_eq!(
        count(
            conn,
            "SELECT COUNT(*) FROM (SELECT item_id FROM review_item WHERE status = 'pending'
             GROUP BY item_id HAVING COUNT(*) > 1)"
        ),
        0,
        "an item has two pending review items"
    );
    let sessions = conn
        .prepare("SELECT DISTINCT session_id FROM review_item WHERE status = 'pending'")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    (
        count(
            conn,
            "SELECT COUNT(*) FROM review_item WHERE status = 'pending'",
        ),
        sessions,
    )
}

/// The queue on screen: `total` items, every visible row a different item
/// and, with several sessions in the queue, naming one of `sessions`.
fn check_queue(pane: &Pane, total: i64, sessions: &BTreeSet<String>) -> String {
    let screen = pane.wait("the review queue", WAIT, |s| {
        review_title(s) == Some((1, total as u64)) && !queue_rows(s).is_empty()
    });
    let rows = queue_rows(&screen);
    let ids: BTreeSet<&String> = rows.iter().map(|(id, _)| id).collect();
    assert_eq!(ids.len(), rows.len(), "an item twice on screen:\n{screen}");
    let tails: Vec<String> = sessions.iter().map(|s| tail(s)).collect();
    for (id, rest) in &rows {
        let named = tails.iter().filter(|t| rest.contains(t.as_str())).count();
        if sessions.len() > 1 {
            assert_eq!(
                named, 1,
                "row {id} names no session of {tails:?}:\n{screen}"
            );
        } else {
            assert_eq!(
                named, 0,
                "one session: row {id} needs no session:\n{screen}"
            );
        }
    }
    for line in screen.lines() {
        assert!(
            line.chars().count() <= 80,
            "a line past 80 columns:\n{screen}"
        );
    }
    screen
}

#[test]
fn a_re_asked_item_is_queued_once_and_its_card_names_what_it_replaced() {
    let home = Home {
        dir: tempfile::tempdir().expect("tempdir"),
    };
    let ws = home.init_workspace();
    home.import(&ws, "first.jsonl", 30);
    let (s1, _) = home.adjudicate(&ws, &[]);
    let conn = Connection::open(ws.join("docket.sqlite")).unwrap();
    let (first_pending, _) = pending(&conn);
    assert!(
        first_pending >= 3,
        "only {first_pending} pending review items"
    );

    // More items; the default run leaves the pending ones out, and says so.
    home.import(&ws, "more.jsonl", 45);
    let (s2, said) = home.adjudicate(&ws, &[]);
    assert!(
        said.contains(&format!("{first_pending} item(s) awaiting review left out")),
        "{said}"
    );
    let (total, sessions) = pending(&conn);
    assert!(sessions.contains(&s1), "{sessions:?}");
    let console = home.console(&ws, "queue-two");
    let screen = check_queue(&console, total, &sessions);
    if sessions.contains(&s2) {
        assert!(
            screen.contains(&tail(&s1)) || screen.contains(&tail(&s2)),
            "{screen}"
        );
    }
    console.keys(&["q"]);
    drop(console);

    // Asked again: the first ten candidates' new suggestions supersede
    // their old ones.
    let (s3, said) = home.adjudicate(&ws, &["--rereview-pending", "--limit", "10"]);
    assert!(!said.contains("awaiting review left out"), "{said}");
    // (An item that errored before may have been answered this time.)
    let (total_after, sessions_after) = pending(&conn);
    assert!(total_after >= total, "{total_after} < {total}");
    assert!(sessions_after.contains(&s3), "{sessions_after:?}");
    let (item, old_session, old_confidence): (String, String, f64) = conn
        .query_row(
            "SELECT o.item_id, o.session_id, o.confidence FROM review_item o
             JOIN review_item n ON n.review_id = o.superseded_by
             WHERE o.status = 'superseded' AND n.session_id = ?1 ORDER BY o.review_id LIMIT 1",
            [&s3],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .expect("a superseded review item");
    let console = home.console(&ws, "queue-three");
    check_queue(&console, total_after, &sessions_after);

    // The re-asked item: one row, then its card.
    console.keys(&["/"]);
    console.keys(&[item.as_str()]);
    console.keys(&["Enter"]);
    let screen = console.wait("the queue filtered to the item", WAIT, |s| {
        review_title(s) == Some((1, 1)) && queue_rows(s).iter().any(|(id, _)| id == &item)
    });
    let rows = queue_rows(&screen);
    assert_eq!(rows.len(), 1, "{screen}");
    if sessions_after.len() > 1 {
        assert!(rows[0].1.contains(&tail(&s3)), "{screen}");
    }
    console.keys(&["Enter"]);
    let replaced =
        format!("replaces an earlier suggestion: session {old_session} · {old_confidence:.2}");
    let card = console.wait("the card naming what it replaced", WAIT, |s| {
        s.contains("Review item") && s.contains(&replaced)
    });
    assert!(card.contains(&item), "{card}");
    console.keys(&["Escape"]);
    console.keys(&["q"]);
}
