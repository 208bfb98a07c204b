//! A SQLite ledger whose write lock another process holds for longer than
//! the busy timeout (fault-matrix row D1).
//!
//! Every write transaction starts with `BEGIN IMMEDIATE` (so none can meet
//! SQLITE_BUSY, or BUSY_SNAPSHOT, halfway through). That statement waits
//! up to the busy timeout (`ledger::busy_timeout`) for the lock; if the lock
//! is still held then, in a process that runs a session (`wait_long`), the
//! transaction is not failed: it backs off (50 ms, doubling up to 2 s) and
//! tries again, for up to [`GIVE_UP`]; elsewhere (`docket pause`, a review
//! decision) it fails then, as a command should rather than hang. The wait is
//! said in the log ("ledger busy", once per wait, and when the ledger is
//! written again), and the thread's [`BusyWatch`], if it has one (the
//! ledger writer's `Health`), shows it while it lasts. Readers never wait:
//! the ledger is in WAL mode.

use std::sync::atomic::{AtomicBool, Ordering};

/// This process runs a session: its writes wait out a held lock.
static LONG_WAITS: AtomicBool = AtomicBool::new(false);

/// From now on, this process's write transactions wait out a lock held
/// past the busy timeout (up to [`GIVE_UP`]): it runs a session, whose
/// paid answers must not be lost to another process's long transaction.
pub fn wait_long() {
    LONG_WAITS.store(true, Ordering::Relaxed);
}
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a write transaction keeps trying a ledger whose lock stays
/// held before it fails with SQLite's "database is locked".
pub const GIVE_UP: Duration = Duration::from_secs(30 * 60);
const BACKOFF_FIRST: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// What one thread's write transactions are waiting for, seen from other
/// threads (the ledger writer's `Health`).
#[derive(Default)]
pub struct BusyWatch {
    /// Since when a write has waited (the busy timeout included).
    since: Mutex<Option<Instant>>,
    /// The last wait that ended, until it is taken.
    ended: Mutex<Option<Duration>>,
    /// Stop waiting: the next busy answer fails the transaction.
    give_up: AtomicBool,
}

impl BusyWatch {
    /// How long the thread's current write has waited for the lock.
    pub fn busy_for(&self) -> Option<Duration> {
        lock(&self.since).map(|s| s.elapsed())
    }

    /// A wait that ended since the last call, and how long it was.
    pub fn take_ended(&self) -> Option<Duration> {
        lock(&self.ended).take()
    }

    /// Fail writes that find the lock held instead of waiting on (the run
    /// is being abandoned).
    pub fn give_up(&self) {
        self.give_up.store(true, Ordering::Relaxed);
    }

    fn giving_up(&self) -> bool {
        self.give_up.load(Ordering::Relaxed)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

thread_local! {
    static WATCH: std::cell::RefCell<Option<Arc<BusyWatch>>> = const { std::cell::RefCell::new(None) };
}

/// Report this thread's waits to `watch` (the ledger writer's thread).
pub fn watch_this_thread(watch: Arc<BusyWatch>) {
    WATCH.with(|w| *w.borrow_mut() = Some(watch));
}

fn this_watch() -> Option<Arc<BusyWatch>> {
    WATCH.with(|w| w.borrow().clone())
}

/// SQLITE_BUSY: another connection holds the lock (its extended codes,
/// BUSY_SNAPSHOT among them, share the primary code).
pub fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e,
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DatabaseBusy
    )
}

/// `BEGIN IMMEDIATE` on `c`, waiting out a lock another process holds
/// past the busy timeout (see the module's notes).
pub fn begin_immediate(c: &rusqlite::Connection) -> rusqlite::Result<()> {
    let watch = this_watch();
    let mut waiting: Option<Instant> = None;
    let mut backoff = BACKOFF_FIRST;
    loop {
        let err = match c.execute_batch("BEGIN IMMEDIATE") {
            Ok(()) => {
                if let Some(since) = waiting {
                    ended(c, watch.as_deref(), since.elapsed());
                }
                return Ok(());
            }
            Err(e) if is_busy(&e) => e,
            Err(e) => return Err(e),
        };
        let since = *waiting.get_or_insert_with(|| {
            // The busy timeout was waited already, inside SQLite.
            let since = Instant::now()
                .checked_sub(crate::busy_timeout())
                .unwrap_or_else(Instant::now);
            started(c, watch.as_deref(), since);
            since
        });
        let give_up = !LONG_WAITS.load(Ordering::Relaxed)
            || since.elapsed() >= GIVE_UP
            || watch.as_deref().is_some_and(BusyWatch::giving_up);
        if give_up {
            ended(c, watch.as_deref(), since.elapsed());
            tracing::warn!(
                "ledger {}: still busy after {:.1} s; the write fails",
                place(c),
                since.elapsed().as_secs_f64()
            );
            return Err(err);
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

fn place(c: &rusqlite::Connection) -> String {
    c.path()
        .filter(|p| !p.is_empty())
        .unwrap_or("(in memory)")
        .to_string()
}

fn started(c: &rusqlite::Connection, watch: Option<&BusyWatch>, since: Instant) {
    tracing::warn!(
        "ledger busy: another process has held the write lock of {} for more than the busy timeout ({} ms); \
         the write waits and is tried again",
        place(c),
        crate::busy_timeout().as_millis()
    );
    if let Some(w) = watch {
        *lock(&w.since) = Some(since);
    }
}

fn ended(c: &rusqlite::Connection, watch: Option<&BusyWatch>, waited: Duration) {
    tracing::warn!(
        "ledger {} written again after {:.1} s busy",
        place(c),
        waited.as_secs_f64()
    );
    if let Some(w) = watch {
        *lock(&w.since) = None;
        *lock(&w.ended) = Some(waited);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock held past the busy timeout is waited out, and the watch of
    /// the waiting thread shows the wait while it lasts and after.
    #[test]
    fn a_lock_held_past_the_busy_timeout_is_waited_out() {
        wait_long();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.pragma_update(None, "journal_mode", "WAL").unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let watch = Arc::new(BusyWatch::default());
        let seen = watch.clone();
        let waiter = std::thread::spawn(move || {
            watch_this_thread(seen);
            let c = rusqlite::Connection::open(&path).unwrap();
            c.busy_timeout(Duration::from_millis(20)).unwrap();
            let r = begin_immediate(&c);
            c.execute_batch("COMMIT").unwrap();
            r
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while watch.busy_for().is_none() {
            assert!(Instant::now() < deadline, "the wait never showed");
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(300));
        assert!(!waiter.is_finished(), "gave up while the lock was held");
        holder.execute_batch("COMMIT").unwrap();
        waiter
            .join()
            .unwrap()
            .expect("began once the lock was free");
        assert!(watch.busy_for().is_none());
        assert!(watch.take_ended().unwrap() >= Duration::from_millis(300));
        assert!(watch.take_ended().is_none());
    }

    /// A watch told to give up fails the next busy answer.
    #[test]
    fn a_watch_giving_up_fails_the_write() {
        wait_long();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("l.sqlite");
        let holder = rusqlite::Connection::open(&path).unwrap();
        holder.pragma_update(None, "journal_mode", "WAL").unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let watch = Arc::new(BusyWatch::default());
        watch.give_up();
        watch_this_thread(watch);
        let c = rusqlite::Connection::open(&path).unwrap();
        c.busy_timeout(Duration::from_millis(20)).unwrap();
        let e = begin_immediate(&c).unwrap_err();
        assert!(is_busy(&e), "{e}");
        WATCH.with(|w| *w.borrow_mut() = None);
    }
}
