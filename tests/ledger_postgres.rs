//! The PostgreSQL ledger against a real server the test starts itself
//! (support::pg): migrations under an advisory lock, a newer ledger
//! refused, the password never shown, and `docket ledger copy` from SQLite
//! to PostgreSQL and back with every table equal.

use docket_testkit as support;

use std::process::{Command, Output};

use docket::engine::RunEnd;
use docket::ledger::copy::TABLES;
use docket::ledger::postgres::{self, PG_MIGRATIONS, PgUrl};
use docket::mock::MockConfig;
use support::pg::PgServer;
use support::*;

fn docket(ws: &std::path::Path, args: &[&str]) -> Output {
    Command::new(support::procs::bin())
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env("HOME", ws)
        .output()
        .expect("docket")
}

/// Workers starting together on an empty database migrate it once: the
/// others wait on the advisory lock and find it current.
#[test]
fn workers_starting_together_migrate_once_and_a_newer_ledger_is_refused() {
    let server = PgServer::start();
    let url = server.fresh_database();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let url = url.clone();
            std::thread::spawn(move || {
                let url = PgUrl::parse(&url).unwrap();
                postgres::open(&url).map(|_| ())
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap().expect("every worker opens the ledger");
    }
    let known = PG_MIGRATIONS.last().unwrap().0;
    assert_eq!(known, docket::ledger::MIGRATIONS.last().unwrap().0);
    assert_eq!(
        server.psql(&url, "SELECT COUNT(*), MAX(version) FROM docket_schema"),
        format!("1|{known}")
    );
    // Opening again changes nothing.
    postgres::open(&PgUrl::parse(&url).unwrap()).unwrap();

    server.psql(&url, "UPDATE docket_schema SET version = 99");
    let e = postgres::open(&PgUrl::parse(&url).unwrap())
        .err()
        .expect("a newer ledger is refused")
        .to_string();
    assert!(e.contains("newer docket") && e.contains("99"), "{e}");
    assert!(!e.contains(PgServer::PASSWORD), "{e}");
}

/// The password (a canary) is in no error message: a wrong database, a
/// wrong password, a server that is not there; nor in what `ledger copy`
/// prints.
#[test]
fn the_password_never_reaches_an_error_or_the_screen() {
    if std::env::var_os("DOCKET_TEST_PG_URL").is_some() {
        // The canary is the password of a cluster the harness made itself.
        eprintln!("skipped: needs the harness's own server (DOCKET_TEST_PG_URL is set)");
        return;
    }
    let server = PgServer::start();
    let url = server.fresh_database();
    let canary = PgServer::PASSWORD;

    let no_db = format!("{}_missing", url);
    let e = postgres::open(&PgUrl::parse(&no_db).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("does not exist") && !e.contains(canary), "{e}");

    let wrong = url.replace(canary, "canary-wrong-password-11");
    let e = postgres::open(&PgUrl::parse(&wrong).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("password authentication failed"), "{e}");
    assert!(!e.contains("canary-wrong-password-11"), "{e}");

    let port = free_port();
    let gone = format!("postgres://docket:{canary}@127.0.0.1:{port}/docket");
    let e = postgres::open(&PgUrl::parse(&gone).unwrap())
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("cannot connect") && !e.contains(canary), "{e}");

    // The command line: a failed copy and a successful one.
    let ws = workspace(&Job::new("http://127.0.0.1:9/v1"));
    import_demo_items(&ws, 5);
    let out = docket(ws.path(), &["ledger", "copy", "--to", &no_db]);
    assert!(!out.status.success());
    assert!(
        !support::said(&out).contains(canary),
        "{}",
        support::said(&out)
    );
    let out = docket(ws.path(), &["ledger", "copy", "--to", &url]);
    assert!(out.status.success(), "{}", support::said(&out));
    assert!(
        support::said(&out).contains("docket:***@"),
        "{}",
        support::said(&out)
    );
    assert!(
        !support::said(&out).contains(canary),
        "{}",
        support::said(&out)
    );

    // The password may come from PGPASSWORD instead of the URL.
    let bare = PgUrl::parse(&server.url_without_password()).unwrap();
    assert!(postgres::open(&bare).is_err());
    let other = server.fresh_database();
    let out = Command::new(support::procs::bin())
        .arg("--workspace")
        .arg(ws.path())
        .args(["ledger", "copy", "--to"])
        .arg(other.replace(&format!(":{canary}@"), "@"))
        .env("PGPASSWORD", canary)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", support::said(&out));
    assert!(
        !support::said(&out).contains(canary),
        "{}",
        support::said(&out)
    );
}

