//! Sync writes under way, for a reader that sums the store and memory (`Limiter::usage`).
//!
//! A round's snapshot (`Limiter::collect`) moves hits from pending to stored in memory before
//! the store has them: while its write is under way they are in neither of the places such a
//! reader sums, the store's totals and this instance's pending hits, and the reader would
//! count too few. [`Writes`] tells the reader that a write is under way, or began while it
//! read, so that it reads again once the write is done: between two writes every hit is in
//! exactly one of the two places.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

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
}
