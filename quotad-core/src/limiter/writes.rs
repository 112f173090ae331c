//! Sync writes under way, for a reader that sums the store and memory (`Limiter::usage`).
//!
//! A round's snapshot (`Limiter::collect`) moves hits from pending to stored in memory before
//! the store has them: while its write is under way they are in neither of the places such a
//! reader sums, the store's totals and this instance's pending hits, and the reader would
//! count too few. [`Writes`] tells the reader that a write is under way, or began while it
//! read, so that it reads again once the write is done: between two writes every hit is in
//! exactly one of the two places.

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::store::StoreError;

/// How long a read waits for sync writes under way before it sums what it has: a write takes
/// milliseconds, and one the store does not answer ends at the sync task's own deadline.
const WAIT_FOR_WRITES: Duration = Duration::from_secs(2);

/// The snapshots taken and the writes of them still under way.
#[derive(Debug, Default)]
pub(super) struct Writes {
    begun: AtomicU64,
    under_way: Arc<AtomicU32>,
}

/// A snapshot's write, under way until this is dropped (written, given back, or abandoned).
#[derive(Debug)]
pub struct Writing(Arc<AtomicU32>);

impl Drop for Writing {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Writes {
    /// A snapshot is being taken: its write is under way from now on.
    pub(super) fn begin(&self) -> Writing {
        self.under_way.fetch_add(1, Ordering::SeqCst);
        self.begun.fetch_add(1, Ordering::SeqCst);
        Writing(self.under_way.clone())
    }

    /// A mark to read between writes with: none while a write is under way.
    pub(super) fn quiet(&self) -> Option<u64> {
        let mark = self.begun.load(Ordering::SeqCst);
        (self.under_way.load(Ordering::SeqCst) == 0).then_some(mark)
    }

    /// Whether no snapshot was taken since `mark`.
    pub(super) fn none_since(&self, mark: u64) -> bool {
        self.begun.load(Ordering::SeqCst) == mark
    }

    /// The snapshots taken so far: a mark for [`Writes::done_before`].
    pub(super) fn begun(&self) -> u64 {
        self.begun.load(Ordering::SeqCst)
    }

    /// Whether every write of a snapshot taken before `mark` is done. The sync task writes
    /// one snapshot at a time, so once a later one was taken, the earlier ones are done.
    pub(super) fn done_before(&self, mark: u64) -> bool {
        self.under_way.load(Ordering::SeqCst) == 0 || self.begun.load(Ordering::SeqCst) > mark
    }

    /// Runs `read` (of the store, then of this instance's unwritten hits) between two sync
    /// writes: after any write under way, and again if a snapshot was taken meanwhile.
    pub(super) async fn between<T, F, Fut>(&self, mut read: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        loop {
            // None when it gave up waiting: the read is then as good as it gets.
            let mark = self.wait(Writes::quiet).await;
            let out = read().await?;
            if mark.is_none_or(|m| self.none_since(m)) {
                return Ok(out);
            }
        }
    }

    /// Waits until every sync write of a snapshot taken before `mark` is done, for at most
    /// [`WAIT_FOR_WRITES`].
    pub(super) async fn wait_done_before(&self, mark: u64) {
        self.wait(|w| w.done_before(mark).then_some(())).await;
    }

    /// Polls the sync writes every millisecond until `ready` gives something, for at most
    /// [`WAIT_FOR_WRITES`] (then None).
    async fn wait<T>(&self, ready: impl Fn(&Writes) -> Option<T>) -> Option<T> {
        let give_up = tokio::time::Instant::now() + WAIT_FOR_WRITES;
        loop {
            if let Some(v) = ready(self) {
                return Some(v);
            }
            if tokio::time::Instant::now() >= give_up {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