/// A ledger with a finished run (results in every band, review items, a
/// review decision, events) goes to PostgreSQL and back to a new workspace
/// with every table equal; a second copy into the same database is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_to_postgres_and_back_keeps_every_table() {
    let server = PgServer::start();
    let url = server.fresh_database();
    let (_mock, ws) = mocked(MockConfig::default(), 120, |_| {}).await;
    let (report, lines) = run(options(&ws)).await;
    assert_eq!(report.end, RunEnd::Completed, "{}", lines.text());
    // A review decision, so review_log has a row; odd text in an answer
    // (tabs, newlines, backslashes, quotes) must survive COPY's escaping.
    {
        let conn = ws.conn();
        conn.execute(
            "INSERT INTO review_log (review_id, item_id, action, actor, at, prev_decision_json)
             SELECT review_id, item_id, 'accept', 'review:alice', 1.5, '{\"a\":\"x\\ty\"}'
             FROM review_item LIMIT 1",
            [],
        )
        .unwrap();
        conn.execute(
            "UPDATE llm_messages SET assistant_output = 'tab\there\nnew line \\ back\\slash \"q\" é'
             WHERE message_id = (SELECT MIN(message_id) FROM llm_messages)",
            [],
        )
        .unwrap();
        // An answer jsonb cannot hold (\u0000 is valid JSON for SQLite):
        // PostgreSQL still takes the row, its generated columns NULL.
        conn.execute(
            "UPDATE llm_batch_result SET answer_json = '{\"crg_mbid\":\"x\",\"note\":\"a\\u0000b\"}'
             WHERE item_id = (SELECT MIN(item_id) FROM llm_batch_result)",
            [],
        )
        .unwrap();
    }
    let before = dump(&ws.conn());
    for table in [
        "decision",
        "llm_batch_session",
        "llm_requests",
        "llm_messages",
        "session_item",
        "session_request",
        "run_stages",
        "llm_batch_result",
        "review_item",
        "review_log",
        "session_event",
        "session_worker",
    ] {
        assert!(!before[table].is_empty(), "the run left {table} empty");
    }

    let out = docket(ws.path(), &["ledger", "copy", "--to", &url]);
    assert!(out.status.success(), "{}", support::said(&out));
    assert_eq!(
        server.psql(&url, "SELECT COUNT(*) FROM decision"),
        before["decision"].len().to_string()
    );
    // New rows in PostgreSQL take ids after the copied ones.
    let max_event = server.psql(&url, "SELECT MAX(event_id) FROM session_event");
    server.psql(
        &url,
        "INSERT INTO session_event (session_id, at, level, kind, message)
         SELECT session_id, 0, 'info', 'note', 'after the copy' FROM llm_batch_session LIMIT 1",
    );
    let new_event = server.psql(
        &url,
        "SELECT event_id FROM session_event WHERE message = 'after the copy'",
    );
    assert!(new_event.parse::<i64>().unwrap() > max_event.parse::<i64>().unwrap());
    server.psql(
        &url,
        "DELETE FROM session_event WHERE message = 'after the copy'",
    );

    // Rows updated in PostgreSQL move within its table; the import order
    // (the dispatch order) must not move with them.
    server.psql(
        &url,
        "UPDATE decision SET updated_at = updated_at
         WHERE item_id IN (SELECT item_id FROM decision ORDER BY import_seq LIMIT 3)",
    );

    // Into a database that already holds a ledger: refused, nothing changed.
    let out = docket(ws.path(), &["ledger", "copy", "--to", &url]);
    assert!(!out.status.success());
    assert!(
        support::said(&out).contains("already holds"),
        "{}",
        support::said(&out)
    );

    let back = tempfile::tempdir().unwrap();
    let out = docket(back.path(), &["ledger", "copy", "--from", &url]);
    assert!(out.status.success(), "{}", support::said(&out));
    let copy = docket::ledger::open(&back.path().join("docket.sqlite")).unwrap();
    let after = dump(&copy);
    for table in TABLES {
        assert_eq!(before[table], after[table], "table {table} differs");
    }
    let order = |conn: &rusqlite::Connection| -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT item_id FROM decision ORDER BY rowid")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    assert_eq!(order(&ws.conn()), order(&copy), "the import order moved");
    let ok: String = copy
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(ok, "ok");
    let fk: i64 = copy
        .query_row("SELECT COUNT(*) FROM pragma_foreign_key_check", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(fk, 0);
}

