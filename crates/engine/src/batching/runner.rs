//! One provider batch from its record to its last result: record, submit
//! (finding the batch again when the create answer is lost), poll on the
//! provider's cadence, cancel when asked, stream the results to the waiting
//! workers, and mark the batch finished with once every line has its outcome.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rand::Rng;

use super::lines::LedgerLines;
use super::{Adoption, Batcher, Delivered, Reply};
use docket_ledger::batches::{BatchOp, LineId, OpenBatch};
use docket_ledger::work::BatchLedger;
use docket_ledger::writer::WriteOp;
use docket_ledger::{Ledger, LedgerError, now_ts};
use docket_providers::batch::{BatchState, BatchStatus, Found, LineSource, SubmitSpec, Submitted};
use docket_providers::{ErrorClass, ProviderError};

/// Submissions tried before a batch's requests are failed back to their
/// items (which retry them within their own budgets).
const MAX_SUBMITS: u32 = 5;
/// Results fetches tried (a cut stream, a file not there yet) before the
/// operator is told; fetching goes on, slower, until the run stops.
const RESULTS_TRIES_BEFORE_EVENT: u32 = 5;
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Results fetches after which the lines are held for the operator (the
/// results may be gone at the provider): about an hour of tries.
const RESULTS_TRIES_MAX: u32 = 70;
/// Results handed to their items at once: what the engine holds of a
/// batch's results besides the replies read and not yet applied.
pub(super) const DELIVER_CHUNK: usize = 512;

/// A batch being driven: submitted. Its lines are in the ledger, not here.
struct Tracked {
    tag: String,
    provider_batch_id: String,
    /// The uploaded input file, when known (deleted once the batch is done
    /// with; looked up at the provider when None).
    input_file_id: Option<String>,
    /// Unix seconds of the record (its age drives the poll cadence).
    created_at: f64,
    /// This batch alone is to be cancelled (asked before a stop).
    cancel_wanted: bool,
    cancel_sent: bool,
    /// What the budget holds for its lines until their results are applied.
    held: Held,
    /// Counted in the enqueued-token budget while open at the provider.
    open: Option<super::enqueued::Opened>,
    /// The provider failed it for the enqueued-token limit: its lines wait
    /// this long before they go again.
    hold: Option<Duration>,
    /// Unix seconds it has been at the provider since (its submission).
    since: f64,
    /// Its state at the last poll that answered.
    state: String,
    /// Said to be stalled (row B8) already.
    stall_told: bool,
}

/// The budget a batch's lines hold, given back as their results are
/// applied (each result then counts what it cost) and, for the rest, when
/// the batch is done with.
pub(super) struct Held {
    per_line: f64,
    lines: usize,
    budget: Arc<crate::budget::Budget>,
}

impl Held {
    /// `reserved` held for `lines` lines.
    pub(super) fn new(b: &Batcher, reserved: f64, lines: usize) -> Held {
        Held {
            per_line: reserved / lines.max(1) as f64,
            lines,
            budget: b.budget.clone(),
        }
    }

    fn none(b: &Batcher) -> Held {
        Held {
            per_line: 0.0,
            lines: 0,
            budget: b.budget.clone(),
        }
    }

    pub(super) fn give_back(&mut self, lines: usize) {
        let n = lines.min(self.lines);
        self.lines -= n;
        if self.per_line > 0.0 && n > 0 {
            self.budget.settle(self.per_line * n as f64, 0.0);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.give_back(self.lines);
    }
}

/// A batch the former cut: every line recorded, nothing uploaded yet.
pub(super) struct Formed {
    pub tag: String,
    pub created_at: f64,
    pub lines: usize,
    /// Estimated prompt tokens (the enqueued-token budget).
    pub tokens: u64,
    pub held: Held,
    /// Its place among the provider batches open at once.
    pub permit: tokio::sync::OwnedSemaphorePermit,
}

/// Submit and drive a batch the former cut. Its lines are uploaded from
/// the ledger, a page at a time.
pub(super) async fn run_formed(b: Arc<Batcher>, formed: Formed) {
    let Formed {
        tag,
        created_at,
        lines,
        tokens,
        held,
        permit,
    } = formed;
    // Paused: nothing new goes to the provider until the operator resumes.
    // Stopped first: the batch stays recorded, and a resume submits it.
    // Likewise while the model's enqueued-token budget has no room.
    let room = match b.wait_unpaused().await {
        true => wait_for_room(&b, &tag, tokens).await,
        false => None,
    };
    if let Some(open) = room {
        let source = LedgerLines::new(b.clone(), tag.clone(), lines);
        let mut open = Some(open);
        let submitted = submit_resolved(&b, &tag, created_at, &mut open, &source).await;
        drop(source);
        match submitted {
            Submitting::Done(s) => {
                if let Some(o) = &open {
                    o.made();
                }
                docket_model::failpoint::hit("after_create");
                if record_submitted(&b, &tag, &s, lines).await {
                    let tracked = Tracked {
                        tag,
                        provider_batch_id: s.provider_batch_id,
                        input_file_id: s.input_file_id,
                        created_at,
                        cancel_wanted: false,
                        cancel_sent: false,
                        held,
                        open,
                        hold: None,
                        since: now_ts(),
                        state: BatchState::Validating.as_str().to_string(),
                        stall_told: false,
                    };
                    drive(&b, tracked).await;
                }
            }
            other => {
                drop(open);
                not_submitted(&b, &tag, other).await
            }
        }
    } else if b.is_cancelling() {
        never_submitted(&b, &tag).await;
    }
    b.open.fetch_sub(1, Ordering::Relaxed);
    drop(permit);
}

/// Wait until batch `tag` (`tokens` estimated prompt tokens) fits its
/// model's enqueued-token budget (row B3), saying so once if it must wait;
/// its place in the budget, or None when the run stops forming batches
/// meanwhile.
async fn wait_for_room(
    b: &Arc<Batcher>,
    tag: &str,
    tokens: u64,
) -> Option<super::enqueued::Opened> {
    let key = b.enqueued_key();
    let room = b.enqueued.room(&key, tokens, b.settings.max_enqueued_tokens, |open, cap| {
        let cap = cap.map_or_else(|| "a pause after a refusal".to_string(), |c| format!("about {c}"));
        let why = format!(
            "batch {tag} waits before its create: about {open} prompt tokens are enqueued for {} at {} and this batch adds about {tokens} (the limit: {cap}); it is submitted once open batches finish",
            docket_model::sanitize::for_terminal(&key.1),
            docket_model::sanitize::for_terminal(&b.stage().provider_name),
        );
        b.event("info", "batch_waits_for_tokens", why.clone());
        b.reporter.line(&format!("Batch {why}."));
    });
    tokio::select! {
        open = room => (!b.stop_forming.is_cancelled()).then_some(open),
        _ = b.stop_forming.cancelled() => None,
    }
}

/// A batch recorded but never uploaded, cancelled: settled as never run
/// (not billed), its lines handed back to their items.
pub(super) async fn never_submitted(b: &Arc<Batcher>, tag: &str) {
    let why = "cancelled before it was submitted: never run, not billed";
    let event = ("info", "batch_cancelled", format!("batch {tag}: {why}"));
    end_unrun(b, tag, "cancelled", why.into(), event, || {
        Reply::NotRun(why.into())
    })
    .await;
}

/// End a batch that never ran at the provider: `state` (with `message`)
/// recorded as its last, `event` logged, and each waiting line answered
/// with `reply()`; then the batch is finished with.
async fn end_unrun(
    b: &Arc<Batcher>,
    tag: &str,
    state: &str,
    message: String,
    event: (&'static str, &'static str, String),
    reply: impl Fn() -> Reply,
) {
    b.write(WriteOp::Batch(BatchOp::Status {
        tag: tag.to_string(),
        state: state.into(),
        completed: 0,
        failed: 0,
        output_ref: None,
        error_ref: None,
        error_message: Some(message),
        next_poll_at: None,
        polled: false,
        ended: true,
    }))
    .await;
    let (level, kind, text) = event;
    b.event(level, kind, text);
    let Some(waiting) = waiting_ids(b, tag).await else {
        return;
    };
    let replies = waiting.into_iter().map(|w| Delivered {
        request_id: w.request_id,
        attempt: w.attempt,
        reply: reply(),
    });
    deliver_in_chunks(b, replies, &mut Held::none(b)).await;
    settle(b, tag).await;
}

/// A batch found open in the ledger (a resume, or one whose worker died):
/// collect it, never send its lines again unless the provider shows it was
/// never made.
pub(super) async fn reattach(
    b: Arc<Batcher>,
    batch: OpenBatch,
    waiting: usize,
    adoption: Adoption,
) {
    let permit = tokio::select! {
        p = b.open_slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        _ = b.detached.cancelled() => return,
    };
    b.open.fetch_add(1, Ordering::Relaxed);
    // Counted open from here: the adoption is over.
    drop(adoption);
    b.stats
        .in_flight
        .fetch_add(waiting as u64, Ordering::Relaxed);
    b.stats.batched.fetch_add(waiting as u64, Ordering::Relaxed);
    let provider_batch_id = match batch.provider_batch_id.clone() {
        Some(id) => Some(id),
        None => adopt_or_resubmit(&b, &batch, waiting).await,
    };
    if let Some(provider_batch_id) = provider_batch_id {
        b.reporter.line(&format!(
            "Re-attached provider batch {} ({}, {waiting} requests waiting): polling it, nothing is sent again.",
            docket_model::sanitize::for_terminal(&provider_batch_id),
            batch.tag,
        ));
        let tracked = Tracked {
            tag: batch.tag.clone(),
            provider_batch_id,
            input_file_id: batch.input_file_id.clone(),
            created_at: batch.created_at,
            // A cancel asked before the stop is asked again (idempotent).
            cancel_wanted: batch.cancel_requested,
            cancel_sent: false,
            // A resumed run's lines hold no budget: what they cost counts
            // as their results are applied.
            held: Held::none(&b),
            // Its tokens are not known: it counts as an open batch.
            open: Some(b.enqueued.open(&b.enqueued_key(), 0)),
            hold: None,
            since: batch.submitted_at.unwrap_or(batch.created_at),
            state: batch.state.clone(),
            stall_told: false,
        };
        drive(&b, tracked).await;
    }
    b.open.fetch_sub(1, Ordering::Relaxed);
    drop(permit);
}

/// A batch recorded but with no provider id: its create may or may not have
/// happened. Look for it first; submit only when the provider shows none.
async fn adopt_or_resubmit(b: &Arc<Batcher>, batch: &OpenBatch, waiting: usize) -> Option<String> {
    match find_ours(
        b,
        &batch.tag,
        batch.created_at,
        batch.request_count as usize,
    )
    .await
    {
        Ok(Found::One(id)) => {
            b.event(
                "info",
                "batch_found",
                format!(
                    "batch {}: its create answer was lost before the stop; found it at the provider as {}: collecting it, nothing is sent again",
                    batch.tag,
                    docket_model::sanitize::for_terminal(&id)
                ),
            );
            let s = Submitted {
                provider_batch_id: id.clone(),
                input_file_id: None,
            };
            record_submitted(b, &batch.tag, &s, batch.request_count as usize)
                .await
                .then_some(id)
        }
        Ok(Found::None) => {
            // Never made: the same lines (same custom ids, same attempts)
            // go again under the same tag, read back from the ledger a page
            // at a time.
            let lines = LedgerLines::new(b.clone(), batch.tag.clone(), waiting);
            b.event(
                "info",
                "batch_resubmitted",
                format!(
                    "batch {}: not found at the provider (it was never made): submitting its {} requests now",
                    batch.tag,
                    lines.len()
                ),
            );
            match submit_resolved(b, &batch.tag, batch.created_at, &mut None, &lines).await {
                Submitting::Done(s) => record_submitted(b, &batch.tag, &s, lines.len())
                    .await
                    .then_some(s.provider_batch_id),
                other => {
                    drop(lines);
                    not_submitted(b, &batch.tag, other).await;
                    None
                }
            }
        }
        Ok(Found::Ambiguous(candidates)) => {
            // Several could be it: wait for them to end and match their
            // results' custom ids against this batch's lines (row B1).
            let lines = LedgerLines::new(b.clone(), batch.tag.clone(), waiting);
            let ambiguous = Submitting::Ambiguous(candidates);
            let sub = settle_ambiguity(
                b,
                &batch.tag,
                batch.created_at,
                &mut None,
                &lines,
                ambiguous,
            )
            .await;
            match sub {
                Submitting::Done(s) => record_submitted(b, &batch.tag, &s, lines.len())
                    .await
                    .then_some(s.provider_batch_id),
                other => {
                    drop(lines);
                    not_submitted(b, &batch.tag, other).await;
                    None
                }
            }
        }
        Err(e) => {
            not_submitted(
                b,
                &batch.tag,
                Submitting::Held(format!(
                    "cannot check whether the batch was made ({e}); its requests wait rather than risk paying twice: resume again later"
                )),
            )
            .await;
            None
        }
    }
}

fn held_message(candidates: &[String]) -> String {
    format!(
        "the create answer was lost and the provider shows {} batches that could be this one ({}): its requests wait rather than risk paying twice. Check them at the provider; cancel the extra ones, then resume",
        candidates.len(),
        candidates
            .iter()
            .take(5)
            .map(|c| docket_model::sanitize::for_terminal(c))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

enum Submitting {
    Done(Submitted),
    /// The provider refused the batch; it was not made.
    Failed(ProviderError),
    /// It may exist and cannot be told apart: wait for the operator.
    Held(String),
    /// Its create answer was lost and several batches at the provider could
    /// be it (their ids): `settle_ambiguity` tells them apart.
    Ambiguous(Vec<String>),
    /// The run stopped while submitting (the batch may exist: a resume
    /// looks for it).
    Stopped,
}

/// `submit`, and when the batch cannot be told apart from others, the
/// wait for them to end and the match of their custom ids.
async fn submit_resolved(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    open: &mut Option<super::enqueued::Opened>,
    lines: &dyn LineSource,
) -> Submitting {
    let sub = submit(b, tag, created_at, open, lines).await;
    settle_ambiguity(b, tag, created_at, open, lines, sub).await
}

/// Row B1: a batch whose create answer was lost, with several batches at
/// the provider that could be it (Anthropic keeps no metadata: same window,
/// same request count). Nothing is sent while they run; once every one has
/// ended, their results are read for this batch's custom ids (unique to
/// each session, request and attempt): the one that has them is adopted;
/// when none has any, the create never made a batch (or one that ran
/// nothing) and it is submitted again. Anything else holds the batch for
/// the operator.
async fn settle_ambiguity(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    open: &mut Option<super::enqueued::Opened>,
    lines: &dyn LineSource,
    mut sub: Submitting,
) -> Submitting {
    for _ in 0..3 {
        let Submitting::Ambiguous(candidates) = sub else {
            return sub;
        };
        match resolve_by_custom_ids(b, tag, created_at, &candidates).await {
            Resolved::Ours(id) => {
                b.event(
                    "info",
                    "batch_found",
                    format!(
                        "batch {tag}: of the {} batches that could be it, {} has its custom ids: collecting it, nothing is sent again",
                        candidates.len(),
                        docket_model::sanitize::for_terminal(&id)
                    ),
                );
                return Submitting::Done(Submitted {
                    provider_batch_id: id,
                    input_file_id: None,
                });
            }
            Resolved::NotMade => {
                b.event(
                    "info",
                    "batch_resubmitted",
                    format!(
                        "batch {tag}: none of the {} batches that could be it has any of its custom ids (they all ended): it was never made; submitting its {} requests now",
                        candidates.len(),
                        lines.len()
                    ),
                );
                sub = submit(b, tag, created_at, open, lines).await;
            }
            Resolved::Unsure(why) => return Submitting::Held(why),
            Resolved::Stopped => return Submitting::Stopped,
        }
    }
    match sub {
        Submitting::Ambiguous(c) => Submitting::Held(held_message(&c)),
        other => other,
    }
}

/// What the candidates' custom ids showed.
enum Resolved {
    /// This one has the batch's custom ids.
    Ours(String),
    /// None has any: the batch was never made (or ran nothing).
    NotMade,
    /// Cannot tell (results not to be had, several with its ids): why.
    Unsure(String),
    /// The run let go of its batches meanwhile.
    Stopped,
}

/// Polls before a candidate that keeps failing to answer leaves the batch
/// to the operator.
const RESOLVE_POLL_ERRORS_MAX: u32 = 20;

/// Wait for every one of `candidates` to end, then read their results for
/// batch `tag`'s custom ids.
async fn resolve_by_custom_ids(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    candidates: &[String],
) -> Resolved {
    let listed = candidates
        .iter()
        .take(5)
        .map(|c| docket_model::sanitize::for_terminal(c))
        .collect::<Vec<_>>()
        .join(", ");
    let why = format!(
        "the create answer was lost and the provider shows {} batches that could be this one ({listed}): nothing is sent again; once they have all ended, their results are matched against its custom ids",
        candidates.len()
    );
    mark_unknown(b, tag, &why).await;
    let Some(ours) = line_ids(b, tag).await else {
        return Resolved::Stopped;
    };
    // Every candidate to its end.
    let mut ended: Vec<(String, BatchStatus)> = Vec::new();
    let mut running: Vec<String> = candidates.to_vec();
    let mut errors = 0u32;
    while !running.is_empty() {
        let mut still = Vec::new();
        for id in running {
            let polled = tokio::select! {
                r = b.adapter.poll(&id) => r,
                _ = b.detached.cancelled() => return Resolved::Stopped,
            };
            match polled {
                Ok(s) if s.state.is_terminal() && !s.results_pending => ended.push((id, s)),
                Ok(_) => still.push(id),
                Err(e) => {
                    errors += 1;
                    if errors >= RESOLVE_POLL_ERRORS_MAX {
                        return Resolved::Unsure(format!(
                            "{why}; but batch {} cannot be polled ({e}): its requests wait rather than risk paying twice. Check it at the provider, then resume",
                            docket_model::sanitize::for_terminal(&id)
                        ));
                    }
                    still.push(id);
                }
            }
        }
        running = still;
        if !running.is_empty() {
            // At the cadence; slower while polls fail.
            let mut wait = cadence(b, &BatchState::InProgress, created_at);
            if errors > 0 {
                wait = wait.max(backoff(errors).min(Duration::from_secs(60)));
            }
            if !pause(b, wait).await {
                return Resolved::Stopped;
            }
        }
    }
    // Whose results have this batch's custom ids.
    let mut matched = Vec::new();
    for (id, status) in &ended {
        let mut hits = 0u64;
        let mut read;
        let mut tries = 0u32;
        loop {
            tries += 1;
            read = {
                let mut sink = |l: docket_providers::batch::ResultLine| {
                    if ours.contains(&l.custom_id) {
                        hits += 1;
                    }
                };
                tokio::select! {
                    r = b.adapter.results(status, &ours, &mut sink) => r,
                    _ = b.detached.cancelled() => return Resolved::Stopped,
                }
            };
            // A stream that broke off before any of its ids, or a read
            // that failed: read again, a few times.
            let again = match &read {
                Ok(sum) => sum.cut && hits == 0,
                Err(_) => true,
            };
            if !again || tries >= 3 {
                break;
            }
            if !pause(b, backoff(tries)).await {
                return Resolved::Stopped;
            }
        }
        match read {
            Ok(sum) if !sum.cut => {}
            Ok(_) if hits > 0 => {}
            Ok(_) => {
                return Resolved::Unsure(format!(
                    "{why}; but the results of {} broke off before any of its custom ids: its requests wait rather than risk paying twice; resume to look again",
                    docket_model::sanitize::for_terminal(id)
                ));
            }
            Err(e) => {
                return Resolved::Unsure(format!(
                    "{why}; but the results of {} cannot be read ({e}): its requests wait rather than risk paying twice. Check it at the provider, then resume",
                    docket_model::sanitize::for_terminal(id)
                ));
            }
        }
        if hits > 0 {
            matched.push(id.clone());
        }
    }
    match matched.len() {
        0 => Resolved::NotMade,
        1 => Resolved::Ours(matched.remove(0)),
        _ => Resolved::Unsure(format!(
            "{why}; {} of them have its custom ids ({}): its requests wait. Check them at the provider, then resume",
            matched.len(),
            matched
                .iter()
                .map(|c| docket_model::sanitize::for_terminal(c))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Submit `lines` as batch `tag`. When the create's answer is lost (a
/// network error, a 5xx after the batch may have been made), look for the
/// batch before submitting again.
async fn submit(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    open: &mut Option<super::enqueued::Opened>,
    lines: &dyn LineSource,
) -> Submitting {
    let mut tries = 0u32;
    loop {
        tries += 1;
        let spec = SubmitSpec {
            tag,
            model: &b.stage().model,
            lines,
        };
        let r = tokio::select! {
            r = b.adapter.submit(spec) => r,
            _ = b.detached.cancelled() => return Submitting::Stopped,
        };
        let e = match r {
            Ok(s) => return Submitting::Done(s),
            Err(e) => e,
        };
        tracing::warn!(tag, "batch submit failed: {e}");
        // The model's enqueued-token limit (a 429 at create): no batch was
        // made. Learn from it and give the lines back to wait, rather than
        // ask again in a loop (row B3).
        if e.class == ErrorClass::RateLimited && super::enqueued::is_token_limit(&e.message) {
            let delay = match open.take() {
                Some(o) => o.refused(hold_base(b)),
                None => b
                    .enqueued
                    .refused(&b.enqueued_key(), 0, false, hold_base(b)),
            };
            let mut e = e;
            e.headers.retry_after = Some(delay.max(e.headers.retry_after.unwrap_or_default()));
            return Submitting::Failed(e);
        }
        match e.class {
            ErrorClass::RateLimited if tries < MAX_SUBMITS * 2 => {
                let wait = e.headers.retry_after.unwrap_or_else(|| backoff(tries));
                if !pause(b, wait).await {
                    return Submitting::Stopped;
                }
            }
            ErrorClass::Ambiguous | ErrorClass::Transient | ErrorClass::Overloaded => {
                if !pause(b, backoff(tries).min(Duration::from_secs(10))).await {
                    return Submitting::Stopped;
                }
                match find_ours(b, tag, created_at, lines.len()).await {
                    Ok(Found::One(id)) => {
                        b.event(
                            "info",
                            "batch_found",
                            format!(
                                "batch {tag}: the create answer was lost ({}); found the batch at the provider as {}: not submitted again",
                                e.message,
                                docket_model::sanitize::for_terminal(&id)
                            ),
                        );
                        return Submitting::Done(Submitted {
                            provider_batch_id: id,
                            input_file_id: None,
                        });
                    }
                    Ok(Found::None) if tries < MAX_SUBMITS => {}
                    Ok(Found::None) => return Submitting::Failed(e),
                    Ok(Found::Ambiguous(c)) => return Submitting::Ambiguous(c),
                    Err(fe) => {
                        return Submitting::Held(format!(
                            "the create answer was lost ({}) and the provider's batch list could not be read ({fe}): its requests wait rather than risk paying twice; resume later",
                            e.message
                        ));
                    }
                }
            }
            _ => return Submitting::Failed(e),
        }
    }
}

/// `find`, with the batches docket already knows taken out: a batch that is
/// another of ours can never be the one looked for.
async fn find_ours(
    b: &Arc<Batcher>,
    tag: &str,
    created_at: f64,
    count: usize,
) -> Result<Found, ProviderError> {
    let found = b.adapter.find(tag, created_at, count).await?;
    let path = b.p.ledger.clone();
    let known: HashSet<String> = tokio::task::spawn_blocking(move || {
        Ledger::open_read_only(&path)
            .ok()
            .and_then(|l| l.known_provider_ids().ok())
            .unwrap_or_default()
    })
    .await
    .unwrap_or_default()
    .into_iter()
    .collect();
    Ok(match found {
        Found::One(id) if known.contains(&id) => Found::None,
        Found::Ambiguous(ids) => {
            let mut rest: Vec<String> = ids.into_iter().filter(|i| !known.contains(i)).collect();
            match rest.len() {
                0 => Found::None,
                1 => Found::One(rest.remove(0)),
                _ => Found::Ambiguous(rest),
            }
        }
        other => other,
    })
}

async fn record_submitted(b: &Arc<Batcher>, tag: &str, s: &Submitted, n: usize) -> bool {
    let ok = b
        .write(WriteOp::Batch(BatchOp::Submitted {
            tag: tag.to_string(),
            provider_batch_id: s.provider_batch_id.clone(),
            input_file_id: s.input_file_id.clone(),
        }))
        .await;
    if ok {
        let id = docket_model::sanitize::for_terminal(&s.provider_batch_id);
        b.event(
            "info",
            "batch_submitted",
            format!(
                "batch {tag} submitted to {}: {n} requests, provider id {id}",
                b.stage().provider_name
            ),
        );
        b.reporter.line(&format!(
            "Submitted batch {tag} to {} ({}): {n} requests, provider id {id}",
            b.stage().provider_name,
            b.adapter.name()
        ));
    }
    ok
}

/// The batch was not made (refused) or cannot be told apart (held): tell
/// its lines, and the operator.
async fn not_submitted(b: &Arc<Batcher>, tag: &str, how: Submitting) {
    match how {
        Submitting::Failed(e) => {
            // No batch was made and this tag is not asked for again: an
            // upload the adapter kept for it goes (row B2).
            if let Err(e) = b.adapter.abandon(tag).await {
                tracing::warn!(tag, "could not delete a kept upload: {e}");
            }
            let msg = format!("not submitted: {e}");
            let event = ("warn", "batch_failed", format!("batch {tag} {msg}"));
            // A create the provider refused made no batch and cost nothing
            // (row B2): its lines go back, each spending one transport
            // attempt, rather than fail their items at once. A refusal that
            // never changes ends them after `max_transport_attempts`. What
            // docket's own checks refused (no HTTP status) fails at once.
            let lines_get = if e.class == ErrorClass::Request && e.http_status.is_some() {
                ProviderError {
                    class: ErrorClass::Transient,
                    message: format!("batch create refused: {}", e.message),
                    ..e.clone()
                }
            } else {
                e.clone()
            };
            end_unrun(b, tag, "failed", msg, event, || {
                Reply::Error(lines_get.clone())
            })
            .await;
        }
        Submitting::Held(why) => {
            mark_unknown(b, tag, &why).await;
            // The lines stay as they are, in their batch: nothing claims
            // their items until the operator settles it and resumes.
            if let Some(waiting) = waiting_ids(b, tag).await {
                hold(b, waiting.len());
            }
        }
        Submitting::Ambiguous(c) => {
            Box::pin(not_submitted(b, tag, Submitting::Held(held_message(&c)))).await
        }
        Submitting::Stopped | Submitting::Done(_) => {}
    }
}

/// `n` lines wait for the operator: no longer in flight, counted as held.
fn hold(b: &Batcher, n: usize) {
    b.held.fetch_add(n, Ordering::Relaxed);
    b.stats.in_flight.fetch_sub(n as u64, Ordering::Relaxed);
    b.stats.batched.fetch_sub(n as u64, Ordering::Relaxed);
}

/// The lines of batch `tag` still waiting for a result, from the ledger
/// (None when it cannot be read: the run stops).
async fn waiting_ids(b: &Batcher, tag: &str) -> Option<Vec<LineId>> {
    read_batch(b, tag, |l, tag| l.waiting_ids(tag)).await
}

/// Every line of batch `tag` (a re-read of its results must tell the lines
/// already applied from ids that are not the batch's).
async fn line_ids(b: &Batcher, tag: &str) -> Option<HashSet<String>> {
    read_batch(b, tag, |l, tag| l.line_ids(tag))
        .await
        .map(|ids| ids.into_iter().collect())
}

/// `read` of batch `tag`, off the async threads; a ledger that cannot be
/// read stops the run (None).
async fn read_batch<T: Send + 'static>(
    b: &Batcher,
    tag: &str,
    read: fn(&Ledger, &str) -> Result<T, LedgerError>,
) -> Option<T> {
    let (path, tag) = (b.p.ledger.clone(), tag.to_string());
    let r = tokio::task::spawn_blocking(move || {
        let l = Ledger::open_read_only(&path).map_err(|e| e.to_string())?;
        read(&l, &tag).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            (b.on_fatal)(format!("ledger: {e}"));
            None
        }
    }
}

/// Hand `replies` to their items a chunk at a time, each chunk applied
/// before the next is handed over; the budget the lines held is given back
/// as they go.
async fn deliver_in_chunks(
    b: &Batcher,
    replies: impl IntoIterator<Item = Delivered>,
    held: &mut Held,
) -> u64 {
    let mut n = 0u64;
    let mut chunk = Vec::with_capacity(DELIVER_CHUNK);
    for r in replies {
        chunk.push(r);
        if chunk.len() == DELIVER_CHUNK {
            n += chunk.len() as u64;
            held.give_back(chunk.len());
            b.deliver(std::mem::replace(
                &mut chunk,
                Vec::with_capacity(DELIVER_CHUNK),
            ))
            .await;
        }
    }
    n += chunk.len() as u64;
    held.give_back(chunk.len());
    b.deliver(chunk).await;
    n
}

/// Poll until the batch is over (cancelling it when asked), then collect.
async fn drive(b: &Arc<Batcher>, mut t: Tracked) {
    let mut next = first_poll(b);
    let mut poll_errors = 0u32;
    let status = loop {
        if (b.cancel.is_cancelled() || t.cancel_wanted) && !t.cancel_sent {
            t.cancel_sent = true;
            cancel(b, &t).await;
            next = Duration::ZERO;
        }
        tokio::select! {
            _ = tokio::time::sleep(next) => {}
            _ = b.detached.cancelled() => return,
            _ = b.cancel.cancelled(), if !t.cancel_sent => continue,
        }
        let polled = tokio::select! {
            r = b.adapter.poll(&t.provider_batch_id) => r,
            _ = b.detached.cancelled() => return,
        };
        match polled {
            Ok(s) => {
                poll_errors = 0;
                t.state = s.state.as_str().to_string();
                tell_if_stalled(b, &mut t, None);
                let done = s.state.is_terminal() && !s.results_pending;
                next = cadence(b, &s.state, t.created_at);
                let next_at = (!done).then(|| now_ts() + next.as_secs_f64());
                if !b
                    .write(WriteOp::Batch(status_op(&t.tag, &s, next_at, true)))
                    .await
                {
                    // Taken over (or the ledger failed): not ours to collect.
                    return;
                }
                if done {
                    if s.state == BatchState::Cancelled && !t.cancel_sent {
                        // Row B5: cancelled at the provider, not by docket.
                        b.event(
                            "warn",
                            "batch_cancelled_by_provider",
                            format!(
                                "batch {}: cancelled at the provider (docket did not ask): what it finished is kept, the rest goes again",
                                t.tag
                            ),
                        );
                    }
                    // Its tokens leave the model's queue; a failure for the
                    // enqueued-token limit teaches the budget.
                    if let Some(open) = t.open.take() {
                        match &s.state {
                            BatchState::Failed(why) if super::enqueued::is_token_limit(why) => {
                                t.hold = Some(open.refused(hold_base(b)));
                            }
                            _ => drop(open),
                        }
                    }
                    break s;
                }
            }
            Err(e) => {
                poll_errors += 1;
                next = e
                    .headers
                    .retry_after
                    .unwrap_or_else(|| backoff(poll_errors))
                    .max(cadence(b, &BatchState::InProgress, t.created_at));
                tell_if_stalled(b, &mut t, Some(&e));
                if poll_errors == 1 || poll_errors.is_multiple_of(10) {
                    b.event(
                        "warn",
                        "batch_poll_failed",
                        format!(
                            "batch {}: poll failed ({e}); trying again in {:.0} s (the batch goes on at the provider)",
                            t.tag,
                            next.as_secs_f64()
                        ),
                    );
                }
                b.writer.post(WriteOp::Batch(BatchOp::NextPoll {
                    tag: t.tag.clone(),
                    next_poll_at: now_ts() + next.as_secs_f64(),
                }))
            }
        }
    };
    collect(b, &mut t, &status).await;
}

/// Row B8: a batch still not done past its window (the provider's usual
/// 24 h, or `stall_after_secs`) is said to be stalled, once: an event and
/// a line. Polling goes on (backing off while polls fail); nothing is
/// cancelled or sent again: its lines wait for its results.
fn tell_if_stalled(b: &Batcher, t: &mut Tracked, poll_error: Option<&ProviderError>) {
    if t.stall_told {
        return;
    }
    let window = b.settings.stall_after;
    let Some(late) =
        docket_providers::batch::stalled_for(&t.state, Some(t.since), now_ts(), window)
    else {
        return;
    };
    t.stall_told = true;
    let human = docket_providers::batch::human_duration;
    let at = Duration::from_secs_f64((now_ts() - t.since).max(0.0));
    let polls = match poll_error {
        Some(e) => format!("its polls fail ({e}) and back off"),
        None => "polling goes on".to_string(),
    };
    let why = format!(
        "batch {} is stalled for {}: still {} at {} {} after its submission (expected within {}); {polls}, nothing is cancelled or sent again",
        t.tag,
        human(late),
        t.state,
        b.stage().provider_name,
        human(at),
        human(window.unwrap_or(docket_providers::batch::USUAL_WINDOW)),
    );
    b.event("warn", "batch_stalled", why.clone());
    b.reporter.line(&format!("Batch {why}."));
}

/// The first poll: soon after a submit (validation is quick), at the
/// cadence otherwise.
fn first_poll(b: &Batcher) -> Duration {
    b.settings.poll_interval.unwrap_or_else(|| {
        b.adapter
            .poll_after(&BatchState::Validating, Duration::ZERO)
    })
}

/// The provider's cadence for `state` (or the configured interval), with
/// jitter so many batches do not poll in step.
fn cadence(b: &Batcher, state: &BatchState, created_at: f64) -> Duration {
    let age = Duration::from_secs_f64((now_ts() - created_at).max(0.0));
    let base = b
        .settings
        .poll_interval
        .unwrap_or_else(|| b.adapter.poll_after(state, age));
    let jitter = rand::rng().random_range(0.9..1.1);
    base.mul_f64(jitter)
}

fn backoff(tries: u32) -> Duration {
    let secs = 2f64
        .powi(tries.min(16) as i32)
        .min(MAX_BACKOFF.as_secs_f64());
    Duration::from_secs_f64(secs)
}

/// Sleep unless the run lets go of its batches meanwhile.
async fn pause(b: &Batcher, d: Duration) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => true,
        _ = b.detached.cancelled() => false,
    }
}

fn status_op(tag: &str, s: &BatchStatus, next_poll_at: Option<f64>, polled: bool) -> BatchOp {
    BatchOp::Status {
        tag: tag.to_string(),
        state: s.state.as_str().to_string(),
        completed: s.counts.completed,
        failed: s.counts.failed,
        output_ref: s.output_ref.clone(),
        error_ref: s.error_ref.clone(),
        error_message: match &s.state {
            BatchState::Failed(why) => Some(why.clone()),
            _ => None,
        },
        next_poll_at,
        polled,
        ended: s.state.is_terminal(),
    }
}

async fn cancel(b: &Arc<Batcher>, t: &Tracked) {
    b.write(WriteOp::Batch(BatchOp::CancelRequested {
        tag: t.tag.clone(),
    }))
    .await;
    match b.adapter.cancel(&t.provider_batch_id).await {
        Ok(s) => {
            b.event(
                "warn",
                "batch_cancelled",
                format!(
                    "batch {}: cancel asked of the provider (now {}); what it finished is collected",
                    t.tag,
                    s.state.as_str()
                ),
            );
            b.write(WriteOp::Batch(status_op(&t.tag, &s, None, false)))
                .await;
        }
        Err(e) => b.event(
            "warn",
            "batch_cancel_failed",
            format!(
                "batch {}: the provider did not take the cancel ({e}); it is polled until it ends",
                t.tag
            ),
        ),
    }
}

/// Read the results of a finished batch and apply them to their items, a
/// chunk at a time; every line not answered by a result line hears why
/// (never run, failed batch, no line). The lines waiting are read from the
/// ledger, so a re-read after a cut stream applies only what is missing.
async fn collect(b: &Arc<Batcher>, t: &mut Tracked, status: &BatchStatus) {
    // One batch's results in memory at a time.
    let Ok(_turn) = b.collecting.acquire().await else {
        return;
    };
    let mut tries = 0u32;
    let has_results = status.output_ref.is_some() || status.error_ref.is_some();
    // Lines whose result this run applied (one that stopped before its
    // outcome still waits, and is not "without a result").
    let mut applied: HashSet<String> = HashSet::new();
    // Lines the last whole read found no result line for, where the
    // provider writes one for every request: whether they ran is unknown,
    // whatever the batch's state.
    let mut missing: HashSet<String> = HashSet::new();
    // Result lines that could not be used: the results files are kept at
    // the provider to be looked at.
    let mut quarantined_any = false;
    while has_results && !b.detached.is_cancelled() {
        tries += 1;
        let (Some(expected), Some(waiting)) =
            (line_ids(b, &t.tag).await, waiting_ids(b, &t.tag).await)
        else {
            return;
        };
        if waiting.is_empty() {
            break;
        }
        let waiting: HashMap<String, (i64, i64)> = waiting
            .into_iter()
            .map(|w| (w.custom_id, (w.request_id, w.attempt)))
            .collect();
        let now = super::applying::read_and_apply(b, status, &expected, waiting, &mut t.held).await;
        drop(expected);
        let delivered = now.ids.len() as u64;
        applied.extend(now.ids);
        let Some(got) = now.read else {
            return;
        };
        match got {
            Ok(sum) => {
                let quarantined = sum.quarantined.len() as u64 + sum.quarantined_more;
                quarantined_any |= quarantined > 0;
                if quarantined > 0 {
                    b.event(
                        "warn",
                        "batch_quarantined",
                        format!(
                            "batch {}: {quarantined} result line(s) could not be used and were put aside (first: {})",
                            t.tag,
                            sum.quarantined
                                .first()
                                .map(|q| format!("line {}: {}", q.line, q.reason))
                                .unwrap_or_default()
                        ),
                    );
                }
                missing = sum.missing.into_iter().collect();
                b.write(WriteOp::Batch(BatchOp::Ingested {
                    tag: t.tag.clone(),
                    delivered,
                    quarantined: sum.quarantined,
                    quarantined_more: sum.quarantined_more,
                }))
                .await;
                if !sum.cut {
                    break;
                }
                if tries == RESULTS_TRIES_BEFORE_EVENT {
                    b.event(
                        "warn",
                        "batch_results_cut",
                        format!(
                            "batch {}: the results stream keeps breaking off; what came is kept, fetching the rest again",
                            t.tag
                        ),
                    );
                }
            }
            Err(e) if tries >= RESULTS_TRIES_MAX => {
                // Paid for, but not to be had: the lines wait for the
                // operator rather than be sent (and paid for) again.
                let why = format!(
                    "batch {}: its results could not be fetched after {tries} tries ({e}); its requests wait. Check the batch at the provider, then resume",
                    t.tag
                );
                b.event("error", "batch_results_failed", why.clone());
                if let Some(w) = waiting_ids(b, &t.tag).await {
                    hold(b, w.len());
                }
                return;
            }
            Err(e) => {
                if tries == 1 || tries.is_multiple_of(RESULTS_TRIES_BEFORE_EVENT) {
                    b.event(
                        "warn",
                        "batch_results_failed",
                        format!(
                            "batch {}: results could not be fetched ({e}); trying again",
                            t.tag
                        ),
                    );
                }
            }
        }
        if !pause(b, backoff(tries).min(Duration::from_secs(60))).await {
            return;
        }
    }
    if b.detached.is_cancelled() {
        return;
    }
    // Lines no result line spoke for.
    let Some(waiting) = waiting_ids(b, &t.tag).await else {
        return;
    };
    let unanswered: Vec<LineId> = waiting
        .into_iter()
        .filter(|w| !applied.contains(&w.custom_id))
        .collect();
    drop(applied);
    let left = unanswered.len();
    let no_line = || {
        Reply::Error(ProviderError {
            class: ErrorClass::Ambiguous,
            http_status: None,
            message: "the batch finished without a result line for this request".into(),
            headers: Default::default(),
        })
    };
    let replies = unanswered.into_iter().map(|w| Delivered {
        request_id: w.request_id,
        attempt: w.attempt,
        reply: match &status.state {
            BatchState::Failed(why) => Reply::Error(failed_batch_error(why, t.hold)),
            _ if missing.contains(&w.custom_id) => no_line(),
            BatchState::Expired | BatchState::Cancelled => Reply::NotRun(format!(
                "the batch was {} before this request ran",
                status.state.as_str()
            )),
            _ => no_line(),
        },
    });
    deliver_in_chunks(b, replies, &mut t.held).await;
    let summary = format!(
        "{} {}: {} completed, {} failed at the provider{}",
        t.tag,
        status.state.as_str(),
        status.counts.completed,
        status.counts.failed,
        if left > 0 {
            format!("; {left} request(s) without a result go back to be sent again")
        } else {
            String::new()
        }
    );
    b.event("info", "batch_ended", format!("batch {summary}"));
    b.reporter.line(&format!("Batch {summary}."));
    if settle(b, &t.tag).await {
        let results = (!quarantined_any).then_some(status);
        delete_files(
            b,
            &t.tag,
            &t.provider_batch_id,
            t.input_file_id.as_deref(),
            results,
        )
        .await;
    }
}

/// Row B2: a batch docket is done with (terminal, every line's outcome
/// recorded) leaves nothing in the provider's file storage: its uploaded
/// input is deleted, and its results files too unless `results` is None
/// (some result lines could not be used: the files are kept to be looked
/// at, and expire at the provider on their own). A file already gone is
/// fine; a failure is told, never fatal.
pub(super) async fn delete_files(
    b: &Batcher,
    tag: &str,
    provider_batch_id: &str,
    input_file: Option<&str>,
    results: Option<&BatchStatus>,
) {
    let deleting = b
        .adapter
        .delete_files(provider_batch_id, input_file, results);
    let r = tokio::select! {
        r = deleting => r,
        _ = b.detached.cancelled() => return,
    };
    match r {
        Ok(n) => tracing::debug!(tag, n, "batch files deleted at the provider"),
        Err(e) => b.event(
            "warn",
            "batch_files_kept",
            format!(
                "batch {tag}: its files at the provider could not be deleted ({e}); they expire there on their own"
            ),
        ),
    }
}

/// A batch the provider failed as a whole: its requests were not run. A
/// limit (enqueued tokens) is "not now"; anything else may pass next time.
fn failed_batch_error(why: &str, hold: Option<Duration>) -> ProviderError {
    let limit = why.contains("token_limit") || why.contains("limit");
    let headers = docket_providers::limiter::RateHeaders {
        retry_after: hold,
        ..Default::default()
    };
    ProviderError {
        class: if limit {
            ErrorClass::RateLimited
        } else {
            ErrorClass::Transient
        },
        http_status: None,
        message: format!("the batch failed at the provider: {why}"),
        headers,
    }
}

/// The first hold after an enqueued-token refusal: the poll interval (a
/// batch ending is seen no sooner), doubled with each refusal in a row.
fn hold_base(b: &Batcher) -> Duration {
    b.settings.poll_interval.unwrap_or_else(|| {
        b.adapter
            .poll_after(&BatchState::InProgress, Duration::ZERO)
    })
}

/// Mark the batch finished with once every line's outcome is recorded
/// (the last writes of a chunk may still be on their way to the ledger);
/// whether it is.
async fn settle(b: &Arc<Batcher>, tag: &str) -> bool {
    let path = b.p.ledger.clone();
    for _ in 0..400 {
        b.writer.post(WriteOp::Batch(BatchOp::Settle {
            tag: tag.to_string(),
        }));
        if !pause(b, Duration::from_millis(150)).await {
            return false;
        }
        let (path, tag2) = (path.clone(), tag.to_string());
        let done = tokio::task::spawn_blocking(move || {
            Ledger::open_read_only(&path)
                .ok()
                .and_then(|l| l.is_settled(&tag2).ok())
                .unwrap_or(false)
        })
        .await
        .unwrap_or(false);
        if done {
            return true;
        }
    }
    false
}

/// A batch whose create may or may not have made it at the provider: its
/// state `unknown` with why, said in an event and on the output.
async fn mark_unknown(b: &Batcher, tag: &str, why: &str) {
    b.write(WriteOp::Batch(BatchOp::Status {
        tag: tag.to_string(),
        state: "unknown".into(),
        completed: 0,
        failed: 0,
        output_ref: None,
        error_ref: None,
        error_message: Some(why.to_string()),
        next_poll_at: None,
        polled: false,
        ended: false,
    }))
    .await;
    b.event("warn", "batch_unknown", format!("batch {tag}: {why}"));
    b.reporter.line(&format!("Batch {tag}: {why}."));
}
