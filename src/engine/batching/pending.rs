//! Where a batch line's result meets the worker waiting for it. Results may
//! come before the worker asks (a resumed run re-attaches open batches while
//! the feed is still paging towards their items), so a slot holds either
//! the waiting worker or the result that came first.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::oneshot;

use super::Reply;

enum Slot {
    /// A worker waits on the other end.
    Waiting(oneshot::Sender<Reply>),
    /// Re-attached from the ledger: no worker has asked yet.
    Unclaimed,
    /// The result came before the worker asked.
    Arrived(Box<Reply>),
}

#[derive(Default)]
pub(super) struct Pending {
    slots: Mutex<HashMap<String, Slot>>,
}

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A new line's worker waits for `custom_id`.
    pub(super) fn wait(&self, custom_id: String, reply: oneshot::Sender<Reply>) {
        self.lock().insert(custom_id, Slot::Waiting(reply));
    }

    /// A line of an open batch found in the ledger; its worker comes later.
    pub(super) fn expect(&self, custom_id: String) {
        self.lock().entry(custom_id).or_insert(Slot::Unclaimed);
    }

    /// Whether a re-attached line waits for its worker.
    #[cfg(test)]
    pub(super) fn is_expected(&self, custom_id: &str) -> bool {
        matches!(
            self.lock().get(custom_id),
            Some(Slot::Unclaimed | Slot::Arrived(_))
        )
    }

    /// The worker of a re-attached line: the result, now or later. None when
    /// the line is not waiting in any open batch.
    pub(super) fn claim(&self, custom_id: &str) -> Option<oneshot::Receiver<Reply>> {
        let mut slots = self.lock();
        let (tx, rx) = oneshot::channel();
        match slots.remove(custom_id) {
            Some(Slot::Unclaimed) => {
                slots.insert(custom_id.to_string(), Slot::Waiting(tx));
                Some(rx)
            }
            Some(Slot::Arrived(reply)) => {
                let _ = tx.send(*reply);
                Some(rx)
            }
            Some(waiting @ Slot::Waiting(_)) => {
                // Already claimed: a second worker for one line cannot
                // happen; keep the first and refuse.
                slots.insert(custom_id.to_string(), waiting);
                None
            }
            None => None,
        }
    }

    /// Hand a result to its line. False when nobody expects it (already
    /// delivered, or not a line of this run).
    pub(super) fn deliver(&self, custom_id: &str, reply: Reply) -> bool {
        let mut slots = self.lock();
        match slots.remove(custom_id) {
            Some(Slot::Waiting(tx)) => {
                // A worker that has gone (the run is stopping) leaves the
                // attempt 'sent': the resume fetches the result again.
                let _ = tx.send(reply);
                true
            }
            Some(Slot::Unclaimed) => {
                slots.insert(custom_id.to_string(), Slot::Arrived(Box::new(reply)));
                true
            }
            Some(arrived @ Slot::Arrived(_)) => {
                slots.insert(custom_id.to_string(), arrived);
                false
            }
            None => false,
        }
    }

    /// Stop waiting for `custom_id` (its batch went to another worker): a
    /// worker waiting on it hears nothing more and stops.
    pub(super) fn forget(&self, custom_id: &str) {
        self.lock().remove(custom_id);
    }

    /// Whether `custom_id` still waits for a result.
    pub(super) fn contains(&self, custom_id: &str) -> bool {
        matches!(
            self.lock().get(custom_id),
            Some(Slot::Waiting(_) | Slot::Unclaimed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn not_run(s: &str) -> Reply {
        Reply::NotRun(s.into())
    }

    #[tokio::test]
    async fn a_result_before_the_worker_is_kept_for_it() {
        let p = Pending::default();
        p.expect("a".into());
        assert!(p.is_expected("a"));
        assert!(p.deliver("a", not_run("early")));
        let rx = p.claim("a").expect("claimable");
        assert!(matches!(rx.await, Ok(Reply::NotRun(s)) if s == "early"));
        assert!(p.claim("a").is_none(), "delivered once");
        assert!(!p.deliver("a", not_run("again")), "nobody waits any more");
    }

    #[tokio::test]
    async fn a_claimed_line_gets_its_result_later() {
        let p = Pending::default();
        p.expect("b".into());
        let rx = p.claim("b").unwrap();
        assert!(p.claim("b").is_none(), "one worker per line");
        assert!(p.contains("b"));
        assert!(p.deliver("b", not_run("late")));
        assert!(matches!(rx.await, Ok(Reply::NotRun(s)) if s == "late"));
        assert!(!p.contains("b"));
    }

    #[tokio::test]
    async fn unknown_lines_are_refused() {
        let p = Pending::default();
        assert!(p.claim("x").is_none());
        assert!(!p.deliver("x", not_run("?")));
        let (tx, rx) = oneshot::channel();
        p.wait("y".into(), tx);
        assert!(!p.is_expected("y"), "a new line is not a re-attached one");
        assert!(p.deliver("y", not_run("ok")));
        assert!(matches!(rx.await, Ok(Reply::NotRun(_))));
    }
}
