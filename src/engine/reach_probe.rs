//! The half-open side of the reach breaker (`reach_watch`): while a stage's
//! breaker is open, the control loop asks its provider for the cheap
//! preflight request (the models list), 1 s after the opening and then
//! twice as long after each probe that reached nothing, up to 30 s. The
//! first probe that gets any HTTP answer closes the breaker and the run
//! goes on by itself; the session shows `paused` with the reason meanwhile.
//! After `GIVE_UP` the run stops paused (exit 4), as an operator's pause:
//! `--resume` goes on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::ctx::{Ctx, StopCause};
use crate::ledger::writer::WriteOp;
use crate::provider::ProviderError;

const FIRST_PROBE: Duration = Duration::from_secs(1);
const MAX_PROBE_GAP: Duration = Duration::from_secs(30);
/// How long a run waits for an unreachable provider before it lets go.
const GIVE_UP: Duration = Duration::from_secs(15 * 60);

type Probe = tokio::task::JoinHandle<Result<(), ProviderError>>;

#[derive(Default)]
struct Opened {
    since: Option<Instant>,
    gap: Duration,
    next: Option<Instant>,
    probe: Option<Probe>,
}

/// Per stage: when its breaker opened, and the probe schedule.
pub(super) struct ReachProbes {
    stages: Vec<Opened>,
}

impl ReachProbes {
    pub(super) fn new(stages: usize) -> ReachProbes {
        ReachProbes {
            stages: (0..stages).map(|_| Opened::default()).collect(),
        }
    }

    /// One control-loop tick: announce new openings, start the probes that
    /// are due, close the breakers whose provider answered.
    pub(super) async fn tick(&mut self, ctx: &Arc<Ctx>, operator_paused: bool) {
        for (stage, o) in self.stages.iter_mut().enumerate() {
            let Some(why) = ctx.reach_watch.open_because(stage) else {
                continue;
            };
            let provider = ctx.p.stages[stage].provider_name.clone();
            let now = Instant::now();
            let Some(since) = o.since else {
                o.since = Some(now);
                o.gap = FIRST_PROBE;
                o.next = Some(now + FIRST_PROBE);
                let reason = format!(
                    "provider {provider} unreachable: {why}. Nothing is sent and no item is failed for it; \
                     probing it every few seconds, the run goes on by itself when it answers"
                );
                tracing::warn!(session = %ctx.session_id, "{reason}");
                set_state(ctx, "paused", Some(reason.clone()));
                ctx.event("warn", "unreachable", reason);
                continue;
            };
            if let Some(probe) = o.probe.take_if(|p| p.is_finished()) {
                match probe.await {
                    // Any HTTP answer (even a refused key: the sends will
                    // say so) means the provider is there.
                    Ok(Ok(()))
                    | Ok(Err(ProviderError {
                        http_status: Some(_),
                        ..
                    })) => {
                        ctx.reach_watch.close(stage);
                        *o = Opened::default();
                        let message = format!(
                            "provider {provider} answers again after {:.0} s: sending resumes",
                            since.elapsed().as_secs_f64()
                        );
                        if !operator_paused && !ctx.soft_stop.is_cancelled() {
                            set_state(ctx, "running", None);
                        }
                        ctx.event("info", "reachable", message);
                        continue;
                    }
                    _ => {
                        o.gap = (o.gap * 2).min(MAX_PROBE_GAP);
                        o.next = Some(now + o.gap);
                    }
                }
            }
            if since.elapsed() >= GIVE_UP {
                ctx.stop(StopCause::Paused(format!(
                    "provider {provider} unreachable for {} min: {why}. Nothing more is sent and no item is failed for it; resume the session once the provider is back",
                    GIVE_UP.as_secs() / 60
                )));
                continue;
            }
            if o.probe.is_none()
                && o.next.is_some_and(|t| now >= t)
                && !ctx.soft_stop.is_cancelled()
            {
                let client = ctx.rt(stage).provider.clone();
                o.probe = Some(tokio::spawn(async move { client.preflight().await }));
            }
        }
    }

    /// What slows the run, while a breaker is open.
    pub(super) fn slow_reason(&self, ctx: &Ctx) -> Option<String> {
        self.stages.iter().enumerate().find_map(|(stage, o)| {
            o.since?;
            Some(format!(
                "provider {} unreachable: probing every {} s",
                ctx.p.stages[stage].provider_name,
                o.gap.as_secs()
            ))
        })
    }
}

fn set_state(ctx: &Ctx, state: &'static str, reason: Option<String>) {
    ctx.writer.post(WriteOp::SessionState {
        session_id: ctx.session_id.clone(),
        state,
        stop_reason: reason,
        completed: false,
        released: false,
    });
}
