//! The PostgreSQL side of the SQL surface: one client, its statements
//! translated and prepared once, transactions that take docket's write lock
//! (exclusively, or shared by the workers' writers), and a connection that
//! survives the server going away.
//!
//! When the connection is lost (the server restarted, the link cut), the
//! next statement reconnects, with backoff, for up to [`RECONNECT_WINDOW`],
//! and says so (`unreachable`, shown by the console and the progress line).
//! A statement outside a transaction is then sent again; a transaction open
//! at the loss is gone (the server rolled it back) and its caller is told
//! ([`Error::ConnectionLost`], [`PgConnection::take_lost`]) so it can run
//! it again. A COMMIT whose answer was lost is settled by asking the server
//! what became of its transaction id (`txid_status`), so a transaction is
//! never applied twice.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::value::{ToDb, Value};
use super::{Error, Result};
use crate::postgres::{PgUrl, blocking};

mod statements;
mod transactions;

pub use statements::Cursor;

/// How long a lost connection is tried again before the statement fails.
const RECONNECT_WINDOW: Duration = Duration::from_secs(120);
/// The first wait between reconnects; doubled up to `MAX_BACKOFF`.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often the server's clock is read again (see `now`).
const CLOCK_CHECK: Duration = Duration::from_secs(60);

/// Set while some connection of this process cannot reach its ledger: the
/// reason, for the screen.
static UNREACHABLE: Mutex<Option<String>> = Mutex::new(None);

/// Why the ledger cannot be reached now, if it cannot ("ledger ...
/// unreachable, retrying").
pub fn unreachable() -> Option<String> {
    UNREACHABLE.lock().ok().and_then(|u| u.clone())
}

fn set_unreachable(why: Option<String>) {
    if let Ok(mut u) = UNREACHABLE.lock() {
        *u = why;
    }
}

/// A prepared statement, the names of its `:name` parameters, and what it
/// was prepared from (to prepare it again on a new connection).
#[derive(Clone)]
pub struct PgStatement {
    statement: postgres::Statement,
    names: std::sync::Arc<[String]>,
    sql: std::sync::Arc<str>,
    /// The connection it was prepared on.
    generation: u64,
}

impl PgStatement {
    /// Named parameters in the order the statement numbers them; a name
    /// not given is NULL.
    pub(super) fn order<'p>(&self, named: &[(&str, &'p dyn ToDb)]) -> Vec<&'p dyn ToDb> {
        self.names
            .iter()
            .map(|n| {
                named
                    .iter()
                    .find(|(k, _)| k == n)
                    .map_or(&Value::Null as &dyn ToDb, |(_, v)| *v)
            })
            .collect()
    }
}

/// The key of the advisory lock docket's write transactions take on
/// PostgreSQL ("docketw" in ASCII). Taken exclusively, writes serialize as
/// SQLite's `BEGIN IMMEDIATE` makes them, so a check and the write it allows
/// see no other writer between them. The workers' writers take it shared
/// (see [`WriteLock`]); claims do not take it: they lock rows with
/// `FOR UPDATE SKIP LOCKED`, so workers claim side by side.
const WRITE_LOCK: i64 = 0x0064_6f63_6b65_7477;

/// How a PostgreSQL transaction takes docket's write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteLock {
    /// Not at all (reads, claims).
    None,
    /// Shared: beside other shared holders, never beside an exclusive one.
    /// For the workers' writers, whose checks lock the rows they read, so
    /// several workers commit side by side.
    Shared,
    /// Alone: the check-then-write transactions of commands.
    Exclusive,
}

/// A connection to a PostgreSQL ledger.
pub struct PgConnection {
    /// Taken out only when dropped (see `Drop`).
    client: RefCell<Option<postgres::Client>>,
    /// Prepared statements by their SQLite-dialect text.
    statements: RefCell<HashMap<String, PgStatement>>,
    in_transaction: Cell<bool>,
    /// Counts connections: statements prepared on an earlier one are
    /// prepared again.
    generation: Cell<u64>,
    /// The last transaction lost its connection before it committed.
    lost: Cell<bool>,
    /// The transaction under way was lost with its connection and is not
    /// ended yet: every statement fails until it is, so none runs on the
    /// new connection outside any transaction (each committed alone, the
    /// rest of a rolled-back transaction would be applied by halves).
    dead_transaction: Cell<bool>,
    /// Names the next cursor (see `open_cursor`).
    cursors: Cell<u64>,
    /// The server's clock minus this machine's, and when it was measured.
    clock_offset: Cell<Option<(f64, Instant)>>,
    url: PgUrl,
}

/// The server's message for a failed statement, without the URL.
pub(super) fn describe(e: &postgres::Error) -> String {
    crate::postgres::detail(e)
}

fn pg_error(e: postgres::Error) -> Error {
    Error::Postgres(describe(&e))
}

