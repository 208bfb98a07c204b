//! A finished batch's results, applied while they are read. The adapter
//! streams the results file line by line into a [`ResultSink`]; this one
//! matches each line to the request it answers and queues it, and a
//! consumer beside the read hands the queue to the engine a chunk at a
//! time. The read waits whenever `RESULTS_AHEAD` results are queued but
//! not yet applied, so a 50,000-line batch never sits in memory whole:
//! applying is slower than downloading.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc};

use super::runner::{DELIVER_CHUNK, Held};
use super::{Batcher, Delivered, Reply};
use docket_providers::ProviderError;
use docket_providers::batch::{BatchStatus, LineOutcome, ResultLine, ResultSink, ResultsSummary};

/// Results read but not yet applied, at most (two chunks: one being
/// applied, one ready).
const RESULTS_AHEAD: usize = 2 * DELIVER_CHUNK;

/// What one read of a batch's results came to.
pub(super) struct Applied {
    /// The adapter's answer: its summary, or why the read failed; None
    /// when the runner was detached while reading (what was queued by then
    /// is applied all the same).
    pub read: Option<Result<ResultsSummary, ProviderError>>,
    /// The custom ids of the results applied (what came before a break
    /// counts too).
    pub ids: Vec<String>,
}

/// Read `status`'s results and apply each line that answers a request in
/// `waiting` (custom id → (request id, attempt)); a line for anything else
/// was applied before and is skipped. `held` gives back each applied
/// line's budget.
pub(super) async fn read_and_apply(
    b: &Batcher,
    status: &BatchStatus,
    expected: &HashSet<String>,
    waiting: HashMap<String, (i64, i64)>,
    held: &mut Held,
) -> Applied {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    let applied_some = Arc::new(Notify::new());
    let mut sink = Matching {
        waiting,
        tx,
        queued: queued.clone(),
        applied_some: applied_some.clone(),
    };
    let read = async move {
        let read = tokio::select! {
            r = b.adapter.results(status, expected, &mut sink) => Some(r),
            _ = b.detached.cancelled() => None,
        };
        // The queue closes with the sink: the consumer ends once it is empty.
        drop(sink);
        read
    };
    let apply = async {
        let mut ids = Vec::new();
        let mut chunk = Vec::with_capacity(DELIVER_CHUNK);
        while let Some((id, d)) = rx.recv().await {
            ids.push(id);
            chunk.push(d);
            while chunk.len() < DELIVER_CHUNK {
                match rx.try_recv() {
                    Ok((id, d)) => {
                        ids.push(id);
                        chunk.push(d);
                    }
                    Err(_) => break,
                }
            }
            let n = chunk.len();
            held.give_back(n);
            b.deliver(std::mem::replace(
                &mut chunk,
                Vec::with_capacity(DELIVER_CHUNK),
            ))
            .await;
            queued.fetch_sub(n, Ordering::AcqRel);
            applied_some.notify_one();
        }
        ids
    };
    let (read, ids) = tokio::join!(read, apply);
    Applied { read, ids }
}

/// The sink: a line that answers a waiting request is queued for the
/// consumer.
struct Matching {
    waiting: HashMap<String, (i64, i64)>,
    tx: mpsc::UnboundedSender<(String, Delivered)>,
    queued: Arc<AtomicUsize>,
    applied_some: Arc<Notify>,
}

impl ResultSink for Matching {
    fn accept(&mut self, line: ResultLine) {
        docket_model::failpoint::hit("mid_ingest");
        // A line applied before a cut is read again: not twice.
        let Some((request_id, attempt)) = self.waiting.remove(&line.custom_id) else {
            return;
        };
        let reply = match line.outcome {
            LineOutcome::Answer(a) => Reply::Answer(a),
            LineOutcome::Error(e) => Reply::Error(e),
            LineOutcome::NotRun(why) => Reply::NotRun(why),
        };
        let d = Delivered {
            request_id,
            attempt,
            reply,
        };
        self.queued.fetch_add(1, Ordering::AcqRel);
        // The consumer outlives the read (it ends when this sink drops).
        let _ = self.tx.send((line.custom_id, d));
    }

    fn room(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            // notify_one keeps a permit when nobody waits, so a chunk
            // applied between the check and the wait is not missed.
            while self.queued.load(Ordering::Acquire) >= RESULTS_AHEAD {
                self.applied_some.notified().await;
            }
        })
    }
}
