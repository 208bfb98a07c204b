//! An attempt without an answer: the limiter and the breakers told, then
//! the session stopped, the item failed, or the request sent again after
//! its backoff or its rate-limit wait.

use std::sync::atomic::Ordering::Relaxed;

use super::{Job, Next, StageEnd, Via};
use crate::ctx::{Ctx, StopCause};
use docket_ledger::writer::{AttemptRecord, WriteOp};
use docket_providers::{ErrorClass, ProviderError};

/// A request whose last this-many failures (at most its transport attempts)
/// were alike when its attempts run out failed deterministically (row S4):
/// named apart from a run of bad luck.
const DETERMINISTIC_STREAK: u32 = 3;

/// Sends of one item that reached nothing (they spend none of its transport
/// attempts; a provider that is gone opens the breaker long before this).
const MAX_UNREACHED_RETRIES: u32 = 30;

/// A refused request for the early watch: true when the stage's first
/// requests were all refused alike and the session pauses (row S3).
fn watch_refusals(ctx: &Ctx, job: &Job<'_>, err: &ProviderError) -> bool {
    let reason = match err.http_status {
        Some(status) => format!(
            "HTTP {status}: {}",
            docket_model::sanitize::truncate(&err.message, 160)
        ),
        None => err.message.clone(),
    };
    let Some(why) = ctx
        .refusal_watch
        .failed(job.stage.index, &job.item.item_id, &reason)
    else {
        return false;
    };
    ctx.stop(StopCause::Paused(format!(
        "stage {} (provider {}, model {}): {why}. Nothing more is sent and no item is failed for it. \
         If docket.toml is wrong (the model's name, a parameter), fix it and start the job again \
         (`docket cancel {}` first: none of its requests was answered); if the provider's side \
         (access to the model) is fixed instead, resume the session",
        job.stage.name, job.stage.provider_name, job.stage.model, ctx.session_id
    )));
    true
}

/// When a failed attempt goes again.
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Resend {
    AfterBackoff,
    /// A request cut at its deadline: the provider is answering others,
    /// this one was lost; waiting would only stretch the run.
    AtOnce,
}

/// No answer: throttle, stop the session, fail the item, or back off.
pub(super) async fn on_error(
    ctx: &Ctx,
    job: &mut Job<'_>,
    base: AttemptRecord,
    err: &ProviderError,
    resend: Resend,
) -> Next {
    // A batch line's error says nothing about the synchronous limits.
    if job.via == Via::Sync {
        match err.class {
            ErrorClass::RateLimited | ErrorClass::Overloaded => {
                job.rt(ctx).limiter.on_throttled(&err.headers)
            }
            _ => job.rt(ctx).limiter.on_other(&err.headers),
        }
    }
    let f = Failure::of(ctx, job, err);
    let rec = AttemptRecord {
        state: if f.ambiguous { "ambiguous" } else { "failed" },
        http_status: err.http_status,
        error_kind: Some(err.class.as_str().into()),
        error_message: Some(err.message.clone()),
        rate_limited: f.rate_limited,
        transport_failure: !f.rate_limited
            && !f.unreached
            && !f.held
            && !f.probation
            && f.retryable,
        ..base
    };
    tracing::debug!(
        request = job.request_id,
        attempt = job.attempt,
        "attempt failed: {err}"
    );
    tell_breakers(ctx, job, err, &f);
    if err.class.stops_session() {
        tracing::warn!(session = %ctx.session_id, "stopping: {err}");
        ctx.stop(StopCause::Fatal(fatal_message(
            err,
            &job.stage.provider_name,
        )));
        ctx.write(job.item, WriteOp::Attempt(rec)).await;
        return Next::Done(StageEnd::Stopped);
    }
    if f.probation && watch_refusals(ctx, job, err) {
        ctx.write(job.item, WriteOp::Attempt(rec)).await;
        return Next::Done(StageEnd::Stopped);
    }
    if !f.retryable {
        return Next::Done(StageEnd::Failed(err.to_string(), Some(rec)));
    }
    if f.rate_limited && job.rate_limited >= job.stage.max_rate_limit_retries {
        // Row S2: refused for rate limits every time, `max_rate_limit_retries`
        // in a row. "Not now" never fails an item: the request waits
        // `retry_wait_secs` (jittered, so waiting requests do not come back
        // together), then its rate-limit retries start over.
        return retry_wait(ctx, job, rec, err).await;
    }
    let (exhausted, retry_no, deterministic) = count_failure(job, err, &f);
    if exhausted {
        let msg = match deterministic {
            Some(n) => format!(
                "failed_deterministic: the same request failed the same way {n} times in a row: {err}"
            ),
            None => format!("gave up after {retry_no} failed attempts: {err}"),
        };
        return Next::Done(StageEnd::Failed(msg, Some(rec)));
    }
    retry_later(ctx, job, rec, err, retry_no, resend).await
}