/// Whether `e` means the connection is gone (not that the statement was
/// wrong): closed, a connection exception (08), the server shutting down
/// (57P01-57P03), or the server ending a session that sat idle (25P03 in a
/// transaction: this process was stalled inside one, which
/// `postgres::END_STALLED_TRANSACTION` ends on purpose; 57P05 outside one).
/// Such a process, running again, connects anew rather than stop.
fn is_lost(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.as_db_error() {
        Some(db) => {
            let code = db.code().code();
            code.starts_with("08")
                || matches!(code, "57P01" | "57P02" | "57P03" | "57P05" | "25P03")
        }
        // No answer from the server at all: the socket failed.
        None => std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

impl PgConnection {
    pub fn new(client: postgres::Client, url: PgUrl) -> PgConnection {
        PgConnection {
            client: RefCell::new(Some(client)),
            statements: RefCell::new(HashMap::new()),
            cursors: Cell::new(0),
            in_transaction: Cell::new(false),
            generation: Cell::new(0),
            lost: Cell::new(false),
            dead_transaction: Cell::new(false),
            clock_offset: Cell::new(None),
            url,
        }
    }

    /// The ledger's URL, its password hidden.
    pub fn url(&self) -> &PgUrl {
        &self.url
    }

    /// The time now by the server's clock, in unix seconds: this machine's
    /// clock plus the offset measured once a minute (half the round trip
    /// is the error), so asking costs no round trip.
    pub(super) fn now(&self) -> Result<f64> {
        let fresh = self
            .clock_offset
            .get()
            .filter(|(_, at)| at.elapsed() < CLOCK_CHECK);
        let offset = match fresh {
            Some((offset, _)) => offset,
            None => {
                let before = crate::now_ts();
                let server: f64 = self
                    .run(|c| {
                        c.query_one("SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8", &[])
                    })?
                    .get(0);
                let after = crate::now_ts();
                let offset = server - (before + after) / 2.0;
                self.clock_offset.set(Some((offset, Instant::now())));
                offset
            }
        };
        Ok(crate::now_ts() + offset)
    }

    /// Whether the last transaction was lost with its connection (nothing
    /// of it was applied); cleared by the reading.
    pub fn take_lost(&self) -> bool {
        self.lost.replace(false)
    }

    fn client(&self) -> std::cell::RefMut<'_, postgres::Client> {
        std::cell::RefMut::map(self.client.borrow_mut(), |c| {
            c.as_mut()
                .expect("the client is there until the connection is dropped")
        })
    }

    fn broken(&self) -> bool {
        self.client.borrow().as_ref().is_none_or(|c| c.is_closed())
    }

    /// Connect again, with backoff, for up to `RECONNECT_WINDOW`.
    fn reconnect(&self, why: &str) -> Result<()> {
        let started = Instant::now();
        let mut wait = FIRST_BACKOFF;
        set_unreachable(Some(format!(
            "ledger {} unreachable ({why}), retrying",
            self.url.redacted()
        )));
        tracing::warn!(
            "ledger {} unreachable ({why}); reconnecting",
            self.url.redacted()
        );
        loop {
            match crate::postgres::connect(&self.url) {
                Ok(client) => {
                    let old = self.client.borrow_mut().replace(client);
                    blocking(move || drop(old));
                    self.statements.borrow_mut().clear();
                    self.generation.set(self.generation.get() + 1);
                    set_unreachable(None);
                    tracing::warn!("ledger {} reachable again", self.url.redacted());
                    return Ok(());
                }
                Err(e) if started.elapsed() < RECONNECT_WINDOW => {
                    tracing::debug!("reconnecting: {e}");
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(MAX_BACKOFF);
                }
                Err(e) => {
                    set_unreachable(None);
                    return Err(Error::Postgres(format!(
                        "the ledger stayed unreachable for {} s: {e}",
                        RECONNECT_WINDOW.as_secs()
                    )));
                }
            }
        }
    }

    /// Run `f` on the client once. A lost connection is reconnected:
    /// outside a transaction the answer is `None` (run it again, on the new
    /// connection); inside one the transaction is reported lost.
    fn attempt<T>(
        &self,
        f: impl FnOnce(&mut postgres::Client) -> std::result::Result<T, postgres::Error>,
    ) -> Result<Option<T>> {
        if self.dead_transaction.get() {
            return Err(Error::ConnectionLost(
                "the transaction was lost with its connection".into(),
            ));
        }
        if self.broken() && !self.in_transaction.get() {
            self.reconnect("the connection was closed")?;
        }
        match blocking(|| f(&mut self.client())) {
            Ok(v) => Ok(Some(v)),
            Err(e) if is_lost(&e) => {
                let why = describe(&e);
                if self.in_transaction.get() {
                    self.in_transaction.set(false);
                    self.lost.set(true);
                    self.dead_transaction.set(true);
                    return Err(Error::ConnectionLost(why));
                }
                self.reconnect(&why)?;
                Ok(None)
            }
            Err(e) => Err(pg_error(e)),
        }
    }

    /// `f` until it runs on a live connection (see `attempt`).
    fn run<T>(
        &self,
        mut f: impl FnMut(&mut postgres::Client) -> std::result::Result<T, postgres::Error>,
    ) -> Result<T> {
        loop {
            if let Some(v) = self.attempt(&mut f)? {
                return Ok(v);
            }
        }
    }
}

impl Drop for PgConnection {
    /// Closing the client blocks on its runtime too: off the async threads.
    fn drop(&mut self) {
        if let Some(client) = self.client.get_mut().take() {
            blocking(move || drop(client));
        }
    }
}
