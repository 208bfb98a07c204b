//! A provider that stops answering pauses the run instead of failing every
//! item (fault-matrix row S5): when a stage's sends fail one after another
//! without reaching the provider (connection refused, DNS, TLS: nothing
//! was sent, so nothing is ambiguous), from several items and with no
//! answer in between, the session pauses with the reason and nothing more
//! is sent. Any answer from the provider, even an error status, resets the
//! streak. Resume once the provider is back.

use std::collections::HashSet;

use super::per_stage::PerStage;

/// Sends in a row that reached nothing.
const STREAK: usize = 10;
/// From at least this many items: one item's retries alone are not a
/// provider that is gone.
const ITEMS: usize = 3;

#[derive(Default)]
struct Streak {
    failures: usize,
    items: HashSet<String>,
    /// The run was stopped for this stage already.
    done: bool,
}

/// One streak per stage, in job order.
pub(super) struct ReachWatch {
    stages: PerStage<Streak>,
}

impl ReachWatch {
    pub(super) fn new(stages: usize) -> ReachWatch {
        ReachWatch {
            stages: PerStage::new(stages),
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

    /// A send of `stage` for `item` did not reach the provider. The reason
    /// to stop the run, once: `STREAK` such sends in a row, from `ITEMS`
    /// items or more.
    pub(super) fn unreached(&self, stage: usize, item: &str, error: &str) -> Option<String> {
        let mut s = self.streak(stage)?;
        if s.done {
            return None;
        }
        s.failures += 1;
        s.items.insert(item.to_string());
        if s.failures < STREAK || s.items.len() < ITEMS {
            return None;
        }
        s.done = true;
        Some(format!(
            "its last {} sends, for {} items, did not reach the provider (the last: {error})",
            s.failures,
            s.items.len()
        ))
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
        let one_item = ReachWatch::new(1);
        for _ in 0..30 {
            assert_eq!(one_item.unreached(0, "same", "refused"), None);
        }
    }
}
