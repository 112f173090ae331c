//! The counters of the layout of `migrations/0001_counters.cql` (`counters`: a partition per
//! (tenant, subject, limit, grain, epoch, shard)), after an upgrade to the layout of 0006.
//!
//! Nothing writes the old table any more. Until it is empty, a read of a range that began
//! before [`LEGACY_ROLLOUT_MS`] after the new layout first served the keyspace (recorded once
//! in `counter_layouts`) also sums the old table's buckets; the janitor keeps deleting its
//! expired partitions, and once a sweep finds it empty, no read looks there again. So an
//! upgrade keeps every count stored, with no conversion step, and instances of the old release
//! still running during a rolling upgrade are counted for that hour too.
//!
//! [`Legacy`] is the part of the store that knows whether the old table is still read: the
//! counters ask it for the old buckets of a range, the janitor tells it when the table is empty.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use chrono::Utc;
use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::value::Counter;

use super::connection::Cql;
use super::errors::internal;
use super::lease::Leases;
use super::partition::epochs_of_range;
use super::statements::{
    BucketRow, ClaimLayoutValues, LayoutRow, PartitionRow, ReadBucketsValues, ReadLayoutValues,
};
use crate::store::{BucketTotal, CounterKey, CounterRange, StoreError, StoreResult};

/// How long after the new layout first served a keyspace the old one is still read: a rolling
/// upgrade's old instances write there until they are replaced.
pub(crate) const LEGACY_ROLLOUT_MS: i64 = 3_600_000;
/// The row of `counter_layouts` naming the layout of 0006.
const LAYOUT_NAME: &str = "client_counters";
/// A range's (index) buckets (start, hits) as one shard of the old table holds them.
type ShardRows = (usize, i16, Vec<(i64, i64)>);

/// `until` when the old table is empty: no range begins before it.
const NO_LEGACY: i64 = i64::MIN;

/// The old table, while it holds anything: the instant before which ranges also read it.
pub(super) struct Legacy {
    cql: Arc<Cql>,
    /// Which shards a read sums, and which one is this instance's.
    leases: Arc<Leases>,
    /// Ranges that begin before this instant also read the old table; [`NO_LEGACY`] once it
    /// is empty.
    until: AtomicI64,
}

impl Legacy {
    /// At connect: whether the old table holds anything, and if so since when the new layout
    /// serves (claimed once for the whole fleet).
    pub(super) async fn load(cql: Arc<Cql>, leases: Arc<Leases>) -> StoreResult<Legacy> {
        let until = Self::until(&cql).await?;
        Ok(Legacy {
            cql,
            leases,
            until: AtomicI64::new(until),
        })
    }

    /// The instant before which ranges also read the old table, or [`NO_LEGACY`].
    async fn until(cql: &Cql) -> StoreResult<i64> {
        let any: Vec<PartitionRow> = cql.read_all(&cql.st.legacy_any, ()).await?;
        if any.is_empty() {
            return Ok(NO_LEGACY);
        }
        let claim: ClaimLayoutValues<'_> = (LAYOUT_NAME, Utc::now().timestamp_millis());
        cql.lwt(&cql.st.claim_layout, claim).await?;
        let read: ReadLayoutValues<'_> = (LAYOUT_NAME,);
        let rows: Vec<LayoutRow> = cql.read_all(&cql.st.read_layout, read).await?;
        let since = rows
            .first()
            .and_then(|r| r.0)
            .ok_or_else(|| internal("counter_layouts has no row after claiming it"))?;
        Ok(since.saturating_add(LEGACY_ROLLOUT_MS))
    }

    /// Whether the old table may still hold anything: ranges read it, the janitor sweeps it.
    pub(super) fn in_use(&self) -> bool {
        self.until.load(Ordering::Relaxed) != NO_LEGACY
    }

    /// The old table was found empty: reads stop looking there.
    pub(super) fn emptied(&self) {
        self.until.store(NO_LEGACY, Ordering::Relaxed);
    }

    /// Adds the old table's buckets to the sums of the ranges that began before the cut-over.
    pub(super) async fn add_to(
        &self,
        ranges: &[CounterRange],
        sums: &mut [BTreeMap<i64, BucketTotal>],
    ) -> StoreResult<()> {
        let until = self.until.load(Ordering::Relaxed);
        if until == NO_LEGACY {
            return Ok(());
        }
        let shards = self.leases.read_shards();
        let mine = self.leases.shard().map_or(-1, i32::from);
        let mut queries = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            if r.from > r.to || r.from >= until {
                continue;
            }
            for epoch in epochs_of_range(r.key.grain, r.from, r.to)? {
                for &shard in shards.iter() {
                    queries.push((i, epoch, shard));
                }
            }
        }
        let results: Vec<ShardRows> =
            stream::iter(queries.into_iter().map(|(i, epoch, shard)| async move {
                let r = &ranges[i];
                let rows = self
                    .legacy_partition(&r.key, epoch, shard, r.from, r.to)
                    .await?;
                Ok::<_, StoreError>((i, shard, rows))
            }))
            .buffer_unordered(self.cql.max_concurrency)
            .try_collect()
            .await?;
        for (i, shard, rows) in results {
            for (start, n) in rows {
                let e = sums[i].entry(start).or_insert(BucketTotal::empty(start));
                e.total += n;
                if i32::from(shard) == mine {
                    e.mine += n;
                }
                // The old layout predates regions: its counts were all written in one.
                e.region += n;
            }
        }
        Ok(())
    }

    async fn legacy_partition(
        &self,
        key: &CounterKey,
        epoch: i64,
        shard: i16,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<(i64, i64)>> {
        let values: ReadBucketsValues<'_> = (
            &key.tenant,
            &key.subject,
            &key.limit,
            key.grain.code(),
            epoch,
            shard,
            from,
            to,
        );
        let rows: Vec<BucketRow> = self
            .cql
            .read_rows(&self.cql.st.legacy_read_buckets, values)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(start, hits)| (start, hits.map_or(0, |Counter(n)| n)))
            .collect())
    }
}