/// Every data table's rows (generated columns aside), sorted, as text.
fn dump(conn: &rusqlite::Connection) -> std::collections::HashMap<&'static str, Vec<String>> {
    TABLES
        .iter()
        .map(|&table| {
            let mut stmt = conn.prepare(&format!("SELECT * FROM {table}")).unwrap();
            let n = stmt.column_count();
            let mut rows: Vec<String> = stmt
                .query_map([], |r| {
                    (0..n)
                        .map(|i| {
                            r.get::<_, rusqlite::types::Value>(i)
                                .map(|v| format!("{v:?}"))
                        })
                        .collect::<Result<Vec<_>, _>>()
                        .map(|v| v.join("|"))
                })
                .unwrap()
                .map(Result::unwrap)
                .collect();
            rows.sort();
            (table, rows)
        })
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// libpq's sslmodes over rustls: `require` encrypts, `verify-full` and
/// `verify-ca` check the server's certificate against `sslrootcert`, a
/// certificate from another CA is refused, `disable` stays plain, and a
/// server without TLS refuses `require` in words.
#[test]
fn tls_follows_sslmode() {
    if std::env::var_os("DOCKET_TEST_PG_URL").is_some() {
        eprintln!("skipped: the test turns TLS on in the harness's own server");
        return;
    }
    let server = PgServer::start_own();
    let url = server.fresh_database();
    let with = |params: &str| format!("{url}?{params}");
    let uses_tls = |u: &str| -> Result<bool, String> {
        let mut client = postgres::open(&PgUrl::parse(u).unwrap()).map_err(|e| e.to_string())?;
        Ok(client
            .query_one(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
                &[],
            )
            .unwrap()
            .get(0))
    };

    // No TLS on the server yet.
    let e = uses_tls(&with("sslmode=require")).unwrap_err();
    assert!(
        e.contains("cannot connect") && e.to_lowercase().contains("tls"),
        "{e}"
    );
    assert_eq!(uses_tls(&with("sslmode=prefer")), Ok(false));
    // A Unix socket never leaves the machine: no TLS there, as in libpq.
    let socket = server.socket_url(&url).expect("the harness's own cluster");
    assert_eq!(uses_tls(&format!("{socket}?sslmode=require")), Ok(false));

    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    make_certificates(dir);
    if running_as_root() {
        shell("chown", &["-R", "postgres", dir.to_str().unwrap()]);
    }
    for (key, value) in [
        ("ssl_cert_file", dir.join("server.pem")),
        ("ssl_key_file", dir.join("server.key")),
    ] {
        server.psql(
            &url,
            &format!("ALTER SYSTEM SET {key} = '{}'", value.display()),
        );
    }
    server.psql(&url, "ALTER SYSTEM SET ssl = on");
    server.psql(&url, "SELECT pg_reload_conf()");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while server.psql(&url, "SHOW ssl") != "on" {
        assert!(std::time::Instant::now() < deadline, "ssl never came on");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    let ca = dir.join("ca.pem");
    let other_ca = dir.join("other-ca.pem");
    assert_eq!(uses_tls(&with("sslmode=require")), Ok(true));
    assert_eq!(uses_tls(&with("sslmode=prefer")), Ok(true));
    assert_eq!(uses_tls(&with("sslmode=disable")), Ok(false));
    let root = |mode: &str, ca: &std::path::Path| {
        with(&format!("sslmode={mode}&sslrootcert={}", ca.display()))
    };
    assert_eq!(uses_tls(&root("verify-full", &ca)), Ok(true));
    assert_eq!(uses_tls(&root("verify-ca", &ca)), Ok(true));
    // The name checked is the host connected to: the certificate names
    // localhost and 127.0.0.1, not 127.0.0.2.
    let renamed = root("verify-full", &ca).replace("127.0.0.1", "localhost");
    assert_eq!(uses_tls(&renamed), Ok(true));
    for mode in ["verify-full", "verify-ca", "require"] {
        let e = uses_tls(&root(mode, &other_ca)).unwrap_err();
        assert!(
            e.contains("cannot connect") && e.contains("certificate"),
            "{mode}: {e}"
        );
        assert!(!e.contains(PgServer::PASSWORD), "{e}");
    }
    // verify-ca with the system's roots would take any public CA's
    // certificate for any host: refused.
    let e = uses_tls(&with("sslmode=verify-ca")).unwrap_err();
    assert!(e.contains("sslrootcert"), "{e}");
    let e = uses_tls(&root("verify-full", &dir.join("missing.pem"))).unwrap_err();
    assert!(
        e.contains("sslrootcert") && e.contains("missing.pem"),
        "{e}"
    );
}

/// A CA, a server certificate it signed for localhost and 127.0.0.1, and a
/// second CA that signed nothing here.
fn make_certificates(dir: &std::path::Path) {
    let p = |name: &str| dir.join(name).to_str().unwrap().to_string();
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    for ca in ["ca", "other-ca"] {
        let mut args = vec!["req", "-x509"];
        args.extend(ec);
        let (key, pem, subject) = (
            p(&format!("{ca}.key")),
            p(&format!("{ca}.pem")),
            format!("/CN=docket test {ca}"),
        );
        args.extend([
            "-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subject,
        ]);
        shell("openssl", &args);
    }
    let mut args = vec!["req"];
    args.extend(ec);
    let (key, csr) = (p("server.key"), p("server.csr"));
    args.extend(["-keyout", &key, "-out", &csr, "-subj", "/CN=localhost"]);
    shell("openssl", &args);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    shell(
        "openssl",
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &p("ca.pem"),
            "-CAkey",
            &p("ca.key"),
            "-CAcreateserial",
            "-out",
            &p("server.pem"),
            "-days",
            "2",
            "-extfile",
            &p("san.ext"),
        ],
    );
    shell("chmod", &["600", &key]);
}

