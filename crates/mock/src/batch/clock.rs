//! The running phase of a mock batch, compressed to `running`: which lines
//! are due at a moment, when the batch expires (with `expire`, the share of
//! its lines that get to run first), and which lines finish after a cancel.
//! Shared by the OpenAI/Azure, Anthropic and Gemini batch runners.

use std::time::Duration;

use tokio::time::Instant;

pub(crate) struct Schedule {
    n: usize,
    running: Duration,
    /// (lines run by then, when) once the window closes; None: never.
    expire_at: Option<(usize, Duration)>,
    /// How often the runner wakes to run the lines now due.
    pub(crate) tick: Duration,
    started: Instant,
}

/// What the runner should do now.
pub(crate) enum Due {
    /// Run lines up to this count (in input order).
    Run(usize),
    /// Run lines up to this count, then the batch expires.
    Expire(usize),
}

impl Schedule {
    /// `n` lines spread evenly over `running`, starting now; `expire` > 0
    /// ends the batch once that share of the lines ran.
    pub(crate) fn start(n: usize, running: Duration, expire: f64) -> Schedule {
        let expire_at = (expire > 0.0).then(|| {
            let k = (n as f64 * expire).floor() as usize;
            (k.min(n), running.mul_f64(expire.min(1.0)))
        });
        Schedule {
            n,
            running,
            expire_at,
            tick: (running / 20).clamp(Duration::from_millis(10), Duration::from_millis(250)),
            started: Instant::now(),
        }
    }

    fn due_at(&self, at: Duration) -> usize {
        if self.running.is_zero() {
            return self.n;
        }
        ((self.n as f64 * at.as_secs_f64() / self.running.as_secs_f64()).floor() as usize)
            .min(self.n)
    }

    pub(crate) fn now(&self) -> Due {
        let elapsed = self.started.elapsed();
        let due = self.due_at(elapsed);
        match self.expire_at {
            Some((k, when)) if elapsed >= when => Due::Expire(k),
            Some((k, _)) => Due::Run(due.min(k)),
            None => Due::Run(due),
        }
    }

    /// Every line ran and nothing is left to wait for.
    pub(crate) fn finished(&self, done: usize) -> bool {
        done == self.n && self.expire_at.is_none()
    }

    /// After a cancel the lines in flight finish: those due by the next
    /// tick, and at least one more.
    pub(crate) fn on_cancel(&self, done: usize) -> usize {
        self.due_at(self.started.elapsed() + self.tick)
            .max(done + 1)
            .min(self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn lines_come_due_evenly_and_expiry_caps_them() {
        let s = Schedule::start(100, Duration::from_secs(10), 0.0);
        assert!(matches!(s.now(), Due::Run(0)));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(s.now(), Due::Run(50)));
        // The tick is capped at 250 ms: the lines due by 5.25 s finish.
        assert_eq!(s.on_cancel(50), 52, "in flight: due by the next tick");
        tokio::time::advance(Duration::from_secs(6)).await;
        assert!(matches!(s.now(), Due::Run(100)));
        assert!(s.finished(100));

        let e = Schedule::start(100, Duration::from_secs(10), 0.3);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert!(matches!(e.now(), Due::Run(20)));
        assert!(!e.finished(100), "an expiring batch waits for its expiry");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(matches!(e.now(), Due::Expire(30)));

        let instant = Schedule::start(7, Duration::ZERO, 0.0);
        assert!(matches!(instant.now(), Due::Run(7)));
    }
}
