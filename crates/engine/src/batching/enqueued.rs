//! The enqueued-token budget (row B3): a provider caps the prompt tokens
//! waiting in a model's open batches (OpenAI's and Azure's "enqueued
//! tokens", Anthropic's processing queue, Gemini's batch quota), and a
//! batch that would pass the cap is refused at create (`token_limit_exceeded`,
//! a 429) or failed at validation. The planner keeps, per provider and
//! model, an estimate of the tokens its open batches hold, and a batch
//! waits before its create until it fits: under `max_enqueued_tokens` when
//! configured, and under what the provider's refusals taught (the tokens
//! open when it refused, plus the refused batch's, less one).
//!
//! A batch is always let through when none of the model's batches is open
//! (else a batch larger than the cap would wait for ever: the provider
//! then says no, and its lines fail on their own budgets); and after a
//! refusal nothing is let through for a delay that doubles with each
//! refusal in a row (the poll interval at first, at most ten minutes), so
//! a provider whose queue is full of other clients' batches is never
//! asked in a loop. Waiting is on a `Notify` woken when a batch ends or is
//! refused, with a timer for the delay: no polling.
//!
//! The books are the process's (one worker): two workers on one key each
//! keep their own and learn from their own refusals.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

/// The longest wait after refusals in a row.
const MAX_DELAY: Duration = Duration::from_secs(600);

/// A provider (its name in docket.toml) and model.
pub(super) type Key = (String, String);

#[derive(Debug, Default)]
struct Book {
    /// Estimated prompt tokens of the batches submitted and not yet ended.
    open_tokens: u64,
    /// Batches submitted (or re-attached) and not yet ended.
    open_batches: u64,
    /// The cap the provider's refusals taught.
    learned: Option<u64>,
    /// Refusals since the last batch the provider took.
    refusals_in_a_row: u32,
    /// Nothing new goes before this (after a refusal).
    not_before: Option<Instant>,
}

impl Book {
    fn cap(&self, configured: Option<u64>) -> Option<u64> {
        match (self.learned, configured) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a batch of `tokens` may go now; else how long at most
    /// before it is worth looking again (None: until something changes).
    fn admit(
        &self,
        tokens: u64,
        configured: Option<u64>,
        now: Instant,
    ) -> Result<(), Option<Instant>> {
        if let Some(t) = self.not_before.filter(|t| *t > now) {
            return Err(Some(t));
        }
        let fits = self
            .cap(configured)
            .is_none_or(|cap| self.open_tokens.saturating_add(tokens) <= cap);
        if fits || self.open_batches == 0 {
            Ok(())
        } else {
            Err(None)
        }
    }
}

/// Every key's book, and a wake-up for the batches waiting on one.
#[derive(Default)]
pub(super) struct Enqueued {
    books: Mutex<HashMap<Key, Book>>,
    changed: Notify,
}

/// The process's books: every stage batching for one provider and model
/// shares its budget.
pub(super) fn books() -> Arc<Enqueued> {
    static BOOKS: LazyLock<Arc<Enqueued>> = LazyLock::new(Arc::default);
    BOOKS.clone()
}

impl Enqueued {
    fn with<T>(&self, key: &Key, f: impl FnOnce(&mut Book) -> T) -> T {
        let mut books = self.books.lock().unwrap_or_else(|p| p.into_inner());
        f(books.entry(key.clone()).or_default())
    }

    /// Wait until a batch of `tokens` fits `key`'s budget (`configured`,
    /// and what refusals taught), and count it open from then on (two
    /// batches let through at once cannot both take the last room): the
    /// guard holds its place until dropped. `on_wait` is called once if it
    /// has to wait, with the tokens open and the cap. Cancel-safe: nothing
    /// is held while waiting.
    pub(super) async fn room(
        self: &Arc<Self>,
        key: &Key,
        tokens: u64,
        configured: Option<u64>,
        mut on_wait: impl FnMut(u64, Option<u64>),
    ) -> Opened {
        let mut waited = false;
        loop {
            // Registered before the look, so a change between the two is
            // not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let verdict = self.with(key, |b| match b.admit(tokens, configured, now) {
                Ok(()) => {
                    b.open_tokens = b.open_tokens.saturating_add(tokens);
                    b.open_batches += 1;
                    Ok(())
                }
                Err(until) => Err((until, b.open_tokens, b.cap(configured))),
            });
            match verdict {
                Ok(()) => {
                    return Opened {
                        books: self.clone(),
                        key: key.clone(),
                        tokens,
                    };
                }
                Err((until, open, cap)) => {
                    if !waited {
                        on_wait(open, cap);
                    }
                    waited = true;
                    match until {
                        Some(t) => {
                            tokio::select! {
                                _ = tokio::time::sleep_until(t) => {}
                                _ = changed => {}
                            }
                        }
                        None => changed.await,
                    }
                }
            }
        }
    }

    /// A batch of `tokens` is at the provider, re-attached: counted until
    /// the guard is dropped (the batch ended, or the run let go of it).
    pub(super) fn open(self: &Arc<Self>, key: &Key, tokens: u64) -> Opened {
        self.with(key, |b| {
            b.open_tokens = b.open_tokens.saturating_add(tokens);
            b.open_batches += 1;
        });
        Opened {
            books: self.clone(),
            key: key.clone(),
            tokens,
        }
    }

    /// A batch `opened` with `tokens` ended (its tokens leave the queue).
    fn ended(&self, key: &Key, tokens: u64) {
        self.with(key, |b| {
            b.open_tokens = b.open_tokens.saturating_sub(tokens);
            b.open_batches = b.open_batches.saturating_sub(1);
        });
        self.changed.notify_waiters();
    }

    /// The provider refused a batch of `tokens` for the enqueued-token
    /// limit (`counted`: the batch is counted open). Learns the cap and
    /// holds new batches for a delay growing from `base`; the delay, for
    /// the refused batch's lines to wait before they go again.
    pub(super) fn refused(
        &self,
        key: &Key,
        tokens: u64,
        counted: bool,
        base: Duration,
    ) -> Duration {
        let delay = self.with(key, |b| {
            let others = if counted {
                b.open_tokens.saturating_sub(tokens)
            } else {
                b.open_tokens
            };
            let cap = others.saturating_add(tokens).saturating_sub(1);
            b.learned = Some(b.learned.map_or(cap, |l| l.min(cap)));
            b.refusals_in_a_row = b.refusals_in_a_row.saturating_add(1);
            let delay = base
                .max(Duration::from_secs(1))
                .saturating_mul(1 << (b.refusals_in_a_row - 1).min(10))
                .min(MAX_DELAY);
            b.not_before = Some(Instant::now() + delay);
            delay
        });
        self.changed.notify_waiters();
        delay
    }
}

