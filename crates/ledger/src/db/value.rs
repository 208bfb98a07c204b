//! Values crossing into and out of either engine with SQLite's loose
//! typing. rusqlite already converts as SQLite does; PostgreSQL is strict
//! (a BIGINT parameter refuses an f64, `SUM` of integers is NUMERIC, a
//! comparison is BOOLEAN), so its side converts here: a parameter takes the
//! type the server inferred for it, and a column is read as whatever the
//! caller asked for when the value fits.

use std::error::Error as StdError;

use bytes::BytesMut;
use postgres::types::{FromSql, IsNull, Kind, ToSql, Type, to_sql_checked};

/// A value of either engine, owned.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Integer(i64),
    Real(f64),
    Text(String),
    Blob(Vec<u8>),
}

/// What may be bound as a statement parameter.
pub trait ToDb: rusqlite::ToSql {
    fn to_value(&self) -> Value;
}

macro_rules! to_db_int {
    ($($t:ty),*) => {$(
        impl ToDb for $t {
            fn to_value(&self) -> Value {
                Value::Integer(*self as i64)
            }
        }
    )*};
}
to_db_int!(i64, i32, u32, u8, i8, u16, i16);

impl ToDb for bool {
    fn to_value(&self) -> Value {
        Value::Integer(i64::from(*self))
    }
}

impl ToDb for f64 {
    fn to_value(&self) -> Value {
        Value::Real(*self)
    }
}

impl ToDb for str {
    fn to_value(&self) -> Value {
        Value::Text(self.to_string())
    }
}

impl ToDb for String {
    fn to_value(&self) -> Value {
        Value::Text(self.clone())
    }
}

impl ToDb for [u8] {
    fn to_value(&self) -> Value {
        Value::Blob(self.to_vec())
    }
}

impl ToDb for Vec<u8> {
    fn to_value(&self) -> Value {
        Value::Blob(self.clone())
    }
}

impl<T: ToDb + ?Sized> ToDb for &T {
    fn to_value(&self) -> Value {
        (**self).to_value()
    }
}

impl<T: ToDb> ToDb for Option<T> {
    fn to_value(&self) -> Value {
        self.as_ref().map_or(Value::Null, ToDb::to_value)
    }
}

