//! The half-open side of the reach breaker (`reach_watch`): while a stage's
//! breaker is open, the control loop asks its provider for the cheap
//! preflight request (the models list), 1 s after the opening and then
//! twice as long after each probe that reached nothing, up to 30 s. The
//! first probe that gets any HTTP answer closes the breaker and the run
//! goes on by itself; the session shows `paused` with the reason meanwhile.
//! A breaker opened for server errors is probed on the same schedule with
//! one real send instead (`ReachWatch::allow_probe`): the first answer that
//! is not a server error closes it. After `GIVE_UP` the run stops paused
//! (exit 4), as an operator's pause: `--resume` goes on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ctx::{Ctx, StopCause};
use super::reach_watch::Cause;
use docket_ledger::writer::WriteOp;
use docket_providers::ProviderError;

const FIRST_PROBE: Duration = Duration::from_secs(1);
const MAX_PROBE_GAP: Duration = Duration::from_secs(30);
/// How long a run waits for an unreachable (or failing) provider before it
/// lets go, unless `DOCKET_UNREACHABLE_GIVE_UP_SECS` says otherwise.
const GIVE_UP: Duration = Duration::from_secs(15 * 60);
pub(crate) const GIVE_UP_ENV: &str = "DOCKET_UNREACHABLE_GIVE_UP_SECS";

/// [`GIVE_UP`], or the seconds `DOCKET_UNREACHABLE_GIVE_UP_SECS` gives (at
/// least 1: tests, and operators who would rather be told sooner).
fn give_up() -> Duration {
    std::env::var(GIVE_UP_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 1.0)
        .map(|s| Duration::from_secs_f64(s.min(30.0 * 24.0 * 3600.0)))
        .unwrap_or(GIVE_UP)
}

/// "15 min", "90 s".
fn minutes_or_seconds(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 && secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{} s", d.as_secs_f64().round())
    }
}

type Probe = tokio::task::JoinHandle<Result<(), ProviderError>>;

#[derive(Default)]
struct Opened {
    /// The breaker opening this schedule is for.
    opening: Option<Instant>,
    since: Option<Instant>,
    gap: Duration,
    next: Option<Instant>,
    probe: Option<Probe>,
}

/// Per stage: when its breaker opened, and the probe schedule.
pub(super) struct ReachProbes {
    stages: Vec<Opened>,
    /// How long a breaker may stay open before the run stops paused.
    give_up: Duration,
}

impl ReachProbes {
    pub(super) fn new(stages: usize) -> ReachProbes {
        ReachProbes {
            stages: (0..stages).map(|_| Opened::default()).collect(),
            give_up: give_up(),
        }
    }

    /// One control-loop tick: announce new openings, start the probes that
    /// are due, close the breakers whose provider answered.
    pub(super) async fn tick(&mut self, ctx: &Arc<Ctx>, operator_paused: bool) {
        for (stage, o) in self.stages.iter_mut().enumerate() {
            let provider = ctx.p.stages[stage].provider_name.clone();
            let Some((why, cause, opening)) = ctx.reach_watch.opened(stage) else {
                // Closed by an answer (a server-error breaker's probe,
                // announced by `healed`).
                *o = Opened::default();
                continue;
            };
            if o.opening != Some(opening) {
                // A new opening (perhaps closed and opened again since the
                // last tick): its own announcement and schedule.
                *o = Opened {
                    opening: Some(opening),
                    ..Opened::default()
                };
            }
            let now = Instant::now();
            let Some(since) = o.since else {
                o.since = Some(opening);
                o.gap = FIRST_PROBE;
                o.next = Some(now + FIRST_PROBE);
                let reason = held_because(&provider, cause, &why);
                tracing::warn!(session = %ctx.session_id, "{reason}");
                set_state(ctx, "paused", Some(reason.clone()));
                ctx.event("warn", "unreachable", reason);
                continue;
            };
            if let Some(probe) = o.probe.take_if(|p| p.is_finished()) {
                if reached(probe).await {
                    ctx.reach_watch.close(stage);
                    *o = Opened::default();
                    resumed(ctx, &provider, since.elapsed(), operator_paused);
                    continue;
                }
                o.gap = (o.gap * 2).min(MAX_PROBE_GAP);
                o.next = Some(now + o.gap);
            }
            if since.elapsed() >= self.give_up {
                pause_given_up(ctx, &provider, cause, &why, self.give_up);
                continue;
            }
            if cause == Cause::Failing {
                // Half-open: one real send, on the probes' schedule.
                if o.next.is_some_and(|t| now >= t) && !ctx.soft_stop.is_cancelled() {
                    ctx.reach_watch.allow_probe(stage);
                    o.gap = (o.gap * 2).min(MAX_PROBE_GAP);
                    o.next = Some(now + o.gap);
                }
                continue;
            }
            if o.probe.is_none()
                && o.next.is_some_and(|t| now >= t)
                && !ctx.soft_stop.is_cancelled()
            {
                let client = ctx.rt(stage).provider.clone();
                o.probe = Some(tokio::spawn(
                    async move { client.preflight().await.map(drop) },
                ));
            }
        }
        ctx.stats.set_held(Self::held(ctx));
    }

