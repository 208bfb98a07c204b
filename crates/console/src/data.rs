//! The console's ledger worker: a thread that owns the console's ledger
//! handle, reads snapshots through `ConsoleReads` when the ledger changed or
//! a second passed, and carries out decisions and controls. The UI thread
//! never waits on it.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use super::app::{Effect, Snapshot};
use docket_ledger::console::ConsoleReads;
use docket_ledger::review::{Operator, ReviewDecisions};
use docket_ledger::watch::{
    ChartData, ProviderBatchRow, ProviderBatchSummary, ReviewPage, ReviewQuery,
};
use docket_ledger::{Ledger, LedgerError, LedgerLocation};

/// From the worker to the UI.
#[derive(Debug)]
pub enum DataMsg {
    Snapshot(Box<Snapshot>),
    Toast(String),
    /// An undo made these review items pending again.
    Undone(Vec<i64>),
}

/// How many events the events pane keeps.
const EVENTS: usize = 200;
/// How many provider batches the batches overlay lists (open ones first).
const BATCHES: usize = 500;
/// A fresh read at least this often, so a dead engine's stale heartbeat shows.
const REFRESH: Duration = Duration::from_secs(1);
/// How often the loop asks whether the ledger changed: SQLite's answer is a
/// counter read, PostgreSQL's a flag its listener set (LISTEN), so a change
/// shows within this.
const TICK: Duration = Duration::from_millis(50);
/// An unchanged read is still sent this often, so ages move on screen; in
/// between, nothing is sent and the console does not redraw.
const RESEND: Duration = Duration::from_secs(30);
/// The review page is re-read on the timer this often even when the ledger
/// did not change (a crashed console's lease runs out without a write).
const REVIEW_STALE: Duration = Duration::from_secs(10);
/// A filtered page costs a trigram search (a few ms on 100,000 items);
/// while a live run keeps changing the ledger, it is re-read at most this
/// often, which still keeps another operator's decision under a second.
const FILTERED_REFRESH: Duration = Duration::from_millis(800);
/// The charts read every attempt of the session: while they are shown,
/// at most this often (and not at all while nothing changed)...
const CHARTS_REFRESH: Duration = Duration::from_secs(2);
/// ...and, on a big session whose read takes long, no more than this
/// share of the worker's time (about 1.4 s for 100,000 attempts on a
/// busy 2-core machine: then every 7 s), so the other panes stay fresh.
const CHARTS_BUSY_SHARE: u32 = 5;
/// Claims are renewed well inside their lease.
const CLAIM_RENEW: Duration = Duration::from_secs(10);
/// An operator away from the keyboard this long lets go of the item, so it
/// does not stay blocked for everyone; the next key takes it back.
const IDLE_RELEASE: Duration = Duration::from_secs(300);

/// Where waiting for the ledger got to.
enum Opening {
    Opened(Ledger),
    /// Not there (or not openable) yet: look again next tick.
    NotYet,
    /// The UI is gone.
    Stop,
}

mod writes;

pub struct DataWorker {
    ledger_path: LedgerLocation,
    workspace: PathBuf,
    operator: Operator,
    read_only: bool,
    watch: Option<String>,
    query: ReviewQuery,
    detail: Option<i64>,
    claim: Option<i64>,
    claim_at: Instant,
    review_cache: Option<(ReviewQuery, ReviewPage, Instant)>,
    /// A ledger change was seen but the (filtered) page was not re-read yet.
    review_behind: bool,
    last_key: Instant,
    /// The claim was let go for idleness (and is taken back on a key).
    claim_idle: bool,
    /// The watched session's provider batches as last read.
    batches_cache: Option<(String, Vec<ProviderBatchRow>, ProviderBatchSummary)>,
    /// The charts are on screen: read their data.
    charts_wanted: bool,
    /// The charts as last read: for which session, when, and how long the
    /// read took.
    charts_cache: Option<(String, ChartData, Instant, Duration)>,
}

impl DataWorker {
    pub fn new(workspace: PathBuf, operator: Operator, read_only: bool) -> DataWorker {
        DataWorker {
            // A location that cannot be read was refused before the console
            // opened; the workspace's file is the fallback.
            ledger_path: LedgerLocation::for_workspace(&workspace).unwrap_or_else(|_| {
                LedgerLocation::File(workspace.join(docket_ledger::LEDGER_FILE))
            }),
            workspace,
            operator,
            read_only,
            watch: None,
            query: ReviewQuery {
                limit: super::app::REVIEW_WINDOW,
                ..ReviewQuery::default()
            },
            detail: None,
            claim: None,
            claim_at: Instant::now(),
            review_cache: None,
            review_behind: false,
            last_key: Instant::now(),
            claim_idle: false,
            batches_cache: None,
            charts_wanted: false,
            charts_cache: None,
        }
    }