fn shell(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        support::said(&out)
    );
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// A large answer (an export) is read from a server-side cursor a page at a
/// time: every row comes, in order, across page boundaries; other
/// statements run on the connection between pages (the items export asks
/// for each item's stages while it reads the items); the cursor is closed
/// when the rows are dropped; and the same holds inside a transaction.
#[test]
fn large_answers_come_a_page_at_a_time_from_a_cursor() {
    use docket::ledger::db::{Connection, PgConnection, ToDb};
    let server = PgServer::start();
    let url = PgUrl::parse(&server.fresh_database()).unwrap();
    let client = postgres::open(&url).unwrap();
    let conn = Connection::Postgres(Box::new(PgConnection::new(client, url)));
    conn.execute_batch(
        "CREATE TABLE numbers (n BIGINT PRIMARY KEY, word TEXT);
         INSERT INTO numbers SELECT g, 'n' || g FROM generate_series(1, 2500) g;",
    )
    .unwrap();
    let open_cursors = |conn: &Connection| -> i64 {
        conn.query_row(
            "SELECT COUNT(*) FROM pg_cursors WHERE name LIKE 'docket_rows_%'",
            &[],
            |r| r.get(0),
        )
        .unwrap()
    };

    let read_all = |conn: &Connection| -> Vec<i64> {
        let mut stmt = conn
            .prepare("SELECT n, word FROM numbers WHERE n > ?1 ORDER BY n")
            .unwrap();
        let mut rows = stmt.query_large(&[&0i64 as &dyn ToDb]).unwrap();
        let mut seen = Vec::new();
        while let Some(row) = rows.next().unwrap() {
            let n: i64 = row.get(0).unwrap();
            assert_eq!(row.get::<_, String>(1).unwrap(), format!("n{n}"));
            seen.push(n);
            if n % 700 == 0 {
                // A statement of its own between the cursor's pages.
                let doubled: i64 = conn
                    .query_row(
                        "SELECT n * 2 FROM numbers WHERE n = ?1",
                        &[&n as &dyn ToDb],
                        |r| r.get(0),
                    )
                    .unwrap();
                assert_eq!(doubled, 2 * n);
                assert_eq!(
                    open_cursors(conn),
                    1,
                    "the cursor is open while rows are read"
                );
            }
        }
        seen
    };

    let all: Vec<i64> = (1..=2500).collect();
    assert_eq!(read_all(&conn), all);
    assert_eq!(open_cursors(&conn), 0, "closed when the rows are dropped");

    let tx = conn.transaction().unwrap();
    assert_eq!(read_all(&tx), all);
    assert_eq!(open_cursors(&tx), 0);
    tx.commit().unwrap();

    // Rows dropped halfway close their cursor too.
    {
        let mut stmt = conn.prepare("SELECT n FROM numbers ORDER BY n").unwrap();
        let mut rows = stmt.query_large(&[]).unwrap();
        for _ in 0..1500 {
            rows.next().unwrap().unwrap();
        }
    }
    assert_eq!(open_cursors(&conn), 0);
}

