//! The sends of the last minute, as the limiter let them go: the ceiling
//! that keeps any 60-second window at or under the per-minute limits (the
//! buckets alone allow a minute's pace plus their burst), and the count the
//! gauges read, so `req/min` and `tok/min` never read above their limits
//! because of how they are measured.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// How far back the window reaches.
pub(super) const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
pub(super) struct SentWindow {
    /// (when it was let go, tokens it counts for), oldest first.
    sends: VecDeque<(Instant, u64)>,
    /// The tokens of `sends`, summed.
    tokens: u64,
}

impl SentWindow {
    /// Forget the sends older than a minute.
    pub(super) fn prune(&mut self, now: Instant) {
        while let Some(&(at, tokens)) = self.sends.front() {
            if now.duration_since(at) < WINDOW {
                break;
            }
            self.sends.pop_front();
            self.tokens = self.tokens.saturating_sub(tokens);
        }
    }

    /// Sends let go over the last minute (after `prune`).
    pub(super) fn requests(&self) -> u64 {
        self.sends.len() as u64
    }

    /// Their tokens, as reserved and then corrected by the usage reported.
    pub(super) fn tokens(&self) -> u64 {
        self.tokens
    }

    /// How long until a send of `tokens` fits both limits (0 = no limit);
    /// None when it fits now. A send larger than a whole minute's tokens
    /// goes alone once the window is empty, rather than never.
    pub(super) fn wait_for(
        &self,
        now: Instant,
        rpm: u64,
        tpm: u64,
        tokens: u64,
    ) -> Option<Duration> {
        let until_expired = |i: usize| {
            let at = self.sends[i].0;
            (at + WINDOW).saturating_duration_since(now)
        };
        let n = self.sends.len();
        if rpm > 0 && n as u64 >= rpm {
            // Once the sends up to this one leave, one fewer than the limit
            // remain.
            let i = n - usize::try_from(rpm).unwrap_or(n);
            return Some(until_expired(i));
        }
        if tpm > 0 && n > 0 && self.tokens.saturating_add(tokens) > tpm {
            let mut left = self.tokens;
            for (i, &(_, t)) in self.sends.iter().enumerate() {
                left = left.saturating_sub(t);
                if left.saturating_add(tokens) <= tpm {
                    return Some(until_expired(i));
                }
            }
            return Some(until_expired(n - 1));
        }
        None
    }

    /// A send let go now, counting for `tokens`.
    pub(super) fn admit(&mut self, now: Instant, tokens: u64) {
        self.sends.push_back((now, tokens));
        self.tokens = self.tokens.saturating_add(tokens);
    }

    /// The send let go at `at` for `reserved` tokens used `used`: it counts
    /// for what it used, while it is still in the window.
    pub(super) fn correct(&mut self, at: Instant, reserved: u64, used: u64) {
        let from = self.sends.partition_point(|&(t, _)| t < at);
        let found = self
            .sends
            .iter_mut()
            .skip(from)
            .take_while(|(t, _)| *t == at)
            .find(|(_, t)| *t == reserved);
        if let Some(entry) = found {
            entry.1 = used;
            self.tokens = self.tokens.saturating_sub(reserved).saturating_add(used);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_full_window_waits_for_its_oldest_send() {
        let t0 = Instant::now();
        let mut w = SentWindow::default();
        for i in 0..3u64 {
            assert_eq!(w.wait_for(t0 + Duration::from_secs(i), 3, 0, 10), None);
            w.admit(t0 + Duration::from_secs(i), 10);
        }
        let now = t0 + Duration::from_secs(5);
        assert_eq!(w.wait_for(now, 3, 0, 10), Some(Duration::from_secs(55)));
        // Tokens: 30 in the window, 25 allowed: the first two must leave.
        assert_eq!(w.wait_for(now, 0, 25, 10), Some(Duration::from_secs(56)));
        // A correction to what was used frees room at once.
        w.correct(t0, 10, 1);
        assert_eq!((w.requests(), w.tokens()), (3, 21));
        w.prune(t0 + Duration::from_secs(60));
        assert_eq!((w.requests(), w.tokens()), (2, 20));
        // Larger than a minute's tokens: waits for an empty window, then goes.
        assert!(w.wait_for(now, 0, 5, 100).is_some());
        w.prune(t0 + Duration::from_secs(70));
        assert_eq!(w.wait_for(t0 + Duration::from_secs(70), 0, 5, 100), None);
    }
}
