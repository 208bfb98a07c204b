//! A PostgreSQL ledger's address. The URL may carry a password (or the
//! password comes from `PGPASSWORD`); it must never reach the ledger, logs,
//! exports, the screen or an error message, so everything that shows a URL
//! shows `redacted()`, and every error text from the driver is scrubbed of
//! the password before it leaves this module.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::super::LedgerError;

/// libpq's `sslmode`, all six (the driver knows only three): what the
/// connection asks of TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// TLS when the server offers it, unverified (libpq's `allow` and
    /// `prefer`, and the default).
    Prefer,
    /// TLS or no connection; the certificate is checked against
    /// `sslrootcert` when one is given (as libpq does), else not at all.
    Require,
    /// TLS with a certificate signed by a trusted root; any host name.
    VerifyCa,
    /// TLS with a trusted certificate for the host connected to.
    VerifyFull,
}

/// A parsed `postgres://` (or `postgresql://`) URL.
#[derive(Clone)]
pub struct PgUrl {
    config: postgres::Config,
    redacted: String,
    password: Option<String>,
    ssl_mode: SslMode,
    /// `sslrootcert`: a PEM file of the roots to trust (else the system's).
    root_cert: Option<PathBuf>,
}

impl PgUrl {
    /// Parse `url`; a password missing from it is taken from `PGPASSWORD`
    /// (as libpq does).
    pub fn parse(url: &str) -> Result<PgUrl, LedgerError> {
        if !is_postgres_url(url) {
            // Not echoed: a libpq keyword string ("host=... password=...")
            // would show its password.
            return Err(LedgerError::Postgres {
                url: "(not shown)".into(),
                detail: "not a PostgreSQL URL (it must start with postgres:// or postgresql://)"
                    .into(),
            });
        }
        let redacted = redact(url);
        let written_password = url_password(url);
        let (driver_url, ssl_mode, root_cert) =
            take_tls_params(url).map_err(|detail| LedgerError::Postgres {
                url: redacted.clone(),
                detail,
            })?;
        let mut config =
            postgres::Config::from_str(&driver_url).map_err(|e| LedgerError::Postgres {
                url: redacted.clone(),
                detail: scrub(
                    &format!("the URL does not parse: {}", error_chain(&e)),
                    written_password.as_deref(),
                ),
            })?;
        // docket took sslmode out of what the driver saw; if the driver still
        // found one (a percent-encoded key, say), the two would disagree on
        // TLS: refuse rather than guess.
        if config.get_ssl_mode() != postgres::config::SslMode::Prefer {
            return Err(LedgerError::Postgres {
                url: redacted,
                detail: "the URL's sslmode is written in a way docket cannot read; write it as sslmode=MODE"
                    .into(),
            });
        }
        if config.get_password().is_none()
            && let Ok(p) = std::env::var("PGPASSWORD")
            && !p.is_empty()
        {
            config.password(p);
        }
        let password = config
            .get_password()
            .map(|p| String::from_utf8_lossy(p).into_owned());
        let redacted = scrub(&redacted, password.as_deref());
        Ok(PgUrl {
            config,
            redacted,
            password,
            ssl_mode,
            root_cert,
        })
    }

    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    pub fn root_cert(&self) -> Option<&std::path::Path> {
        self.root_cert.as_deref()
    }

    /// The URL with its password replaced by `***`: the only form shown.
    pub fn redacted(&self) -> &str {
        &self.redacted
    }

    pub(crate) fn config(&self) -> &postgres::Config {
        &self.config
    }

    /// A failed statement or connection as a ledger error: the server's
    /// own message (see `detail`).
    pub(crate) fn db_error(&self, e: &postgres::Error) -> LedgerError {
        self.error(super::detail(e))
    }

    /// A ledger error about this URL whose text cannot hold the password.
    pub(crate) fn error(&self, detail: impl fmt::Display) -> LedgerError {
        LedgerError::Postgres {
            url: self.redacted.clone(),
            detail: scrub(&detail.to_string(), self.password.as_deref()),
        }
    }
}