    /// Run until the UI drops its sender.
    pub fn run(mut self, rx: Receiver<Effect>, out: impl Fn(DataMsg) -> bool) {
        let mut ledger: Option<Ledger> = None;
        let mut last_read = Instant::now() - REFRESH;
        let mut said_missing = false;
        let mut last_sent: Option<(Snapshot, Instant)> = None;
        while let Some(mut dirty) = self.take_effects(&rx, ledger.as_ref(), &out) {
            if ledger.is_none() {
                match self.wait_for_ledger(&mut said_missing, &out) {
                    Opening::Opened(l) => {
                        ledger = Some(l);
                        dirty = true;
                    }
                    Opening::NotYet => continue,
                    Opening::Stop => break,
                }
            }
            let Some(l) = ledger.as_mut() else { continue };
            // When the ledger cannot say, the one-second timer still reads.
            let changed = l.has_changed().unwrap_or(false);
            if changed || dirty || last_read.elapsed() >= REFRESH {
                last_read = Instant::now();
                if !self.send_read(&*l, changed, dirty, &mut last_sent, &out) {
                    break;
                }
            }
            self.keep_claim(&*l);
        }
        if let Some(l) = ledger.as_ref()
            && !self.read_only
        {
            let _ = l.release_all(&self.operator);
        }
    }

