//! `--max-cost`: a hard budget. A send reserves its worst-case cost (prompt
//! estimate plus max_tokens of output) before it goes; dispatch stops before
//! the spend could pass the budget, and the reservation is settled to the
//! reported cost afterwards.
//!
//! With several workers on a session the budget is the session's: each
//! worker sees the session's spend in the ledger (every heartbeat) and
//! counts the others as reserving what it reserves itself, so together they
//! stop before the spend could pass it.

use std::sync::Mutex;

/// How a stop for the budget begins: the run's end says to raise
/// `--max-cost` only after this one, not after any other pause.
pub(crate) const BUDGET_REACHED: &str = "budget reached";

#[derive(Debug, Default)]
struct State {
    spent: f64,
    reserved: f64,
    /// Workers on the session, this one included (at least 1).
    workers: u64,
}

#[derive(Debug)]
pub struct Budget {
    max: Option<f64>,
    state: Mutex<State>,
}

impl Budget {
    pub fn new(max: Option<f64>, already_spent: f64) -> Self {
        Self {
            max,
            state: Mutex::new(State {
                spent: already_spent,
                reserved: 0.0,
                workers: 1,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reserve `worst_case` dollars; false if that could pass the budget.
    pub fn try_reserve(&self, worst_case: f64) -> bool {
        let mut s = self.lock();
        let workers = s.workers.max(1) as f64;
        if let Some(max) = self.max
            && s.spent + (s.reserved + worst_case) * workers > max + 1e-12
        {
            return false;
        }
        s.reserved += worst_case;
        true
    }

    /// Replace a reservation by what was actually spent.
    pub fn settle(&self, reserved: f64, actual: f64) {
        let mut s = self.lock();
        s.reserved = (s.reserved - reserved).max(0.0);
        s.spent += actual;
    }

    /// What the ledger says the session has spent (every worker's committed
    /// spend), and how many workers run it now.
    pub fn observe(&self, session_spent: f64, workers: u64) {
        let mut s = self.lock();
        s.spent = s.spent.max(session_spent);
        s.workers = workers.max(1);
    }

    pub fn spent(&self) -> f64 {
        self.lock().spent
    }

    pub fn max(&self) -> Option<f64> {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_a_send_that_could_pass_the_budget() {
        let b = Budget::new(Some(1.0), 0.25);
        assert!(b.try_reserve(0.5));
        assert!(!b.try_reserve(0.3), "0.25 spent + 0.5 reserved + 0.3 > 1.0");
        b.settle(0.5, 0.1); // the send cost less than its worst case
        assert!(b.try_reserve(0.6));
        assert!((b.spent() - 0.35).abs() < 1e-12);
    }

    #[test]
    fn two_workers_share_the_headroom() {
        let b = Budget::new(Some(1.0), 0.0);
        // Another worker spent 0.4 of the session's budget.
        b.observe(0.4, 2);
        assert!(b.try_reserve(0.25), "0.4 + 2 x 0.25 = 0.9");
        assert!(
            !b.try_reserve(0.1),
            "0.4 + 2 x 0.35 = 1.1: the other may reserve as much"
        );
        // The ledger never lowers what this worker knows it spent.
        b.settle(0.25, 0.5);
        b.observe(0.3, 1);
        assert!((b.spent() - 0.9).abs() < 1e-12);
    }

    #[test]
    fn no_budget_never_refuses() {
        let b = Budget::new(None, 0.0);
        assert!(b.try_reserve(1e9));
    }
}
