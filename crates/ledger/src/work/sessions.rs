//! A session as the engine plans, starts, resumes and runs it: the items a
//! new session would take, creating it, repairing it for a resume or a
//! worker joining, asking stages again, and what a running worker reads
//! back (the operator's controls, the counters, the work left).

use crate::queue::Repair;
use std::ops::ControlFlow;

use crate::rerun::{self, Rerun, RerunError, RerunStage};
use crate::store::{
    self, Candidate, CandidateError, CandidateFilter, Controls, NewSession, NewStage, SessionRow,
    WorkItem,
};
use crate::{Ledger, LedgerError};

/// The engine's sessions in the ledger.
pub trait RunSessions {
    /// How many indeterminate items a new session would take.
    fn count_candidates(&self, filter: CandidateFilter) -> Result<u64, LedgerError>;

    /// Indeterminate items a new session leaves out by default because
    /// they await review (they have a pending review item).
    fn count_awaiting_review(&self) -> Result<u64, LedgerError>;

    /// Visit the items a new session would take, in import order; returns
    /// how many. `each` breaking stops the visit with
    /// `CandidateError::Stopped` (the visitor keeps its reason).
    fn for_each_candidate(
        &self,
        filter: CandidateFilter,
        each: &mut dyn FnMut(Candidate) -> ControlFlow<()>,
    ) -> Result<u64, CandidateError>;

    /// An item's evidence as stored (JSON text); None for an unknown item.
    fn evidence_of(&self, item_id: &str) -> Result<Option<String>, LedgerError>;

    /// Answered requests a new session would reuse although they were made
    /// with another template or parameters: (stage, count) per stage.
    fn stale_answers(
        &self,
        stages: &[NewStage<'_>],
        item_ids: &[String],
    ) -> Result<Vec<(String, u64)>, LedgerError>;

    /// Of the planned items, how many have an answer made on evidence
    /// `docket import --update` replaced since (asked again).
    fn count_stale_evidence(&self, item_ids: &[String]) -> Result<u64, LedgerError>;

    /// Create the session with its requests, items and stage checkpoints in
    /// one step; returns how many of the planned items it took (those a
    /// live session took meanwhile are left out; none left: nothing is
    /// created).
    fn create_session(&mut self, session: &NewSession<'_>) -> Result<usize, LedgerError>;

    /// The session's row; None when there is no such session.
    fn load_session(&self, session_id: &str) -> Result<Option<SessionRow>, LedgerError>;

    /// The newest session id, for messages that suggest one.
    fn latest_session(&self) -> Result<Option<String>, LedgerError>;

    /// Before a process works on a session: lapsed leases let go, attempts
    /// lost in flight marked ambiguous, the session claimed for this
    /// process. `resume`: the operator resumes it (its pause and stop after
    /// a stage are cleared); else a worker joins and the controls stay.
    fn repair_interrupted(
        &mut self,
        session_id: &str,
        max_cost_usd: Option<f64>,
        resume: bool,
    ) -> Result<Repair, LedgerError>;

    /// Ask `stages[from]` and every stage after it again for every item of
    /// the session (new request versions; outcomes moved to history).
    /// Refused while the session has provider batches open.
    fn rerun_stages(
        &mut self,
        stages: &[RerunStage],
        session_id: &str,
        from: usize,
        actor: &str,
    ) -> Result<Rerun, RerunError>;

    /// Everything an operator may have asked of the session (desired
    /// state, stop after a stage, retune); None when there is no such
    /// session.
    fn session_controls(&self, session_id: &str) -> Result<Option<Controls>, LedgerError>;

    /// The next `n` items after `after_position` that have no outcome yet,
    /// in order, with every stage's request.
    fn next_work(
        &self,
        session_id: &str,
        after_position: i64,
        n: usize,
    ) -> Result<Vec<WorkItem>, LedgerError>;

    /// Answers paid for but refused because their worker had lost the item:
    /// (count, USD).
    fn orphaned_spend(&self, session_id: &str) -> Result<(u64, f64), LedgerError>;
}

impl RunSessions for Ledger {
    fn count_candidates(&self, filter: CandidateFilter) -> Result<u64, LedgerError> {
        Ok(store::count_candidates(self.conn(), filter)?)
    }

    fn count_awaiting_review(&self) -> Result<u64, LedgerError> {
        Ok(store::count_awaiting_review(self.conn())?)
    }

    fn for_each_candidate(
        &self,
        filter: CandidateFilter,
        each: &mut dyn FnMut(Candidate) -> ControlFlow<()>,
    ) -> Result<u64, CandidateError> {
        store::for_each_candidate(self.conn(), filter, each)
    }

    fn evidence_of(&self, item_id: &str) -> Result<Option<String>, LedgerError> {
        Ok(store::evidence_of(self.conn(), item_id)?)
    }

    fn stale_answers(
        &self,
        stages: &[NewStage<'_>],
        item_ids: &[String],
    ) -> Result<Vec<(String, u64)>, LedgerError> {
        Ok(store::stale_answers(self.conn(), stages, item_ids)?)
    }

    fn count_stale_evidence(&self, item_ids: &[String]) -> Result<u64, LedgerError> {
        Ok(store::count_stale_evidence(self.conn(), item_ids)?)
    }

    fn create_session(&mut self, session: &NewSession<'_>) -> Result<usize, LedgerError> {
        Ok(store::create_session(self.conn_mut(), session)?)
    }

    fn load_session(&self, session_id: &str) -> Result<Option<SessionRow>, LedgerError> {
        Ok(store::load_session(self.conn(), session_id)?)
    }

    fn latest_session(&self) -> Result<Option<String>, LedgerError> {
        Ok(store::latest_session(self.conn())?)
    }

    fn repair_interrupted(
        &mut self,
        session_id: &str,
        max_cost_usd: Option<f64>,
        resume: bool,
    ) -> Result<Repair, LedgerError> {
        Ok(crate::queue::repair_interrupted(
            self.conn_mut(),
            session_id,
            max_cost_usd,
            resume,
        )?)
    }

    fn rerun_stages(
        &mut self,
        stages: &[RerunStage],
        session_id: &str,
        from: usize,
        actor: &str,
    ) -> Result<Rerun, RerunError> {
        rerun::rerun_stages(self.conn_mut(), stages, session_id, from, actor)
    }

    fn session_controls(&self, session_id: &str) -> Result<Option<Controls>, LedgerError> {
        Ok(store::session_controls(self.conn(), session_id)?)
    }

    fn next_work(
        &self,
        session_id: &str,
        after_position: i64,
        n: usize,
    ) -> Result<Vec<WorkItem>, LedgerError> {
        Ok(store::next_work(
            self.conn(),
            session_id,
            after_position,
            n,
        )?)
    }

    fn orphaned_spend(&self, session_id: &str) -> Result<(u64, f64), LedgerError> {
        Ok(store::orphaned_spend(self.conn(), session_id)?)
    }
}
