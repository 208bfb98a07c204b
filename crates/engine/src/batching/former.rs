//! The former: requests are checked as they come, recorded in the ledger a
//! piece at a time as part of the batch being formed, and the batch is cut
//! when a trigger fires (or, in `auto` mode with too few requests, the
//! requests are sent back to go synchronously). A batch's prompts are never
//! held whole: what waits in memory is the piece not yet recorded, and the
//! upload reads the lines back from the ledger a page at a time.
//!
//! Triggers: COUNT (`max_requests`), SIZE (`max_bytes` of the provider's
//! encoding, each line measured exactly as it comes), TIME (`max_wait`
//! since the first request began to wait), and "settled": the feed has
//! handed out every item and nothing new came for `SETTLE`, so waiting
//! longer would only delay the last batch.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;

use super::runner::{self, Formed, Held};
use super::{Batcher, Delivered, Queued, Reply, SETTLE, Ticket};
use docket_ledger::batches::{BatchOp, NewBatch, NewBatchLine};
use docket_ledger::now_ts;
use docket_ledger::writer::WriteOp;
use docket_model::config::BatchMode;
use docket_providers::batch::BatchLine;

/// Lines recorded in one write while a batch forms: what is held of a
/// batch's prompts at most, besides what the feed has claimed ahead.
pub(super) const RECORD_PIECE: usize = 2_000;

/// A line of a forming batch besides its request: its ids, its item, the
/// hash of the evidence it was rendered from, its ticket.
struct Meta {
    request_id: i64,
    attempt: i64,
    item: (String, i64),
    evidence_hash: Option<String>,
    ticket: Ticket,
}

/// The batch being formed.
#[derive(Default)]
struct Forming {
    /// Lines not yet recorded, each with its ids, item and ticket.
    pending: Vec<(BatchLine, Meta)>,
    pending_bytes: u64,
    /// Estimated prompt tokens of the pending lines (the enqueued budget).
    pending_tokens: u64,
    /// Set once its first piece is recorded.
    recorded: Option<Recorded>,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
}

/// What of the forming batch is in the ledger.
struct Recorded {
    tag: String,
    created_at: f64,
    lines: usize,
    bytes: u64,
    /// Estimated prompt tokens of its recorded lines.
    tokens: u64,
    /// The budget its recorded lines hold until their results are applied.
    reserved: f64,
    /// Its place among the provider batches open at once.
    permit: OwnedSemaphorePermit,
}

impl Forming {
    fn lines(&self) -> usize {
        self.pending.len() + self.recorded.as_ref().map_or(0, |r| r.lines)
    }

    fn bytes(&self) -> u64 {
        self.pending_bytes + self.recorded.as_ref().map_or(0, |r| r.bytes)
    }

    fn is_empty(&self) -> bool {
        self.lines() == 0
    }

    fn push(&mut self, line: BatchLine, meta: Meta, bytes: u64) {
        let now = Instant::now();
        self.first_at.get_or_insert(now);
        self.last_at = Some(now);
        self.pending_tokens +=
            super::enqueued::estimate(line.request.system.as_deref(), &line.request.user);
        self.pending.push((line, meta));
        self.pending_bytes += bytes;
    }
}

