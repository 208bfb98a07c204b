//! The ledger's disk (fault-matrix row D2). Two guards:
//! - before it fills: when the disk under a SQLite ledger has less than
//!   `min_free` left, nothing new is sent (`Ctx::disk_hold`: sync sends
//!   and batch lines alike) and the session shows paused with the reason;
//!   requests under way finish and are written. Sends go again once
//!   `min_free` more is free (or a tenth of a small disk). After
//!   `HOLD_GIVE_UP` the run stops paused (exit 4), resumable.
//! - once it is full: the ledger writer keeps the writes it could not
//!   commit in memory and tries them again (`writer::Health`); this says
//!   so, and says when the ledger is written again.

use std::path::PathBuf;

use super::Reporter;
use super::ctx::Ctx;
use super::reach_probe::set_state;
use docket_ledger::LedgerLocation;

/// Free space under which nothing new is sent, unless
/// [`MIN_FREE_ENV`] says otherwise.
const MIN_FREE_MB: u64 = 64;
/// The environment variable setting the guard's floor in MB (also
/// `docket doctor`'s, so the two agree).
pub const MIN_FREE_ENV: &str = "DOCKET_MIN_FREE_MB";
/// How long sending is held for a disk that stays almost full.
const HOLD_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(30 * 60);

pub(super) struct DiskGuard {
    /// The SQLite ledger's folder; None on PostgreSQL (its server's disk).
    dir: Option<PathBuf>,
    min_free: u64,
    held: Option<std::time::Instant>,
    full_said: bool,
    /// The writer's wait for another process's write lock (row D1), said.
    busy_said: bool,
    /// Writes the writer gave up on, already said.
    dropped_said: usize,
}

impl DiskGuard {
    pub(super) fn new(ledger: &LedgerLocation) -> DiskGuard {
        DiskGuard {
            dir: ledger_dir(ledger),
            min_free: min_free_bytes(),
            held: None,
            full_said: false,
            busy_said: false,
            dropped_said: 0,
        }
    }

    /// One control-loop tick.
    pub(super) fn tick(&mut self, ctx: &Ctx, reporter: &dyn Reporter, operator_paused: bool) {
        self.watch_writer(ctx, reporter);
        let Some((free, size)) = self.dir.as_deref().and_then(space) else {
            return;
        };
        let dir = self
            .dir
            .as_deref()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        let room = resume_room(self.min_free, size);
        match self.held {
            None if free < self.min_free => {
                self.held = Some(std::time::Instant::now());
                let why = format!(
                    "the ledger's disk ({dir}) has {} free, under {}: nothing new is sent until space is freed; \
                     requests under way finish and are written",
                    mb(free),
                    mb(self.min_free)
                );
                ctx.disk_hold.send_replace(true);
                set_state(ctx, "paused", Some(why.clone()));
                ctx.event("warn", "disk_low", why.clone());
                reporter.line(&format!("Paused: {why}."));
            }
            Some(_) if free >= room => {
                self.held = None;
                ctx.disk_hold.send_replace(false);
                if !operator_paused && !ctx.soft_stop.is_cancelled() && !ctx.reach_watch.any_open()
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
            Some(since) if since.elapsed() >= HOLD_GIVE_UP => {
                ctx.stop(super::ctx::StopCause::Paused(format!(
                    "the ledger's disk ({dir}) stayed almost full for {} min ({} free): nothing more is sent; \
                     resume the session once space is freed",
                    HOLD_GIVE_UP.as_secs() / 60,
                    mb(free)
                )));
            }
            _ => {}
        }
    }

    /// Say when the writer starts and stops holding writes for a full disk,
    /// or waiting for a write lock another process holds (row D1).
    fn watch_writer(&mut self, ctx: &Ctx, reporter: &dyn Reporter) {
        match ctx.writer.health().busy() {
            Some(for_) if !self.busy_said => {
                self.busy_said = true;
                reporter.line(&format!(
                    "The ledger is busy: another process has held its write lock for {:.0} s, past the busy timeout. \
                     Writes wait in memory and are tried again; nothing is lost, and the run goes on when it lets go.",
                    for_.as_secs_f64()
                ));
            }
            None if self.busy_said => {
                self.busy_said = false;
                reporter.line(
                    "The ledger's write lock is free again: the writes that waited are in it.",
                );
            }
            _ => {}
        }
        match ctx.writer.health().full() {
            Some((_, why, held)) if !self.full_said => {
                self.full_said = true;
                reporter.line(&format!(
                    "The ledger cannot be written ({}): {held} write(s) are held in memory and tried again every few seconds. \
                     Free space on its disk and the run goes on; nothing is lost unless docket is stopped meanwhile \
                     (answers not yet written are then counted ambiguous on resume).",
                    docket_model::sanitize::for_terminal(&why)
                ));
            }
            None if self.full_said => {
                self.full_said = false;
                let dropped = ctx.writer.health().dropped();
                if dropped > self.dropped_said {
                    reporter.line(&format!(
                        "The ledger still cannot be written: {} write(s) held in memory are given up; the run stops. \
                         Resume once there is room (answers not written are counted ambiguous).",
                        dropped - self.dropped_said
                    ));
                    self.dropped_said = dropped;
                } else {
                    reporter
                        .line("The ledger is written again: the writes held in memory are in it.");
                    ctx.event(
                        "info",
                        "disk_ok",
                        "the ledger was full; the writes held in memory are now written".into(),
                    );
                }
            }
            _ => {}
        }
    }

    /// What slows the run, while a guard holds it.
    pub(super) fn slow_reason(&self, ctx: &Ctx) -> Option<String> {
        if let Some(for_) = ctx.writer.health().busy() {
            return Some(format!(
                "ledger busy for {} s: another process holds its write lock",
                for_.as_secs()
            ));
        }
        if let Some((for_, _, held)) = ctx.writer.health().full() {
            return Some(format!(
                "ledger disk full for {} s: {held} write(s) held in memory",
                for_.as_secs()
            ));
        }
        self.held
            .map(|_| "the ledger's disk is almost full: nothing new is sent".to_string())
    }
}

/// The folder whose disk the guard watches: the SQLite ledger's; None on
/// PostgreSQL (its server's disk).
pub fn ledger_dir(ledger: &LedgerLocation) -> Option<PathBuf> {
    match ledger {
        LedgerLocation::File(path) => Some(
            path.parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(".")),
        ),
        LedgerLocation::Postgres(_) => None,
    }
}

/// The free bytes under which nothing new is sent: [`MIN_FREE_ENV`] MB
/// when set to a whole number, else 64 MB.
pub fn min_free_bytes() -> u64 {
    let min_free_mb = std::env::var(MIN_FREE_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(MIN_FREE_MB);
    min_free_mb.saturating_mul(1024 * 1024)
}

/// The free bytes at which a held run sends again: the floor and as much
/// again, or a tenth of a disk too small for that.
pub fn resume_room(min_free: u64, size: u64) -> u64 {
    min_free.saturating_add(min_free.min(size / 10))
}

fn mb(bytes: u64) -> String {
    format!("{:.1} MB", bytes as f64 / (1024.0 * 1024.0))
}

/// Bytes an unprivileged process may still write under `dir`, and the
/// filesystem's size.
pub fn space(dir: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs fills the zeroed struct we own; `c` outlives the call.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        let block = st.f_frsize as u64;
        Some((
            (st.f_bavail as u64).saturating_mul(block),
            (st.f_blocks as u64).saturating_mul(block),
        ))
    }
}
