//! Transactions on PostgreSQL: begun under docket's write lock (exclusive,
//! or shared by the workers' writers), and ended so that a COMMIT whose
//! answer was lost is settled, never applied twice.

use super::super::{Error, Result};
use super::{PgConnection, WRITE_LOCK, WriteLock, describe, is_lost, pg_error};
use crate::postgres::blocking;

impl PgConnection {
    pub(in crate::db) fn in_transaction(&self) -> bool {
        self.in_transaction.get()
    }

    pub(in crate::db) fn begin(&self, lock: WriteLock) -> Result<()> {
        // A lost transaction nobody ended is over all the same.
        self.dead_transaction.set(false);
        let take = match lock {
            WriteLock::None => None,
            WriteLock::Shared => Some("pg_advisory_xact_lock_shared"),
            WriteLock::Exclusive => Some("pg_advisory_xact_lock"),
        };
        let sql = match take {
            Some(take) => format!(
                "BEGIN; {}; SELECT {take}({WRITE_LOCK})",
                crate::postgres::END_STALLED_TRANSACTION
            ),
            None => "BEGIN".to_string(),
        };
        self.batch_execute(&sql)?;
        self.in_transaction.set(true);
        Ok(())
    }

    pub(in crate::db) fn end(&self, commit: bool) -> Result<()> {
        if self.dead_transaction.replace(false) {
            // The server rolled it back when the connection went: there is
            // nothing to roll back, and a commit did not happen.
            self.in_transaction.set(false);
            if commit {
                self.lost.set(true);
                return Err(Error::ConnectionLost(
                    "the transaction was lost with its connection; nothing of it was applied"
                        .into(),
                ));
            }
            return Ok(());
        }
        if !commit {
            self.in_transaction.set(false);
            return self.batch_execute("ROLLBACK");
        }
        // The transaction's id first, if it wrote (a read-only one has
        // none and nothing to lose): if the COMMIT's answer is lost, the
        // server still knows whether it committed.
        let txid: Option<i64> = self
            .run(|c| c.query_one("SELECT txid_current_if_assigned()", &[]))?
            .get(0);
        self.in_transaction.set(false);
        match blocking(|| self.client().batch_execute("COMMIT")) {
            Ok(()) => {
                self.lost.set(false);
                Ok(())
            }
            Err(e) if is_lost(&e) && txid.is_none() => {
                // It wrote nothing: there is nothing to settle.
                self.reconnect(&describe(&e))?;
                self.lost.set(false);
                Ok(())
            }
            Err(e) if is_lost(&e) => {
                self.reconnect(&describe(&e))?;
                let status: Option<String> = self
                    .run(|c| c.query_one("SELECT txid_status($1)", &[&txid]))?
                    .get(0);
                if status.as_deref() == Some("committed") {
                    self.lost.set(false);
                    Ok(())
                } else {
                    self.lost.set(true);
                    Err(Error::ConnectionLost(describe(&e)))
                }
            }
            Err(e) => Err(pg_error(e)),
        }
    }
}
