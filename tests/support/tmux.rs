//! A real terminal for the end-to-end tests: one tmux session running one
//! command, read with `capture-pane`, killed (only it) when dropped.

use std::process::Command;
use std::time::{Duration, Instant};

fn tmux(args: &[&str]) -> std::process::Output {
    Command::new("tmux")
        .args(args)
        .output()
        .expect("tmux is needed by this test")
}

/// Single-quote for `sh`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

pub struct Pane {
    pub name: String,
}

impl Pane {
    /// Start the shell command line `cmd` in a fresh tmux session of
    /// `width` x `height`, named after this process and `tag`. The pane
    /// stays after the command ends, so its last screen can be read.
    pub fn start(tag: &str, cmd: &str, width: u16, height: u16) -> Pane {
        let name = format!("docket-test-{}-{tag}", std::process::id());
        // A leftover of an earlier run of this very process id.
        let _ = tmux(&["kill-session", "-t", &name]);
        let line = format!("{cmd}; echo EXIT=$?; sleep 60");
        let (w, h) = (width.to_string(), height.to_string());
        let new_session = || tmux(&["new-session", "-d", "-s", &name, "-x", &w, "-y", &h, &line]);
        // A session started while the tmux server is exiting (another
        // test killed the last session) fails: that is tmux, so try again.
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
        let pane = Pane { name };
        tmux(&["set-option", "-t", &pane.name, "remain-on-exit", "on"]);
        pane
    }

    /// The visible screen as plain text.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &self.name]).stdout).to_string()
    }

    /// Wait until the screen satisfies `f`; that screen, or a panic naming
    /// `what` with the last screen seen.
    pub fn wait(&self, what: &str, timeout: Duration, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.screen();
            if f(&s) {
                return s;
            }
            if Instant::now() >= deadline {
                panic!("timed out after {timeout:?} waiting for {what}; the screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = tmux(&["kill-session", "-t", &self.name]);
    }
}
