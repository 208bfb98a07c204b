//! Connection URLs: a database's name in one, its password, its port, the
//! same URL without its password.

use super::*;

/// A database name no other test (thread, process) picks: unquoted-safe.
pub(super) fn random_name() -> String {
    use std::hash::BuildHasher;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let h = std::collections::hash_map::RandomState::new().hash_one((
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        nanos,
    ));
    format!("docket_test_{h:016x}")
}

/// Where the authority of a postgres:// URL ends (its path or query begins).
pub(super) fn authority(url: &str) -> (usize, usize) {
    let start = url.find("://").map_or(0, |i| i + 3);
    let end = url[start..]
        .find(['/', '?'])
        .map_or(url.len(), |i| start + i);
    (start, end)
}

/// `url` pointing at database `db`, its query (sslmode=…) kept.
pub(super) fn with_database(url: &str, db: &str) -> String {
    let (_, end) = authority(url);
    let query = url[end..].find('?').map_or("", |q| &url[end + q..]);
    format!("{}/{db}{query}", &url[..end])
}

pub fn without_password(url: &str) -> String {
    let (start, end) = authority(url);
    match url[start..end].rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}@{host}{}", &url[..start], &url[end..])
        }
        None => url.to_string(),
    }
}

/// The URL's password, percent-decoded (for PGPASSWORD).
pub(super) fn password_of(url: &str) -> String {
    let (start, end) = authority(url);
    let raw = url[start..end]
        .rsplit_once('@')
        .and_then(|(userinfo, _)| userinfo.split_once(':'))
        .map_or("", |(_, p)| p);
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(super) fn port_of(url: &str) -> u16 {
    let (start, end) = authority(url);
    let host = url[start..end]
        .rsplit_once('@')
        .map_or(&url[start..end], |(_, h)| h);
    host.rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or(5432)
}
