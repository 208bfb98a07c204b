//! Reading one column whatever SQLite stored in it. The ledger is a shared
//! file that other versions and hand edits can touch, and SQLite lets any
//! column hold any type: the console reads a wrong type as NULL or 0 and
//! goes on, rather than failing the whole screen over one odd row.

use crate::db::{Row, Value};

/// A count column: NULL, negative, text or a blob read as 0; a fraction is
/// cut, and a huge float saturates.
pub(super) fn count(r: &Row, i: usize) -> crate::db::Result<u64> {
    Ok(match r.get_value(i)? {
        Value::Integer(n) => clamp(n),
        // `as` saturates, and NaN fails the comparison.
        Value::Real(f) if f > 0.0 => f as u64,
        _ => 0,
    })
}

/// An id column: NULL, text or a blob read as 0.
pub(super) fn signed(r: &Row, i: usize) -> crate::db::Result<i64> {
    Ok(match r.get_value(i)? {
        Value::Integer(n) => n,
        Value::Real(f) if f.is_finite() => f as i64,
        _ => 0,
    })
}

/// A text column: NULL is None, numbers are their text, bytes are read
/// lossily. As stored: the caller decides whether it must be made safe for
/// a terminal here or when drawn.
pub(super) fn text(r: &Row, i: usize) -> crate::db::Result<Option<String>> {
    Ok(match r.get_value(i)? {
        Value::Null => None,
        Value::Integer(n) => Some(n.to_string()),
        Value::Real(f) => Some(f.to_string()),
        Value::Text(t) => Some(t),
        Value::Blob(b) => Some(String::from_utf8_lossy(&b).into_owned()),
    })
}

/// A REAL column (a time, a confidence): NULL, text, a blob or a non-finite
/// number read as None.
pub(super) fn real(r: &Row, i: usize) -> crate::db::Result<Option<f64>> {
    Ok(match r.get_value(i)? {
        Value::Integer(n) => Some(n as f64),
        Value::Real(f) if f.is_finite() => Some(f),
        _ => None,
    })
}

/// Counters are never negative in the ledger; clamp rather than wrap if one is.
pub(super) fn clamp(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}
