//! A value per stage of the job, each behind its own lock (the run's
//! watches keep their counts this way).

use std::sync::{Mutex, MutexGuard};

pub(super) struct PerStage<T>(Vec<Mutex<T>>);

impl<T: Default> PerStage<T> {
    pub(super) fn new(stages: usize) -> Self {
        PerStage((0..stages).map(|_| Mutex::new(T::default())).collect())
    }

    /// Stage `k`'s value, locked (a poisoned lock still gives it: the
    /// counts stay usable); None past the last stage.
    pub(super) fn get(&self, k: usize) -> Option<MutexGuard<'_, T>> {
        self.0
            .get(k)
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()))
    }
}
