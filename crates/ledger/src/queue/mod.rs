//! The work queue: every worker process claims a session's items from the
//! ledger, page by page, with a lease and a fencing token.
//!
//! - A claim sets `claimed_by`, `lease_until` and a `claim_token` one higher
//!   than any before it, in one write transaction, so two workers never hold
//!   the same item.
//! - The worker renews its leases while it works. Everything it writes for
//!   an item carries the token it claimed with, and the writer commits it
//!   only while the row still has that token (`writer::Fence`): a worker that
//!   stalled past its lease and was taken over has its late writes refused,
//!   counted as orphaned spend, never doubled.
//! - A claim that takes over an item another worker held marks that
//!   worker's attempts still marked 'sent' ambiguous (they may have been
//!   billed) before the item is sent again.
//! - Workers on this host whose process is gone lose their leases at once;
//!   elsewhere a lease runs out on its own.

mod claims;
mod leases;
mod repair;
mod workers;

pub(crate) use claims::{claim_page, claim_requests};
pub(crate) use leases::{
    current_token, expire_dead_local_workers, held_by_others, release_all, renew,
};
pub use repair::Repair;
pub(crate) use repair::repair_interrupted;
pub use workers::{WorkerBeat, WorkerRow};
pub(crate) use workers::{beat, live_workers, others_gauges, worker_ended, workers};

/// Seconds a worker's heartbeat may be old and the worker still count as
/// alive (it beats every 400 ms).
pub const WORKER_LIVE_SECS: f64 = 5.0;

/// `user@host:pid#random`: unique per process start, so a recycled pid never
/// inherits a dead worker's claims.
pub fn new_worker_id() -> String {
    format!(
        "{}#{}",
        docket_model::operator::Operator::current()
            .claimant
            .replace(' ', "_"),
        docket_model::ids::random_suffix(6)
    )
}