/// A batch counted in its key's book while it is open at the provider.
pub(super) struct Opened {
    books: Arc<Enqueued>,
    key: Key,
    tokens: u64,
}

impl Opened {
    /// The provider made the batch: refusals in a row are over.
    pub(super) fn made(&self) {
        self.books.with(&self.key, |b| b.refusals_in_a_row = 0);
    }

    /// The provider refused the batch (at create) or failed it (at
    /// validation) for the enqueued-token limit: learn from it; the delay
    /// its lines wait. Dropped, the batch counts no more.
    pub(super) fn refused(self, base: Duration) -> Duration {
        self.books.refused(&self.key, self.tokens, true, base)
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        self.books.ended(&self.key, self.tokens);
    }
}

pub(super) use docket_providers::batch::is_token_limit;

/// A request's prompt tokens as estimated for the budget: four characters
/// a token, and a few for each message's framing.
pub(super) fn estimate(system: Option<&str>, user: &str) -> u64 {
    let msg = |t: &str| 4 + (t.chars().count() as u64).div_ceil(4);
    3 + system.map_or(0, msg) + msg(user)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        ("p".into(), "m".into())
    }

    #[test]
    fn a_refusal_teaches_the_cap_and_holds_for_a_growing_delay() {
        let now = Instant::now();
        let mut b = Book::default();
        assert!(b.admit(1_000, None, now).is_ok(), "nothing known: it goes");
        b.open_tokens = 600;
        b.open_batches = 2;
        assert!(
            b.admit(500, Some(1_000), now).is_err(),
            "over the configured cap"
        );
        assert!(b.admit(400, Some(1_000), now).is_ok());
        b.open_batches = 0;
        b.open_tokens = 0;
        assert!(
            b.admit(5_000, Some(1_000), now).is_ok(),
            "alone, it is tried"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_waits_for_an_open_one_to_end_after_a_refusal() {
        let e = Arc::new(Enqueued::default());
        let k = key();
        let first = e.room(&k, 300, None, |_, _| panic!("room")).await;
        let second = e.room(&k, 300, None, |_, _| panic!("room")).await;
        // A third of 300 refused: the cap is 899 and nothing goes for 1 s.
        let third = e.room(&k, 300, None, |_, _| panic!("room")).await;
        let d = third.refused(Duration::from_millis(100));
        assert_eq!(d, Duration::from_secs(1));
        let waiter = {
            let (e, k) = (e.clone(), k.clone());
            tokio::spawn(async move { e.room(&k, 300, None, |_, _| {}).await })
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!waiter.is_finished(), "600 open + 300 passes 899");
        drop(first);
        let fourth = waiter.await.unwrap();
        assert_eq!(e.with(&k, |b| (b.open_tokens, b.open_batches)), (600, 2));
        // A second refusal in a row doubles the hold.
        let d = second.refused(Duration::from_millis(100));
        assert_eq!(d, Duration::from_secs(2));
        drop(fourth);
        assert_eq!(e.with(&k, |b| (b.open_tokens, b.open_batches)), (0, 0));
    }

    #[test]
    fn token_limits_are_told_apart_from_other_refusals() {
        assert!(is_token_limit(
            "the batch failed at the provider: Enqueued token limit reached [token_limit_exceeded]"
        ));
        assert!(is_token_limit(
            "Number of queued batch tokens would exceed your rate limit"
        ));
        assert!(is_token_limit(
            "Quota exceeded for metric: generativelanguage.googleapis.com/batch_enqueued_tokens"
        ));
        assert!(!is_token_limit(
            "Rate limit reached for requests per minute"
        ));
        assert_eq!(estimate(None, "abcd"), 3 + 4 + 1);
        assert_eq!(estimate(Some("abcde"), "abcd"), 3 + 6 + 5);
    }
}
