//! A provider that stops answering holds the run instead of failing every
//! item (fault-matrix row S5): when a stage's sends fail one after
//! another without reaching the provider (connection refused, DNS, TLS:
//! nothing was sent, so nothing is ambiguous), from several items and with
//! no answer in between, the stage's breaker opens. Its sends wait; the
//! control loop probes the provider (`reach_probe`) and closes the breaker
//! when it answers, and the run goes on by itself. Any answer from the
//! provider, even an error status, resets the streak.

use std::collections::HashSet;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::per_stage::PerStage;

/// Sends in a row that reached nothing. From any items: a connection
/// that could not be made (refused, DNS, TLS) says nothing about the item
/// it was for, and at concurrency 1 one item's retries are all there is.
const STREAK: usize = 10;

#[derive(Default)]
struct Streak {
    failures: usize,
    items: HashSet<String>,
    /// The breaker is open, for this reason.
    open: Option<String>,
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
    pub(super) fn open_because(&self, stage: usize) -> Option<String> {
        self.streak(stage)?.open.clone()
    }

    /// The provider of `stage` answered a probe: its sends go again, and
    /// the streak starts over.
    pub(super) fn close(&self, stage: usize) {
        if let Some(mut s) = self.streak(stage) {
            s.failures = 0;
            s.items.clear();
            s.open = None;
        }
        if let Some(tx) = self.open.get(stage) {
            tx.send_replace(false);
        }
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
            if !*rx.borrow_and_update() {
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

    /// The provider of `stage` answered (whatever it said).
    pub(super) fn answered(&self, stage: usize) {
        if let Some(mut s) = self.streak(stage) {
            s.failures = 0;
            s.items.clear();
        }
    }

    /// A send of `stage` for `item` did not reach the provider. Opens the
    /// breaker after `STREAK` such sends in a row (from any items), and
    /// returns why (once per opening).
    pub(super) fn unreached(&self, stage: usize, item: &str, error: &str) -> Option<String> {
        let mut s = self.streak(stage)?;
        if s.open.is_some() {
            return None;
        }
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
        s.open = Some(why.clone());
        drop(s);
        if let Some(tx) = self.open.get(stage) {
            tx.send_replace(true);
        }
        Some(why)
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
