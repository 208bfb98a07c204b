//! Named rate-limit profiles in the ledger (`rate_limit_profile`,
//! migration 12): every `set` adds a version, none is changed or removed,
//! and a session records the name and version it ran with
//! (`llm_batch_session.profile_name`, `profile_version`).

use crate::db::{Connection, OptionalExtension, params};
use crate::transaction::write_transaction;
use crate::{Ledger, LedgerError, now_ts};
use docket_model::profile::{Profile, ProfileLimits};

/// What the ledger keeps of rate-limit profiles.
pub trait Profiles {
    /// Store a new version of `name` (version 1 when it is new); returns it.
    fn set_profile(
        &self,
        name: &str,
        provider: &str,
        model: Option<&str>,
        limits: &ProfileLimits,
        actor: &str,
    ) -> Result<Profile, LedgerError>;

    /// The newest version of every profile, by name.
    fn profiles(&self) -> Result<Vec<Profile>, LedgerError>;

    /// Every version of `name`, oldest first (empty: no such profile).
    fn profile_history(&self, name: &str) -> Result<Vec<Profile>, LedgerError>;

    /// The profile name and version a session ran with, if any.
    fn session_profile(&self, session_id: &str) -> Result<Option<(String, i64)>, LedgerError>;
}

const SELECT: &str =
    "SELECT name, version, provider, model, limits_json, created_at FROM rate_limit_profile";

impl Profiles for Ledger {
    fn set_profile(
        &self,
        name: &str,
        provider: &str,
        model: Option<&str>,
        limits: &ProfileLimits,
        actor: &str,
    ) -> Result<Profile, LedgerError> {
        let conn = self.conn();
        let limits_json = serde_json::to_string(limits).map_err(|e| LedgerError::Refused {
            ledger: self.location().to_string(),
            detail: format!("profile {name}: {e}"),
        })?;
        let created_at = now_ts();
        // Under the write lock: two `set`s of one name at once get two
        // versions, never the same one twice.
        let version = write_transaction(conn, || -> Result<i64, LedgerError> {
            let last: Option<i64> = conn.query_row(
                "SELECT MAX(version) FROM rate_limit_profile WHERE name = ?1",
                params![name],
                |r| r.get(0),
            )?;
            let version = last.unwrap_or(0) + 1;
            conn.execute(
                "INSERT INTO rate_limit_profile (name, version, provider, model, limits_json, created_at, created_by)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![name, version, provider, model, limits_json, created_at, actor],
            )?;
            Ok(version)
        })?;
        Ok(Profile {
            name: name.to_string(),
            version,
            provider: provider.to_string(),
            model: model.map(str::to_string),
            limits: limits.clone(),
            created_at,
        })
    }

    fn profiles(&self) -> Result<Vec<Profile>, LedgerError> {
        let sql = format!(
            "{SELECT} p WHERE version = (SELECT MAX(version) FROM rate_limit_profile q WHERE q.name = p.name)
             ORDER BY name"
        );
        read(self, &sql, None)
    }

    fn profile_history(&self, name: &str) -> Result<Vec<Profile>, LedgerError> {
        let sql = format!("{SELECT} WHERE name = ?1 ORDER BY version");
        read(self, &sql, Some(name))
    }

    fn session_profile(&self, session_id: &str) -> Result<Option<(String, i64)>, LedgerError> {
        Ok(session_profile(self.conn(), session_id)?)
    }
}

/// The profile a session ran with (`profile_name`, `profile_version`).
pub(crate) fn session_profile(
    conn: &Connection,
    session_id: &str,
) -> crate::db::Result<Option<(String, i64)>> {
    let row: Option<(Option<String>, Option<i64>)> = conn
        .query_row(
            "SELECT profile_name, profile_version FROM llm_batch_session WHERE session_id = ?1",
            params![session_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    Ok(match row {
        Some((Some(name), Some(version))) => Some((name, version)),
        _ => None,
    })
}

/// `name@version`, as `sessions` and `batch-results` show a session's profile.
pub fn label(name: &str, version: i64) -> String {
    format!("{name}@{version}")
}

fn read(ledger: &Ledger, sql: &str, name: Option<&str>) -> Result<Vec<Profile>, LedgerError> {
    type Raw = (String, i64, String, Option<String>, String, f64);
    let mut stmt = ledger.conn().prepare(sql)?;
    let map = |r: &crate::db::Row<'_>| -> crate::db::Result<Raw> {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
        ))
    };
    let raws: Vec<Raw> = match name {
        Some(n) => stmt
            .query_map(params![n], map)?
            .collect::<crate::db::Result<_>>()?,
        None => stmt
            .query_map(params![], map)?
            .collect::<crate::db::Result<_>>()?,
    };
    raws.into_iter()
        .map(
            |(name, version, provider, model, limits_json, created_at)| {
                // Written by `set_profile` only; unreadable means damaged.
                let limits =
                    serde_json::from_str(&limits_json).map_err(|e| LedgerError::Corrupt {
                        path: ledger.location().to_string(),
                        detail: format!(
                            "rate_limit_profile {name} version {version}: limits_json: {e}"
                        ),
                    })?;
                Ok(Profile {
                    name,
                    version,
                    provider,
                    model,
                    limits,
                    created_at,
                })
            },
        )
        .collect()
}