/// The attempt on record as one to retry; then sent again at once (after
/// a cut) or after its backoff.
async fn retry_later(
    ctx: &Ctx,
    job: &mut Job<'_>,
    rec: AttemptRecord,
    err: &ProviderError,
    retry_no: u32,
    resend: Resend,
) -> Next {
    ctx.stats.retries.fetch_add(1, Relaxed);
    if !ctx
        .write(
            job.item,
            WriteOp::Attempt(AttemptRecord {
                will_retry: true,
                ..rec
            }),
        )
        .await
    {
        return Next::Done(StageEnd::Stopped);
    }
    if resend == Resend::AtOnce {
        return Next::Retry;
    }
    let delay = ctx
        .backoff
        .delay_with_hint(retry_no, err.headers.retry_after, &mut rand::rng());
    Next::RetryAfter(delay)
}

/// What kind of failure an error is, for the item and for the stage.
struct Failure {
    rate_limited: bool,
    ambiguous: bool,
    /// Nothing reached the provider.
    unreached: bool,
    /// A server error of a synchronous send.
    server_error: bool,
    /// A server error while the stage's breaker is open for them.
    held: bool,
    /// Refused before the provider ever answered the stage.
    probation: bool,
    retryable: bool,
}

impl Failure {
    /// Classify `err`, counting rate limits and ambiguous sends.
    fn of(ctx: &Ctx, job: &Job<'_>, err: &ProviderError) -> Failure {
        let is_rl = err.class == ErrorClass::RateLimited;
        let ambiguous = err.class == ErrorClass::Ambiguous;
        if is_rl {
            ctx.stats.rate_limited.fetch_add(1, Relaxed);
        }
        if ambiguous {
            ctx.stats.ambiguous.fetch_add(1, Relaxed);
        }
        // Nothing reached the provider (no status came back, and the request
        // is not ambiguous): not one of the item's transport attempts, and a
        // streak of these opens the stage's breaker, which holds its sends
        // until a probe gets an answer (row S5).
        let unreached =
            err.class == ErrorClass::Transient && err.http_status.is_none() && job.via == Via::Sync;
        // A server error while the stage's breaker is open for server errors
        // (this send was its half-open probe, or was under way when it opened):
        // the outage's, not the item's (row S4).
        let server_error = job.via == Via::Sync
            && err.http_status.is_some_and(|s| s >= 500)
            && matches!(err.class, ErrorClass::Transient | ErrorClass::Overloaded);
        let held = server_error
            && ctx
                .reach_watch
                .opened(job.stage.index)
                .is_some_and(|(_, cause, _)| cause == crate::reach_watch::Cause::Failing);
        // A request the provider refused before it ever answered this stage:
        // the job may be at fault (a model it does not know), not the item.
        // Retried like a transport failure while the refusal watch decides.
        let probation = err.class == ErrorClass::Request
            && err.http_status.is_some()
            && job.via == Via::Sync
            && ctx.refusal_watch.undecided(job.stage.index);
        Failure {
            rate_limited: is_rl,
            ambiguous,
            unreached,
            server_error,
            held,
            probation,
            retryable: err.class.is_retryable() || probation,
        }
    }
}