/// A ledger made where pg_trgm could not be installed has no trigram index
/// for the review search (it scans). Once the extension is there, the next
/// docket that opens the ledger builds the index: nothing to run by hand.
#[test]
fn the_search_index_is_built_once_pg_trgm_can_be() {
    let server = PgServer::start();
    let url = server.fresh_database();
    postgres::open(&PgUrl::parse(&url).unwrap()).unwrap();
    let index = "SELECT COUNT(*) FROM pg_indexes WHERE indexname = 'idx_review_item_search'";
    assert_eq!(server.psql(&url, index), "1");
    // As if the extension had been missing when the ledger was made.
    server.psql(
        &url,
        "DROP INDEX idx_review_item_search; DROP EXTENSION pg_trgm;",
    );
    assert_eq!(server.psql(&url, index), "0");
    postgres::open(&PgUrl::parse(&url).unwrap()).unwrap();
    assert_eq!(server.psql(&url, index), "1", "built again on open");
    assert_eq!(
        server.psql(
            &url,
            "SELECT COUNT(*) FROM pg_extension WHERE extname = 'pg_trgm'"
        ),
        "1"
    );
}

/// A ledger connection to a fresh database holding one `counter` row at 0
/// (with its server and URL), for the lost-transaction tests.
fn counter_ledger() -> (PgServer, String, docket::ledger::db::Connection) {
    use docket::ledger::db::{Connection, PgConnection};
    let server = PgServer::start();
    let url_text = server.fresh_database();
    let url = PgUrl::parse(&url_text).unwrap();
    let client = postgres::open(&url).unwrap();
    let conn = Connection::Postgres(Box::new(PgConnection::new(client, url)));
    conn.execute_batch("CREATE TABLE counter (n BIGINT); INSERT INTO counter VALUES (0);")
        .unwrap();
    (server, url_text, conn)
}