pub(super) async fn form(b: Arc<Batcher>, mut rx: mpsc::UnboundedReceiver<Queued>) {
    let s = b.settings;
    let mut f = Forming::default();
    loop {
        let time_due = f.first_at.map(|t| t + s.max_wait);
        let settle_due = (b.feed_done.load(Ordering::Relaxed) && !f.is_empty())
            .then(|| f.last_at.map(|t| t + SETTLE))
            .flatten();
        let due = match (time_due, settle_due) {
            (Some(a), Some(c)) => Some(a.min(c)),
            (a, c) => a.or(c),
        };
        tokio::select! {
            q = rx.recv() => match q {
                Some(q) => {
                    if !take(&b, &mut f, q).await {
                        break;
                    }
                }
                // Every sender is gone: nothing more will come.
                None => {
                    if !b.stop_forming.is_cancelled() {
                        cut(&b, &mut f).await;
                    }
                    break;
                }
            },
            _ = sleep_until(due), if due.is_some() => {
                if !cut(&b, &mut f).await {
                    break;
                }
            }
            _ = b.feed_done_notify.notified() => {}
            _ = b.stop_forming.cancelled() => break,
        }
    }
    abandon(&b, f);
    // Requests still handed in are dropped: nothing was recorded for them,
    // so they stay pending and their budget is given back.
    rx.close();
    while rx.recv().await.is_some() {}
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Check one request and add it to the batch being formed, cutting the
/// batch first when it would not fit and after when it is full. False
/// when the batch cannot be recorded (the run is stopping).
async fn take(b: &Arc<Batcher>, f: &mut Forming, q: Queued) -> bool {
    let s = b.settings;
    let line = BatchLine {
        custom_id: q.request.client_request_id.clone(),
        request: q.request,
    };
    let meta = Meta {
        request_id: q.request_id,
        attempt: q.attempt,
        item: q.item,
        evidence_hash: q.evidence_hash,
        ticket: q.ticket,
    };
    // A line the provider would refuse is refused here, with its reason,
    // and never recorded nor uploaded; the others go on.
    let bytes = match b.adapter.split(std::slice::from_ref(&line)) {
        Ok(chunks) => chunks.iter().map(|c| c.bytes).sum::<u64>(),
        Err(e) => {
            let refused = Delivered {
                request_id: meta.request_id,
                attempt: meta.attempt,
                reply: Reply::Refused(format!(
                    "refused before upload: this request cannot go in a {} batch: {}",
                    b.adapter.name(),
                    e.reason
                )),
            };
            drop(meta);
            let me = b.clone();
            b.spawn(async move { me.deliver(vec![refused]).await });
            return true;
        }
    };
    let full = f.lines() >= s.max_requests || f.bytes() + bytes > s.max_bytes;
    if !f.is_empty() && full && !cut(b, f).await {
        return false;
    }
    f.push(line, meta, bytes);
    if f.lines() >= s.max_requests {
        return cut(b, f).await;
    }
    // `auto` records nothing until the batch is sure to be made: fewer
    // requests than `min_batch_size` go synchronously.
    let sure = s.mode != BatchMode::Auto || f.lines() >= s.min_batch_size;
    if f.pending.len() >= RECORD_PIECE && sure {
        return record(b, f).await;
    }
    true
}

/// Record the lines not yet recorded: with the batch itself the first
/// time (once a place among the open batches is free), else added to it.
/// Intent before side effect: every line and its attempt are on disk
/// before a byte is uploaded; the lines' items are let go (the batch's
/// lease covers them) and their prompts are dropped here.
async fn record(b: &Arc<Batcher>, f: &mut Forming) -> bool {
    if f.pending.is_empty() {
        return true;
    }
    // The batch's totals once these lines are in.
    let (total, bytes) = (f.lines(), f.bytes());
    let n = f.pending.len();
    let mut tickets = Vec::with_capacity(n);
    let lines: Vec<NewBatchLine> = f
        .pending
        .drain(..)
        .map(|(l, m)| {
            tickets.push(m.ticket);
            NewBatchLine {
                custom_id: l.custom_id,
                request_id: m.request_id,
                attempt: m.attempt,
                system_prompt: l.request.system,
                user_prompt: l.request.user,
                evidence_hash: m.evidence_hash,
                release: Some(m.item),
            }
        })
        .collect();
    let written = match &f.recorded {
        Some(r) => {
            b.write(WriteOp::Batch(BatchOp::AddLines {
                tag: r.tag.clone(),
                session_id: b.session_id.clone(),
                lines,
                request_count: total as u64,
                input_bytes: bytes,
            }))
            .await
        }
        None => create_batch(b, f, lines, total, bytes).await,
    };
    if !written {
        return false;
    }
    // The lines' budget goes with the batch; their tickets no longer count
    // them against what the feed may claim ahead.
    let reserved: f64 = tickets.iter_mut().map(Ticket::take_reserved).sum();
    drop(tickets);
    if let Some(r) = f.recorded.as_mut() {
        r.lines += n;
        r.bytes = bytes;
        r.tokens += f.pending_tokens;
        r.reserved += reserved;
    }
    f.pending_bytes = 0;
    f.pending_tokens = 0;
    b.stats.sent.fetch_add(n as u64, Ordering::Relaxed);
    b.stats.in_flight.fetch_add(n as u64, Ordering::Relaxed);
    b.stats.batched.fetch_add(n as u64, Ordering::Relaxed);
    true
}

/// The first lines of a new batch: it takes an open slot, gets its tag and
/// goes on record with them (not yet sent). False when the run stops or
/// the write fails.
async fn create_batch(
    b: &Arc<Batcher>,
    f: &mut Forming,
    lines: Vec<NewBatchLine>,
    total: usize,
    bytes: u64,
) -> bool {
    let permit = tokio::select! {
        p = b.open_slots.clone().acquire_owned() => match p {
            Ok(p) => p,
            Err(_) => return false,
        },
        // Not recorded, not sent: the requests stay pending.
        _ = b.stop_forming.cancelled() => return false,
    };
    let tag = b.new_tag();
    let created_at = now_ts();
    let record = NewBatch {
        tag: tag.clone(),
        session_id: b.session_id.clone(),
        stage: b.stage().name.clone(),
        provider: b.stage().provider_name.clone(),
        provider_kind: b.stage().provider_kind.as_str().to_string(),
        model: b.stage().model.clone(),
        input_bytes: bytes,
        request_count: total as u64,
        lines,
        claimed_by: b.lease.worker_id.to_string(),
        lease_until: now_ts() + b.lease.secs,
    };
    let written = b.write(WriteOp::Batch(BatchOp::Create(record))).await;
    if written {
        b.open.fetch_add(1, Ordering::Relaxed);
        f.recorded = Some(Recorded {
            tag,
            created_at,
            lines: 0,
            bytes: 0,
            tokens: 0,
            reserved: 0.0,
            permit,
        });
    }
    written
}

/// Cut the batch being formed: record its last lines and hand it to a
/// runner, or send its lines back to go synchronously when `auto` has too
/// few. False when it could not be recorded.
async fn cut(b: &Arc<Batcher>, f: &mut Forming) -> bool {
    if f.is_empty() {
        return true;
    }
    let s = b.settings;
    if f.recorded.is_none() && s.mode == BatchMode::Auto && f.lines() < s.min_batch_size {
        tracing::debug!(
            n = f.lines(),
            min = s.min_batch_size,
            "too few for a batch: synchronous"
        );
        let back: Vec<Delivered> = std::mem::take(&mut f.pending)
            .into_iter()
            .map(|(_, m)| Delivered {
                request_id: m.request_id,
                attempt: m.attempt,
                reply: Reply::GoSync,
            })
            .collect();
        *f = Forming::default();
        let me = b.clone();
        b.spawn(async move { me.deliver(back).await });
        return true;
    }
    if !record(b, f).await {
        return false;
    }
    let Some(r) = std::mem::take(f).recorded else {
        return true;
    };
    let formed = Formed {
        tag: r.tag,
        created_at: r.created_at,
        lines: r.lines,
        tokens: r.tokens,
        held: Held::new(b, r.reserved, r.lines),
        permit: r.permit,
    };
    let me = b.clone();
    b.spawn(async move { runner::run_formed(me, formed).await });
    true
}

/// The run stops forming batches: lines not recorded are dropped (they
/// stay pending; their items are let go with the worker's claims). A batch
/// recorded in part stays in the ledger, never uploaded: a resume (or the
/// worker that takes its lease over) finds nothing at the provider and
/// submits it; a cancel settles it as never run.
fn abandon(b: &Arc<Batcher>, f: Forming) {
    let Some(r) = f.recorded else { return };
    if b.is_cancelling() {
        // Still open until its lines are answered: the run waits for it.
        let me = b.clone();
        b.spawn(async move {
            runner::never_submitted(&me, &r.tag).await;
            me.open.fetch_sub(1, Ordering::Relaxed);
            drop(r.permit);
        });
    } else {
        b.open.fetch_sub(1, Ordering::Relaxed);
        drop(r.permit);
    }
}
