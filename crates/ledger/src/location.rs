//! Where a workspace's ledger lives: the SQLite file in the workspace (the
//! default), or a PostgreSQL server named by URL, for a job that spans
//! machines. The URL comes from `--ledger`, else `DOCKET_LEDGER_URL`, else
//! `[ledger] url` in the workspace's docket.toml; its password only ever
//! from the URL given on the command line or in the environment, or from
//! `PGPASSWORD` (docket.toml refuses one).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use super::db::{Connection, PgConnection};
use super::postgres::{PgUrl, has_written_password, is_postgres_url};
use super::{LEDGER_FILE, LedgerError};

/// The environment variable naming a PostgreSQL ledger.
pub const LEDGER_URL_ENV: &str = "DOCKET_LEDGER_URL";

/// `--ledger` (or `DOCKET_LEDGER_URL`, which clap reads for it), set once
/// by `main` before any ledger is opened.
static CHOSEN: OnceLock<String> = OnceLock::new();

/// Use `url` for every workspace's ledger in this process (`--ledger`).
pub fn choose(url: String) {
    let _ = CHOSEN.set(url);
}

/// A ledger's place.
#[derive(Clone)]
pub enum LedgerLocation {
    File(PathBuf),
    Postgres(Box<PgUrl>),
}

impl LedgerLocation {
    /// The ledger of the workspace at `ws`: the URL chosen for this process,
    /// else the one in docket.toml, else the workspace's SQLite file.
    pub fn for_workspace(ws: &Path) -> Result<LedgerLocation, LedgerError> {
        let url = match CHOSEN.get() {
            Some(u) => Some(u.clone()),
            None => match std::env::var(LEDGER_URL_ENV) {
                Ok(u) if !u.trim().is_empty() => Some(u),
                _ => configured_url(ws)?,
            },
        };
        match url {
            Some(u) => LedgerLocation::parse(&u),
            None => Ok(LedgerLocation::File(ws.join(LEDGER_FILE))),
        }
    }

    /// A PostgreSQL URL, or a path to a SQLite file.
    pub fn parse(s: &str) -> Result<LedgerLocation, LedgerError> {
        if is_postgres_url(s) {
            Ok(LedgerLocation::Postgres(Box::new(PgUrl::parse(s)?)))
        } else {
            Ok(LedgerLocation::File(PathBuf::from(s)))
        }
    }

    /// Whether there is a ledger to open: the file exists (a server is
    /// asked when connecting).
    pub fn exists(&self) -> bool {
        match self {
            LedgerLocation::File(p) => p.exists(),
            LedgerLocation::Postgres(_) => true,
        }
    }

    /// A connection to the ledger: created and migrated if needed, or,
    /// `existing`, only opened (it must be there; changed only when older).
    pub(crate) fn connect(&self, existing: bool) -> Result<Connection, LedgerError> {
        Ok(match self {
            LedgerLocation::File(path) if existing => {
                Connection::Sqlite(super::open_read_only(path)?)
            }
            LedgerLocation::File(path) => Connection::Sqlite(super::open(path)?),
            LedgerLocation::Postgres(url) => {
                let client = if existing {
                    super::postgres::open_existing(url)?
                } else {
                    super::postgres::open(url)?
                };
                Connection::Postgres(Box::new(PgConnection::new(client, (**url).clone())))
            }
        })
    }

    /// The SQLite file, when it is one.
    pub fn file(&self) -> Option<&Path> {
        match self {
            LedgerLocation::File(p) => Some(p),
            LedgerLocation::Postgres(_) => None,
        }
    }
}

/// `[ledger] url` in the workspace's docket.toml, read on its own (the
/// config's full check reports any other mistake where it is loaded). A
/// password written there is refused: secrets come from the environment.
fn configured_url(ws: &Path) -> Result<Option<String>, LedgerError> {
    let path = ws.join("docket.toml");
    let Ok(text) = docket_model::files::read_text_file(&path) else {
        return Ok(None);
    };
    let Ok(doc) = text.parse::<toml::Table>() else {
        return Ok(None);
    };
    let Some(url) = doc
        .get("ledger")
        .and_then(|l| l.get("url"))
        .and_then(toml::Value::as_str)
    else {
        return Ok(None);
    };
    if url.trim().is_empty() {
        return Ok(None);
    }
    if has_written_password(url) {
        return Err(LedgerError::Refused {
            ledger: super::postgres::redact(url),
            detail: format!(
                "{}: [ledger] url holds a password; leave it out and set PGPASSWORD \
                 (or give the whole URL in {LEDGER_URL_ENV} or --ledger) so it stays out of files",
                path.display()
            ),
        });
    }
    Ok(Some(url.to_string()))
}

/// The file's path, or the URL without its password.
impl fmt::Display for LedgerLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerLocation::File(p) => write!(f, "{}", p.display()),
            LedgerLocation::Postgres(u) => f.write_str(u.redacted()),
        }
    }
}

impl fmt::Debug for LedgerLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl From<&Path> for LedgerLocation {
    fn from(p: &Path) -> Self {
        LedgerLocation::File(p.to_path_buf())
    }
}

impl From<&PathBuf> for LedgerLocation {
    fn from(p: &PathBuf) -> Self {
        LedgerLocation::File(p.clone())
    }
}

impl From<PathBuf> for LedgerLocation {
    fn from(p: PathBuf) -> Self {
        LedgerLocation::File(p)
    }
}

impl From<&LedgerLocation> for LedgerLocation {
    fn from(l: &LedgerLocation) -> Self {
        l.clone()
    }
}
