//! Fault injection and latency, drawn from one RNG seeded by `MockConfig::seed`.
//!
//! Contract: faults depend on the draw sequence, never on the prompt, so a
//! retried request can succeed. Each fault is drawn independently with its own
//! rate; when several hit, the first in pipeline order wins: 500, 503, hang, late
//! (decided before the latency sleep), then malformed, reset mid-body, truncated, wrong_schema,
//! refusal, empty (applied after it). Latency is log-normal with the configured median and p99
//! (sigma = (ln p99 - ln median) / 2.326); p99 <= median means a constant median.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::MockConfig;

/// Fault that replaces the answer before any latency is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EarlyFault {
    ServerError,
    Overloaded,
    Hang,
    /// Billed now, answered after `late_ms`.
    Late,
}

/// Fault that damages the answer after the latency sleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LateFault {
    Malformed,
    ResetMidBody,
    Truncated,
    WrongSchema,
    /// The model declines: no content, the wire's refusal marker.
    Refused,
    /// Empty content with a normal stop.
    Empty,
}

/// Everything random about one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Draw {
    pub early: Option<EarlyFault>,
    pub late: Option<LateFault>,
    pub latency: Duration,
}

/// The parts of a config this module needs, precomputed once per config change.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct FaultPlan {
    early: [(f64, EarlyFault); 3],
    late: [(f64, LateFault); 3],
    /// Faults added later, drawn after the latency: a config without them
    /// draws exactly the stream it drew before they existed (benchmarks
    /// and seeded tests keep their numbers).
    added: [Added; 4],
    latency: Latency,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Latency {
    None,
    Constant(Duration),
    LogNormal { mu: f64, sigma: f64 },
}

/// Longest latency ever slept: keeps a huge p99 or a far-tail draw from parking a request for hours.
const MAX_LATENCY: Duration = Duration::from_secs(600);

