//! What the engine may ask of a running writer: whether the ledger's disk
//! is full, how long it has waited for another process's write lock, and
//! how many held writes were given up.

use std::sync::Arc;

/// A ledger whose disk is full (fault-matrix row D2): the writer keeps the
/// group that could not commit in memory and tries it again every
/// `FULL_RETRY`, so paid answers are not lost to a full disk; every write
/// queued behind it waits, so nothing new is sent. The engine shows it and
/// gives up (`give_up`) when the run is abandoned.
#[derive(Default)]
pub struct Health {
    pub(super) full: std::sync::Mutex<Option<(std::time::Instant, String)>>,
    held: std::sync::atomic::AtomicUsize,
    give_up: std::sync::atomic::AtomicBool,
    /// Writes held for a full disk and then given up, in all.
    pub(super) dropped: std::sync::atomic::AtomicUsize,
    /// The writer thread's wait for a write lock another process holds
    /// past the busy timeout (row D1; `db::busy`).
    pub(super) busy: Arc<crate::db::busy::BusyWatch>,
}

impl Health {
    /// Since when the ledger's disk has been full, why, and how many
    /// writes are held in memory for it.
    pub fn full(&self) -> Option<(std::time::Duration, String, usize)> {
        let full = self.full.lock().unwrap_or_else(|p| p.into_inner());
        full.as_ref().map(|(since, why)| {
            (
                since.elapsed(),
                why.clone(),
                self.held.load(std::sync::atomic::Ordering::Relaxed),
            )
        })
    }

    /// How long the writer has waited for the ledger's write lock, which
    /// another process has held past the busy timeout (row D1): every
    /// write queued meanwhile waits in memory, so nothing new is sent.
    pub fn busy(&self) -> Option<std::time::Duration> {
        self.busy.busy_for()
    }

    /// Writes held for a full disk and then given up (they failed), in all.
    pub fn dropped(&self) -> usize {
        self.dropped.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Stop holding: the writes that cannot commit fail (the run is being
    /// abandoned; what they held is counted ambiguous on resume).
    pub fn give_up(&self) {
        self.give_up
            .store(true, std::sync::atomic::Ordering::Relaxed);
        self.busy.give_up();
    }

    pub(super) fn set_full(&self, why: Option<String>, held: usize) {
        let mut full = self.full.lock().unwrap_or_else(|p| p.into_inner());
        match why {
            Some(why) => {
                if full.is_none() {
                    *full = Some((std::time::Instant::now(), why));
                }
                self.held.store(held, std::sync::atomic::Ordering::Relaxed);
            }
            None => {
                *full = None;
                self.held.store(0, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    pub(super) fn giving_up(&self) -> bool {
        self.give_up.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How often a group that met a full disk is tried again.
pub(super) const FULL_RETRY: std::time::Duration = std::time::Duration::from_secs(2);
/// How long a full disk is waited for before the writes fail (the run then
/// stops, resumable, exit 6).
pub(super) const FULL_GIVE_UP: std::time::Duration = std::time::Duration::from_secs(30 * 60);
