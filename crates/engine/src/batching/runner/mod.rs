//! One provider batch from its record to its last result: record, submit
//! (finding the batch again when the create answer is lost), poll on the
//! provider's cadence, cancel when asked, stream the results to the waiting
//! workers, and mark the batch finished with once every line has its outcome.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

mod collect;
mod poll;
mod reattach;
mod resolve;
mod submit;

use super::lines::LedgerLines;
use super::{Batcher, Delivered, Reply};
use docket_ledger::batches::{BatchOp, LineId};
use docket_ledger::work::BatchLedger;
use docket_ledger::writer::WriteOp;
use docket_ledger::{Ledger, LedgerError, now_ts};
use docket_providers::batch::BatchState;
use docket_providers::{ErrorClass, ProviderError};

pub(super) use collect::delete_files;
use poll::{drive, pause};
pub(super) use reattach::reattach;
use submit::{Submitting, not_submitted, record_submitted, submit_resolved};

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
