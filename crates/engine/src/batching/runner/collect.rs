//! Collecting a finished batch: its results applied to their items, the
//! lines without a result told why, and its files deleted at the provider.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::poll::{backoff, pause};
use super::{Tracked, deliver_in_chunks, failed_batch_error, hold, line_ids, settle, waiting_ids};
use crate::batching::{Batcher, Delivered, Reply};
use docket_ledger::batches::{BatchOp, LineId};
use docket_ledger::writer::WriteOp;
use docket_providers::batch::{BatchState, BatchStatus, ResultsSummary};
use docket_providers::{ErrorClass, ProviderError};

/// Results fetches after which the lines are held for the operator (the
/// results may be gone at the provider): about an hour of tries.
const RESULTS_TRIES_MAX: u32 = 70;

/// Results fetches tried (a cut stream, a file not there yet) before the
/// operator is told; fetching goes on, slower, until the run stops.
const RESULTS_TRIES_BEFORE_EVENT: u32 = 5;

/// Read the results of a finished batch and apply them to their items, a
/// chunk at a time; every line not answered by a result line hears why
/// (never run, failed batch, no line). The lines waiting are read from the
/// ledger, so a re-read after a cut stream applies only what is missing.
pub(super) async fn collect(b: &Arc<Batcher>, t: &mut Tracked, status: &BatchStatus) {
    // One batch's results in memory at a time.
    let Ok(_turn) = b.collecting.acquire().await else {
        return;
    };
    let Some(read) = read_results(b, t, status).await else {
        return;
    };
    if b.detached.is_cancelled() {
        return;
    }
    let quarantined_any = read.quarantined_any;
    let Some(left) = answer_the_rest(b, t, status, read).await else {
        return;
    };
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

/// What the reads of a batch's results came to.
#[derive(Default)]
struct ResultsRead {
    /// Lines whose result this run applied (one that stopped before its
    /// outcome still waits, and is not "without a result").
    applied: HashSet<String>,
    /// Lines the last whole read found no result line for, where the
    /// provider writes one for every request: whether they ran is unknown,
    /// whatever the batch's state.
    missing: HashSet<String>,
    /// Result lines that could not be used: the results files are kept at
    /// the provider to be looked at.
    quarantined_any: bool,
}

/// Read the batch's results (again while the stream breaks off) and apply
/// them. None when the run let go of the batch, or its results could not
/// be had and its lines wait for the operator.
async fn read_results(
    b: &Arc<Batcher>,
    t: &mut Tracked,
    status: &BatchStatus,
) -> Option<ResultsRead> {
    let mut tries = 0u32;
    let has_results = status.output_ref.is_some() || status.error_ref.is_some();
    let mut read = ResultsRead::default();
    while has_results && !b.detached.is_cancelled() {
        tries += 1;
        let (Some(expected), Some(waiting)) =
            (line_ids(b, &t.tag).await, waiting_ids(b, &t.tag).await)
        else {
            return None;
        };
        if waiting.is_empty() {
            break;
        }
        let waiting: HashMap<String, (i64, i64)> = waiting
            .into_iter()
            .map(|w| (w.custom_id, (w.request_id, w.attempt)))
            .collect();
        let now =
            crate::batching::applying::read_and_apply(b, status, &expected, waiting, &mut t.held)
                .await;
        drop(expected);
        let delivered = now.ids.len() as u64;
        read.applied.extend(now.ids);
        match now.read? {
            Ok(sum) => {
                if !read.take_summary(b, t, sum, delivered).await {
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
                give_up_results(b, t, tries, &e).await;
                return None;
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
            return None;
        }
    }
    Some(read)
}

impl ResultsRead {
    /// Take in one read's summary: its quarantined lines told, its missing
    /// lines kept, the ingest on record. True when the stream broke off and
    /// the rest must be read again.
    async fn take_summary(
        &mut self,
        b: &Batcher,
        t: &Tracked,
        sum: ResultsSummary,
        delivered: u64,
    ) -> bool {
        let quarantined = sum.quarantined.len() as u64 + sum.quarantined_more;
        self.quarantined_any |= quarantined > 0;
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
        self.missing = sum.missing.into_iter().collect();
        b.write(WriteOp::Batch(BatchOp::Ingested {
            tag: t.tag.clone(),
            delivered,
            quarantined: sum.quarantined,
            quarantined_more: sum.quarantined_more,
        }))
        .await;
        sum.cut
    }
}

/// The results cannot be fetched, try after try: paid for, but not to be
/// had, the lines wait for the operator rather than be sent (and paid for)
/// again.
async fn give_up_results(b: &Batcher, t: &Tracked, tries: u32, e: &ProviderError) {
    let why = format!(
        "batch {}: its results could not be fetched after {tries} tries ({e}); its requests wait. Check the batch at the provider, then resume",
        t.tag
    );
    b.event("error", "batch_results_failed", why.clone());
    if let Some(w) = waiting_ids(b, &t.tag).await {
        hold(b, w.len());
    }
}

/// Every line no result line spoke for hears why: the batch failed, it
/// ended before the line ran, or it has no result line. Returns how many
/// (None when the run let go of the batch).
async fn answer_the_rest(
    b: &Arc<Batcher>,
    t: &mut Tracked,
    status: &BatchStatus,
    read: ResultsRead,
) -> Option<usize> {
    let ResultsRead {
        applied, missing, ..
    } = read;
    let waiting = waiting_ids(b, &t.tag).await?;
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
    Some(left)
}

/// Row B2: a batch docket is done with (terminal, every line's outcome
/// recorded) leaves nothing in the provider's file storage: its uploaded
/// input is deleted, and its results files too unless `results` is None
/// (some result lines could not be used: the files are kept to be looked
/// at, and expire at the provider on their own). A file already gone is
/// fine; a failure is told, never fatal.
pub(in crate::batching) async fn delete_files(
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