/// The stage's breakers hear of the failure: a send that reached nothing
/// or a server error counts toward opening one; any other answer from the
/// provider closes an open one.
fn tell_breakers(ctx: &Ctx, job: &Job<'_>, err: &ProviderError, f: &Failure) {
    if f.unreached {
        if let Some(why) =
            ctx.reach_watch
                .unreached(job.stage.index, &job.item.item_id, &err.message)
        {
            tracing::warn!(stage = %job.stage.name, "breaker open: {why}");
        }
    } else if f.server_error {
        if let Some(why) =
            ctx.reach_watch
                .server_failed(job.stage.index, &job.item.item_id, &err.message)
        {
            tracing::warn!(stage = %job.stage.name, "breaker open: {why}");
        }
    } else if err.http_status.is_some()
        && let Some(open_for) = ctx.reach_watch.answered(job.stage.index)
    {
        crate::reach_probe::healed(ctx, job.stage.index, open_for);
    }
}

/// Count the failure against the request's retries of its kind: whether
/// they are used up, which retry this is, and, when the request's last
/// failures were all this one (row S4), how many in a row
/// (`deterministic`, named apart from a run of bad luck when it gives up).
fn count_failure(job: &mut Job<'_>, err: &ProviderError, f: &Failure) -> (bool, u32, Option<u32>) {
    if f.rate_limited {
        job.rate_limited += 1;
        // Something else came between: not "in a row".
        job.streak = None;
        (false, job.rate_limited, None)
    } else if f.unreached || f.held || f.probation {
        // Nothing was sent, the provider is down for everyone, or it has
        // refused this stage's every request so far: not one of the
        // item's transport attempts. A breaker or the refusal watch stops
        // the sends long before this cap.
        job.unreached += 1;
        job.streak = None;
        (job.unreached > MAX_UNREACHED_RETRIES, job.unreached, None)
    } else {
        job.transport_failures += 1;
        let how = (err.class, err.http_status);
        let n = match job.streak {
            Some((last, n)) if last == how => n + 1,
            _ => 1,
        };
        job.streak = Some((how, n));
        // Two alike at least: one failure says nothing of the next.
        let alike = DETERMINISTIC_STREAK
            .min(job.stage.max_transport_attempts)
            .max(2);
        (
            job.transport_failures >= job.stage.max_transport_attempts,
            job.transport_failures,
            (n >= alike).then_some(n),
        )
    }
}

/// Send a request whose rate-limit retries ran out to `retry_wait` (see
/// `retry_wait`): its attempt recorded, to go again after the wait.
async fn retry_wait(ctx: &Ctx, job: &mut Job<'_>, rec: AttemptRecord, err: &ProviderError) -> Next {
    let refused = job.rate_limited + 1;
    job.rate_limited = 0;
    job.streak = None;
    let wait = ctx
        .retry_waits
        .enter(ctx, job.stage.retry_wait, refused, &err.message);
    ctx.stats.retries.fetch_add(1, Relaxed);
    let recorded = ctx
        .write(
            job.item,
            WriteOp::Attempt(AttemptRecord {
                will_retry: true,
                ..rec
            }),
        )
        .await;
    if recorded {
        Next::RetryWait(wait)
    } else {
        Next::Done(StageEnd::Stopped)
    }
}

fn fatal_message(err: &ProviderError, provider: &str) -> String {
    match err.class {
        ErrorClass::Auth => format!(
            "the provider rejected the credentials ({err}). Check the key named by providers.{provider}.api_key_env, then resume."
        ),
        _ => format!(
            "the provider says the quota or billing is exhausted ({err}). Add credit or raise the limit, then resume."
        ),
    }
}
