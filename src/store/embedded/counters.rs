//! The counters of the embedded store ([`Counters`]): their rows ([`super::rows`]) and the
//! journal of sync rounds not yet added to them ([`super::journal`]), which this part owns and
//! every write, read and sweep goes through.

use std::sync::{Arc, Mutex};

use super::db::Db;
use super::increments::Increments;
use super::journal::{self, Journal};
use crate::store::{BucketTotal, CounterRange, Delta, StoreResult};

/// The counter rows and what waits in the journal, in memory.
pub(super) struct Counters {
    db: Db,
    /// What the counter journal holds ([`super::journal`]).
    pub(super) journal: Arc<Mutex<Journal>>,
}

impl Counters {
    /// Counters whose journal is empty: the store just folded what a crash left
    /// ([`journal::recover`]).
    pub(super) fn new(db: Db) -> Self {
        Counters {
            db,
            journal: Arc::default(),
        }
    }

    pub(super) async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        if deltas.is_empty() {
            return Ok(());
        }
        let increments = Increments::of(deltas);
        let j = self.journal.clone();
        self.db
            .blocking(move |db| journal::write(db, &j, &increments))
            .await
    }

    pub(super) async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let ranges = ranges.to_vec();
        let j = self.journal.clone();
        self.db
            .blocking(move |db| journal::read(db, &j, &ranges))
            .await
    }

    /// One write transaction: redb has a single writer, so no other increment can land between
    /// this one and the read, and strict mode is exact on one machine.
    pub(super) async fn increment_and_read(
        &self,
        deltas: &[Delta],
        ranges: &[CounterRange],
    ) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let increments = Increments::of(deltas);
        let ranges = ranges.to_vec();
        let j = self.journal.clone();
        self.db
            .blocking(move |db| journal::increment_and_read(db, &j, &increments, &ranges))
            .await
    }

    pub(super) async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        let j = self.journal.clone();
        self.db
            .blocking(move |db| journal::delete_expired(db, &j, now_ms, budget))
            .await
    }

    /// Folds the counter journal into the rows: a store closed cleanly holds none, and an
    /// earlier release (which knows no journal) reads every count.
    pub(super) async fn flush(&self) -> StoreResult<()> {
        let j = self.journal.clone();
        self.db.blocking(move |db| journal::fold_all(db, &j)).await
    }
}