impl fmt::Display for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted)
    }
}

impl fmt::Debug for PgUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PgUrl({})", self.redacted)
    }
}

/// `url` without its `sslmode` and `sslrootcert` parameters (docket reads
/// them itself: the driver knows three of libpq's six modes and no root
/// file), and what they said.
fn take_tls_params(url: &str) -> Result<(String, SslMode, Option<PathBuf>), String> {
    let (head, query) = split_query(url);
    // libpq's environment variables, when the URL does not say.
    let mut mode = match std::env::var("PGSSLMODE") {
        Ok(m) if !m.is_empty() => ssl_mode(&m)?,
        _ => SslMode::Prefer,
    };
    let mut root = std::env::var_os("PGSSLROOTCERT")
        .filter(|r| !r.is_empty())
        .map(PathBuf::from);
    let mut kept = Vec::new();
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some((key, value)) if percent_decode(key) == "sslmode" => {
                mode = ssl_mode(&percent_decode(value))?
            }
            Some((key, value)) if percent_decode(key) == "sslrootcert" => {
                root = Some(PathBuf::from(percent_decode(value)))
            }
            _ => kept.push(pair),
        }
    }
    let url = if kept.is_empty() {
        head.to_string()
    } else {
        format!("{head}?{}", kept.join("&"))
    };
    Ok((url, mode, root))
}

fn ssl_mode(value: &str) -> Result<SslMode, String> {
    Ok(match value {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(format!(
                "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            ));
        }
    })
}

/// `url` split where the driver finds its query: the user info runs to the
/// first '@' (the driver's rule, so a '/' or '?' in a password stays in
/// it), and the query starts at the first '?' after that.
fn split_query(url: &str) -> (&str, Option<&str>) {
    let after_scheme = url.find("://").map(|i| i + 3).unwrap_or(0);
    let after_userinfo = url[after_scheme..]
        .find('@')
        .map(|i| after_scheme + i + 1)
        .unwrap_or(after_scheme);
    match url[after_userinfo..].find('?') {
        Some(i) => (
            &url[..after_userinfo + i],
            Some(&url[after_userinfo + i + 1..]),
        ),
        None => (url, None),
    }
}

/// An error with its causes (the driver's Display alone says only
/// "invalid connection string").
pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

/// `%XX` escapes decoded (a root file's path may hold any character).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether `s` names a PostgreSQL ledger rather than a SQLite file.
/// Whether `url` has a password written in it (not one from PGPASSWORD).
pub fn has_written_password(url: &str) -> bool {
    url_password(url).is_some()
}

pub fn is_postgres_url(s: &str) -> bool {
    s.starts_with("postgres://") || s.starts_with("postgresql://")
}

/// The password part of a URL's user info, as written (percent-encoded):
/// the user info runs to the first '@', as the driver reads it.
fn url_password(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split_once('@')?.0;
    let password = userinfo.split_once(':')?.1;
    (!password.is_empty()).then(|| password.to_string())
}

/// `url` with the password in its user info replaced by `***`, and any
/// `password=` query parameter too.
pub fn redact(url: &str) -> String {
    let mut out = url.to_string();
    if url_password(url).is_some()
        && let Some((scheme, rest)) = url.split_once("://")
        && let Some((userinfo, tail)) = rest.split_once('@')
    {
        let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
        out = format!("{scheme}://{user}:***@{tail}");
    }
    let (head, query) = split_query(&out);
    if let Some(query) = query {
        let query: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if percent_decode(k).eq_ignore_ascii_case("password") => {
                    format!("{k}=***")
                }
                _ => kv.to_string(),
            })
            .collect();
        out = format!("{head}?{}", query.join("&"));
    }
    out
}