impl<T: ToDb + Clone> ToDb for std::borrow::Cow<'_, T>
where
    T: rusqlite::ToSql,
{
    fn to_value(&self) -> Value {
        self.as_ref().to_value()
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match self {
            Value::Null => ValueRef::Null,
            Value::Integer(i) => ValueRef::Integer(*i),
            Value::Real(f) => ValueRef::Real(*f),
            Value::Text(s) => ValueRef::Text(s.as_bytes()),
            Value::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl ToDb for Value {
    fn to_value(&self) -> Value {
        self.clone()
    }
}

type BoxError = Box<dyn StdError + Sync + Send>;

fn refuse(v: &Value, ty: &Type) -> BoxError {
    format!("cannot store {v:?} as PostgreSQL {ty}").into()
}

/// What a NUL character in text becomes on PostgreSQL, whose text cannot
/// hold one (SQLite's can): U+2400 SYMBOL FOR NULL, visible and never
/// confused with a character an item meant. Without it, one item with a NUL
/// in a field stopped the whole run at the write of its prompt.
pub const NUL_STAND_IN: &str = "\u{2400}";

impl ToSql for Value {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        if *self == Value::Null {
            return Ok(IsNull::Yes);
        }
        // The type the server inferred for the parameter decides.
        let target = match ty.kind() {
            Kind::Domain(inner) => inner.clone(),
            _ => ty.clone(),
        };
        match target {
            Type::BOOL => match self {
                Value::Integer(i) => (*i != 0).to_sql(&Type::BOOL, out),
                Value::Real(f) => (*f != 0.0).to_sql(&Type::BOOL, out),
                _ => Err(refuse(self, ty)),
            },
            Type::INT8 => self.as_i64(ty)?.to_sql(&Type::INT8, out),
            Type::INT4 => i32::try_from(self.as_i64(ty)?)
                .map_err(|_| refuse(self, ty))?
                .to_sql(&Type::INT4, out),
            Type::INT2 => i16::try_from(self.as_i64(ty)?)
                .map_err(|_| refuse(self, ty))?
                .to_sql(&Type::INT2, out),
            Type::FLOAT8 => self.as_f64(ty)?.to_sql(&Type::FLOAT8, out),
            Type::FLOAT4 => (self.as_f64(ty)? as f32).to_sql(&Type::FLOAT4, out),
            Type::BYTEA => match self {
                Value::Blob(b) => b.as_slice().to_sql(&Type::BYTEA, out),
                Value::Text(s) => s.as_bytes().to_sql(&Type::BYTEA, out),
                _ => Err(refuse(self, ty)),
            },
            Type::JSONB => {
                // jsonb's binary form: a version byte, then the text.
                out.extend_from_slice(&[1]);
                out.extend_from_slice(self.as_text(ty)?.as_bytes());
                Ok(IsNull::No)
            }
            Type::NUMERIC => Err(refuse(self, ty)),
            // TEXT, VARCHAR, NAME, UNKNOWN, JSON: their binary form is the text.
            _ => {
                let text = self.as_text(ty)?;
                if text.contains('\0') {
                    out.extend_from_slice(text.replace('\0', NUL_STAND_IN).as_bytes());
                } else {
                    out.extend_from_slice(text.as_bytes());
                }
                Ok(IsNull::No)
            }
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    to_sql_checked!();
}

impl Value {
    fn as_i64(&self, ty: &Type) -> Result<i64, BoxError> {
        match self {
            Value::Integer(i) => Ok(*i),
            Value::Real(f) if f.fract() == 0.0 && f.abs() < 9.2e18 => Ok(*f as i64),
            Value::Text(s) => s.trim().parse().map_err(|_| refuse(self, ty)),
            _ => Err(refuse(self, ty)),
        }
    }

    fn as_f64(&self, ty: &Type) -> Result<f64, BoxError> {
        match self {
            Value::Integer(i) => Ok(*i as f64),
            Value::Real(f) => Ok(*f),
            Value::Text(s) => s.trim().parse().map_err(|_| refuse(self, ty)),
            _ => Err(refuse(self, ty)),
        }
    }

    fn as_text(&self, ty: &Type) -> Result<std::borrow::Cow<'_, str>, BoxError> {
        match self {
            Value::Text(s) => Ok(s.as_str().into()),
            Value::Integer(i) => Ok(i.to_string().into()),
            Value::Real(f) => Ok(f.to_string().into()),
            Value::Blob(b) => std::str::from_utf8(b)
                .map(Into::into)
                .map_err(|_| refuse(self, ty)),
            Value::Null => Err(refuse(self, ty)),
        }
    }
}

/// Any PostgreSQL column, decoded to a [`Value`] (NUMERIC to a float,
/// BOOLEAN to 0/1, jsonb to its text).
pub(super) struct PgAny(pub Value);

impl<'a> FromSql<'a> for PgAny {
    fn from_sql(ty: &Type, raw: &'a [u8]) -> Result<Self, BoxError> {
        let v = match *ty {
            Type::BOOL => Value::Integer(i64::from(bool::from_sql(ty, raw)?)),
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            Type::OID => Value::Integer(u32::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::NUMERIC => numeric(raw)?,
            Type::BYTEA => Value::Blob(raw.to_vec()),
            Type::JSONB => {
                Value::Text(std::str::from_utf8(raw.get(1..).unwrap_or_default())?.to_string())
            }
            _ => Value::Text(std::str::from_utf8(raw)?.to_string()),
        };
        Ok(PgAny(v))
    }

    fn from_sql_null(_: &Type) -> Result<Self, BoxError> {
        Ok(PgAny(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

/// NUMERIC's binary form (digits in base 10,000) as an integer when it has
/// no fraction, else a float: what `SUM` and `AVG` of integers return.
fn numeric(raw: &[u8]) -> Result<Value, BoxError> {
    let word = |i: usize| -> Result<i16, BoxError> {
        raw.get(i * 2..i * 2 + 2)
            .map(|b| i16::from_be_bytes([b[0], b[1]]))
            .ok_or_else(|| "a short NUMERIC".into())
    };
    let ndigits = word(0)?.max(0) as usize;
    let weight = i32::from(word(1)?);
    let sign = word(2)? as u16;
    let dscale = word(3)?;
    if sign == 0xC000 {
        return Ok(Value::Real(f64::NAN));
    }
    let mut value = 0f64;
    for k in 0..ndigits {
        let digit = f64::from(word(4 + k)?);
        value += digit * 10_000f64.powi(weight - k as i32);
    }
    if sign == 0x4000 {
        value = -value;
    }
    if dscale == 0 && value.abs() < 9.0e15 {
        Ok(Value::Integer(value as i64))
    } else {
        Ok(Value::Real(value))
    }
}

/// What a column may be read as: rusqlite's conversions on SQLite, and on
/// PostgreSQL the same ones from a [`Value`].
pub trait FromDb: rusqlite::types::FromSql + Sized {
    fn from_value(v: Value) -> Result<Self, FromDbError>;
}

/// Why a PostgreSQL value could not be read as the type asked for.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FromDbError {
    /// The value is of another kind (or out of the type's range).
    #[error("cannot read {value:?} as {what}")]
    Wrong { value: Value, what: &'static str },
    /// Bytes read as text that are not UTF-8.
    #[error(transparent)]
    NotUtf8(#[from] std::string::FromUtf8Error),
}

fn wrong(v: &Value, what: &'static str) -> FromDbError {
    FromDbError::Wrong {
        value: v.clone(),
        what,
    }
}

impl FromDb for i64 {
    fn from_value(v: Value) -> Result<Self, FromDbError> {
        match v {
            Value::Integer(i) => Ok(i),
            Value::Real(f) if f.fract() == 0.0 => Ok(f as i64),
            v => Err(wrong(&v, "an integer")),
        }
    }
}

macro_rules! from_db_narrow {
    ($($t:ty),*) => {$(
        impl FromDb for $t {
            fn from_value(v: Value) -> Result<Self, FromDbError> {
                let what = v.clone();
                i64::from_value(v).and_then(|i| <$t>::try_from(i).map_err(|_| wrong(&what, stringify!($t))))
            }
        }
    )*};
}
from_db_narrow!(i32, u32, u8, u16);

impl FromDb for f64 {
    fn from_value(v: Value) -> Result<Self, FromDbError> {
        match v {
            Value::Integer(i) => Ok(i as f64),
            Value::Real(f) => Ok(f),
            v => Err(wrong(&v, "a number")),
        }
    }
}

impl FromDb for bool {
    fn from_value(v: Value) -> Result<Self, FromDbError> {
        match v {
            Value::Integer(i) => Ok(i != 0),
            Value::Real(f) => Ok(f != 0.0),
            v => Err(wrong(&v, "a boolean")),
        }
    }
}

impl FromDb for String {
    fn from_value(v: Value) -> Result<Self, FromDbError> {
        match v {
            Value::Text(s) => Ok(s),
            Value::Blob(b) => Ok(String::from_utf8(b)?),
            v => Err(wrong(&v, "text")),
        }
    }
}

impl FromDb for Vec<u8> {
    fn from_value(v: Value) -> Result<Self, FromDbError> {
        match v {
            Value::Blob(b) => Ok(b),
            Value::Text(s) => Ok(s.into_bytes()),
            v => Err(wrong(&v, "bytes")),
        }
    }
}

impl<T: FromDb> FromDb for Option<T> {
    fn from_value(v: Value) -> Result<Self, FromDbError> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

impl rusqlite::types::FromSql for Value {
    fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        use rusqlite::types::ValueRef;
        Ok(match v {
            ValueRef::Null => Value::Null,
            ValueRef::Integer(i) => Value::Integer(i),
            ValueRef::Real(f) => Value::Real(f),
            ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
            ValueRef::Blob(b) => Value::Blob(b.to_vec()),
        })
    }
}

impl FromDb for Value {
    fn from_value(v: Value) -> Result<Self, FromDbError> {
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NUMERIC 12345.5 and -3: base-10,000 digits with weight and scale.
    #[test]
    fn numeric_is_decoded() {
        let enc =
            |words: &[i16]| -> Vec<u8> { words.iter().flat_map(|w| w.to_be_bytes()).collect() };
        assert_eq!(
            numeric(&enc(&[3, 1, 0, 1, 1, 2345, 5000])).unwrap(),
            Value::Real(12345.5)
        );
        assert_eq!(
            numeric(&enc(&[1, 0, 0x4000u16 as i16, 0, 3])).unwrap(),
            Value::Integer(-3)
        );
        assert_eq!(numeric(&enc(&[0, 0, 0, 0])).unwrap(), Value::Integer(0));
        assert!(
            numeric(&enc(&[2, 0])).is_err(),
            "a short value is an error, not a panic"
        );
    }

    #[test]
    fn loose_reads_follow_sqlite() {
        assert_eq!(i64::from_value(Value::Real(3.0)), Ok(3));
        assert!(i64::from_value(Value::Real(3.5)).is_err());
        assert_eq!(f64::from_value(Value::Integer(2)), Ok(2.0));
        assert_eq!(bool::from_value(Value::Integer(0)), Ok(false));
        assert_eq!(Option::<String>::from_value(Value::Null), Ok(None));
        assert!(u32::from_value(Value::Integer(-1)).is_err());
    }
}