    /// Why the sends are held, for the progress line: the first stage
    /// whose breaker is open (None once every breaker is closed).
    fn held(ctx: &Ctx) -> Option<String> {
        (0..ctx.p.stages.len()).find_map(|stage| {
            let (why, cause, _) = ctx.reach_watch.opened(stage)?;
            Some(held_because(
                &ctx.p.stages[stage].provider_name,
                cause,
                &why,
            ))
        })
    }

    /// What slows the run, while a breaker is open.
    pub(super) fn slow_reason(&self, ctx: &Ctx) -> Option<String> {
        self.stages.iter().enumerate().find_map(|(stage, o)| {
            o.since?;
            let state = match ctx.reach_watch.opened(stage)?.1 {
                Cause::Unreached => "unreachable",
                Cause::Failing => "failing",
            };
            Some(format!(
                "provider {} {state}: probing every {} s",
                ctx.p.stages[stage].provider_name,
                o.gap.as_secs()
            ))
        })
    }
}

/// Whether a finished probe reached the provider: any HTTP answer (even a
/// refused key: the sends will say so) means the provider is there.
async fn reached(probe: Probe) -> bool {
    matches!(
        probe.await,
        Ok(Ok(()))
            | Ok(Err(ProviderError {
                http_status: Some(_),
                ..
            }))
    )
}

/// The provider stayed unreachable (or failing) past `after`: the session
/// pauses, nothing more is sent and no item is failed for it.
fn pause_given_up(ctx: &Ctx, provider: &str, cause: Cause, why: &str, after: Duration) {
    let state = match cause {
        Cause::Unreached => "unreachable",
        Cause::Failing => "failing",
    };
    ctx.stop(StopCause::Paused(format!(
        "provider {provider} {state} for {}, given up: {why}. Nothing more is sent \
         and no item is failed for it; once the provider is back, resume the session: \
         docket batch-adjudicate --resume {}",
        minutes_or_seconds(after),
        ctx.session_id
    )));
}

/// Why a stage's sends are held while its breaker is open: the session's
/// stop reason, its event, and the headless run's line.
fn held_because(provider: &str, cause: Cause, why: &str) -> String {
    match cause {
        Cause::Unreached => format!(
            "provider {provider} unreachable: {why}. Nothing is sent and no item is failed for it; \
             probing it every few seconds, the run goes on by itself when it answers"
        ),
        Cause::Failing => format!(
            "provider {provider} failing: {why}. Nothing more is sent and no item is failed for it; \
             one request goes now and then as a probe, the run goes on by itself when it is answered"
        ),
    }
}

/// A breaker opened for server errors was closed by an answer (its probe,
/// or a send under way), `open_for` after it opened: said at once, from
/// the send that saw it.
pub(super) fn healed(ctx: &Ctx, stage: usize, open_for: Duration) {
    let provider = &ctx.p.stages[stage].provider_name;
    resumed(ctx, provider, open_for, *ctx.paused.borrow());
}

/// The breaker of `provider` closed: the session runs again (unless the
/// operator paused it meanwhile).
fn resumed(ctx: &Ctx, provider: &str, open_for: Duration, operator_paused: bool) {
    let message = format!(
        "provider {provider} answers again after {:.0} s: sending resumes",
        open_for.as_secs_f64()
    );
    // Still held by another breaker or by the disk: stays paused.
    if !operator_paused
        && !ctx.soft_stop.is_cancelled()
        && !ctx.reach_watch.any_open()
        && !ctx.disk_held()
    {
        set_state(ctx, "running", None);
    }
    ctx.event("info", "reachable", message);
}

pub(super) fn set_state(ctx: &Ctx, state: &'static str, reason: Option<String>) {
    ctx.writer.post(WriteOp::SessionState {
        session_id: ctx.session_id.clone(),
        state,
        stop_reason: reason,
        completed: false,
        released: false,
    });
}
