//! A real terminal for the end-to-end tests: one tmux server of its own
//! (`tmux -L`, no config) running one command, read with `capture-pane`,
//! killed (only it) when dropped.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Single-quote for `sh`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The `env` prefix of a docket started in a pane: the variables a test
/// must not inherit cleared, then `vars` set.
pub fn env_line(vars: impl IntoIterator<Item = (impl AsRef<str>, impl AsRef<str>)>) -> String {
    let mut s = String::from(
        "env -u NO_COLOR -u DOCKET_WORKSPACE -u DOCKET_LOG -u DOCKET_LEDGER_URL -u PGPASSWORD",
    );
    for (k, v) in vars {
        s.push_str(&format!(" {}={}", k.as_ref(), sh_quote(v.as_ref())));
    }
    s
}

/// Poll `f` every 100 ms until it gives a value; panic with `what` (and the
/// last diagnostics from `f`) after `timeout`.
pub fn poll<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let last = match f() {
            Ok(v) => return v,
            Err(e) => e,
        };
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last seen:\n{last}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The code from the `EXIT=<code>` a pane's shell prints (at the end of
/// the command's last line when that has no newline, as after a `^C`).
pub fn exit_code(text: &str) -> Option<i32> {
    text.lines()
        .find_map(|l| l.rsplit_once("EXIT=").map(|(_, code)| code))
        .and_then(|c| c.trim().parse().ok())
}

/// The one session of a pane's server.
const SESSION: &str = "main";

pub struct Pane {
    socket: String,
    /// The socket file, removed after the server is killed (tmux leaves it).
    socket_path: Option<PathBuf>,
}

impl Pane {
    fn tmux(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux is needed by this test")
    }

    /// Start the shell command line `cmd` in a fresh tmux server of
    /// `width` x `height`, named after this process and `tag`. The shell
    /// traps SIGINT, so a Ctrl-C reaches the command alone (it gets the
    /// default disposition back); after it the shell prints `EXIT=<code>`
    /// and stays a while, so its last screen and exit can be read.
    pub fn start(tag: &str, cmd: &str, width: u16, height: u16) -> Pane {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let mut pane = Pane {
            socket: format!("docket-test-{}-{tag}-{n}", std::process::id()),
            socket_path: None,
        };
        // A leftover of an earlier run of this very process id.
        let _ = pane.tmux(&["kill-server"]);
        let line = format!("trap : INT; {cmd}; echo EXIT=$?; sleep 60");
        let (w, h) = (width.to_string(), height.to_string());
        let new_session = || {
            pane.tmux(&[
                "new-session",
                "-d",
                "-s",
                SESSION,
                "-x",
                &w,
                "-y",
                &h,
                &line,
            ])
        };
        // A server still exiting ("server exited unexpectedly") is tmux,
        // not the command: try again.
        let mut out = new_session();
        for _ in 0..20 {
            if out.status.success() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
            out = new_session();
        }
        assert!(
            out.status.success(),
            "tmux new-session: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        pane.tmux(&["set-option", "-t", SESSION, "remain-on-exit", "on"]);
        let path = pane.display("#{socket_path}");
        if path.ends_with(&pane.socket) {
            pane.socket_path = Some(PathBuf::from(path));
        }
        pane
    }

    /// The visible screen as plain text.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.tmux(&["capture-pane", "-p", "-t", SESSION]).stdout)
            .to_string()
    }

    /// The visible screen with its attributes as escape sequences.
    pub fn screen_escaped(&self) -> String {
        String::from_utf8_lossy(
            &self
                .tmux(&["capture-pane", "-p", "-e", "-t", SESSION])
                .stdout,
        )
        .to_string()
    }

    /// The screen and its scrollback, wrapped lines joined.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .tmux(&["capture-pane", "-p", "-J", "-S", "-1000", "-t", SESSION])
                .stdout,
        )
        .to_string()
    }

    /// A tmux format (`#{alternate_on}`, `#{pane_pid}`) for the pane.
    pub fn display(&self, format: &str) -> String {
        String::from_utf8_lossy(&self.tmux(&["display", "-p", "-t", SESSION, format]).stdout)
            .trim()
            .to_string()
    }

    /// Send `keys` (tmux key names: `b`, `Escape`, `C-c`; other text as
    /// typed) to the pane.
    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", SESSION];
        args.extend_from_slice(keys);
        let out = self.tmux(&args);
        assert!(
            out.status.success(),
            "tmux send-keys {keys:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Resize the terminal to `width` x `height`.
    pub fn resize(&self, width: u16, height: u16) {
        let (w, h) = (width.to_string(), height.to_string());
        let out = self.tmux(&["resize-window", "-t", SESSION, "-x", &w, "-y", &h]);
        assert!(
            out.status.success(),
            "tmux resize-window: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Wait until the screen satisfies `f`; that screen, or a panic naming
    /// `what` with the last screen seen.
    pub fn wait(&self, what: &str, timeout: Duration, f: impl Fn(&str) -> bool) -> String {
        poll(what, timeout, || {
            let s = self.screen();
            if f(&s) { Ok(s) } else { Err(s) }
        })
    }

    /// Wait until `text` is on the screen.
    pub fn wait_for(&self, text: &str, timeout: Duration) -> String {
        self.wait(&format!("{text:?} on the screen"), timeout, |s| {
            s.contains(text)
        })
    }

    /// Wait until the text with scrollback ([`Pane::text`]) satisfies `f`.
    pub fn wait_text(&self, what: &str, timeout: Duration, f: impl Fn(&str) -> bool) -> String {
        poll(what, timeout, || {
            let s = self.text();
            if f(&s) { Ok(s) } else { Err(s) }
        })
    }

    /// Wait until the command has ended; its exit code and the text.
    pub fn wait_exit(&self, timeout: Duration) -> (i32, String) {
        let text = self.wait_text("the command to exit (EXIT=)", timeout, |s| {
            exit_code(s).is_some()
        });
        (exit_code(&text).unwrap(), text)
    }

    /// The pid of the command in the pane (the shell's child).
    pub fn command_pid(&self, timeout: Duration) -> u32 {
        let shell = self.display("#{pane_pid}");
        poll("the command's pid", timeout, || {
            let out = Command::new("pgrep").args(["-P", &shell]).output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            text.split_whitespace()
                .next()
                .and_then(|p| p.parse().ok())
                .ok_or(format!("no child of {shell}"))
        })
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = self.tmux(&["kill-server"]);
        if let Some(p) = &self.socket_path {
            let _ = std::fs::remove_file(p);
        }
    }
}
