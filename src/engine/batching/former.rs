//! The former: requests wait in a buffer until a trigger fires, then the
//! buffer is cut into a batch (or, in `auto` mode with too few requests,
//! sent back to go synchronously).
//!
//! Triggers: COUNT (`max_requests`), SIZE (`max_bytes` of JSONL, measured
//! roughly here and exactly by the provider's split), TIME (`max_wait` since
//! the first request began to wait), and "settled": the feed has handed out
//! every item and nothing new came for `SETTLE`, so waiting longer would
//! only delay the last batch.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::runner::Meta;
use super::{Batcher, Delivered, Queued, Reply, SETTLE};
use crate::config::BatchMode;
use crate::provider::batch::BatchLine;

/// JSONL bytes a line adds beyond its prompt (its envelope, the model, the
/// schema reference): a rough figure for the SIZE trigger only.
const LINE_OVERHEAD: u64 = 256;

fn rough_bytes(q: &Queued) -> u64 {
    let r = &q.request;
    r.user.len() as u64 + r.system.as_ref().map_or(0, |s| s.len() as u64) + LINE_OVERHEAD
}

/// The lines waiting to be cut, as the runner takes them: their requests
/// and, beside them, their ids, items and tickets.
#[derive(Default)]
struct Buffer {
    lines: Vec<BatchLine>,
    meta: Vec<Meta>,
    bytes: u64,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
}

/// A buffer grows by doubling only this far; past it, room for a whole
/// batch is made at once. Doubling to 50,000 lines would leave a quarter
/// of the room unused and briefly hold two copies of the buffer, at the
/// moment the most prompts are held.
const GROW_BY_DOUBLING: usize = 4096;

impl Buffer {
    fn push(&mut self, q: Queued, max_requests: usize) {
        let now = Instant::now();
        self.bytes += rough_bytes(&q);
        self.first_at.get_or_insert(now);
        self.last_at = Some(now);
        if self.lines.len() == GROW_BY_DOUBLING {
            let room = max_requests.saturating_sub(self.lines.len());
            self.lines.reserve_exact(room);
            self.meta.reserve_exact(room);
        }
        self.lines.push(BatchLine {
            custom_id: q.request.client_request_id.clone(),
            request: q.request,
        });
        self.meta.push(Meta {
            request_id: q.request_id,
            attempt: q.attempt,
            item: q.item,
            ticket: q.ticket,
        });
    }

    fn len(&self) -> usize {
        self.lines.len()
    }

    fn is_empty(&self) -> bool {
        self.lines.is_empty()
    }

    fn take(&mut self) -> (Vec<BatchLine>, Vec<Meta>) {
        self.bytes = 0;
        self.first_at = None;
        self.last_at = None;
        (
            std::mem::take(&mut self.lines),
            std::mem::take(&mut self.meta),
        )
    }
}

pub(super) async fn form(b: Arc<Batcher>, mut rx: mpsc::UnboundedReceiver<Queued>) {
    let s = b.settings;
    let mut buf = Buffer::default();
    loop {
        let time_due = buf.first_at.map(|t| t + s.max_wait);
        let settle_due = (b.feed_done.load(Ordering::Relaxed) && !buf.is_empty())
            .then(|| buf.last_at.map(|t| t + SETTLE))
            .flatten();
        let due = match (time_due, settle_due) {
            (Some(a), Some(c)) => Some(a.min(c)),
            (a, c) => a.or(c),
        };
        tokio::select! {
            q = rx.recv() => match q {
                Some(q) => {
                    buf.push(q, s.max_requests);
                    if buf.len() >= s.max_requests || buf.bytes >= s.max_bytes {
                        cut(&b, buf.take());
                    }
                }
                // Every sender is gone: nothing more will come.
                None => {
                    if !buf.is_empty() && !b.stop_forming.is_cancelled() {
                        cut(&b, buf.take());
                    }
                    return;
                }
            },
            _ = sleep_until(due), if due.is_some() => cut(&b, buf.take()),
            _ = b.feed_done_notify.notified() => {}
            _ = b.stop_forming.cancelled() => {
                // Dropped: nothing was recorded for them, so their requests
                // stay pending (their items are let go with the worker's
                // claims) and their budget is given back.
                drop(buf.take());
                rx.close();
                while rx.recv().await.is_some() {}
                return;
            }
        }
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Make batches of the buffer's lines, or send them back to go
/// synchronously when `auto` has too few.
fn cut(b: &Arc<Batcher>, (lines, meta): (Vec<BatchLine>, Vec<Meta>)) {
    if lines.is_empty() {
        return;
    }
    if b.settings.mode == BatchMode::Auto && lines.len() < b.settings.min_batch_size {
        tracing::debug!(
            n = lines.len(),
            min = b.settings.min_batch_size,
            "too few for a batch: synchronous"
        );
        let back: Vec<Delivered> = meta
            .into_iter()
            .map(|m| Delivered {
                request_id: m.request_id,
                attempt: m.attempt,
                reply: Reply::GoSync,
            })
            .collect();
        drop(lines);
        let me = b.clone();
        b.spawn(async move { me.deliver(back).await });
        return;
    }
    let me = b.clone();
    b.spawn(async move { super::runner::submit_new(me, lines, meta).await });
}
