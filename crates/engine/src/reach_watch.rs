//! A provider that stops answering holds the run instead of failing every
//! item (fault-matrix row S5): when a stage's sends fail one after
//! another without reaching the provider (connection refused, DNS, TLS:
//! nothing was sent, so nothing is ambiguous), from several items and with
//! no answer in between, the stage's breaker opens. Its sends wait; the
//! control loop probes the provider (`reach_probe`) and closes the breaker
//! when it answers, and the run goes on by itself. Any answer from the
//! provider, even an error status, resets the streak.
//!
//! A provider that answers only server errors (500, 502, 503, 529: an
//! outage, row S4) opens the same breaker after `FAILING_STREAK` of them in
//! a row from at least `FAILING_ITEMS` items (one item's own 500s are its
//! own problem, and its transport attempts end them). Its models list may
//! well still answer, so the probe there is one real send: the control
//! loop lets one waiting send through now and then (half-open), and the
//! first answer that is not a server error closes the breaker. Failures
//! while the breaker is open (the probe, a send already under way) spend
//! no item's transport attempts.

use std::collections::HashSet;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::per_stage::PerStage;

/// Sends in a row that reached nothing. From any items: a connection
/// that could not be made (refused, DNS, TLS) says nothing about the item
/// it was for, and at concurrency 1 one item's retries are all there is.
const STREAK: usize = 10;

/// Server errors in a row, and from how many items at least.
const FAILING_STREAK: usize = 20;
const FAILING_ITEMS: usize = 3;

/// Why a breaker is open: it decides how the provider is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cause {
    /// Nothing reached it: probed with its models list.
    Unreached,
    /// It answers only server errors: probed with one real send.
    Failing,
}

#[derive(Default)]
struct Streak {
    failures: usize,
    items: HashSet<String>,
    server_failures: usize,
    server_items: HashSet<String>,
    /// The breaker is open, for this reason.
    open: Option<(String, Cause)>,
    /// Half-open: one waiting send may go now.
    ticket: bool,
    /// When the breaker opened.
    since: Option<std::time::Instant>,
}

impl Streak {
    fn reset(&mut self) {
        self.failures = 0;
        self.items.clear();
        self.server_failures = 0;
        self.server_items.clear();
    }
}

/// One streak and breaker per stage, in job order.
pub(super) struct ReachWatch {
    stages: PerStage<Streak>,
    /// Each stage's breaker, for the sends that wait on it.
    open: Vec<watch::Sender<bool>>,
}

impl ReachWatch {
    pub(super) fn new(stages: usize) -> ReachWatch {
        ReachWatch {
            stages: PerStage::new(stages),
            open: (0..stages).map(|_| watch::Sender::new(false)).collect(),
        }
    }

    /// Why `stage`'s breaker is open; None while its sends go.
    #[cfg(test)]
    pub(super) fn open_because(&self, stage: usize) -> Option<String> {
        self.opened(stage).map(|(why, _, _)| why)
    }

    /// Why `stage`'s breaker is open, the kind of opening, and when it
    /// opened (each opening has its own instant: a breaker closed and
    /// opened again between two looks is a new opening).
    pub(super) fn opened(&self, stage: usize) -> Option<(String, Cause, std::time::Instant)> {
        let s = self.streak(stage)?;
        let (why, cause) = s.open.clone()?;
        Some((why, cause, s.since?))
    }

    /// Whether any stage's breaker is open.
    pub(super) fn any_open(&self) -> bool {
        (0..self.open.len()).any(|stage| self.opened(stage).is_some())
    }

    /// The provider of `stage` answered a probe: its sends go again, and
    /// the streak starts over.
    pub(super) fn close(&self, stage: usize) {
        if let Some(mut s) = self.streak(stage) {
            s.reset();
            s.open = None;
            s.ticket = false;
            s.since = None;
        }
        if let Some(tx) = self.open.get(stage) {
            tx.send_replace(false);
        }
    }

    /// Half-open: let one waiting send of `stage` through as a probe.
    pub(super) fn allow_probe(&self, stage: usize) {
        if let Some(mut s) = self.streak(stage) {
            if s.open.is_none() {
                return;
            }
            s.ticket = true;
        }
        if let Some(tx) = self.open.get(stage) {
            // Wakes the waiters; the breaker stays open.
            tx.send_modify(|_| {});
        }
    }

