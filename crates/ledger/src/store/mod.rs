//! Session planning and the reads the engine needs. Writes during a run go
//! through `writer`; these run before it starts (planning, resume repair) or
//! read-only alongside it.

mod candidates;
mod flags;
mod plan;
mod sessions;
mod stale;
mod work;

pub use candidates::{Candidate, CandidateError, CandidateFilter};
pub(crate) use candidates::{count_awaiting_review, count_candidates, for_each_candidate};
pub use flags::FlagChange;
pub(crate) use plan::create_session;
pub use plan::{NewSession, NewStage};
pub use sessions::{
    Controls, LIVE_HEARTBEAT_SECS, RESUME_WINDOW_SECS, SessionRow, desired_state, latest_session,
    load_session, run_by_live_process, set_desired_state, shown_state_of,
};
pub(crate) use sessions::{hostname, orphaned_spend, process_alive, session_controls};
pub(crate) use stale::{count_stale_evidence, stale_answers};
pub use work::{StageWork, WorkItem};
pub(crate) use work::{evidence_of, next_work, record_sent_evidence, work_between};
