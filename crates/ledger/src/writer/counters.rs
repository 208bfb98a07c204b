//! The session and stage counters a write group changes (and the
//! session's heartbeat), added up while its operations apply and written
//! once at its end.
//!
//! Every result bumps the same few rows (the session's row, its stage's
//! checkpoint). On PostgreSQL several workers' writers commit side by side,
//! and a row updated early in a transaction stays locked until its commit,
//! so counters bumped operation by operation would serialize the writers
//! for their whole transactions, and two writers bumping two stages in
//! opposite orders would deadlock. Written last, in one fixed order (the
//! sessions, then their stages, each sorted), the rows are locked only for
//! the commit, and always in the same order.

use crate::db::{Connection, params};
use docket_model::routing::Outcome;

use super::AttemptRecord;

/// What a group adds to one session's counters, and its heartbeat.
#[derive(Debug, Default, Clone, PartialEq)]
struct SessionDelta {
    /// A counter changed (the row's `updated_at` moves; a heartbeat alone
    /// leaves it).
    counted: bool,
    /// A heartbeat came (`heartbeat_at` moves), with the newest gauges.
    beat: bool,
    live_json: Option<String>,
    orphaned: i64,
    orphaned_cost_usd: f64,
    attempts: i64,
    retries: i64,
    rate_limited: i64,
    ambiguous: i64,
    input_tokens: i64,
    output_tokens: i64,
    cost_usd: f64,
    processed: i64,
    accepted: i64,
    reviewed: i64,
    rejected: i64,
    errors: i64,
}

impl SessionDelta {
    fn add(&mut self, o: SessionDelta) {
        self.counted |= o.counted;
        self.beat |= o.beat;
        if o.live_json.is_some() {
            self.live_json = o.live_json;
        }
        self.orphaned += o.orphaned;
        self.orphaned_cost_usd += o.orphaned_cost_usd;
        self.attempts += o.attempts;
        self.retries += o.retries;
        self.rate_limited += o.rate_limited;
        self.ambiguous += o.ambiguous;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.cost_usd += o.cost_usd;
        self.processed += o.processed;
        self.accepted += o.accepted;
        self.reviewed += o.reviewed;
        self.rejected += o.rejected;
        self.errors += o.errors;
    }
}

/// What a group adds to one stage's checkpoint.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct StageDelta {
    completed: i64,
    failed: i64,
    skipped: i64,
}

/// The counter changes of a group (or of one operation, merged into its
/// group once it applied).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    /// By session; a group holds one or two, so a list searched in place
    /// costs less than a map (no key allocated per operation). Sorted when
    /// written.
    sessions: Vec<(String, SessionDelta)>,
    /// By (session, stage).
    stages: Vec<((String, String), StageDelta)>,
}

impl Counters {
    fn session(&mut self, session_id: &str) -> &mut SessionDelta {
        let at = match self.sessions.iter().position(|(s, _)| s == session_id) {
            Some(at) => at,
            None => {
                let fresh = (session_id.to_string(), SessionDelta::default());
                self.sessions.push(fresh);
                self.sessions.len() - 1
            }
        };
        &mut self.sessions[at].1
    }

    /// A closed attempt and/or an item's outcome.
    pub(crate) fn attempt(
        &mut self,
        session_id: &str,
        a: Option<&AttemptRecord>,
        outcome: Option<Outcome>,
    ) {
        let d = self.session(session_id);
        d.counted = true;
        if let Some(a) = a {
            d.attempts += 1;
            d.retries += a.will_retry as i64;
            d.rate_limited += a.rate_limited as i64;
            d.ambiguous += (a.state == "ambiguous") as i64;
            d.input_tokens += a.input_tokens.unwrap_or(0) as i64;
            d.output_tokens += a.output_tokens.unwrap_or(0) as i64;
            d.cost_usd += a.cost_usd;
        }
        if let Some(outcome) = outcome {
            d.processed += 1;
            match outcome {
                Outcome::Accepted => d.accepted += 1,
                Outcome::Review => d.reviewed += 1,
                Outcome::Rejected => d.rejected += 1,
                Outcome::Error => d.errors += 1,
            }
        }
    }

    /// An attempt abandoned as ambiguous (its answer never came).
    pub(crate) fn abandoned(&mut self, session_id: &str) {
        let d = self.session(session_id);
        d.counted = true;
        d.attempts += 1;
        d.ambiguous += 1;
    }

    /// An answer refused by its fence: paid for, never applied.
    pub(crate) fn orphaned(&mut self, session_id: &str, cost_usd: f64) {
        let d = self.session(session_id);
        d.counted = true;
        d.orphaned += 1;
        d.orphaned_cost_usd += cost_usd;
    }

    /// A worker's heartbeat, with its gauges when it sent them.
    pub(crate) fn beat(&mut self, session_id: &str, live_json: Option<&str>) {
        let d = self.session(session_id);
        d.beat = true;
        if let Some(live) = live_json {
            d.live_json = Some(live.to_string());
        }
    }