    /// Wait a tick for the UI's effects and carry out every one queued.
    /// Some(whether one changes what to read), or None once the UI is gone.
    fn take_effects(
        &mut self,
        rx: &Receiver<Effect>,
        ledger: Option<&Ledger>,
        out: &impl Fn(DataMsg) -> bool,
    ) -> Option<bool> {
        let mut dirty = false;
        match rx.recv_timeout(TICK) {
            Ok(fx) => {
                // A bare key press changes nothing to read.
                dirty = !matches!(fx, Effect::Activity);
                self.apply(ledger, fx, out);
                while let Ok(fx) = rx.try_recv() {
                    dirty |= !matches!(fx, Effect::Activity);
                    self.apply(ledger, fx, out);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return None,
        }
        Some(dirty)
    }

    /// The console may open before the first import: wait for the ledger,
    /// saying once that it is missing (or cannot be opened).
    fn wait_for_ledger(&self, said_missing: &mut bool, out: &impl Fn(DataMsg) -> bool) -> Opening {
        if self.ledger_path.exists() {
            return match self.open() {
                Ok(l) => Opening::Opened(l),
                Err(e) => {
                    if !*said_missing {
                        out(DataMsg::Toast(e));
                        *said_missing = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    Opening::NotYet
                }
            };
        }
        if !*said_missing {
            *said_missing = true;
            let msg = format!(
                "{}: no ledger yet (import items with `docket import FILE`)",
                self.ledger_path
            );
            if !out(DataMsg::Toast(msg)) {
                return Opening::Stop;
            }
            if !out(DataMsg::Snapshot(Box::default())) {
                return Opening::Stop;
            }
        }
        Opening::NotYet
    }

    /// Read a snapshot and send it, unless it is the same as the last one
    /// sent a short while ago; a failed read is a toast. False once the UI
    /// is gone.
    fn send_read(
        &mut self,
        l: &Ledger,
        changed: bool,
        dirty: bool,
        last_sent: &mut Option<(Snapshot, Instant)>,
        out: &impl Fn(DataMsg) -> bool,
    ) -> bool {
        match self.read(l, changed, dirty) {
            Ok(snap) => {
                let unchanged = last_sent.as_ref().is_some_and(|(prev, at)| {
                    !dirty && at.elapsed() < RESEND && prev.same_data(&snap)
                });
                if !unchanged {
                    *last_sent = Some((snap.clone(), Instant::now()));
                    return out(DataMsg::Snapshot(Box::new(snap)));
                }
                true
            }
            Err(e) => {
                tracing::warn!("console read failed: {e}");
                out(DataMsg::Toast(format!("ledger read failed: {e}")))
            }
        }
    }

    /// Renew the claim on the item in view well inside its lease, or let
    /// it go when the operator has been away from the keyboard.
    fn keep_claim(&mut self, l: &Ledger) {
        if let Some(id) = self.claim
            && !self.claim_idle
            && self.claim_at.elapsed() >= CLAIM_RENEW
        {
            self.claim_at = Instant::now();
            if self.last_key.elapsed() >= IDLE_RELEASE {
                self.claim_idle = true;
                let _ = l.release(id, &self.operator);
            } else {
                let _ = l.claim(id, &self.operator);
            }
        }
    }

    fn open(&self) -> Result<Ledger, String> {
        let ledger = if self.read_only {
            Ledger::open_read_only(&self.ledger_path)
        } else {
            Ledger::open(&self.ledger_path)
        };
        ledger.map_err(|e| e.to_string())
    }

    /// `changed`: another connection wrote since the last read; `force`: we
    /// did (or the operator asked for something), so nothing may be reused.
    fn read<R: ConsoleReads + ?Sized>(
        &mut self,
        db: &R,
        changed: bool,
        force: bool,
    ) -> Result<Snapshot, LedgerError> {
        let sessions = db.sessions()?;
        let id = self
            .watch
            .clone()
            .or_else(|| sessions.first().map(|s| s.session_id.clone()));
        let (view, events) = match &id {
            Some(id) => (db.session_view(id)?, db.events(id, EVENTS)?),
            None => (None, Vec::new()),
        };
        let (batches, batch_summary) = match &id {
            Some(id) => self.batches(db, id, changed || force)?,
            None => (Vec::new(), ProviderBatchSummary::default()),
        };
        // Read every pass, not only on a change: a dead worker writes
        // nothing, and time alone turns it from alive to gone.
        let workers = match &id {
            Some(id) => db.workers(id)?,
            None => Vec::new(),
        };
        let charts = match &id {
            Some(id) if self.charts_wanted => Some(self.charts(db, id, changed || force)?),
            _ => None,
        };
        let review = self.review(db, changed, force)?;
        let detail = match self.detail {
            Some(rid) => db.review_detail(rid)?,
            None => None,
        };
        Ok(Snapshot {
            sessions,
            view,
            events,
            review,
            detail,
            batches,
            batch_summary,
            workers,
            charts,
            now: docket_ledger::now_ts(),
        })
    }

    /// The session's charts, re-read when the ledger changed (or another
    /// session is watched), but at most every [`CHARTS_REFRESH`] (longer
    /// when the read is slow: [`CHARTS_BUSY_SHARE`]).
    fn charts<R: ConsoleReads + ?Sized>(
        &mut self,
        db: &R,
        session_id: &str,
        changed: bool,
    ) -> Result<ChartData, LedgerError> {
        if let Some((id, data, at, took)) = &self.charts_cache
            && id == session_id
            && (!changed || at.elapsed() < CHARTS_REFRESH.max(*took * CHARTS_BUSY_SHARE))
        {
            return Ok(data.clone());
        }
        let started = Instant::now();
        let data = db.charts(session_id)?;
        let cached = (
            session_id.to_string(),
            data.clone(),
            started,
            started.elapsed(),
        );
        self.charts_cache = Some(cached);
        Ok(data)
    }

    /// The session's provider batches, re-read only when the ledger changed
    /// (or another session is watched).
    fn batches<R: ConsoleReads + ?Sized>(
        &mut self,
        db: &R,
        session_id: &str,
        changed: bool,
    ) -> Result<(Vec<ProviderBatchRow>, ProviderBatchSummary), LedgerError> {
        if let Some((id, rows, summary)) = &self.batches_cache
            && id == session_id
            && !changed
        {
            return Ok((rows.clone(), summary.clone()));
        }
        let rows = db.provider_batches(session_id, BATCHES)?;
        let summary = db.provider_batch_summary(session_id)?;
        self.batches_cache = Some((session_id.to_string(), rows.clone(), summary.clone()));
        Ok((rows, summary))
    }

    /// The review page, re-read only when it can have changed.
    fn review<R: ConsoleReads + ?Sized>(
        &mut self,
        db: &R,
        changed: bool,
        force: bool,
    ) -> Result<ReviewPage, LedgerError> {
        if let Some((q, page, at)) = &self.review_cache
            && *q == self.query
            && !force
        {
            let age = at.elapsed();
            let throttled = q.filter.is_some() && age < FILTERED_REFRESH;
            if changed && throttled {
                // Re-read on the next pass once the throttle allows.
                self.review_behind = true;
                return Ok(page.clone());
            }
            let due = self.review_behind && age >= FILTERED_REFRESH;
            if !changed && !due && age < REVIEW_STALE {
                return Ok(page.clone());
            }
        }
        self.review_behind = false;
        let page = db.review_page(&self.query)?;
        self.review_cache = Some((self.query.clone(), page.clone(), Instant::now()));
        Ok(page)
    }
}
