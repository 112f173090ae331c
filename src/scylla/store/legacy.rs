//! The counters of the layout of `migrations/0001_counters.cql` (`counters`: a partition per
//! (tenant, subject, limit, grain, epoch, shard)), after an upgrade to the layout of 0006.
//!
//! Nothing writes the old table any more. Until it is empty, a read of a range that began
//! before [`LEGACY_ROLLOUT_MS`] after the new layout first served the keyspace (recorded once
//! in `counter_layouts`) also sums the old table's buckets; the janitor keeps deleting its
//! expired partitions, and once a sweep finds it empty, no read looks there again. So an
//! upgrade keeps every count stored, with no conversion step, and instances of the old release
//! still running during a rolling upgrade are counted for that hour too.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use chrono::Utc;
use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::value::Counter;

use super::errors::internal;
use super::partition::epochs_of_range;
use super::statements::{
    BucketRow, ClaimLayoutValues, LayoutRow, PartitionRow, ReadBucketsValues, ReadLayoutValues,
};
use super::ScyllaStore;
use crate::store::{BucketTotal, CounterKey, CounterRange, StoreError, StoreResult};

/// How long after the new layout first served a keyspace the old one is still read: a rolling
/// upgrade's old instances write there until they are replaced.
pub(crate) const LEGACY_ROLLOUT_MS: i64 = 3_600_000;
/// The row of `counter_layouts` naming the layout of 0006.
const LAYOUT_NAME: &str = "client_counters";
/// A range's (index) buckets (start, hits) as one shard of the old table holds them.
type ShardRows = (usize, i16, Vec<(i64, i64)>);

/// `legacy_until` when the old table is empty: no range begins before it.
pub(crate) const NO_LEGACY: i64 = i64::MIN;

impl ScyllaStore {
    /// At connect: whether the old table holds anything, and if so since when the new layout
    /// serves (claimed once for the whole fleet). Returns the instant before which ranges also
    /// read the old table, or [`NO_LEGACY`].
    pub(super) async fn legacy_until(&self) -> StoreResult<i64> {
        let any: Vec<PartitionRow> = self.cql.read_all(&self.cql.st.legacy_any, ()).await?;
        if any.is_empty() {
            return Ok(NO_LEGACY);
        }
        let claim: ClaimLayoutValues<'_> = (LAYOUT_NAME, Utc::now().timestamp_millis());
        self.cql.lwt(&self.cql.st.claim_layout, claim).await?;
        let read: ReadLayoutValues<'_> = (LAYOUT_NAME,);
        let rows: Vec<LayoutRow> = self.cql.read_all(&self.cql.st.read_layout, read).await?;
        let since = rows
            .first()
            .and_then(|r| r.0)
            .ok_or_else(|| internal("counter_layouts has no row after claiming it"))?;
        Ok(since.saturating_add(LEGACY_ROLLOUT_MS))
    }

    /// The old table was found empty: reads stop looking there.
    pub(super) fn legacy_emptied(&self) {
        self.legacy_until.store(NO_LEGACY, Ordering::Relaxed);
    }

    /// Adds the old table's buckets to the sums of the ranges that began before the cut-over.
    pub(super) async fn add_legacy(
        &self,
        ranges: &[CounterRange],
        sums: &mut [BTreeMap<i64, BucketTotal>],
    ) -> StoreResult<()> {
        let until = self.legacy_until.load(Ordering::Relaxed);
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
