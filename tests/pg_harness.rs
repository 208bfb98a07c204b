//! The PostgreSQL test harness (`crates/testkit/src/pg.rs`) itself: a server
//! answers, fresh databases are separate, a stop and a start keep the data,
//! a dropped server is gone, and a wrong password is refused. The failures
//! are checked with psql run directly, not through the panicking helper.

use docket_testkit as support;

use std::process::{Command, Output, Stdio};

use support::pg::PgServer;

/// Stopping and password checks need a cluster of the harness's own.
fn external() -> bool {
    std::env::var_os("DOCKET_TEST_PG_URL").is_some_and(|v| !v.is_empty())
}

/// psql against `url` with no password but the URL's, never prompting.
fn psql_raw(url: &str, sql: &str) -> Output {
    Command::new("psql")
        .args([
            "-X",
            "-A",
            "-t",
            "-w",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
            "-d",
            url,
        ])
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", "/nonexistent")
        .env("PGCONNECT_TIMEOUT", "5")
        .stdin(Stdio::null())
        .output()
        .expect("run psql")
}

#[test]
fn a_server_answers_and_gives_fresh_databases() {
    let pg = PgServer::start_own();
    assert_eq!(pg.psql(&pg.url(), "SELECT 1"), "1");
    // The password only travels through PGPASSWORD here.
    assert_eq!(pg.psql(&pg.url_without_password(), "SELECT 2"), "2");

    let fresh = pg.fresh_database();
    let other = pg.fresh_database();
    let name = |url: &str| pg.psql(url, "SELECT current_database()");
    assert_ne!(name(&fresh), name(&pg.url()));
    assert_ne!(name(&fresh), name(&other));
    pg.psql(&fresh, "CREATE TABLE t (x int); INSERT INTO t VALUES (7)");
    assert_eq!(pg.psql(&fresh, "SELECT x FROM t"), "7");
    let elsewhere = psql_raw(&other, "SELECT x FROM t");
    assert!(!elsewhere.status.success(), "t exists only in its database");

    if !external() {
        assert_eq!(pg.psql(&pg.url(), "SELECT current_database()"), "docket");
        assert_eq!(pg.psql(&pg.url(), "SELECT current_user"), "docket");
        assert!(pg.url().contains(PgServer::PASSWORD));
        assert!(!pg.url_without_password().contains(PgServer::PASSWORD));
        assert_eq!(pg.psql(&pg.url(), "SHOW fsync"), "off");
        // A script may mix statements that cannot share a transaction.
        let script = "CREATE TABLE s (x int); CREATE DATABASE scripted; SELECT 3";
        assert_eq!(pg.psql(&pg.url(), script), "3");
    }
}

#[test]
fn two_servers_at_once_are_separate() {
    if external() {
        return;
    }
    let (a, b) = (PgServer::start_own(), PgServer::start_own());
    assert_ne!(a.url(), b.url());
    a.psql(&a.url(), "CREATE TABLE only_a (x int)");
    assert_eq!(a.psql(&a.url(), "SELECT count(*) FROM only_a"), "0");
    assert!(
        !psql_raw(&b.url(), "SELECT count(*) FROM only_a")
            .status
            .success()
    );
}

#[test]
fn a_stopped_server_comes_back_with_its_data() {
    if external() {
        eprintln!("skipped: stop/start_again need a cluster of the harness's own");
        return;
    }
    let pg = PgServer::start_own();
    let url = pg.url();
    pg.psql(
        &url,
        "CREATE TABLE kept (x text); INSERT INTO kept VALUES ('before the stop')",
    );

    pg.stop();
    let down = psql_raw(&url, "SELECT 1");
    assert!(!down.status.success(), "a stopped server answered");

    pg.start_again();
    assert_eq!(pg.psql(&url, "SELECT x FROM kept"), "before the stop");

    drop(pg);
    let gone = psql_raw(&url, "SELECT 1");
    assert!(!gone.status.success(), "a dropped server answered");
}

#[test]
fn a_wrong_or_missing_password_is_refused() {
    if external() {
        eprintln!("skipped: the external server's auth is not the harness's");
        return;
    }
    let pg = PgServer::start();
    let wrong = pg.url().replace(PgServer::PASSWORD, "not-the-password");
    let out = psql_raw(&wrong, "SELECT 1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a wrong password was let in");
    assert!(err.contains("password authentication failed"), "{err}");

    let out = psql_raw(&pg.url_without_password(), "SELECT 1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "no password was let in");
    assert!(err.contains("no password supplied"), "{err}");

    // The right one, through the same direct path, is let in.
    let ok = psql_raw(&pg.url(), "SELECT 1");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
}

/// `start` gives each test a database of its own on the test process's
/// one cluster: what one test makes the other never sees, and a test's
/// database is dropped with its `PgServer` while the cluster serves on.
#[test]
fn tests_share_a_cluster_but_never_a_database() {
    let (a, b) = (PgServer::start(), PgServer::start());
    assert_ne!(a.url(), b.url());
    a.psql(&a.url(), "CREATE TABLE only_a (x int)");
    assert_eq!(a.psql(&a.url(), "SELECT count(*) FROM only_a"), "0");
    assert!(
        !psql_raw(&b.url(), "SELECT count(*) FROM only_a")
            .status
            .success()
    );
    let gone = a.url();
    drop(a);
    assert!(
        !psql_raw(&gone, "SELECT 1").status.success(),
        "a dropped test's database is still there"
    );
    assert_eq!(b.psql(&b.url(), "SELECT 1"), "1");
}
