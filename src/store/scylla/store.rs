//! The store itself: one session, the prepared statements, and the counter operations.
//!
//! Increments are grouped per partition into one COUNTER batch (a batch is routed by its
//! first statement, so one partition per batch keeps routing right), partitions written in
//! parallel with bounded concurrency. They are never retried: counter writes are not
//! idempotent, so a timed-out write is reported as [`StoreError::Uncertain`]. A read sums
//! the `shards` partitions of each epoch; the part found in this instance's own shard is
//! [`BucketTotal::mine`].

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use async_trait::async_trait;
use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::SerialConsistency;
use scylla::value::Counter;

use super::errors::{combine_write_outcomes, internal, map_exec, map_new_session, Op};
use super::partition::{epochs_of_range, group_increments, PartitionWrite};
use super::statements::{BucketRow, IncrementValues, ReadBucketsValues, Statements};
use crate::cql::{session_builder, ScyllaOptions};
use crate::store::{
    BucketTotal, CounterKey, CounterRange, CounterStore, Delta, PolicyStore, StoreError,
    StoreResult,
};

/// The scylla store; cheap to share behind an `Arc` (one session, its own connection pools).
pub struct ScyllaStore {
    pub(super) session: Session,
    pub(super) st: Statements,
    pub(super) shard: i16,
    pub(super) shards: i16,
    pub(super) max_concurrency: usize,
    /// Token after which the janitor's next sweep continues. A std mutex: it is only read and
    /// written between awaits, never held across one.
    pub(super) janitor_cursor: Mutex<i64>,
}

impl fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("shard", &self.shard)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl ScyllaStore {
    /// Connects to the keyspace (which `quotad migrate` must have created) and prepares every
    /// statement. Fails with `Internal` on bad options or a missing schema, `Unavailable` when
    /// the cluster cannot be reached.
    pub async fn connect(opts: ScyllaOptions) -> Result<ScyllaStore, StoreError> {
        opts.validate().map_err(StoreError::Internal)?;
        let profile = ExecutionProfile::builder()
            .consistency(opts.consistency)
            .serial_consistency(Some(SerialConsistency::LocalSerial))
            .request_timeout(Some(opts.request_timeout))
            .build();
        let mut builder = session_builder(&opts)
            .use_keyspace(&opts.keyspace, false)
            .default_execution_profile_handle(profile.into_handle());
        if let Some(dc) = &opts.local_dc {
            builder = builder.prefer_datacenter(dc.clone());
        }
        let session = builder.build().await.map_err(map_new_session)?;
        let st = Statements::prepare(&session).await?;
        Ok(ScyllaStore {
            session,
            st,
            shard: opts.shard,
            shards: opts.shards,
            max_concurrency: opts.max_concurrency,
            janitor_cursor: Mutex::new(i64::MIN),
        })
    }

    /// This instance's write shard.
    pub fn shard(&self) -> i16 {
        self.shard
    }

    async fn write_partition(&self, p: &PartitionWrite) -> StoreResult<()> {
        let k = &p.key;
        let values: Vec<IncrementValues<'_>> = p
            .rows
            .iter()
            .map(|&(start, delta)| {
                (
                    Counter(delta),
                    &*k.tenant,
                    &*k.subject,
                    &*k.limit,
                    k.grain.code(),
                    p.epoch,
                    self.shard,
                    start,
                )
            })
            .collect();
        if let [one] = values.as_slice() {
            self.session
                .execute_unpaged(&self.st.increment, one)
                .await
                .map_err(|e| map_exec(e, Op::Write))?;
            return Ok(());
        }
        // One partition, so the batch is applied atomically on its replicas and routed right.
        let mut batch = Batch::new(BatchType::Counter);
        for _ in &values {
            batch.append_statement(self.st.increment.clone());
        }
        self.session
            .batch(&batch, values)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        Ok(())
    }

    async fn read_partition(
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
        let res = self
            .session
            .execute_unpaged(&self.st.read_buckets, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let mut out = Vec::with_capacity(rows.rows_num());
        for row in rows.rows::<BucketRow>().map_err(internal)? {
            let (start, hits) = row.map_err(internal)?;
            out.push((start, hits.map_or(0, |Counter(n)| n)));
        }
        Ok(out)
    }
}

#[async_trait]
impl CounterStore for ScyllaStore {
    fn kind(&self) -> &'static str {
        "scylla"
    }

    async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        let parts = group_increments(deltas)?;
        let outcomes: Vec<StoreResult<()>> = stream::iter(0..parts.len())
            .map(|i| self.write_partition(&parts[i]))
            .buffer_unordered(self.max_concurrency)
            .collect()
            .await;
        combine_write_outcomes(outcomes)
    }

    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let mut queries = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            if r.from > r.to {
                continue;
            }
            for epoch in epochs_of_range(r.key.grain, r.from, r.to)? {
                for shard in 0..self.shards {
                    queries.push((i, epoch, shard));
                }
            }
        }
        let results: Vec<(usize, i16, Vec<(i64, i64)>)> =
            stream::iter(queries.into_iter().map(|(i, epoch, shard)| async move {
                let r = &ranges[i];
                let rows = self
                    .read_partition(&r.key, epoch, shard, r.from, r.to)
                    .await?;
                Ok::<_, StoreError>((i, shard, rows))
            }))
            .buffer_unordered(self.max_concurrency)
            .try_collect()
            .await?;
        let mut sums: Vec<BTreeMap<i64, (i64, i64)>> = vec![BTreeMap::new(); ranges.len()];
        for (i, shard, rows) in results {
            for (start, n) in rows {
                let e = sums[i].entry(start).or_insert((0, 0));
                e.0 += n;
                if shard == self.shard {
                    e.1 += n;
                }
            }
        }
        Ok(sums
            .into_iter()
            .map(|m| {
                m.into_iter()
                    .map(|(start, (total, mine))| BucketTotal { start, total, mine })
                    .collect()
            })
            .collect())
    }

    async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        self.sweep_expired(now_ms, budget).await
    }

    async fn ping(&self) -> StoreResult<()> {
        // Our own table, not system.local: proves the keyspace and schema answer too.
        PolicyStore::policies_generation(self).await.map(|_| ())
    }
}
