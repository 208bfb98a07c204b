//! The ledger writer: one thread owns the write connection and applies
//! operations in order. Operations that arrive together share one immediate
//! transaction (group commit); each still commits whole with the counters it
//! changes, and its sender hears back only after the commit, so "recorded
//! before the HTTP call" means on disk, not in a queue.
//!
//! Intents (`WriteOp::Send`) go first, in a transaction of their own, and
//! never wait for more writes to join: a request waits for its intent while
//! it holds one of the provider's concurrency slots, so every millisecond an
//! intent waits is a slot standing idle. Everything else (results,
//! heartbeats, events) holds no slot, and waits for the intents and for a
//! fuller group.

use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

mod apply;
mod counters;
mod fence;
mod group;
mod health;
mod linger;
mod ops;
mod outcomes;
mod transaction;

pub use crate::review::NO_SUGGESTION;
pub use health::Health;
pub use ops::{
    AttemptRecord, Fence, FinalResult, MadeRequest, NewRequest, RequestReply, SendIntent,
    StageDone, WriteError, WriteOp,
};

type Reply = oneshot::Sender<Result<(), WriteError>>;
type Queued = (WriteOp, Option<Fence>, Option<Reply>);

#[derive(Clone)]
pub struct LedgerWriter {
    tx: mpsc::UnboundedSender<Queued>,
    health: Arc<Health>,
}

pub struct WriterHandle {
    thread: Option<JoinHandle<()>>,
}

impl WriterHandle {
    /// Wait for every queued write to commit (all senders must be dropped).
    pub fn join(mut self) {
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl LedgerWriter {
    pub fn start(
        at: impl Into<crate::LedgerLocation>,
    ) -> Result<(LedgerWriter, WriterHandle), crate::LedgerError> {
        let location = at.into();
        let conn = location.connect(false)?;
        if let Some(c) = conn.sqlite() {
            // The writer touches the same hot pages (session row, indexes)
            // in every transaction: a larger cache keeps them out of the
            // read path.
            c.pragma_update(None, "cache_size", -16_384)
                .map_err(crate::LedgerError::Sql)?;
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let health = Arc::new(Health::default());
        let writer_health = health.clone();
        let thread = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || {
                crate::db::busy::watch_this_thread(writer_health.busy.clone());
                group::run(conn, rx, &writer_health)
            })
            .map_err(|e| crate::LedgerError::Corrupt {
                path: location.to_string(),
                detail: format!("cannot start writer thread: {e}"),
            })?;
        Ok((
            LedgerWriter { tx, health },
            WriterHandle {
                thread: Some(thread),
            },
        ))
    }

    /// Apply `op` and wait for its commit.
    pub async fn write(&self, op: WriteOp) -> Result<(), WriteError> {
        self.send(op, None).await
    }

    /// Apply `op` only while `fence` holds, and wait for its commit.
    pub async fn write_fenced(&self, op: WriteOp, fence: Fence) -> Result<(), WriteError> {
        self.send(op, Some(fence)).await
    }

    async fn send(&self, op: WriteOp, fence: Option<Fence>) -> Result<(), WriteError> {
        let stopped = || WriteError::Failed("ledger writer has stopped".to_string());
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((op, fence, Some(reply)))
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| stopped())?
    }

    /// Queue `op` without waiting (heartbeats).
    pub fn post(&self, op: WriteOp) {
        let _ = self.tx.send((op, None, None));
    }

    /// Whether the ledger's disk is full (`Health`).
    pub fn health(&self) -> &Health {
        &self.health
    }
}

#[cfg(test)]
mod tests;
