//! The ledger's disk (fault-matrix row D2). Two guards:
//! - before it fills: when the disk under a SQLite ledger has less than
//!   `min_free` left, every stage's sends are held (`Cause::DiskLow`) and
//!   the session shows paused with the reason; requests under way finish
//!   and are written. Sends go again once twice that is free.
//! - once it is full: the ledger writer keeps the writes it could not
//!   commit in memory and tries them again (`writer::Health`); this says
//!   so, and says when the ledger is written again.

use std::path::PathBuf;

use super::Reporter;
use super::ctx::Ctx;
use super::reach_probe::set_state;
use crate::ledger::LedgerLocation;

/// Free space under which nothing new is sent, unless
/// `DOCKET_MIN_FREE_MB` says otherwise.
const MIN_FREE_MB: u64 = 64;

pub(super) struct DiskGuard {
    /// The SQLite ledger's folder; None on PostgreSQL (its server's disk).
    dir: Option<PathBuf>,
    min_free: u64,
    held: bool,
    full_said: bool,
}

impl DiskGuard {
    pub(super) fn new(ledger: &LedgerLocation) -> DiskGuard {
        let dir = match ledger {
            LedgerLocation::File(path) => Some(
                path.parent()
                    .filter(|d| !d.as_os_str().is_empty())
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from(".")),
            ),
            LedgerLocation::Postgres(_) => None,
        };
        let min_free_mb = std::env::var("DOCKET_MIN_FREE_MB")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(MIN_FREE_MB);
        DiskGuard {
            dir,
            min_free: min_free_mb * 1024 * 1024,
            held: false,
            full_said: false,
        }
    }

    /// One control-loop tick.
    pub(super) fn tick(&mut self, ctx: &Ctx, reporter: &dyn Reporter, operator_paused: bool) {
        self.watch_writer(ctx, reporter);
        let Some(free) = self.dir.as_deref().and_then(available) else {
            return;
        };
        let dir = self
            .dir
            .as_deref()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        if !self.held && free < self.min_free {
            self.held = true;
            let why = format!(
                "the ledger's disk ({dir}) has {} free, under {}: nothing new is sent until space is freed; \
                 requests under way finish and are written",
                mb(free),
                mb(self.min_free)
            );
            ctx.reach_watch.hold_all_for_disk(&why);
            set_state(ctx, "paused", Some(why.clone()));
            ctx.event("warn", "disk_low", why.clone());
            reporter.line(&format!("Paused: {why}."));
        } else if self.held && free >= self.min_free.saturating_mul(2) {
            self.held = false;
            if ctx.reach_watch.release_disk_holds()
                && !operator_paused
                && !ctx.soft_stop.is_cancelled()
            {
                set_state(ctx, "running", None);
            }
            let message = format!(
                "the ledger's disk has {} free again: sending resumes",
                mb(free)
            );
            ctx.event("info", "disk_ok", message.clone());
            reporter.line(&format!("Resumed: {message}."));
        }
    }

    /// Say when the writer starts and stops holding writes for a full disk.
    fn watch_writer(&mut self, ctx: &Ctx, reporter: &dyn Reporter) {
        match ctx.writer.health().full() {
            Some((_, why, held)) if !self.full_said => {
                self.full_said = true;
                reporter.line(&format!(
                    "The ledger cannot be written ({}): {held} write(s) are held in memory and tried again every few seconds. \
                     Free space on its disk and the run goes on; nothing is lost unless docket is stopped meanwhile \
                     (answers not yet written are then counted ambiguous on resume).",
                    crate::sanitize::for_terminal(&why)
                ));
            }
            None if self.full_said => {
                self.full_said = false;
                reporter.line("The ledger is written again: the writes held in memory are in it.");
                ctx.event(
                    "info",
                    "disk_ok",
                    "the ledger was full; the writes held in memory are now written".into(),
                );
            }
            _ => {}
        }
    }

    /// What slows the run, while a guard holds it.
    pub(super) fn slow_reason(&self, ctx: &Ctx) -> Option<String> {
        if let Some((for_, _, held)) = ctx.writer.health().full() {
            return Some(format!(
                "ledger disk full for {} s: {held} write(s) held in memory",
                for_.as_secs()
            ));
        }
        self.held
            .then(|| "the ledger's disk is almost full: nothing new is sent".to_string())
    }
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
}

/// Bytes an unprivileged process may still write under `dir`.
fn available(dir: &std::path::Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct we own; `c` outlives the call.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
    }
}
