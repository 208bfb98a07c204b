//! A throwaway, real PostgreSQL server for the integration tests.
//!
//! `PgServer::start()` gives a test a fresh database of its own on the test
//! process's one cluster, which the first call starts (`initdb` into a temp
//! dir, a free loopback port, its unix socket in that dir): an `initdb` per
//! test cost seconds each, and the worker tests alone start fifteen. Tests
//! that stop the server, or reach it through its socket, start a cluster of
//! their own with `PgServer::start_own()`, so parallel test binaries and
//! such tests never share a server, a port or a socket. A cluster trades
//! durability for speed (`fsync`, `synchronous_commit` and
//! `full_page_writes` off); a crash of the machine loses nothing a test
//! cares about. Dropping a `PgServer` drops its database (`start`) or stops
//! its cluster and deletes the dir (`start_own`); a watchdog does the same
//! for a cluster when the test process ends, however it ends (the shared
//! one is never dropped: it lives as long as the process), so no server
//! outlives it.
//!
//! With `DOCKET_TEST_PG_URL=postgres://user:password@host:port/db` set, the
//! harness starts nothing: it creates a database with a random name on that
//! server for each `PgServer` (and for each `fresh_database`) and drops them
//! when the `PgServer` is dropped. `stop`/`start_again` need a cluster of
//! their own and panic there.
//!
//! PostgreSQL refuses to run as root, so a root test process runs `initdb`
//! and `pg_ctl` as the `postgres` OS user (`runuser`, else `su`) and hands it
//! the temp dir with `chown`.

use std::ffi::OsStr;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

mod process;
use process::*;

mod url;
pub use url::*;

/// A server that is already running, used instead of starting one.
const EXTERNAL_ENV: &str = "DOCKET_TEST_PG_URL";
/// The superuser of an owned cluster (also its first database's name).
const USER: &str = "docket";
/// How many free ports to try when another process takes ours between the
/// probe and the server's bind.
const PORT_ATTEMPTS: usize = 5;

pub struct PgServer {
    /// The data dir, the socket, the log and the password file; `None` for
    /// an external server.
    dir: Option<tempfile::TempDir>,
    port: u16,
    /// Where `initdb`, `pg_ctl` and `psql` live; `None` when not found (external only).
    bin: Option<PathBuf>,
    /// The password in `url()`, for psql's PGPASSWORD with
    /// `url_without_password()`.
    password: String,
    external: bool,
    /// The test database, with the password.
    url: String,
    /// Where CREATE/DROP DATABASE run: the cluster's `postgres` database, or
    /// `DOCKET_TEST_PG_URL` itself.
    admin_url: String,
    /// Databases made on an external server, dropped with this value.
    created: Mutex<Vec<String>>,
    /// Whether an owned cluster may be up, so drop only stops what runs.
    running: AtomicBool,
    /// Stops the cluster if the test process dies without dropping this.
    watchdog: Option<Child>,
}

impl PgServer {
    /// The superuser's password: a canary. Tests grep logs, exports and
    /// error messages for it to prove the password never leaks.
    pub const PASSWORD: &'static str = "canary-pg-secret-7f3a";

    /// A fresh database with a random name, on the test process's cluster
    /// (started on first use: initdb with a superuser `docket` whose
    /// password is `PgServer::PASSWORD`, scram-sha-256 auth for TCP from
    /// 127.0.0.1, `listen_addresses=127.0.0.1`, its own port, unix socket in
    /// the temp dir, `fsync=off`, `synchronous_commit=off`,
    /// `full_page_writes=off` for speed); or, when env `DOCKET_TEST_PG_URL`
    /// is set, on that server. Parallel tests never share a database.
    pub fn start() -> PgServer {
        match std::env::var(EXTERNAL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self::start_external(url.trim()),
            _ => Self::start_external(&Self::shared().admin_url),
        }
    }

    /// A cluster of its own (as `start` describes), for a test that stops
    /// and starts the server (`stop`, `start_again`) or reaches it through
    /// its socket (`socket_url`); with `DOCKET_TEST_PG_URL` set, a database
    /// there, as `start` (and those calls panic).
    pub fn start_own() -> PgServer {
        match std::env::var(EXTERNAL_ENV) {
            Ok(url) if !url.trim().is_empty() => Self::start_external(url.trim()),
            _ => Self::start_owned(),
        }
    }

