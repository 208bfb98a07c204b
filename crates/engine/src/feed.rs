//! The feed: claim the session's items from the ledger page by page and
//! hand each to a task that runs it through a group of stages. A pass in
//! order over the items nobody holds, then, until no other worker holds
//! any, the items other workers let go or lost.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;

use super::ctx::{Ctx, PAGE, StopCause};
use super::{EngineError, Prepared};
use docket_ledger::Ledger;
use docket_ledger::queue::ClaimScope;
use docket_ledger::store::WorkItem;
use docket_ledger::work::WorkQueue;
use docket_ledger::writer::WriteOp;
use docket_providers::limiter::Slot;

/// How often a worker with nothing left to claim looks again while other
/// workers still hold items (to take over any whose lease runs out).
const TAKEOVER_POLL: Duration = Duration::from_secs(1);

/// The job's stages in groups: a stage that waits for the whole previous
/// stage starts a new group. Items move through a group's stages one by
/// one; a group starts once the one before it is over for every item.
pub(super) fn stage_groups(p: &Prepared) -> Vec<std::ops::Range<usize>> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (k, st) in p.stages.iter().enumerate().skip(1) {
        if st.wait_for_previous {
            groups.push(start..k);
            start = k;
        }
    }
    groups.push(start..p.stages.len());
    groups
}

/// Run every group in turn over the items that have no outcome yet.
pub(super) async fn feed(ctx: &Arc<Ctx>, read: &Arc<Mutex<Ledger>>) -> Result<(), EngineError> {
    for group in stage_groups(&ctx.p) {
        if ctx.soft_stop.is_cancelled() || (group.start > 0 && ctx.stops_before(group.start)) {
            break;
        }
        feed_group(ctx, read, group).await?;
    }
    for b in ctx.batchers() {
        b.feed_done();
    }
    Ok(())
}

/// Claim the items without an outcome page by page and hand each to a
/// task for the stages of `group`. First a pass in order over the items
/// nobody holds; then, until no other worker holds any, the items other
/// workers let go or lost (their lease ran out): the group is over for this
/// worker only when nobody has any of its work left.
async fn feed_group(
    ctx: &Arc<Ctx>,
    read: &Arc<Mutex<Ledger>>,
    group: std::ops::Range<usize>,
) -> Result<(), EngineError> {
    let mut f = GroupFeed {
        ctx,
        read,
        group,
        workers: JoinSet::new(),
        scope: ClaimScope::After(-1),
        next_page: None,
        looked_last: false,
    };
    loop {
        if ctx.soft_stop.is_cancelled() {
            break;
        }
        if !ctx.wait_unpaused().await {
            break;
        }
        let page = match f.next_page.take() {
            Some(claiming) => claimed(claiming).await?,
            None => {
                let Some(n) = room_to_claim(ctx).await else {
                    break;
                };
                claimed(start_claim(ctx, read, f.scope, n)).await?
            }
        };
        if page.is_empty() {
            if f.on_empty_page().await? {
                continue;
            }
            break;
        }
        if !f.hand_out(page).await {
            break;
        }
    }
    f.finish().await;
    Ok(())
}

/// Claim only what can start soon (a claimed item waiting here is one
/// another worker cannot take): wait until the claims held ahead are low
/// enough, then say how many to claim. None when the run stops meanwhile.
async fn room_to_claim(ctx: &Ctx) -> Option<usize> {
    // Top the claims up once half of what this worker may hold ahead has
    // been worked off.
    let ahead = ctx.claim_ahead();
    // Synchronously, top up once half is worked off (one claim
    // per half, not per item); in batch mode keep the buffer
    // full, or the COUNT trigger could never fire.
    let low_water = if ctx.batchers().any(|b| b.takes_new()) {
        ahead.saturating_sub(1)
    } else {
        ahead / 2
    };
    while ctx.held_ahead() > low_water {
        tokio::select! {
            _ = ctx.claim_room.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = ctx.soft_stop.cancelled() => return None,
        }
    }
    Some(ahead.saturating_sub(ctx.held_ahead()).clamp(1, PAGE))
}

/// The run stopped: what was not started goes back.
struct Stopped;

/// One group's feed: the tasks it started, where its claims stand, and the
/// next page when it is claimed ahead.
struct GroupFeed<'a> {
    ctx: &'a Arc<Ctx>,
    read: &'a Arc<Mutex<Ledger>>,
    group: std::ops::Range<usize>,
    /// The tasks started for the group's items.
    workers: JoinSet<()>,
    scope: ClaimScope,
    /// The next page, claimed while this one is handed out.
    next_page: Option<Claiming>,
    /// Taking over, no other worker held anything at the last look: one
    /// more claim is made before leaving (see `on_empty_page`).
    looked_last: bool,
}

