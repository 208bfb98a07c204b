//! The limiter's tests, on tokio's paused clock: pacing, AIMD, holds.

use super::*;

fn settings(rpm: u64, tpm: u64, conc: usize) -> LimiterSettings {
    LimiterSettings {
        requests_per_minute: rpm,
        tokens_per_minute: tpm,
        max_concurrency: conc,
    }
}

#[tokio::test(start_paused = true)]
async fn requests_are_paced_not_burst() {
    // 600/min = 10/s; the bucket holds half a second (5).
    let l = Limiter::new(settings(600, 0, 100));
    let start = Instant::now();
    for _ in 0..65 {
        l.reserve(0).await;
    }
    let took = start.elapsed();
    // 5 at once, then 60 more at 10/s = 6 s.
    assert!(
        took >= Duration::from_millis(5_900) && took <= Duration::from_millis(6_100),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn tokens_are_reserved_and_credited_back() {
    // 6,000 tokens/min = 100/s; bucket holds 100.
    let l = Limiter::new(settings(0, 6_000, 10));
    let start = Instant::now();
    let r = l.reserve(100).await; // the full bucket
    assert_eq!(start.elapsed(), Duration::ZERO);
    // Only 20 of 100 were used: 80 come back as credit, so the next
    // 80-token send needs no wait at all.
    l.on_success(r, Some(20), &RateHeaders::default());
    l.reserve(80).await;
    assert!(
        start.elapsed() < Duration::from_millis(5),
        "{:?}",
        start.elapsed()
    );
    // Without credit, another 100 tokens take a second.
    l.reserve(100).await;
    assert!(
        start.elapsed() >= Duration::from_millis(990),
        "{:?}",
        start.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn sends_larger_than_the_bucket_are_paced_at_the_limit() {
    // 6,000 tokens/min = 100/s, bucket of 100; each send is 250 tokens.
    let l = Limiter::new(settings(0, 6_000, 10));
    let start = Instant::now();
    for _ in 0..9 {
        let r = l.reserve(250).await;
        l.on_success(r, Some(250), &RateHeaders::default());
    }
    // 2,250 tokens: the first 100 were in the bucket, 2,150 more at 100/s.
    // (The ninth send goes once its tokens are paid.)
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(21_400) && took <= Duration::from_millis(21_600),
        "{took:?}"
    );
    // Overspend is owed too: a send that used 600 of 100 reserved.
    let r = l.reserve(100).await;
    let t = Instant::now();
    l.on_success(r, Some(600), &RateHeaders::default());
    l.reserve(1).await;
    assert!(
        t.elapsed() >= Duration::from_millis(4_990),
        "{:?}",
        t.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn aimd_halves_on_throttle_once_per_second_and_grows_back() {
    let l = std::sync::Arc::new(Limiter::new(settings(0, 0, 32)));
    assert_eq!(l.snapshot().concurrency_limit, 32);
    l.on_throttled(&RateHeaders::default());
    l.on_throttled(&RateHeaders::default()); // same burst: no second cut
    assert_eq!(l.snapshot().concurrency_limit, 16);
    tokio::time::advance(Duration::from_millis(1_100)).await;
    l.on_throttled(&RateHeaders::default());
    assert_eq!(l.snapshot().concurrency_limit, 8);
    // Additive increase: about +1 per window of `limit` successes.
    for _ in 0..9 {
        l.on_success(
            Reservation {
                tokens: 0,
                sent_at: None,
            },
            None,
            &RateHeaders::default(),
        );
    }
    assert_eq!(l.snapshot().concurrency_limit, 9);
    for _ in 0..1_000 {
        l.on_success(
            Reservation {
                tokens: 0,
                sent_at: None,
            },
            None,
            &RateHeaders::default(),
        );
    }
    assert_eq!(
        l.snapshot().concurrency_limit,
        32,
        "never above the configured max"
    );
}

#[tokio::test(start_paused = true)]
async fn retry_after_holds_every_send() {
    let l = Limiter::new(settings(0, 0, 4));
    let start = Instant::now();
    l.on_throttled(&RateHeaders {
        retry_after: Some(Duration::from_secs(3)),
        ..Default::default()
    });
    assert_eq!(l.snapshot().slow_reason, SlowReason::Cooldown);
    l.reserve(0).await;
    assert!(start.elapsed() >= Duration::from_secs(3));
}

/// Row S1: what the operator reads during a hold is the time it has
/// left, counting down, in whole seconds rounded up.
#[tokio::test(start_paused = true)]
async fn a_hold_says_how_long_it_has_left() {
    let l = Limiter::new(settings(0, 0, 4));
    assert_eq!(l.snapshot().slow_reason.describe(), "");
    l.on_throttled(&RateHeaders {
        retry_after: Some(Duration::from_secs(12)),
        ..Default::default()
    });
    let slow = l.snapshot().slow_reason;
    assert_eq!(slow.wait, Some(Duration::from_secs(12)));
    assert_eq!(slow.describe(), "rate limited (waiting 12s)");
    tokio::time::advance(Duration::from_millis(4_500)).await;
    assert_eq!(
        l.snapshot().slow_reason.describe(),
        "rate limited (waiting 8s)"
    );
    tokio::time::advance(Duration::from_millis(7_400)).await;
    assert_eq!(
        l.snapshot().slow_reason.describe(),
        "rate limited (waiting 1s)"
    );
    // An exhausted remaining-requests header holds the same way.
    let l = Limiter::new(settings(0, 0, 4));
    l.on_other(&RateHeaders {
        remaining_requests: Some(0),
        reset_requests: Some(Duration::from_secs(5)),
        ..Default::default()
    });
    assert_eq!(
        l.snapshot().slow_reason.describe(),
        "rate limited (waiting 5s)"
    );
    // The other reasons keep their words.
    let other = Slowdown {
        reason: SlowReason::Requests,
        wait: None,
    };
    assert_eq!(other.describe(), "waiting for requests/min");
}

#[tokio::test(start_paused = true)]
async fn server_limits_lower_ours_and_exhausted_remaining_holds() {
    let l = Limiter::new(settings(12_000, 0, 4));
    l.on_success(
        Reservation {
            tokens: 0,
            sent_at: None,
        },
        None,
        &RateHeaders {
            limit_requests: Some(6_000),
            ..Default::default()
        },
    );
    assert_eq!(l.snapshot().requests_per_minute, 6_000);
    let start = Instant::now();
    l.on_other(&RateHeaders {
        remaining_requests: Some(0),
        reset_requests: Some(Duration::from_millis(750)),
        ..Default::default()
    });
    l.reserve(0).await;
    assert!(start.elapsed() >= Duration::from_millis(750));
}

#[tokio::test(start_paused = true)]
async fn slots_block_at_the_limit_and_free_on_drop() {
    let l = std::sync::Arc::new(Limiter::new(settings(0, 0, 2)));
    let a = l.acquire_slot().await;
    let _b = l.acquire_slot().await;
    assert_eq!(l.snapshot().in_flight, 2);
    let l2 = l.clone();
    let waiter = tokio::spawn(async move {
        let _c = l2.acquire_slot().await;
        Instant::now()
    });
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!waiter.is_finished());
    let freed_at = Instant::now();
    drop(a);
    let got = waiter.await.unwrap();
    assert!(got >= freed_at);
}

#[tokio::test(start_paused = true)]
async fn retune_changes_the_pace() {
    let l = Limiter::new(settings(60, 0, 4)); // 1/s
    l.reserve(0).await;
    l.retune(settings(6_000, 0, 4)); // 100/s
    let start = Instant::now();
    for _ in 0..51 {
        l.reserve(0).await;
    }
    // The rebuilt bucket starts empty: 51 sends at 100/s take about 0.51 s.
    assert!(
        start.elapsed() >= Duration::from_millis(490)
            && start.elapsed() <= Duration::from_millis(530),
        "{:?}",
        start.elapsed()
    );
}

/// The gauges' req/min and tok/min are the limiter's own count of the last
/// 60 seconds: sent flat out for three minutes (a burst at the start and
/// one after a retune up), no 60-second window ever holds more than the
/// limit, by the gauge or by the send times themselves, and the gauge
/// reaches the limit (the test would see a gauge stuck at 0).
#[tokio::test(start_paused = true)]
async fn req_min_and_tok_min_never_read_above_their_limits() {
    let l = Limiter::new(settings(1_200, 60_000, 100));
    let start = Instant::now();
    let mut sent: Vec<Instant> = Vec::new();
    let (mut top_rpm, mut top_tpm) = (0, 0);
    while start.elapsed() < Duration::from_secs(180) {
        let r = l.reserve(40).await;
        sent.push(Instant::now());
        // Half the tokens are used: the window counts what was used.
        l.on_success(r, Some(20), &RateHeaders::default());
        let snap = l.snapshot();
        assert!(
            snap.requests_last_minute <= snap.requests_per_minute,
            "{snap:?}"
        );
        assert!(
            snap.tokens_last_minute <= snap.tokens_per_minute,
            "{snap:?}"
        );
        top_rpm = top_rpm.max(snap.requests_last_minute);
        top_tpm = top_tpm.max(snap.tokens_last_minute);
        if sent.len() == 2_000 {
            // A retune rebuilds the buckets; the window still holds.
            l.retune(settings(1_500, 60_000, 100));
        }
    }
    // Every window of 60 s, by the send times.
    for (i, t) in sent.iter().enumerate() {
        let within = sent[i..]
            .iter()
            .take_while(|u| u.duration_since(*t) < Duration::from_secs(60))
            .count();
        assert!(
            within <= 1_500,
            "{within} sends in the minute from send {i}"
        );
        if i + within <= 2_000 {
            assert!(
                within <= 1_200,
                "{within} sends in the minute from send {i}"
            );
        }
    }
    assert!(top_rpm >= 1_490, "the gauge reached {top_rpm} of 1,500");
    assert!(top_tpm >= 20 * 1_490, "tok/min reached {top_tpm}");
}
