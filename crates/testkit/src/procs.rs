//! Child processes for the end-to-end tests: the real `docket` binary and
//! `docket mock-provider` as its own process, steered over HTTP. Every child
//! is SIGKILLed and reaped when dropped (also on a failing assertion).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The `docket` binary cargo built beside the running test or bench
/// (`target/<profile>/docket`; the test itself runs from
/// `target/<profile>/deps/`). Cargo builds the binary before it runs a
/// test or bench of the package that has it.
pub fn bin() -> &'static str {
    static BINPATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BINPATH.get_or_init(|| {
        let me = std::env::current_exe().expect("the test's own path");
        let profile_dir = me
            .parent()
            .and_then(|deps| deps.parent())
            .expect("a test runs from target/<profile>/deps");
        let bin = profile_dir.join("docket");
        assert!(bin.is_file(), "no docket binary at {}", bin.display());
        bin.to_string_lossy().into_owned()
    })
}
/// The longest a test waits for the mock to listen.
const STATE_TIMEOUT: Duration = Duration::from_secs(20);

/// Send `signal` (`-INT`, `-TERM`) to the process `pid` (one the test
/// started itself).
pub fn signal(pid: u32, signal: &str) {
    let ok = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill")
        .success();
    assert!(ok, "kill {signal} {pid}");
}

/// A child process, SIGKILLed and reaped when dropped (also on a failing
/// assertion), with its stdout and stderr in one file.
pub struct Proc {
    pub child: Child,
    pub what: String,
    pub out: Option<PathBuf>,
}

impl Proc {
    /// Start `command` with stdin closed and its stdout and stderr in the
    /// file `out`; `what` names it in failures.
    pub fn start(mut command: Command, what: String, out: PathBuf) -> Proc {
        let f = std::fs::File::create(&out).expect("output file");
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(f.try_clone().expect("output file")))
            .stderr(Stdio::from(f))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        Proc {
            child,
            what,
            out: Some(out),
        }
    }

    pub fn output(&self) -> String {
        self.out
            .as_ref()
            .map(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned())
            .unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Wait for the exit within `timeout`; on timeout kill it and fail.
    pub fn wait(&mut self, timeout: Duration) -> (Option<i32>, String) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status.code(), self.output());
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not end within {timeout:?}; killed. Output:\n{}",
                    self.what,
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// SIGKILL and reap; the output so far.
    pub fn kill9(&mut self) -> String {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reap");
        self.output()
    }

    /// Fail if the child already ended (it should still be working).
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            panic!(
                "{} ended early ({status}). Output:\n{}",
                self.what,
                self.output()
            );
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// `docket mock-provider` on a free loopback port, steered over HTTP.
pub struct Mock {
    _proc: Proc,
    pub port: u16,
}

impl Mock {
    pub fn start(flags: &[&str]) -> Mock {
        let mut child = Command::new(bin())
            .args(["mock-provider", "--port", "0"])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn mock-provider");
        let stdout = child.stdout.take().expect("mock stdout");
        let proc = Proc {
            child,
            what: "mock-provider".into(),
            out: None,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            // Keep draining so the mock never blocks on a full pipe.
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let line = rx
            .recv_timeout(STATE_TIMEOUT)
            .expect("the mock's 'listening' line");
        // "mock provider listening on http://127.0.0.1:PORT/v1"
        let port = line
            .trim()
            .rsplit(':')
            .next()
            .and_then(|p| p.split('/').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Mock { _proc: proc, port }
    }

    /// "http://127.0.0.1:PORT" (no path).
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn http(&self, method: &str, path: &str, body: &str) -> Value {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to the mock");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).expect("the mock's answer");
        let resp = String::from_utf8_lossy(&resp);
        let (head, body) = resp.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(
            head.starts_with("HTTP/1.1 200"),
            "{method} {path}: {head}\n{body}"
        );
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"))
    }

    pub fn stats(&self) -> Value {
        self.http("GET", "/_mock/stats", "")
    }

    pub fn stat(&self, name: &str) -> u64 {
        self.stats()[name]
            .as_u64()
            .unwrap_or_else(|| panic!("no {name} in the stats"))
    }

    /// Change one field of the live config (the rest kept as it is).
    pub fn set(&self, field: &str, value: Value) {
        let mut cfg = self.http("GET", "/_mock/config", "");
        cfg[field] = value.clone();
        let now = self.http("POST", "/_mock/config", &cfg.to_string());
        assert_eq!(now[field], value, "config change taken");
    }

    pub fn log(&self) -> Vec<Value> {
        match self.http("GET", "/_mock/log", "") {
            Value::Array(a) => a,
            other => panic!("log: {other}"),
        }
    }
}

/// The real `docket` on workspace `ws`, with `home` as its home, data and
/// state folder (so its log is [`log_file`]`(home)`), and none of the
/// caller's docket settings (workspace, log level, busy timeout) leaking in.
pub fn docket_at(ws: &std::path::Path, home: &std::path::Path) -> Command {
    let mut c = Command::new(bin());
    c.arg("--workspace")
        .arg(ws)
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_STATE_HOME", home.join("state"))
        .env_remove("DOCKET_WORKSPACE")
        .env_remove("DOCKET_LOG")
        .env_remove("DOCKET_BUSY_TIMEOUT_MS");
    c
}

/// The folder of docket's daily log files for a `docket_at` started with this `home`.
pub fn log_dir(home: &std::path::Path) -> PathBuf {
    home.join("state/docket/logs")
}

/// docket's newest log file (`docket.YYYY-MM-DD.log`) for a `docket_at`
/// started with this `home`; the folder's `docket.log`, which never exists,
/// when there is none yet (reading it then fails as a missing log should).
pub fn log_file(home: &std::path::Path) -> PathBuf {
    let dir = log_dir(home);
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("docket.") && n.ends_with(".log"))
        })
        .collect();
    // The dates sort as text: the last is today's.
    logs.sort();
    logs.pop().unwrap_or_else(|| dir.join("docket.log"))
}