/// A transaction whose connection is lost halfway (the server ended the
/// backend) applies nothing, even when the caller goes on with statements
/// before it ends it: they fail, rather than run alone on the new
/// connection and commit by halves (the writer's group once counted an
/// attempt whose row the server had rolled back). The commit says the
/// transaction was lost, and the connection works again afterwards.
#[test]
fn statements_after_a_lost_transaction_fail_until_it_ends() {
    use docket::ledger::db::{Error, TransactionBehavior};
    let (server, url_text, conn) = counter_ledger();
    let pid: i32 = conn
        .query_row("SELECT pg_backend_pid()", &[], |r| r.get(0))
        .unwrap();
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Concurrent)
        .unwrap();
    tx.execute("UPDATE counter SET n = n + 1", &[]).unwrap();
    server.psql(&url_text, &format!("SELECT pg_terminate_backend({pid})"));
    let lost = tx.execute("UPDATE counter SET n = n + 10", &[]);
    assert!(matches!(lost, Err(Error::ConnectionLost(_))), "{lost:?}");
    let after = tx.execute("UPDATE counter SET n = n + 100", &[]);
    assert!(
        matches!(after, Err(Error::ConnectionLost(_))),
        "a statement after the loss ran on its own: {after:?}"
    );
    let committed = tx.commit();
    assert!(
        matches!(committed, Err(Error::ConnectionLost(_))),
        "{committed:?}"
    );
    assert!(conn.take_lost(), "the caller is told to apply it again");
    let n: i64 = conn
        .query_row("SELECT n FROM counter", &[], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 0, "nothing of the lost transaction was applied");
}

/// A process stalled inside a transaction (SIGSTOP, swapped out) past the
/// two seconds `postgres::END_STALLED_TRANSACTION` allows: the server ends
/// its session (25P03). Running again, the process is told the transaction
/// was lost, nothing of it applied, and its next transaction runs on a new
/// connection (a stalled worker once stopped with "cannot begin: 25P03"
/// and exit 6 instead).
#[test]
fn a_transaction_the_server_ended_as_stalled_is_lost_and_the_next_reconnects() {
    use docket::ledger::db::{Error, TransactionBehavior};
    let (_server, _url, conn) = counter_ledger();
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Concurrent)
        .unwrap();
    tx.execute("UPDATE counter SET n = n + 1", &[]).unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    let lost = tx.execute("UPDATE counter SET n = n + 10", &[]);
    assert!(matches!(lost, Err(Error::ConnectionLost(_))), "{lost:?}");
    let committed = tx.commit();
    assert!(
        matches!(committed, Err(Error::ConnectionLost(_))),
        "{committed:?}"
    );
    assert!(conn.take_lost(), "the caller is told to apply it again");
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Concurrent)
        .expect("the next transaction begins on a new connection");
    tx.execute("UPDATE counter SET n = n + 100", &[]).unwrap();
    tx.commit().unwrap();
    let n: i64 = conn
        .query_row("SELECT n FROM counter", &[], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 100, "only the transaction after the loss was applied");
}

