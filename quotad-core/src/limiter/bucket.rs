//! A counter's buckets as the limiter keeps them: what the store said last and what this
//! instance admitted since, sorted by start. The window arithmetic (`window`) and the token
//! buckets (`tokens`) both read them; this module needs neither.

use crate::domain::LimitKind;

/// One bucket of a counter: what the store said last, and what this instance admitted since.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Start of the bucket, Unix ms, aligned on the grain.
    pub start: i64,
    /// The total the store returned at the last read (all instances, including ours); negative
    /// when a grant credited more than the bucket's hits.
    pub stored: i64,
    /// Hits admitted here and not yet written to the store.
    pub pending: u64,
    /// This instance's own shard of the bucket in the store, as far as it knows: its part of
    /// the last read, plus what its rounds sent since. The base against which a write of
    /// unknown outcome is settled (`tasks::doubts` in the server).
    pub mine: i64,
}

impl Bucket {
    #[inline]
    pub fn count(&self) -> i64 {
        self.stored
            .saturating_add(self.pending.min(i64::MAX as u64) as i64)
    }
}

/// The bucket starting at `start`, inserted empty (keeping `buckets` sorted) if missing.
#[inline]
pub fn bucket_at(buckets: &mut Vec<Bucket>, start: i64) -> &mut Bucket {
    let i = match buckets.binary_search_by_key(&start, |b| b.start) {
        Ok(i) => i,
        Err(i) => {
            // A counter's first bucket gets room for itself alone (a Vec's first push reserves
            // four): most counters at a million keys are touched in one bucket, and 72 bytes
            // each add up. Later pushes grow as usual, and the capacity stays as buckets roll.
            if buckets.capacity() == 0 {
                buckets.reserve_exact(1);
            }
            buckets.insert(
                i,
                Bucket {
                    start,
                    ..Bucket::default()
                },
            );
            i
        }
    };
    &mut buckets[i]
}

/// Adds `cost` to the pending count of the bucket holding `now`, keeping `buckets` sorted.
#[inline]
pub fn add_pending(kind: LimitKind, buckets: &mut Vec<Bucket>, now: i64, cost: u64) {
    bucket_at(buckets, kind.grain().bucket_start(now)).pending += cost;
}