    /// Take the half-open ticket, if it is there.
    fn take_ticket(&self, stage: usize) -> bool {
        self.streak(stage)
            .is_some_and(|mut s| std::mem::take(&mut s.ticket))
    }

    /// Wait while `stage`'s breaker is open; false when the run stops first.
    pub(super) async fn wait_closed(&self, stage: usize, stop: &CancellationToken) -> bool {
        let Some(tx) = self.open.get(stage) else {
            return true;
        };
        let mut rx = tx.subscribe();
        loop {
            if stop.is_cancelled() {
                return false;
            }
            if !*rx.borrow_and_update() || self.take_ticket(stage) {
                return true;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return !stop.is_cancelled() },
                _ = stop.cancelled() => return false,
            }
        }
    }

    fn streak(&self, stage: usize) -> Option<std::sync::MutexGuard<'_, Streak>> {
        self.stages.get(stage)
    }

    /// The provider of `stage` answered with something other than a
    /// server error: both streaks start over, and a breaker opened for
    /// server errors closes (this was its probe, or a send under way).
    /// Returns how long that breaker was open, when this closed it.
    pub(super) fn answered(&self, stage: usize) -> Option<std::time::Duration> {
        let closes = match self.streak(stage) {
            Some(mut s) => {
                s.reset();
                match (&s.open, s.since) {
                    (Some((_, Cause::Failing)), Some(since)) => Some(since.elapsed()),
                    _ => None,
                }
            }
            None => None,
        };
        if closes.is_some() {
            self.close(stage);
        }
        closes
    }

    /// A send of `stage` for `item` got a server error (5xx, 529). Opens
    /// the breaker after `FAILING_STREAK` in a row from `FAILING_ITEMS`
    /// items or more, and returns why (once per opening).
    pub(super) fn server_failed(&self, stage: usize, item: &str, error: &str) -> Option<String> {
        let mut s = self.streak(stage)?;
        // A failure of any other kind in between broke the unreached streak.
        s.failures = 0;
        s.items.clear();
        if s.open.is_some() {
            return None;
        }
        s.server_failures += 1;
        s.server_items.insert(item.to_string());
        if s.server_failures < FAILING_STREAK || s.server_items.len() < FAILING_ITEMS {
            return None;
        }
        let why = format!(
            "its last {} answers, for {} items, were server errors (the last: {error})",
            s.server_failures,
            s.server_items.len()
        );
        self.open_now(stage, s, why, Cause::Failing)
    }

    /// Open `stage`'s breaker for `why`: its sends wait from now on.
    fn open_now(
        &self,
        stage: usize,
        mut s: std::sync::MutexGuard<'_, Streak>,
        why: String,
        cause: Cause,
    ) -> Option<String> {
        s.open = Some((why.clone(), cause));
        s.since = Some(std::time::Instant::now());
        drop(s);
        if let Some(tx) = self.open.get(stage) {
            tx.send_replace(true);
        }
        Some(why)
    }

    /// A send of `stage` for `item` did not reach the provider. Opens the
    /// breaker after `STREAK` such sends in a row (from any items), and
    /// returns why (once per opening).
    pub(super) fn unreached(&self, stage: usize, item: &str, error: &str) -> Option<String> {
        let mut s = self.streak(stage)?;
        if s.open.is_some() {
            return None;
        }
        s.server_failures = 0;
        s.server_items.clear();
        s.failures += 1;
        s.items.insert(item.to_string());
        if s.failures < STREAK {
            return None;
        }
        let why = format!(
            "its last {} sends, for {} items, did not reach the provider (the last: {error})",
            s.failures,
            s.items.len()
        );
        self.open_now(stage, s, why, Cause::Unreached)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streak_from_several_items_stops_once_and_an_answer_resets_it() {
        let w = ReachWatch::new(1);
        for i in 0..9 {
            assert_eq!(
                w.unreached(0, &format!("i{}", i % 3), "connection refused"),
                None
            );
        }
        w.answered(0);
        for i in 0..9 {
            assert_eq!(
                w.unreached(0, &format!("i{}", i % 3), "connection refused"),
                None
            );
        }
        let stop = w
            .unreached(0, "i0", "connection refused")
            .expect("ten in a row");
        assert!(
            stop.contains("last 10 sends, for 3 items") && stop.contains("connection refused"),
            "{stop}"
        );
        assert_eq!(
            w.unreached(0, "i1", "connection refused"),
            None,
            "only once"
        );
        assert!(w.open_because(0).is_some_and(|why| why == stop));
        w.close(0);
        assert_eq!(w.open_because(0), None);
        for i in 0..9 {
            assert_eq!(w.unreached(0, &format!("i{}", i % 3), "refused"), None);
        }
        assert!(w.unreached(0, "i0", "refused").is_some(), "opens again");
        // At concurrency 1, one item's retries are the streak.
        let one_item = ReachWatch::new(1);
        for _ in 0..9 {
            assert_eq!(one_item.unreached(0, "same", "refused"), None);
        }
        assert!(one_item.unreached(0, "same", "refused").is_some());
    }

    #[test]
    fn server_errors_from_several_items_open_it_and_an_answer_closes_it() {
        let w = ReachWatch::new(1);
        // One item's own 500s never open it, however many.
        for _ in 0..50 {
            assert_eq!(w.server_failed(0, "same", "500"), None);
        }
        w.answered(0);
        for i in 0..19 {
            assert_eq!(w.server_failed(0, &format!("i{}", i % 4), "500"), None);
        }
        // A refused connect in between breaks the streak.
        assert_eq!(w.unreached(0, "i0", "refused"), None);
        for i in 0..19 {
            assert_eq!(w.server_failed(0, &format!("i{}", i % 4), "500"), None);
        }
        let why = w
            .server_failed(0, "i0", "500 boom")
            .expect("twenty in a row");
        assert!(
            why.contains("last 20 answers, for 4 items") && why.contains("500 boom"),
            "{why}"
        );
        assert_eq!(w.opened(0).map(|(_, c, _)| c), Some(Cause::Failing));
        assert_eq!(w.server_failed(0, "i1", "500"), None, "only once");
        assert!(w.answered(0).is_some(), "an answer closes it");
        assert!(w.opened(0).is_none());
        assert_eq!(w.answered(0), None, "nothing to close");
        // An unreached breaker is closed by its probe, not by answers.
        for i in 0..10 {
            w.unreached(0, &format!("i{}", i % 3), "refused");
        }
        assert_eq!(w.answered(0), None);
        assert_eq!(w.opened(0).map(|(_, c, _)| c), Some(Cause::Unreached));
    }

    #[tokio::test]
    async fn half_open_lets_one_waiting_send_through() {
        let w = std::sync::Arc::new(ReachWatch::new(1));
        let stop = CancellationToken::new();
        for i in 0..20 {
            w.server_failed(0, &format!("i{}", i % 4), "500");
        }
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (w, stop) = (w.clone(), stop.clone());
                tokio::spawn(async move { w.wait_closed(0, &stop).await })
            })
            .collect();
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(waiters.iter().all(|t| !t.is_finished()), "held while open");
        w.allow_probe(0);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert_eq!(
            waiters.iter().filter(|t| t.is_finished()).count(),
            1,
            "one probe goes"
        );
        w.answered(0);
        for t in waiters {
            assert!(t.await.unwrap());
        }
    }

    #[tokio::test]
    async fn sends_wait_while_the_breaker_is_open() {
        let w = std::sync::Arc::new(ReachWatch::new(1));
        let stop = CancellationToken::new();
        assert!(w.wait_closed(0, &stop).await, "closed: no wait");
        for i in 0..10 {
            w.unreached(0, &format!("i{}", i % 3), "refused");
        }
        let waiter = {
            let (w, stop) = (w.clone(), stop.clone());
            tokio::spawn(async move { w.wait_closed(0, &stop).await })
        };
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "held while open");
        w.close(0);
        assert!(waiter.await.unwrap(), "goes once closed");
        w.unreached(0, "x", "refused");
        for i in 0..10 {
            w.unreached(0, &format!("i{}", i % 3), "refused");
        }
        stop.cancel();
        assert!(!w.wait_closed(0, &stop).await, "a stop ends the wait");
    }
}
