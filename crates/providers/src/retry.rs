//! Retry policy: exponential backoff from 1 s to 60 s with full jitter, and
//! the server's own word (`retry-after`, `retry-after-ms`) when it gives one.
//! Pure functions: the dispatcher does the sleeping.

use std::time::Duration;

use rand::Rng;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The ceiling for retry number `retry` (1 = first retry): base·2^(retry-1), capped.
    pub fn ceiling(&self, retry: u32) -> Duration {
        let exp = retry.saturating_sub(1).min(16);
        self.base.saturating_mul(1u32 << exp).min(self.max)
    }

    /// A delay for retry number `retry`: uniform in [ceiling/2, ceiling]
    /// ("equal jitter"), so retries spread out but never collapse to zero.
    pub fn delay(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let ceil = self.ceiling(retry);
        let half = ceil / 2;
        let jitter = rng.random_range(0..=half.as_millis().max(1) as u64);
        half + Duration::from_millis(jitter)
    }

    /// The delay to wait, honouring a server-supplied minimum: never shorter
    /// than the server asked, never longer than `max` unless the server asked.
    pub fn delay_with_hint(
        &self,
        retry: u32,
        server_hint: Option<Duration>,
        rng: &mut impl Rng,
    ) -> Duration {
        let ours = self.delay(retry, rng);
        match server_hint {
            // The server's word is a floor, with a little jitter on top so a
            // crowd of clients does not return in the same instant.
            Some(hint) => {
                let jitter = Duration::from_millis(
                    rng.random_range(0..=hint.as_millis().min(1000) as u64 / 10 + 1),
                );
                ours.max(hint + jitter)
            }
            None => ours,
        }
    }
}

/// Parse a Go-style duration as in OpenAI's `x-ratelimit-reset-*` headers:
/// `1s`, `6m0s`, `12ms`, `1m30.5s`, `1h2m`.
pub fn parse_go_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s.is_empty() {
        return None;
    }
    let mut total = 0f64;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return None;
        }
        let value: f64 = rest[..num_len].parse().ok()?;
        rest = &rest[num_len..];
        let (factor, unit_len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with("us") || rest.starts_with("µs") {
            (0.000_001, rest.chars().take(2).map(char::len_utf8).sum())
        } else if rest.starts_with("ns") {
            (0.000_000_001, 2)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else {
            return None;
        };
        total += value * factor;
        rest = &rest[unit_len..];
    }
    // A day caps nonsense such as "99999999999999999999s" (which would not
    // even fit a Duration) without failing the answer that carried it.
    (total.is_finite() && total >= 0.0).then(|| Duration::from_secs_f64(total.min(86_400.0)))
}

/// `retry-after`: seconds (possibly fractional), or an HTTP date (RFC 9110:
/// `Wed, 21 Oct 2015 07:28:00 GMT`), read as the time left until it (none
/// for a date past). Capped at an hour either way.
pub fn parse_retry_after(s: &str) -> Option<Duration> {
    parse_retry_after_at(s, chrono::Utc::now())
}

fn parse_retry_after_at(s: &str, now: chrono::DateTime<chrono::Utc>) -> Option<Duration> {
    let s = s.trim();
    let secs = match s.parse::<f64>() {
        Ok(v) => v,
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(s).ok()?;
            (at.with_timezone(&chrono::Utc) - now)
                .num_milliseconds()
                .max(0) as f64
                / 1000.0
        }
    };
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(3600.0)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn retry_after_as_seconds_or_as_an_http_date() {
        let now = chrono::DateTime::parse_from_rfc2822("Wed, 21 Oct 2015 07:28:00 GMT")
            .unwrap()
            .with_timezone(&chrono::Utc);
        let at = |s: &str| parse_retry_after_at(s, now);
        assert_eq!(at("3"), Some(Duration::from_secs(3)));
        assert_eq!(at(" 1.5 "), Some(Duration::from_millis(1500)));
        assert_eq!(
            at("Wed, 21 Oct 2015 07:28:42 GMT"),
            Some(Duration::from_secs(42)),
            "an HTTP date: the time left until it"
        );
        assert_eq!(
            at("Wed, 21 Oct 2015 07:27:00 GMT"),
            Some(Duration::ZERO),
            "a date past"
        );
        assert_eq!(
            at("Thu, 22 Oct 2015 07:28:00 GMT"),
            Some(Duration::from_secs(3600)),
            "capped"
        );
        assert_eq!(at("soon"), None);
        assert_eq!(at("-4"), None);
    }

    #[test]
    fn ceiling_doubles_from_one_second_to_sixty() {
        let b = Backoff::default();
        let secs: Vec<u64> = (1..=8).map(|r| b.ceiling(r).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(b.ceiling(1000), Duration::from_secs(60));
    }

    #[test]
    fn jittered_delays_stay_in_band_and_vary() {
        let b = Backoff::default();
        let mut rng = StdRng::seed_from_u64(7);
        let mut seen = std::collections::HashSet::new();
        for retry in 1..=10 {
            for _ in 0..50 {
                let d = b.delay(retry, &mut rng);
                let c = b.ceiling(retry);
                assert!(
                    d >= c / 2 && d <= c,
                    "retry {retry}: {d:?} not in [{:?}, {c:?}]",
                    c / 2
                );
                seen.insert(d.as_millis());
            }
        }
        assert!(seen.len() > 100, "jitter should vary the delays");
    }

    #[test]
    fn server_hint_is_a_floor() {
        let b = Backoff::default();
        let mut rng = StdRng::seed_from_u64(1);
        let d = b.delay_with_hint(1, Some(Duration::from_secs(7)), &mut rng);
        assert!(
            d >= Duration::from_secs(7) && d <= Duration::from_millis(7_101),
            "{d:?}"
        );
        // A hint shorter than our own backoff does not shorten it.
        let d = b.delay_with_hint(4, Some(Duration::from_millis(10)), &mut rng);
        assert!(d >= Duration::from_secs(4), "{d:?}");
    }

    #[test]
    fn go_durations() {
        assert_eq!(parse_go_duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(parse_go_duration("6m0s"), Some(Duration::from_secs(360)));
        assert_eq!(parse_go_duration("12ms"), Some(Duration::from_millis(12)));
        assert_eq!(
            parse_go_duration("1m30.5s"),
            Some(Duration::from_millis(90_500))
        );
        assert_eq!(parse_go_duration("1h2m"), Some(Duration::from_secs(3720)));
        assert_eq!(parse_go_duration("abc"), None);
        assert_eq!(parse_go_duration("5x"), None);
        assert_eq!(
            parse_go_duration("99999999999999999999s"),
            Some(Duration::from_secs(86_400))
        );
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after("0.25"), Some(Duration::from_millis(250)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015"), None);
    }
}