/// Which items a claim may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimScope {
    /// After a position, in order: items nobody holds (never claimed, let
    /// go, or a lease that ran out).
    After(i64),
    /// Anywhere in the session: items let go by a worker that left, and
    /// items whose holder's lease ran out (it died or stalled). Items this
    /// worker let go itself (a stop-after-stage held them) are not taken
    /// again.
    Takeover,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::{Connection, params};
    use crate::store::{self, WorkItem};
    use crate::writer::{AttemptRecord, Fence, LedgerWriter, SendIntent, WriteError, WriteOp};

    /// A ledger with one session of `n` items, one stage.
    fn ledger(n: usize) -> (tempfile::TempDir, std::path::PathBuf, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("docket.sqlite");
        let mut conn = Connection::Sqlite(crate::open(&path).unwrap());
        let ids: Vec<String> = (0..n).map(|i| format!("item-{i:03}")).collect();
        for id in &ids {
            conn.execute(
                "INSERT INTO decision (item_id, evidence_json, imported_at, updated_at) VALUES (?1, '{}', 0, 0)",
                params![id],
            )
            .unwrap();
        }
        let taken = store::create_session(
            &mut conn,
            &store::NewSession {
                session_id: "s1",
                config_snapshot_json: "{}",
                stages: &[store::NewStage::for_test("adjudicate", None)],
                estimated_tokens: 0,
                estimated_cost_usd: 0.0,
                max_cost_usd: None,
                item_ids: &ids,
                profile: None,
            },
        )
        .unwrap();
        assert_eq!(taken, n);
        (dir, path, conn)
    }

    fn positions(items: &[WorkItem]) -> Vec<i64> {
        items.iter().map(|w| w.position).collect()
    }

    #[test]
    fn two_workers_claim_disjoint_pages_and_tokens_grow() {
        let (_d, _p, mut conn) = ledger(10);
        let a = claim_page(&mut conn, "s1", "a", ClaimScope::After(-1), 4, 30.0).unwrap();
        let b = claim_page(&mut conn, "s1", "b", ClaimScope::After(-1), 4, 30.0).unwrap();
        assert_eq!(positions(&a), vec![0, 1, 2, 3]);
        assert_eq!(positions(&b), vec![4, 5, 6, 7], "a's items are not b's");
        assert!(a.iter().chain(&b).all(|w| w.claim_token == 1));
        assert_eq!(a[0].stages.len(), 1, "the work comes with the claim");
        // Nothing of the others' is taken over while their leases hold.
        let c = claim_page(&mut conn, "s1", "c", ClaimScope::Takeover, 100, 30.0).unwrap();
        assert_eq!(positions(&c), vec![8, 9]);
        assert!(
            claim_page(&mut conn, "s1", "c", ClaimScope::Takeover, 100, 30.0)
                .unwrap()
                .is_empty()
        );
        assert_eq!(held_by_others(&conn, "s1", "c").unwrap(), 8);
        // a's lease runs out: c takes its items over, each with a new token.
        conn.execute(
            "UPDATE session_item SET lease_until = 1 WHERE claimed_by = 'a'",
            params![],
        )
        .unwrap();
        let taken = claim_page(&mut conn, "s1", "c", ClaimScope::Takeover, 100, 30.0).unwrap();
        assert_eq!(positions(&taken), vec![0, 1, 2, 3]);
        assert!(taken.iter().all(|w| w.claim_token == 2));
        // Renewal extends only what a worker still holds.
        assert_eq!(renew(&conn, "s1", "a", 30.0).unwrap(), 0);
        assert_eq!(renew(&conn, "s1", "b", 30.0).unwrap(), 4);
        // Leaving lets go of everything at once.
        assert_eq!(release_all(&conn, "s1", "b").unwrap(), 4);
        let again = claim_page(&mut conn, "s1", "a", ClaimScope::Takeover, 100, 30.0).unwrap();
        assert_eq!(positions(&again), vec![4, 5, 6, 7]);
    }

    #[test]
    fn a_takeover_marks_the_old_workers_attempts_ambiguous() {
        let (_d, _p, mut conn) = ledger(2);
        let a = claim_page(&mut conn, "s1", "a", ClaimScope::After(-1), 1, 30.0).unwrap();
        let request = a[0].stages[0].request_id;
        conn.execute(
            "INSERT INTO llm_messages (request_id, attempt, session_id, client_request_id, state, user_prompt, sent_at)
             VALUES (?1, 1, 's1', 'x', 'sent', 'p', 0)",
            params![request],
        )
        .unwrap();
        conn.execute(
            "UPDATE session_item SET lease_until = 1 WHERE claimed_by = 'a'",
            params![],
        )
        .unwrap();
        let b = claim_page(&mut conn, "s1", "b", ClaimScope::After(-1), 1, 30.0).unwrap();
        assert_eq!(positions(&b), vec![0]);
        assert_eq!(b[0].stages[0].attempt, 1, "the next send is attempt 2");
        let (state, ambiguous): (String, i64) = conn
            .query_row(
                "SELECT m.state, s.ambiguous_count FROM llm_messages m, llm_batch_session s WHERE s.session_id = 's1'",
                params![],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!((state.as_str(), ambiguous), ("ambiguous", 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_under_a_lost_claim_is_refused_and_counted_as_orphaned() {
        let (_d, path, mut conn) = ledger(1);
        let a = claim_page(&mut conn, "s1", "a", ClaimScope::After(-1), 1, 30.0).unwrap();
        let (item, request) = (a[0].item_id.clone(), a[0].stages[0].request_id);
        let (writer, handle) = LedgerWriter::start(&path).unwrap();
        let fence = |token| Fence::Item {
            session_id: "s1".into(),
            item_id: item.clone(),
            token,
            worker_id: "a".into(),
        };
        let send = WriteOp::Send(SendIntent {
            session_id: "s1".into(),
            request_id: request,
            attempt: 1,
            client_request_id: "s1-1-1".into(),
            system_prompt: None,
            user_prompt: "p".into(),
            evidence_hash: None,
        });
        writer.write_fenced(send, fence(1)).await.unwrap();
        // a stalls; b takes the item over.
        conn.execute("UPDATE session_item SET lease_until = 1", params![])
            .unwrap();
        let b = claim_page(&mut conn, "s1", "b", ClaimScope::Takeover, 1, 30.0).unwrap();
        assert_eq!(b[0].claim_token, 2);
        let late = WriteOp::Attempt(AttemptRecord {
            session_id: "s1".into(),
            request_id: request,
            attempt: 1,
            state: "answered",
            http_status: Some(200),
            output_tokens: Some(7),
            cost_usd: 0.25,
            ..Default::default()
        });
        assert_eq!(
            writer.write_fenced(late, fence(1)).await,
            Err(WriteError::LeaseLost)
        );
        // A send under the old token is refused too: nothing leaves.
        let resend = WriteOp::Send(SendIntent {
            session_id: "s1".into(),
            request_id: request,
            attempt: 2,
            client_request_id: "s1-1-2".into(),
            system_prompt: None,
            user_prompt: "p".into(),
            evidence_hash: None,
        });
        assert_eq!(
            writer.write_fenced(resend, fence(1)).await,
            Err(WriteError::LeaseLost)
        );
        drop(writer);
        tokio::task::block_in_place(|| handle.join());
        let (state, cost): (String, f64) = conn
            .query_row(
                "SELECT state, cost_usd FROM llm_messages WHERE request_id = ?1 AND attempt = 1",
                params![request],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(state, "ambiguous", "marked by the takeover, not answered");
        assert!((cost - 0.25).abs() < 1e-9, "what it paid is on record");
        assert_eq!(store::orphaned_spend(&conn, "s1").unwrap(), (1, 0.25));
        let attempts: i64 = conn
            .query_row("SELECT COUNT(*) FROM llm_messages", params![], |r| r.get(0))
            .unwrap();
        assert_eq!(attempts, 1, "the refused send wrote nothing");
        let events: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM session_event WHERE kind = 'lease_lost'",
                params![],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(events, 1);
    }
}
