//! What the reports and exports read: `docket sessions`, `batch-results`
//! and `export`. Rows are handed over one at a time as report cells (the
//! columns and kinds the report names), so an export of a million rows
//! never sits in memory.
//!
//! The SQLite implementation is split by report: `sessions`, `results`,
//! `export` (decisions and requests) and `items` (one row per item with its
//! stages); `rows` reads SQLite's loosely typed values as cells.

mod attempts;
mod batch_costs;
mod export;
mod items;
mod results;
mod rows;
mod sessions;

use crate::report::{Cell, Kind, ReportError, SessionHead};
use crate::{Ledger, LedgerError};

pub use attempts::AttemptReports;
pub use batch_costs::{BatchCost, BatchCosts};
pub use items::StageRow;

/// Called with each row of a report, in order; an error stops the read.
pub type EachRow<'a> = &'a mut dyn FnMut(&[Cell]) -> Result<(), ReportError>;

/// Called with each item of a session and the rows of its stage requests.
pub type EachItem<'a> = &'a mut dyn FnMut(&[Cell], &[StageRow]) -> Result<(), ReportError>;

/// The ledger's reads for reports and exports. Each `for_each_*` reads the
/// columns its report names (the `report::*_COLUMNS` constants) as the
/// `kinds` given, calls `each` with every row, and returns how many rows
/// there were.
pub trait Reports: AttemptReports {
    /// Whether the ledger has a session with this id.
    fn session_exists(&self, session_id: &str) -> Result<bool, LedgerError>;

    /// Every session (`report::SESSION_COLUMNS`), newest first. A session
    /// started at `resumable_since` or later may be resumed. Its `state` is
    /// the word every view shows at `now` (`store::shown_state_of`): one
    /// whose engine's heartbeat went stale reads `interrupted`.
    fn for_each_session(
        &self,
        resumable_since: f64,
        now: f64,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError>;

    /// One session's header numbers; `None` when there is no such session.
    fn session_head(&self, session_id: &str) -> Result<Option<SessionHead>, LedgerError>;

    /// The longest item id and model id among the session's results, in
    /// characters (to size a table); `None` when there are none.
    fn result_id_widths(&self, session_id: &str)
    -> Result<(Option<i64>, Option<i64>), LedgerError>;

    /// Results (`report::RESULT_COLUMNS`) of one session, or of all, by
    /// session then processing time.
    fn for_each_result(
        &self,
        session_id: Option<&str>,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError>;

    /// Decisions (`report::DECISION_COLUMNS`) of every item, or of one
    /// session's items, by item id.
    fn for_each_decision(
        &self,
        session_id: Option<&str>,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError>;

    /// Requests (`report::REQUEST_COLUMNS`): a session's in dispatch and
    /// stage order, or every request by id.
    fn for_each_request(
        &self,
        session_id: Option<&str>,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError>;

    /// The session's config snapshot (JSON), as the run recorded it.
    fn session_config(&self, session_id: &str) -> Result<Option<String>, LedgerError>;

    /// Every stage the ledger recorded for the session, by first position.
    fn session_stages(&self, session_id: &str) -> Result<Vec<String>, LedgerError>;

    /// Every output (JSON text) the stage gave in the session.
    fn for_each_stage_output(
        &self,
        session_id: &str,
        stage: &str,
        each: &mut dyn FnMut(&str),
    ) -> Result<(), LedgerError>;

    /// The session's items (`report::ITEM_COLUMNS` as `item_kinds`) in
    /// dispatch order, each with its stage requests (their
    /// `report::STAGE_COLUMNS` as `stage_kinds`).
    fn for_each_item(
        &self,
        session_id: &str,
        item_kinds: &[Kind],
        stage_kinds: &[Kind],
        each: EachItem<'_>,
    ) -> Result<u64, ReportError>;
}

impl Reports for Ledger {
    fn session_exists(&self, session_id: &str) -> Result<bool, LedgerError> {
        Ok(export::session_exists(self.conn(), session_id)?)
    }

    fn for_each_session(
        &self,
        resumable_since: f64,
        now: f64,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError> {
        sessions::for_each_session(self.conn(), resumable_since, now, kinds, each)
    }

    fn session_head(&self, session_id: &str) -> Result<Option<SessionHead>, LedgerError> {
        Ok(results::session_head(self.conn(), session_id)?)
    }

    fn result_id_widths(
        &self,
        session_id: &str,
    ) -> Result<(Option<i64>, Option<i64>), LedgerError> {
        Ok(results::result_id_widths(self.conn(), session_id)?)
    }

    fn for_each_result(
        &self,
        session_id: Option<&str>,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError> {
        results::for_each_result(self.conn(), session_id, kinds, each)
    }

    fn for_each_decision(
        &self,
        session_id: Option<&str>,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError> {
        export::for_each_decision(self.conn(), session_id, kinds, each)
    }

    fn for_each_request(
        &self,
        session_id: Option<&str>,
        kinds: &[Kind],
        each: EachRow<'_>,
    ) -> Result<u64, ReportError> {
        export::for_each_request(self.conn(), session_id, kinds, each)
    }

    fn session_config(&self, session_id: &str) -> Result<Option<String>, LedgerError> {
        Ok(items::session_config(self.conn(), session_id)?)
    }

    fn session_stages(&self, session_id: &str) -> Result<Vec<String>, LedgerError> {
        Ok(items::session_stages(self.conn(), session_id)?)
    }

    fn for_each_stage_output(
        &self,
        session_id: &str,
        stage: &str,
        each: &mut dyn FnMut(&str),
    ) -> Result<(), LedgerError> {
        Ok(items::for_each_stage_output(
            self.conn(),
            session_id,
            stage,
            each,
        )?)
    }

    fn for_each_item(
        &self,
        session_id: &str,
        item_kinds: &[Kind],
        stage_kinds: &[Kind],
        each: EachItem<'_>,
    ) -> Result<u64, ReportError> {
        items::for_each_item(self.conn(), session_id, item_kinds, stage_kinds, each)
    }
}

impl From<crate::db::Error> for ReportError {
    fn from(e: crate::db::Error) -> Self {
        ReportError::Ledger(LedgerError::Db(e))
    }
}