impl FaultPlan {
    pub(crate) fn from_config(c: &MockConfig) -> FaultPlan {
        let rate = |r: f64| {
            if r.is_finite() {
                r.clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        let latency = if !(c.latency_median_ms.is_finite() && c.latency_median_ms > 0.0) {
            Latency::None
        } else if !(c.latency_p99_ms.is_finite() && c.latency_p99_ms > c.latency_median_ms) {
            Latency::Constant(
                Duration::from_secs_f64(c.latency_median_ms / 1000.0).min(MAX_LATENCY),
            )
        } else {
            let mu = c.latency_median_ms.ln();
            Latency::LogNormal {
                mu,
                sigma: (c.latency_p99_ms.ln() - mu) / 2.326,
            }
        };
        FaultPlan {
            early: [
                (rate(c.fail_500), EarlyFault::ServerError),
                (rate(c.fail_503), EarlyFault::Overloaded),
                (rate(c.hang), EarlyFault::Hang),
            ],
            late: [
                (rate(c.malformed), LateFault::Malformed),
                (rate(c.truncated), LateFault::Truncated),
                (rate(c.wrong_schema), LateFault::WrongSchema),
            ],
            added: [
                Added::Early(rate(c.late), EarlyFault::Late),
                Added::Late(rate(c.reset_mid_body), LateFault::ResetMidBody),
                Added::Late(rate(c.refusal), LateFault::Refused),
                Added::Late(rate(c.empty), LateFault::Empty),
            ],
            latency,
        }
    }

    /// True when no request needs the RNG at all (lets the hot path skip the lock).
    pub(crate) fn is_quiet(&self) -> bool {
        self.early.iter().all(|(r, _)| *r == 0.0)
            && self.late.iter().all(|(r, _)| *r == 0.0)
            && self.added.iter().all(|a| a.rate() == 0.0)
            && self.latency == Latency::None
    }
}

/// A fault added after the first ones, with where it acts.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Added {
    Early(f64, EarlyFault),
    Late(f64, LateFault),
}

impl Added {
    fn rate(self) -> f64 {
        match self {
            Added::Early(r, _) | Added::Late(r, _) => r,
        }
    }
}

/// The seeded RNG behind all fault and latency draws.
#[derive(Debug)]
pub(crate) struct FaultRng {
    rng: StdRng,
}

impl FaultRng {
    pub(crate) fn new(seed: u64) -> FaultRng {
        FaultRng {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Draw every fault (each one independently, so the stream advances the same
    /// way whatever hits) and the latency for one request.
    pub(crate) fn draw(&mut self, plan: &FaultPlan) -> Draw {
        let mut early = None;
        for (rate, fault) in plan.early {
            let u: f64 = self.rng.random();
            if early.is_none() && u < rate {
                early = Some(fault);
            }
        }
        let mut late = None;
        for (rate, fault) in plan.late {
            let u: f64 = self.rng.random();
            if late.is_none() && u < rate {
                late = Some(fault);
            }
        }
        let latency = match plan.latency {
            Latency::None => Duration::ZERO,
            Latency::Constant(d) => d,
            Latency::LogNormal { mu, sigma } => {
                let ms = (mu + sigma * self.standard_normal()).exp();
                Duration::from_secs_f64((ms / 1000.0).clamp(0.0, MAX_LATENCY.as_secs_f64()))
            }
        };
        // Drawn only when set, and after everything else: the streams of
        // configs without them are the ones they always were.
        for added in plan.added {
            if added.rate() == 0.0 {
                continue;
            }
            let u: f64 = self.rng.random();
            match added {
                Added::Early(rate, fault) if early.is_none() && u < rate => early = Some(fault),
                Added::Late(rate, fault) if late.is_none() && u < rate => late = Some(fault),
                _ => {}
            }
        }
        Draw {
            early,
            late,
            latency,
        }
    }

    /// Box-Muller (rand_distr is not a dependency).
    fn standard_normal(&mut self) -> f64 {
        // 1 - u is in (0, 1], so ln never sees 0.
        let u1: f64 = 1.0 - self.rng.random::<f64>();
        let u2: f64 = self.rng.random();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(f: impl FnOnce(&mut MockConfig)) -> FaultPlan {
        let mut c = MockConfig::default();
        f(&mut c);
        FaultPlan::from_config(&c)
    }

    #[test]
    fn rates_one_and_zero_are_exact_and_ordered() {
        let plan = cfg(|c| {
            c.fail_503 = 1.0;
            c.hang = 1.0;
            c.truncated = 1.0;
        });
        let mut rng = FaultRng::new(1);
        for _ in 0..100 {
            let d = rng.draw(&plan);
            assert_eq!(d.early, Some(EarlyFault::Overloaded));
            assert_eq!(d.late, Some(LateFault::Truncated));
            assert_eq!(d.latency, Duration::ZERO);
        }
        assert!(cfg(|_| {}).is_quiet());
    }

    #[test]
    fn lognormal_hits_median_and_p99() {
        let plan = cfg(|c| {
            c.latency_median_ms = 100.0;
            c.latency_p99_ms = 400.0;
        });
        let mut rng = FaultRng::new(7);
        let mut ms: Vec<f64> = (0..20_000)
            .map(|_| rng.draw(&plan).latency.as_secs_f64() * 1000.0)
            .collect();
        ms.sort_by(f64::total_cmp);
        let median = ms[ms.len() / 2];
        let p99 = ms[ms.len() * 99 / 100];
        assert!((90.0..110.0).contains(&median), "median {median}");
        assert!((340.0..470.0).contains(&p99), "p99 {p99}");
    }

    #[test]
    fn same_seed_same_sequence() {
        let plan = cfg(|c| c.fail_500 = 0.5);
        let a: Vec<_> = {
            let mut r = FaultRng::new(9);
            (0..50).map(|_| r.draw(&plan).early).collect()
        };
        let mut r = FaultRng::new(9);
        let b: Vec<_> = (0..50).map(|_| r.draw(&plan).early).collect();
        assert_eq!(a, b);
        assert!(a.iter().any(Option::is_some) && a.iter().any(Option::is_none));
    }
}
