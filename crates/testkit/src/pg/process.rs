//! The server's processes: who runs them (root hands them to the `postgres`
//! user), where the binaries are, the watchdog, and the small helpers that
//! run a command and read what it said.

use super::*;

/// How the cluster's commands run: PostgreSQL refuses to run as root, so a
/// root test process runs them as the `postgres` OS user.
pub(super) enum RunAs {
    Me,
    Runuser(PathBuf),
    Su(PathBuf),
}

pub(super) fn run_as() -> &'static RunAs {
    static RUN_AS: OnceLock<RunAs> = OnceLock::new();
    RUN_AS.get_or_init(|| {
        let uid = Command::new("id").arg("-u").output();
        let root = uid.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        if !root {
            return RunAs::Me;
        }
        let postgres = Command::new("id").args(["-u", "postgres"]).output();
        assert!(
            postgres.is_ok_and(|o| o.status.success()),
            "the tests run as root and PostgreSQL refuses to: create a `postgres` OS user \
             (the Debian package `postgresql` does), run as another user, or set {EXTERNAL_ENV}"
        );
        if let Some(p) = find_program("runuser", &["/usr/sbin", "/sbin"]) {
            RunAs::Runuser(p)
        } else if let Some(p) = find_program("su", &["/bin", "/usr/bin"]) {
            RunAs::Su(p)
        } else {
            panic!("the tests run as root, and neither runuser nor su is there to run PostgreSQL as `postgres`")
        }
    })
}

/// `program args` as the cluster's user, in `cwd` (initdb fails when the
/// user cannot read its working directory), without the caller's PG*
/// settings.
pub(super) fn as_postgres(program: &Path, args: &[&OsStr], cwd: &Path) -> Command {
    let mut cmd = match run_as() {
        RunAs::Me => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
        RunAs::Runuser(runuser) => {
            let mut c = Command::new(runuser);
            c.args(["-u", "postgres", "--"]).arg(program).args(args);
            c
        }
        RunAs::Su(su) => {
            let line = std::iter::once(program.as_os_str())
                .chain(args.iter().copied())
                .map(|a| sh_quote(&a.to_string_lossy()))
                .collect::<Vec<_>>()
                .join(" ");
            let mut c = Command::new(su);
            c.args(["postgres", "-s", "/bin/sh", "-c"]).arg(line);
            c
        }
    };
    strip_pg_env(&mut cmd);
    cmd.current_dir(cwd).stdin(Stdio::null());
    cmd
}

/// A process that outlives this one by a second: when the test process is
/// gone without having dropped its `PgServer` (SIGKILL, a runner's timeout),
/// it stops the cluster (SIGQUIT to the postmaster: immediate shutdown) and
/// deletes the dir. In a session of its own, ignoring SIGTERM/SIGINT/SIGHUP,
/// so a signal to the test's process group does not take it along.
pub(super) fn watchdog(dir: &Path) -> Option<Child> {
    const SCRIPT: &str = r#"trap '' HUP INT TERM
while kill -0 "$1" 2>/dev/null; do sleep 1; done
pid=$(head -n 1 "$2/data/postmaster.pid" 2>/dev/null) && kill -QUIT "$pid" 2>/dev/null && sleep 1
rm -rf "$2""#;
    let mut cmd = match find_program("setsid", &["/usr/bin", "/bin"]) {
        Some(setsid) => {
            let mut c = Command::new(setsid);
            c.arg("sh");
            c
        }
        None => Command::new("sh"),
    };
    cmd.args(["-c", SCRIPT, "pg-watchdog"])
        .arg(std::process::id().to_string())
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}

/// The dir holding initdb and pg_ctl: PATH first (a symlinked initdb, as in
/// /usr/local/bin, is followed to its real dir, which also has the matching
/// psql), else the highest version under /usr/lib/postgresql (Debian keeps
/// them off PATH).
pub(super) fn bin_dir() -> Option<PathBuf> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| {
        let has_both = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
        let path = std::env::var_os("PATH").unwrap_or_default();
        if let Some(d) = std::env::split_paths(&path).find(|d| has_both(d)) {
            let real = std::fs::canonicalize(d.join("initdb"))
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf));
            return Some(real.filter(|r| has_both(r)).unwrap_or(d));
        }
        let mut found: Vec<(Vec<u32>, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| {
                let e = e.ok()?;
                let version = e
                    .file_name()
                    .to_str()?
                    .split('.')
                    .map(|p| p.parse().ok())
                    .collect::<Option<Vec<u32>>>()?;
                let bin = e.path().join("bin");
                has_both(&bin).then_some((version, bin))
            })
            .collect();
        found.sort();
        found.pop().map(|(_, bin)| bin)
    })
    .clone()
}

pub(super) fn find_program(name: &str, also: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(also.iter().map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A port nothing listens on now. The server binds it a moment later, so
/// another process may take it first; `configure` then tries another.
pub(super) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

pub(super) fn strip_pg_env(cmd: &mut Command) {
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PG") {
            cmd.env_remove(k);
        }
    }
}

pub(super) fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub(super) fn append(path: &Path, s: &str) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| f.write_all(s.as_bytes()))
        .unwrap_or_else(|e| panic!("append to {}: {e}", path.display()));
}

pub(super) fn output(cmd: &mut Command, what: &str) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("spawn {what}: {e}"))
}

pub(super) fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A failed Output carrying `why` as its stderr (for spawn errors).
pub(super) fn failed(why: &str) -> Output {
    use std::os::unix::process::ExitStatusExt;
    Output {
        status: std::process::ExitStatus::from_raw(1 << 8),
        stdout: Vec::new(),
        stderr: why.as_bytes().to_vec(),
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