impl GroupFeed<'_> {
    /// No item came: after the first pass, look for what other workers let
    /// go or lost; after that, wait while another worker still holds work.
    /// False when the group is over for this worker (or the run stops).
    async fn on_empty_page(&mut self) -> Result<bool, EngineError> {
        let ctx = self.ctx;
        match self.scope {
            ClaimScope::After(_) => {
                // The first pass is over: cut what waits for a batch
                // without waiting for the TIME trigger, and once this
                // worker's own items are done, look for what others let
                // go or lost.
                for b in ctx.batchers() {
                    b.feed_done();
                }
                while let Some(done) = self.workers.join_next().await {
                    note_crash(ctx, done);
                }
                ctx.flush().await;
                self.scope = ClaimScope::Takeover;
                Ok(true)
            }
            ClaimScope::Takeover => {
                // The ledger first: a batch adopted from another
                // worker is counted as this worker's (`adopting`)
                // before the ledger hands it over, so it is seen by
                // one check or the other, never missed by both.
                if !others_hold_work(ctx, self.read).await? && !mine_in_batches(ctx) {
                    // A lease that ran out between the empty claim and
                    // this look is no longer counted as held, yet nobody
                    // took its item: claim once more, at once, and leave
                    // only when that finds nothing either (row C2: a
                    // stalled worker's items were left behind).
                    let leave = self.looked_last;
                    self.looked_last = true;
                    return Ok(!leave);
                }
                self.looked_last = false;
                // Another worker still works on items: wait for it to
                // finish them, or for its lease to run out.
                tokio::select! {
                    _ = tokio::time::sleep(TAKEOVER_POLL) => Ok(true),
                    _ = ctx.soft_stop.cancelled() => Ok(false),
                }
            }
        }
    }

    /// Hand each item of the page to a task of its own, claiming the next
    /// page ahead when it is time. False when the run stopped (what was
    /// not started is let go).
    async fn hand_out(&mut self, page: Vec<WorkItem>) -> bool {
        let ctx = self.ctx;
        self.looked_last = false;
        ctx.claims.fetch_add(page.len() as u64, Ordering::Relaxed);
        docket_model::failpoint::hit("after_claim");
        let last_position = page.last().map_or(-1, |i| i.position);
        let mut page = page.into_iter();
        while let Some(item) = page.next() {
            if let ClaimScope::After(after) = &mut self.scope {
                *after = item.position;
            }
            if !ctx.wait_unpaused().await {
                release_unstarted(ctx, std::iter::once(item).chain(page));
                return false;
            }
            // Bound the tasks alive at once (in flight plus waiting to retry)
            // so a long 429 storm cannot pile up the whole session in memory.
            let permit = tokio::select! {
                p = ctx.outstanding.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return false },
                _ = ctx.soft_stop.cancelled() => {
                    release_unstarted(ctx, std::iter::once(item).chain(page));
                    return false;
                }
            };
            let Ok(slot) = first_slot(ctx, &item, &self.group).await else {
                release_unstarted(ctx, std::iter::once(item).chain(page));
                return false;
            };
            let ctx2 = ctx.clone();
            let group = self.group.clone();
            self.workers.spawn(async move {
                run_item(&ctx2, item, group, slot, None).await;
                drop(permit);
            });
            while let Some(done) = self.workers.try_join_next() {
                note_crash(ctx, done);
            }
            if self.next_page.is_none()
                && matches!(self.scope, ClaimScope::After(_))
                && let Some(n) = claim_next_now(ctx, page.len())
            {
                self.next_page = Some(start_claim(
                    ctx,
                    self.read,
                    ClaimScope::After(last_position),
                    n,
                ));
            }
        }
        true
    }

    /// The group is handed out (or the run stopped): let go of a page
    /// claimed ahead, and wait for the tasks started.
    async fn finish(mut self) {
        let ctx = self.ctx;
        // Stopped with the next page claimed: let its items go.
        if let Some(claiming) = self.next_page.take()
            && let Ok(items) = claimed(claiming).await
        {
            ctx.claims.fetch_add(items.len() as u64, Ordering::Relaxed);
            release_unstarted(ctx, items.into_iter());
        }
        // Every item of the group is handed out: cut what waits without
        // waiting for the TIME trigger.
        for b in ctx.batchers() {
            b.feed_done();
        }
        while let Some(done) = self.workers.join_next().await {
            note_crash(ctx, done);
        }
        // The items let go above are free before the next group claims them.
        ctx.flush().await;
    }
}

/// The stage this item runs first: when it goes synchronously, its slot is
/// taken here, in order, so waiting tasks do not pile up on the limiter
/// (one waiter, not hundreds, on every release).
async fn first_slot(
    ctx: &Ctx,
    item: &WorkItem,
    group: &std::ops::Range<usize>,
) -> Result<Option<Slot>, Stopped> {
    let next = item
        .stages
        .iter()
        .filter_map(|sw| {
            ctx.p
                .stages
                .iter()
                .position(|s| s.name == sw.stage)
                .map(|k| (k, sw))
        })
        .find(|(_, sw)| sw.state != "passed")
        .map(|(k, sw)| (k, sw.status == "completed"));
    match next {
        Some((k, false))
            if group.contains(&k)
                && !ctx.batcher(k).is_some_and(|b| b.takes_new())
                && !(k > 0 && ctx.stops_before(k)) =>
        {
            tokio::select! {
                s = ctx.rt(k).limiter.acquire_slot() => Ok(Some(s)),
                _ = ctx.soft_stop.cancelled() => Err(Stopped),
            }
        }
        _ => Ok(None),
    }
}