    /// The test process's one cluster, started on first use; `start` makes
    /// a database on it per test.
    fn shared() -> &'static PgServer {
        static SHARED: OnceLock<PgServer> = OnceLock::new();
        SHARED.get_or_init(Self::start_owned)
    }

    /// postgres://docket:PASSWORD@127.0.0.1:PORT/docket (or the fresh
    /// database on the external server).
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The password of `url()` (and of every `fresh_database`), for
    /// PGPASSWORD.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The same URL without the password (for tests that pass the password
    /// through PGPASSWORD).
    pub fn url_without_password(&self) -> String {
        without_password(&self.url)
    }

    /// `database`'s URL through the cluster's Unix socket instead of TCP
    /// (with the password); `None` for an external server.
    pub fn socket_url(&self, database_url: &str) -> Option<String> {
        let dir = self
            .dir
            .as_ref()?
            .path()
            .to_string_lossy()
            .replace('/', "%2F");
        let database = database_url.rsplit('/').next()?;
        Some(format!(
            "postgres://{USER}:{}@{dir}:{}/{database}",
            self.password, self.port
        ))
    }

    /// A new empty database on this server; its URL (with password). Each
    /// call gives another, so a test can run two ledgers side by side.
    pub fn fresh_database(&self) -> String {
        let name = random_name();
        self.psql(&self.admin_url, &format!("CREATE DATABASE {name}"));
        lock(&self.created).push(name.clone());
        with_database(&self.url, &name)
    }

    /// Stops the server (fast shutdown: clients are disconnected, the data is
    /// kept) and waits until it is down. For tests of a ledger whose server
    /// goes away mid-run; `start_again` brings it back.
    pub fn stop(&self) {
        self.owned_only("stop");
        let out = self.pg_ctl(&["-m", "fast", "-w", "-t", "60", "stop"]);
        assert!(
            out.status.success(),
            "pg_ctl stop failed ({}):\n{}\nServer log:\n{}",
            out.status,
            text(&out),
            self.log_from(0)
        );
        self.running.store(false, Ordering::SeqCst);
    }

    /// Starts the stopped server again on the same port and data, and waits
    /// until it accepts connections.
    pub fn start_again(&self) {
        self.owned_only("start_again");
        if let Err(why) = self.launch() {
            panic!(
                "PostgreSQL did not start again on port {}: {why}",
                self.port
            );
        }
    }

    /// Runs SQL through psql against `url` and returns stdout (psql -X -A -t
    /// -q -v `ON_ERROR_STOP=1`, trailing newlines trimmed, so `SELECT 1` gives
    /// "1"); panics with psql's stderr on failure. The SQL goes in on stdin,
    /// so a script may mix statements that cannot share a transaction
    /// (CREATE DATABASE).
    pub fn psql(&self, url: &str, sql: &str) -> String {
        let out = self.run_psql(url, sql);
        assert!(
            out.status.success(),
            "psql against {} failed ({}):\n{}\nSQL:\n{sql}",
            without_password(url),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .trim_end_matches('\n')
            .to_string()
    }

    fn start_owned() -> PgServer {
        let bin = bin_dir().unwrap_or_else(|| {
            panic!(
                "PostgreSQL server binaries (initdb, pg_ctl) are neither on PATH nor under \
                 /usr/lib/postgresql/*/bin: install the Debian package `postgresql` (CI installs \
                 it), or set {EXTERNAL_ENV}=postgres://user:password@host:port/db to use a \
                 running server"
            )
        });
        let dir = tempfile::Builder::new()
            .prefix("docket-pg-")
            .tempdir()
            .expect("a temp dir for PostgreSQL");
        let root = dir.path().to_path_buf();
        let pwfile = root.join("pwfile");
        std::fs::write(&pwfile, format!("{}\n", Self::PASSWORD)).expect("write the pwfile");
        if !matches!(run_as(), RunAs::Me) {
            // 0700 and ours until now; the server's user must own it.
            let out = output(
                Command::new("chown").arg("-R").arg("postgres").arg(&root),
                "chown",
            );
            assert!(out.status.success(), "chown -R postgres: {}", text(&out));
        }
        let mut server = PgServer {
            dir: Some(dir),
            port: 0,
            bin: Some(bin.clone()),
            password: Self::PASSWORD.to_string(),
            external: false,
            url: String::new(),
            admin_url: String::new(),
            created: Mutex::new(Vec::new()),
            running: AtomicBool::new(false),
            watchdog: watchdog(&root),
        };
        let data = root.join("data");
        let initdb: [&OsStr; 12] = [
            "-D".as_ref(),
            data.as_os_str(),
            "-U".as_ref(),
            USER.as_ref(),
            "--pwfile".as_ref(),
            pwfile.as_os_str(),
            "--auth-host=scram-sha-256".as_ref(),
            "--auth-local=scram-sha-256".as_ref(),
            "-E".as_ref(),
            "UTF8".as_ref(),
            "--locale=C".as_ref(),
            // No fsync of the new cluster: it is thrown away after the test.
            "--no-sync".as_ref(),
        ];
        let out = output(
            &mut as_postgres(&bin.join("initdb"), &initdb, &root),
            "initdb",
        );
        assert!(
            out.status.success(),
            "initdb failed ({}); as root it runs as the `postgres` user, which must be \
                 able to reach {}:\n{}",
            out.status,
            root.display(),
            text(&out)
        );
        server.configure();
        server.url = format!(
            "postgres://{USER}:{}@127.0.0.1:{}/{USER}",
            Self::PASSWORD,
            server.port
        );
        server.admin_url = with_database(&server.url, "postgres");
        server.psql(&server.admin_url, &format!("CREATE DATABASE {USER}"));
        server
    }

    /// Appends the test settings to postgresql.conf and starts the cluster,
    /// moving to another free port when someone else took the probed one.
    fn configure(&mut self) {
        let root = self.root().to_path_buf();
        let socket_dir = root.to_string_lossy().replace('\'', "''");
        append(
            &root.join("data/postgresql.conf"),
            &format!(
                "\n# crates/testkit/src/pg.rs: a throwaway cluster, fast rather than durable.\n\
                 listen_addresses = '127.0.0.1'\n\
                 unix_socket_directories = '{socket_dir}'\n\
                 fsync = off\n\
                 synchronous_commit = off\n\
                 full_page_writes = off\n\
                 # Many clusters run at once; tests need little cache.\n\
                 shared_buffers = 32MB\n\
                 # The tests of a binary share one cluster, several workers each.\n\
                 max_connections = 300\n"
            ),
        );
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            self.port = free_port();
            // A later `port` line wins over an earlier one.
            append(
                &root.join("data/postgresql.conf"),
                &format!("port = {}\n", self.port),
            );
            match self.launch() {
                Ok(()) => return,
                Err(why) if why.contains("could not bind") => last = why,
                Err(why) => panic!("PostgreSQL did not start on port {}: {why}", self.port),
            }
        }
        panic!("PostgreSQL found no free port in {PORT_ATTEMPTS} tries; the last: {last}");
    }

    /// `pg_ctl start`, waiting until the server accepts connections; on
    /// failure, pg_ctl's output and what the server logged this time.
    fn launch(&self) -> Result<(), String> {
        let log = self.root().join("server.log");
        let from = std::fs::metadata(&log).map_or(0, |m| m.len());
        // Before the start: a start that times out may still come up, and
        // drop must then stop it.
        self.running.store(true, Ordering::SeqCst);
        let args: [&OsStr; 6] = [
            "-w".as_ref(),
            "-t".as_ref(),
            "60".as_ref(),
            "-l".as_ref(),
            log.as_os_str(),
            "start".as_ref(),
        ];
        let out = self.pg_ctl(&args);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start failed ({}):\n{}\nServer log:\n{}",
                out.status,
                text(&out),
                self.log_from(from)
            ))
        }
    }

    fn start_external(admin: &str) -> PgServer {
        assert!(
            admin.starts_with("postgres://") || admin.starts_with("postgresql://"),
            "{EXTERNAL_ENV} must be a postgres:// URL, not {:?}",
            without_password(admin)
        );
        let name = random_name();
        let server = PgServer {
            dir: None,
            port: port_of(admin),
            bin: bin_dir(),
            password: password_of(admin),
            external: true,
            url: with_database(admin, &name),
            admin_url: admin.to_string(),
            created: Mutex::new(vec![name.clone()]),
            running: AtomicBool::new(true),
            watchdog: None,
        };
        server.psql(admin, &format!("CREATE DATABASE {name}"));
        server
    }

    fn owned_only(&self, what: &str) {
        assert!(
            !self.external,
            "PgServer::{what} needs a cluster of its own: start it with PgServer::start_own(), \
             with {EXTERNAL_ENV} unset"
        );
    }

    fn root(&self) -> &Path {
        self.dir.as_ref().map_or(Path::new("."), |d| d.path())
    }

    /// `pg_ctl -D <data> <args>` as the cluster's user; never panics (drop
    /// uses it), a failure to spawn is a failed Output.
    fn pg_ctl<S: AsRef<OsStr>>(&self, args: &[S]) -> Output {
        let Some(bin) = &self.bin else {
            return failed("no pg_ctl");
        };
        let data = self.root().join("data");
        let mut all: Vec<&OsStr> = vec!["-D".as_ref(), data.as_os_str()];
        all.extend(args.iter().map(AsRef::as_ref));
        as_postgres(&bin.join("pg_ctl"), &all, self.root())
            .output()
            .unwrap_or_else(|e| failed(&format!("spawn pg_ctl: {e}")))
    }

    fn run_psql(&self, url: &str, sql: &str) -> Output {
        let psql = self
            .bin
            .as_ref()
            .map(|b| b.join("psql"))
            .filter(|p| p.is_file())
            .unwrap_or_else(|| PathBuf::from("psql"));
        let mut cmd = Command::new(psql);
        if !self.external {
            // Nothing from the developer's libpq setup (PGSSLMODE, PGSERVICE,
            // PGOPTIONS…) may change how a private cluster is reached.
            strip_pg_env(&mut cmd);
        }
        cmd.args([
            "-X",
            "-A",
            "-t",
            "-q",
            "-w",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            "-",
            "-d",
        ])
        .arg(url)
        // A password in `url` wins over this one.
        .env("PGPASSWORD", &self.password)
        .env("PGCONNECT_TIMEOUT", "10")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return failed(&format!("spawn psql (is it on PATH?): {e}")),
        };
        // From a thread of its own: psql may fill its stdout pipe before
        // it has read all of a long script.
        let mut stdin = child.stdin.take().expect("psql's stdin");
        let sql = sql.to_string();
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(sql.as_bytes());
        });
        let out = child
            .wait_with_output()
            .unwrap_or_else(|e| failed(&format!("wait for psql: {e}")));
        let _ = feeder.join();
        out
    }

    /// The server log from byte `from` on.
    fn log_from(&self, from: u64) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.root().join("server.log")) {
            let _ = f.seek(SeekFrom::Start(from));
            let mut bytes = Vec::new();
            let _ = f.read_to_end(&mut bytes);
            s = String::from_utf8_lossy(&bytes).into_owned();
        }
        s
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        if self.external {
            let names = std::mem::take(&mut *lock(&self.created));
            for name in names {
                // FORCE: a test may leave a connection (a pool) open.
                let _ = self.run_psql(
                    &self.admin_url,
                    &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
                );
            }
        } else if self.running.swap(false, Ordering::SeqCst) {
            let _ = self.pg_ctl(&["-m", "immediate", "-w", "-t", "30", "stop"]);
        }
        // The TempDir field then deletes the cluster.
    }
}

/// A consistent copy of the PostgreSQL ledger at `url` (one snapshot, by
/// `docket ledger copy --from`) as a SQLite file in `dir`, opened: the
/// checks written for SQLite read a PostgreSQL ledger through it.
pub fn snapshot(url: &str, dir: &Path) -> rusqlite::Connection {
    std::fs::create_dir_all(dir).expect("snapshot dir");
    let out = Command::new(super::procs::bin())
        .arg("--workspace")
        .arg(dir)
        .args(["ledger", "copy", "--from", url])
        .env("HOME", dir)
        .env_remove("DOCKET_LEDGER_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .expect("docket ledger copy");
    assert!(
        out.status.success(),
        "snapshot of the PostgreSQL ledger: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    rusqlite::Connection::open(dir.join("docket.sqlite")).expect("open the snapshot")
}