    /// Items through a stage: passed, failed, or skipped.
    pub(crate) fn stage(
        &mut self,
        session_id: &str,
        stage: &str,
        completed: i64,
        failed: i64,
        skipped: i64,
    ) {
        let at = match self
            .stages
            .iter()
            .position(|((s, g), _)| s == session_id && g == stage)
        {
            Some(at) => at,
            None => {
                let key = (session_id.to_string(), stage.to_string());
                self.stages.push((key, StageDelta::default()));
                self.stages.len() - 1
            }
        };
        let d = &mut self.stages[at].1;
        d.completed += completed;
        d.failed += failed;
        d.skipped += skipped;
    }

    /// Take in an operation's changes once it applied.
    pub(crate) fn merge(&mut self, other: Counters) {
        for (id, d) in other.sessions {
            self.session(&id).add(d);
        }
        for ((session_id, stage), d) in other.stages {
            self.stage(&session_id, &stage, d.completed, d.failed, d.skipped);
        }
    }

    /// Write the changes: each session's row, then each stage's checkpoint
    /// (running once anything happened, done once every item is through it).
    /// Leaves nothing behind.
    pub(crate) fn write(&mut self, conn: &Connection) -> crate::db::Result<()> {
        if self.sessions.is_empty() && self.stages.is_empty() {
            return Ok(());
        }
        let now = conn.now()?;
        let mut sessions = std::mem::take(&mut self.sessions);
        sessions.sort_by(|a, b| a.0.cmp(&b.0));
        let mut stages = std::mem::take(&mut self.stages);
        stages.sort_by(|a, b| a.0.cmp(&b.0));
        for (session_id, d) in sessions {
            conn.prepare_cached(
                "UPDATE llm_batch_session SET
                     attempt_count = attempt_count + ?2,
                     retry_count = retry_count + ?3,
                     rate_limited_count = rate_limited_count + ?4,
                     ambiguous_count = ambiguous_count + ?5,
                     input_tokens = input_tokens + ?6,
                     output_tokens = output_tokens + ?7,
                     cost_usd = cost_usd + ?8,
                     processed_count = processed_count + ?9,
                     accepted_count = accepted_count + ?10, reviewed_count = reviewed_count + ?11,
                     rejected_count = rejected_count + ?12, error_count = error_count + ?13,
                     orphaned_count = orphaned_count + ?15, orphaned_cost_usd = orphaned_cost_usd + ?16,
                     updated_at = CASE WHEN ?17 THEN ?14 ELSE updated_at END,
                     heartbeat_at = CASE WHEN ?18 THEN ?14 ELSE heartbeat_at END,
                     live_json = COALESCE(?19, live_json)
                 WHERE session_id = ?1",
            )?
            .execute(params![
                session_id,
                d.attempts,
                d.retries,
                d.rate_limited,
                d.ambiguous,
                d.input_tokens,
                d.output_tokens,
                d.cost_usd,
                d.processed,
                d.accepted,
                d.reviewed,
                d.rejected,
                d.errors,
                now,
                d.orphaned,
                d.orphaned_cost_usd,
                d.counted,
                d.beat,
                d.live_json
            ])?;
        }
        for ((session_id, stage), d) in stages {
            conn.prepare_cached(
                "UPDATE run_stages SET completed = completed + ?3, failed = failed + ?4, skipped = skipped + ?5,
                     started_at = COALESCE(started_at, ?6),
                     state = CASE WHEN completed + ?3 + failed + ?4 + skipped + ?5 >= total THEN 'done' ELSE 'running' END,
                     completed_at = CASE WHEN completed + ?3 + failed + ?4 + skipped + ?5 >= total THEN ?6 ELSE NULL END,
                     updated_at = ?6
                 WHERE session_id = ?1 AND stage = ?2",
            )?
            .execute(params![session_id, stage, d.completed, d.failed, d.skipped, now])?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operation_merged_adds_to_its_group_and_outcomes_count_once() {
        let mut group = Counters::default();
        let a = AttemptRecord {
            state: "answered",
            input_tokens: Some(10),
            output_tokens: Some(4),
            cost_usd: 0.5,
            will_retry: true,
            ..Default::default()
        };
        group.attempt("s", Some(&a), None);
        let mut op = Counters::default();
        op.attempt("s", Some(&a), Some(Outcome::Review));
        op.abandoned("s");
        op.stage("s", "critic", 0, 0, 1);
        op.stage("s", "adjudicate", 1, 0, 0);
        group.merge(op);
        group.beat("s", Some("{}"));
        let d = &group.sessions[0].1;
        assert_eq!(
            (
                d.attempts,
                d.retries,
                d.ambiguous,
                d.input_tokens,
                d.output_tokens
            ),
            (3, 2, 1, 20, 8)
        );
        assert_eq!((d.processed, d.reviewed, d.accepted), (1, 1, 0));
        assert!((d.cost_usd - 1.0).abs() < 1e-9);
        assert!(d.counted && d.beat && d.live_json.as_deref() == Some("{}"));
        let stages: Vec<(&str, StageDelta)> = group
            .stages
            .iter()
            .map(|((_, s), d)| (s.as_str(), *d))
            .collect();
        assert_eq!(stages.len(), 2);
        assert!(stages.contains(&(
            "adjudicate",
            StageDelta {
                completed: 1,
                failed: 0,
                skipped: 0
            }
        )));
        assert!(stages.contains(&(
            "critic",
            StageDelta {
                completed: 0,
                failed: 0,
                skipped: 1
            }
        )));
    }
}