/// One claimed item through the stages of `group`, then let go of. The
/// caller counted it in `claims`.
pub(super) async fn run_item(
    ctx: &Ctx,
    item: WorkItem,
    group: std::ops::Range<usize>,
    slot: Option<docket_providers::limiter::Slot>,
    delivered: Option<super::batching::Delivered>,
) {
    let fence = ctx.fence(&item);
    let ended = super::worker::process(ctx, item, group, slot, delivered).await;
    // Without an outcome (a stop, a stop-after-stage, a later group's
    // stage) the item is let go, not left to lapse; with one, its lease
    // already ended with the outcome. Waiting as a batch line, it is let
    // go as the line is recorded.
    if ended == super::worker::Ended::Open {
        ctx.writer.post(WriteOp::ReleaseItem(fence));
    }
    ctx.claims.fetch_sub(1, Ordering::Relaxed);
    ctx.claim_room.notify_one();
}

/// Claimed items that never started (the run stopped first): let go now.
fn release_unstarted(ctx: &Ctx, items: impl Iterator<Item = WorkItem>) {
    for item in items {
        ctx.writer.post(WriteOp::ReleaseItem(ctx.fence(&item)));
        ctx.claims.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Claim the next page of `scope` for this worker.
/// A claim under way on the ledger's blocking pool.
type Claiming = tokio::task::JoinHandle<Result<Vec<WorkItem>, docket_ledger::LedgerError>>;

/// Start claiming up to `n` items of `scope`.
fn start_claim(ctx: &Arc<Ctx>, read: &Arc<Mutex<Ledger>>, scope: ClaimScope, n: usize) -> Claiming {
    let read = read.clone();
    let sid = ctx.session_id.clone();
    let worker = ctx.worker_id.clone();
    let lease = ctx.lease_secs;
    tokio::task::spawn_blocking(move || {
        let mut ledger = read.lock().unwrap_or_else(|p| p.into_inner());
        if scope == ClaimScope::Takeover {
            // A dead worker of this host is let go at once.
            for gone in ledger.expire_dead_local_workers(&sid)? {
                tracing::warn!(worker = %gone, "a worker of this host is gone: its items are free");
            }
        }
        ledger.claim_page(&sid, &worker, scope, n, lease)
    })
}

/// The items a claim took.
async fn claimed(claiming: Claiming) -> Result<Vec<WorkItem>, EngineError> {
    claiming
        .await
        .map_err(|e| EngineError::Ledger(e.to_string()))?
        .map_err(EngineError::from)
}

/// While a page is handed out with `unstarted` of its items left: how many
/// items to claim now for the next page, if it is time. A claim waits its
/// turn for the ledger's write lock (milliseconds under load); claimed only
/// once the page ran out, the slots stood idle that long on every page.
/// Synchronously the next page is claimed once half of what this worker
/// may hold ahead is left to start. Not while a batch forms: its buffer
/// sets the pace (see `feed_group`).
fn claim_next_now(ctx: &Ctx, unstarted: usize) -> Option<usize> {
    if ctx.batchers().any(|b| b.takes_new()) {
        return None;
    }
    let ahead = ctx.claim_ahead();
    (unstarted <= ahead / 2).then(|| (ahead - unstarted).clamp(1, PAGE))
}

/// Whether this worker's provider batches still hold items of the session:
/// lines waiting to be recorded, batches open at the provider, results being
/// applied. Their items come back to it (and may go on to the next stage)
/// as the results come.
fn mine_in_batches(ctx: &Ctx) -> bool {
    ctx.batchers()
        // `adopting` first: an adoption ends only once its batch counts
        // as open.
        .any(|b| b.adopting() || b.buffered() > 0 || b.open_count() > 0)
}

/// Whether another worker still holds items of the session under a live
/// lease.
async fn others_hold_work(ctx: &Arc<Ctx>, read: &Arc<Mutex<Ledger>>) -> Result<bool, EngineError> {
    let read = read.clone();
    let sid = ctx.session_id.clone();
    let worker = ctx.worker_id.clone();
    tokio::task::spawn_blocking(move || {
        let ledger = read.lock().unwrap_or_else(|p| p.into_inner());
        ledger.held_by_others(&sid, &worker)
    })
    .await
    .map_err(|e| EngineError::Ledger(e.to_string()))?
    .map(|n| n > 0)
    .map_err(EngineError::from)
}

/// A worker that panicked left its item without an outcome: stop the session
/// (resumable) rather than report it complete or lose the item silently.
pub(super) fn note_crash(ctx: &Ctx, done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        tracing::error!("a worker crashed: {e}");
        ctx.stop(StopCause::LedgerFailed(format!(
            "internal error: a worker crashed ({e}); the session is resumable"
        )));
    }
}