/// `text` with every occurrence of `password` replaced by `***`. A very
/// short password is left alone: it would mangle ordinary words ("db
/// er***r") and the messages scrubbed here never hold it anyway; this is
/// the belt to `redact`'s braces.
fn scrub(text: &str, password: Option<&str>) -> String {
    match password {
        Some(p) if p.len() >= 6 => text.replace(p, "***"),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_password_never_shows() {
        assert_eq!(
            redact("postgres://docket:s3cret@db.example:5432/ledger?sslmode=require"),
            "postgres://docket:***@db.example:5432/ledger?sslmode=require"
        );
        assert_eq!(
            redact("postgresql://docket@db/ledger?password=s3cret&sslmode=disable"),
            "postgresql://docket@db/ledger?password=***&sslmode=disable"
        );
        assert_eq!(redact("postgres://db/ledger"), "postgres://db/ledger");
        // A password holding '@' and ':' (percent-encoded, as URLs need).
        assert_eq!(
            redact("postgres://u:p%40ss%3Aw@h/d"),
            "postgres://u:***@h/d"
        );
        let url = PgUrl::parse("postgres://docket:s3cret@127.0.0.1:1/ledger").unwrap();
        assert_eq!(url.to_string(), "postgres://docket:***@127.0.0.1:1/ledger");
        assert!(!format!("{url:?}").contains("s3cret"));
        let e = url.error("auth failed for s3cret");
        assert!(!e.to_string().contains("s3cret"), "{e}");
    }

    #[test]
    fn tls_parameters_are_read_by_docket_not_the_driver() {
        let url =
            PgUrl::parse("postgres://u@h/d?sslmode=verify-full&sslrootcert=%2Ftmp%2Fca%20x.pem&connect_timeout=3")
                .unwrap();
        assert_eq!(url.ssl_mode(), SslMode::VerifyFull);
        assert_eq!(url.root_cert(), Some(std::path::Path::new("/tmp/ca x.pem")));
        assert_eq!(
            url.config().get_connect_timeout(),
            Some(&std::time::Duration::from_secs(3))
        );
        assert_eq!(
            PgUrl::parse("postgres://u@h/d").unwrap().ssl_mode(),
            SslMode::Prefer
        );
        let e = PgUrl::parse("postgres://u@h/d?sslmode=maybe")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslmode=maybe"), "{e}");
    }

    /// Cases a review found: the user info runs to the first '@' (as the
    /// driver reads it), so '/' and '?' in a password stay hidden and the
    /// query is the one after it; a keyword string is never echoed; a
    /// disguised sslmode is refused, not ignored.
    #[test]
    fn the_driver_and_docket_split_a_url_the_same_way() {
        let url = PgUrl::parse("postgres://dk:pa/ss?wd@127.0.0.1:1/t1?sslmode=require").unwrap();
        assert_eq!(
            url.to_string(),
            "postgres://dk:***@127.0.0.1:1/t1?sslmode=require"
        );
        assert_eq!(url.ssl_mode(), SslMode::Require);
        let e = PgUrl::parse("host=h user=dk password=topsecret dbname=t1")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("topsecret"), "{e}");
        let e = PgUrl::parse("postgres://u:secret-pw@h/d?ssl%6Dode=require");
        assert!(
            matches!(&e, Ok(u) if u.ssl_mode() == SslMode::Require),
            "a percent-encoded key is still sslmode"
        );
        assert_eq!(
            redact("postgres://u@h/d?pass%77ord=topsecret"),
            "postgres://u@h/d?pass%77ord=***"
        );
        let e = PgUrl::parse("postgres://u:secret-pw@h/d?sslcert=x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("sslcert") && !e.contains("secret-pw"), "{e}");
    }

    #[test]
    fn a_file_path_or_garbage_is_no_postgres_url() {
        assert!(!is_postgres_url("/tmp/docket.sqlite"));
        let e = PgUrl::parse("mysql://u:s3cret@h/d")
            .unwrap_err()
            .to_string();
        assert!(e.contains("postgres://") && !e.contains("s3cret"), "{e}");
        let e = PgUrl::parse("postgres://u:s3cret@h:notaport/d")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("s3cret"), "{e}");
    }
}
