//! Unit tests of the limits split between workers and of retunes.

use super::*;
use crate::ctx::share;
use docket_providers::limiter::{Limiter, LimiterSettings};

#[test]
fn workers_split_every_limit_and_stay_under_it_together() {
    let s = LimiterSettings {
        requests_per_minute: 1_000,
        tokens_per_minute: 0,
        max_concurrency: 16,
    };
    assert_eq!(share(s, 1), s);
    let two = share(s, 2);
    assert_eq!(
        (
            two.requests_per_minute,
            two.tokens_per_minute,
            two.max_concurrency
        ),
        (500, 0, 8),
        "0 stays unlimited"
    );
    let three = share(s, 3);
    assert!(three.requests_per_minute * 3 <= 1_000 && three.max_concurrency * 3 <= 16);
    let many = share(s, 40);
    assert_eq!(
        (many.requests_per_minute, many.max_concurrency),
        (25, 1),
        "never below one"
    );
}

fn settings(conc: usize) -> LimiterSettings {
    LimiterSettings {
        requests_per_minute: 0,
        tokens_per_minute: 0,
        max_concurrency: conc,
    }
}

#[tokio::test(start_paused = true)]
async fn raising_concurrency_after_a_lower_retune_lets_it_climb_again() {
    let l = Arc::new(Limiter::new(settings(8)));
    l.retune(settings(2));
    assert_eq!(l.snapshot().concurrency_limit, 2);
    let a = l.acquire_slot().await;
    let _b = l.acquire_slot().await;
    let l2 = l.clone();
    let third = tokio::spawn(async move { l2.acquire_slot().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!third.is_finished(), "held at the lowered limit");
    l.retune(settings(16));
    assert_eq!(l.snapshot().max_concurrency, 16);
    // Additive increase from where the lower retune left it.
    for _ in 0..3 {
        l.on_success(
            docket_providers::limiter::Reservation {
                tokens: 0,
                sent_at: None,
            },
            None,
            &Default::default(),
        );
    }
    assert!(l.snapshot().concurrency_limit >= 3);
    let _c = tokio::time::timeout(Duration::from_secs(1), third)
        .await
        .expect("a third slot once the limit grew")
        .unwrap();
    for _ in 0..500 {
        l.on_success(
            docket_providers::limiter::Reservation {
                tokens: 0,
                sent_at: None,
            },
            None,
            &Default::default(),
        );
    }
    assert_eq!(l.snapshot().concurrency_limit, 16, "climbs to the new max");
    drop(a);
}