/// The review item card the console shows (detail view and preview) reads
/// from PostgreSQL as from SQLite: a critic job's item comes with its
/// generator's answer and its critic's verdict. (`critic_of IS $2` in the
/// critic lookup was SQLite-only: every detail read failed on PostgreSQL.)
#[test]
fn a_critic_jobs_review_card_reads_from_postgres() {
    use docket::ledger::console::ConsoleReads;
    use docket::ledger::{Ledger, LedgerLocation};
    let server = PgServer::start();
    let full_url = server.fresh_database();
    let url = support::pg::without_password(&full_url);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let run = |args: &[&str]| {
        let out = Command::new(support::procs::bin())
            .args(["--workspace", &ws.display().to_string(), "--ledger", &url])
            .args(args)
            .env("HOME", dir.path())
            .env("DOCKET_CONFIG_DIR", dir.path().join("config"))
            .env("PGPASSWORD", server.password())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docket {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["init", "--example", "critic", &ws.display().to_string()]);
    run(&[
        "import",
        &ws.join("items/sample.jsonl").display().to_string(),
    ]);
    run(&["batch-adjudicate", "--headless", "--yes"]);
    let rid: i64 = server
        .psql(
            &full_url,
            "SELECT review_id FROM review_item WHERE status = 'pending' ORDER BY review_id LIMIT 1",
        )
        .parse()
        .expect("a pending review item");
    let ledger = Ledger::open(LedgerLocation::parse(&full_url).unwrap()).unwrap();
    let d = ledger
        .review_detail(rid)
        .expect("the card reads")
        .expect("the item");
    let generator = d.generator.expect("the generator's answer");
    let critic = d.critic.expect("the critic's verdict");
    assert_eq!(generator.stage, "adjudicate");
    assert_eq!(critic.stage, "critic");
    assert!(critic.verdict.is_some(), "{critic:?}");
}

/// A correction on PostgreSQL as on SQLite: the queue row carries the
/// item's evidence (for the `[review]` summary), the correction is
/// exported with its changed fields and the suggestion it replaced
/// (migration 0011), and undo takes it back.
#[test]
fn a_correction_is_exported_and_undone_on_postgres() {
    use docket::ledger::console::ConsoleReads;
    use docket::ledger::review::ReviewDecisions;
    use docket::ledger::{Ledger, LedgerLocation};
    use docket::report::{ExportFormat, ExportOptions, ExportWhat, export};
    use docket::watch::ReviewQuery;
    let server = PgServer::start();
    let full_url = server.fresh_database();
    let url = support::pg::without_password(&full_url);
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    let run = |args: &[&str]| {
        let out = Command::new(support::procs::bin())
            .args(["--workspace", &ws.display().to_string(), "--ledger", &url])
            .args(args)
            .env("HOME", dir.path())
            .env("DOCKET_CONFIG_DIR", dir.path().join("config"))
            .env("PGPASSWORD", server.password())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "docket {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["init", &ws.display().to_string()]);
    run(&[
        "import",
        &ws.join("items/sample.jsonl").display().to_string(),
    ]);
    run(&[
        "batch-adjudicate",
        "--headless",
        "--yes",
        "--review-threshold",
        "0.0",
        "--auto-accept-threshold",
        "1.0",
    ]);
    let ledger = Ledger::open(LedgerLocation::parse(&full_url).unwrap()).unwrap();
    let page = ledger
        .review_page(&ReviewQuery::default())
        .expect("the queue reads");
    let row = page.rows.first().expect("a pending review item").clone();
    let evidence: serde_json::Value = serde_json::from_str(&row.evidence).expect("evidence");
    assert!(evidence.get("title").is_some(), "{evidence}");
    let mut answer: serde_json::Value = serde_json::from_str(&row.suggestion).unwrap();
    answer["crg_mbid"] = serde_json::json!("corrected-by-hand");
    let op = docket::review::Operator::new("alice", "alice@h:1");
    let applied = ledger
        .correct(row.review_id, &answer, &op)
        .expect("correct");
    assert_eq!(applied.done, [row.review_id]);
    let exported = |ledger: &Ledger| -> serde_json::Value {
        let mut out = Vec::new();
        let opts = ExportOptions {
            session: None,
            what: ExportWhat::Decisions,
            format: ExportFormat::Jsonl,
        };
        export(ledger, &opts, &mut out).expect("export");
        String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|r| r["item_id"] == row.item_id.as_str())
            .expect("the item exported")
    };
    let r = exported(&ledger);
    assert_eq!(r["decided_answer_json"], answer);
    assert_eq!(r["corrected_fields"], "crg_mbid");
    assert_eq!(
        r["suggested_answer_json"],
        serde_json::from_str::<serde_json::Value>(&row.suggestion).unwrap()
    );
    ledger.undo_last(&op).expect("undo").expect("undone");
    let r = exported(&ledger);
    assert_eq!(r["state"], "indeterminate");
    assert!(r["corrected_fields"].is_null(), "{r}");
}
