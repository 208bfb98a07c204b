//! The PostgreSQL ledger: for jobs that span machines, the same schema as the
//! SQLite file (numbered migrations in PostgreSQL's dialect) on a server that
//! every worker and console reaches by URL.
//!
//! The driver is `postgres`, the synchronous client of rust-postgres: the
//! ledger API is synchronous (the engine calls it on blocking threads and one
//! writer thread), so an async driver would only add a runtime hop per call;
//! it needs no OpenSSL and speaks the wire protocol itself. Like the SQLite
//! calls, these run off the async threads (the client drives its own small
//! runtime and panics inside another's): on `spawn_blocking`, the writer
//! thread, or under `block_in_place`.

mod listen;
mod migrate;
mod tls;
mod url;

pub use listen::{CHANGE_CHANNEL, CONTROL_CHANNEL, Listener, Notice, listen};
pub use migrate::{PG_MIGRATIONS, check_existing, migrate};
pub use url::{PgUrl, SslMode, has_written_password, is_postgres_url, redact};

pub(crate) use migrate::detail;

use std::time::Duration;

use super::LedgerError;

/// How long a connect may take before it is reported as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Set first in every transaction that holds what other workers wait for
/// (docket's write lock, a claim's rows): the server ends it, and the
/// connection, once its client has said nothing for two seconds inside it.
/// A docket client never pauses that long mid-transaction unless it is
/// stalled (stopped, frozen, swapped out); stalled, it held the write lock
/// and every row it had touched until its process died, and no other
/// worker could record a result or take its items over, whatever their
/// leases said (fault-matrix row C2). A client that comes back finds its
/// connection gone, the transaction rolled back, and applies it again on a
/// new one (fenced: items taken over meanwhile refuse its writes).
pub(crate) const END_STALLED_TRANSACTION: &str =
    "SET LOCAL idle_in_transaction_session_timeout = '2s'";

/// Run `f`, which blocks on the synchronous client, where that is allowed:
/// the client drives a small runtime of its own, which tokio refuses to
/// start on one of its worker threads, so there the thread is first handed
/// over to blocking work (`block_in_place`). Every PostgreSQL call of the
/// ledger goes through here, so callers need not know which backend they
/// hold.
pub(crate) fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Connect to the ledger at `url` and bring its schema up to date.
pub fn open(url: &PgUrl) -> Result<postgres::Client, LedgerError> {
    blocking(|| {
        let mut client = connect_here(url)?;
        migrate(&mut client, url)?;
        Ok(client)
    })
}

/// Connect to an existing ledger to read it: its schema is changed only
/// when it is older than this docket's (see `check_existing`).
pub fn open_existing(url: &PgUrl) -> Result<postgres::Client, LedgerError> {
    blocking(|| {
        let mut client = connect_here(url)?;
        check_existing(&mut client, url)?;
        Ok(client)
    })
}

/// Connect without touching the schema.
pub fn connect(url: &PgUrl) -> Result<postgres::Client, LedgerError> {
    blocking(|| connect_here(url))
}

fn connect_here(url: &PgUrl) -> Result<postgres::Client, LedgerError> {
    let mut config = url.config().clone();
    config.ssl_mode(match url.ssl_mode() {
        SslMode::Disable => postgres::config::SslMode::Disable,
        SslMode::Prefer => postgres::config::SslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
            postgres::config::SslMode::Require
        }
    });
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if config.get_application_name().is_none() {
        config.application_name("docket");
    }
    // libpq uses no TLS on a Unix socket (it never leaves the machine),
    // whatever sslmode says; the driver would refuse `require` there.
    let only_sockets = !config.get_hosts().is_empty()
        && config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, postgres::config::Host::Unix(_)));
    if only_sockets {
        config.ssl_mode(postgres::config::SslMode::Disable);
    }
    let connected = if url.ssl_mode() == SslMode::Disable || only_sockets {
        config.connect(postgres::NoTls)
    } else {
        let tls = tls::connector(url.ssl_mode(), url.root_cert()).map_err(|e| url.error(e))?;
        config.connect(tls)
    };
    connected.map_err(|e| url.error(format!("cannot connect: {}", connect_detail(&e))))
}

/// A connect error in words: the server's message when it answered (bad
/// password, no such database), else the cause (refused, timed out).
fn connect_detail(e: &postgres::Error) -> String {
    if e.as_db_error().is_some() {
        return detail(e);
    }
    url::error_chain(e)
}
