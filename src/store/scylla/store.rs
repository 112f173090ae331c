//! The store itself: one session, the prepared statements, and the counter operations.
//!
//! Increments are grouped per partition into one COUNTER batch (a batch is routed by its
//! first statement, so one partition per batch keeps routing right), partitions written in
//! parallel with bounded concurrency. They are never retried: counter writes are not
//! idempotent, so a timed-out write is reported as [`StoreError::Uncertain`]. A read sums
//! the partitions of every used shard of each epoch; the part found in this instance's own
//! shard is [`BucketTotal::mine`]. Which shard is this instance's, and which are used, comes
//! from its lease ([`super::lease`]); without a lease an increment fails as unavailable, so
//! the hits stay pending until one is held again.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use async_trait::async_trait;
use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::SerialConsistency;
use scylla::value::Counter;

use super::errors::{
    combine_write_outcomes, internal, map_exec, map_new_session, map_next_row, map_pager, Op,
};
use super::partition::{
    epochs_of_range, group_increments, months_between, months_spanned, PartitionWrite,
};
use super::statements::{
    BucketRow, IncrementValues, MonthNameValues, MonthRow, NameRow, ReadBucketsValues, Statements,
};
use crate::cql::{lwt_applied, session_builder, ScyllaOptions};
use crate::store::{
    BucketTotal, CounterKey, CounterRange, CounterStore, Delta, PolicyStore, StoreError,
    StoreResult,
};

/// The widest range of months read month by month; a wider one goes through the month index
/// ([`ScyllaStore::months_to_read`]). 13: a year of daily points, whatever day it starts on.
const CALENDAR_WALK_MONTHS: i64 = 13;

/// The scylla store; cheap to share behind an `Arc` (one session, its own connection pools).
pub struct ScyllaStore {
    pub(super) session: Session,
    pub(super) st: Statements,
    /// The shard this instance writes, from its lease; -1 while it holds none.
    pub(super) shard: AtomicI32,
    /// The shards a read sums: every shard ever claimed.
    pub(super) read_shards: ArcSwap<Vec<i16>>,
    pub(super) max_concurrency: usize,
    /// Token after which the janitor's next sweep continues. A std mutex: it is only read and
    /// written between awaits, never held across one.
    pub(super) janitor_cursor: Mutex<i64>,
}

impl fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("shard", &self.shard())
            .field("read_shards", &self.read_shards.load())
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
            shard: AtomicI32::new(-1),
            read_shards: ArcSwap::from_pointee(Vec::new()),
            max_concurrency: opts.max_concurrency,
            janitor_cursor: Mutex::new(i64::MIN),
        })
    }

    /// This instance's write shard, while it holds a lease.
    pub fn shard(&self) -> Option<i16> {
        let s = self.shard.load(Ordering::Relaxed);
        (s >= 0).then_some(s as i16)
    }

    pub(super) fn set_shards(&self, write: Option<i16>, read: &[i16]) {
        self.shard
            .store(write.map_or(-1, i32::from), Ordering::Relaxed);
        self.read_shards.store(Arc::new(read.to_vec()));
    }

    /// Runs a prepared lightweight transaction; returns its `[applied]`.
    pub(super) async fn lwt(
        &self,
        st: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> StoreResult<bool> {
        let res = self
            .session
            .execute_unpaged(st, values)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        let rows = res.into_rows_result().map_err(internal)?;
        lwt_applied(&rows).map_err(StoreError::Internal)
    }

    async fn write_partition(&self, p: &PartitionWrite, shard: i16) -> StoreResult<()> {
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
                    shard,
                    start,
                )
            })
            .collect();
        self.counter_batch(&self.st.increment, &values).await
    }

    /// Applies counter updates of ONE partition: a single statement, or a COUNTER batch (one
    /// partition, so it is applied atomically on its replicas and routed right). Never
    /// retried: the statements are non-idempotent, and a timeout is `Uncertain`.
    pub(super) async fn counter_batch<V>(
        &self,
        st: &PreparedStatement,
        values: &[V],
    ) -> StoreResult<()>
    where
        V: scylla::serialize::row::SerializeRow,
    {
        match values {
            [] => Ok(()),
            [one] => self
                .session
                .execute_unpaged(st, one)
                .await
                .map(|_| ())
                .map_err(|e| map_exec(e, Op::Write)),
            _ => {
                let mut batch = Batch::new(BatchType::Counter);
                for _ in values {
                    batch.append_statement(st.clone());
                }
                self.session
                    .batch(&batch, values)
                    .await
                    .map(|_| ())
                    .map_err(|e| map_exec(e, Op::Write))
            }
        }
    }

    /// Runs statements that are safe to repeat (deletes, index rows) in parallel; the first
    /// error, as a write's.
    pub(super) async fn run_all<V>(&self, st: &PreparedStatement, values: Vec<V>) -> StoreResult<()>
    where
        V: scylla::serialize::row::SerializeRow,
    {
        stream::iter(values)
            .map(|v| async move {
                self.session
                    .execute_unpaged(st, v)
                    .await
                    .map(|_| ())
                    .map_err(|e| map_exec(e, Op::Write))
            })
            .buffer_unordered(self.max_concurrency)
            .try_collect()
            .await
    }

    /// Every row a read returns, page by page (for partitions that may hold more rows than
    /// one answer should carry).
    /// The months an index statement lists (rows of one `int` month) that ended at or before
    /// `before`, oldest first: what retention deletes.
    pub(super) async fn months_ended_by(
        &self,
        st: &PreparedStatement,
        before: i64,
    ) -> StoreResult<Vec<i32>> {
        let listed: Vec<super::statements::MonthRow> = self.read_all(st, ()).await?;
        let mut months: Vec<i32> = listed
            .into_iter()
            .map(|(m,)| m)
            .filter(|m| super::partition::month_end(*m).is_some_and(|end| end <= before))
            .collect();
        months.sort_unstable();
        Ok(months)
    }

    pub(super) async fn read_all<R>(
        &self,
        st: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> StoreResult<Vec<R>>
    where
        R: for<'f, 'm> scylla::deserialize::row::DeserializeRow<'f, 'm> + 'static,
    {
        let pager = self
            .session
            .execute_iter(st.clone(), values)
            .await
            .map_err(map_pager)?;
        pager
            .rows_stream::<R>()
            .map_err(internal)?
            .map_err(map_next_row)
            .try_collect()
            .await
    }

    /// The months of `first..=last` (yyyymm, oldest first) that may hold `name`'s partitions
    /// of usage history or the audit log. A short range is walked month by month (an empty
    /// partition costs one cheap read); a longer one, e.g. "since 1970", visits only the months
    /// that the month index lists (`list`: its partition keys, one per month kept) and that
    /// hold `name` (`find`).
    pub(super) async fn months_to_read(
        &self,
        first: i32,
        last: i32,
        list: &PreparedStatement,
        find: &PreparedStatement,
        name: &str,
    ) -> StoreResult<Vec<i32>> {
        if months_spanned(first, last) <= CALENDAR_WALK_MONTHS {
            return Ok(months_between(first, last));
        }
        let listed: Vec<MonthRow> = self.read_all(list, ()).await?;
        let mut months: Vec<i32> = listed
            .into_iter()
            .map(|(m,)| m)
            .filter(|m| (first..=last).contains(m))
            .collect();
        months.sort_unstable();
        let held: Vec<Option<i32>> = stream::iter(months.into_iter().map(|m| async move {
            let values: MonthNameValues<'_> = (m, name);
            let rows: Vec<NameRow> = self.read_all(find, values).await?;
            Ok::<_, StoreError>((!rows.is_empty()).then_some(m))
        }))
        .buffered(self.max_concurrency)
        .try_collect()
        .await?;
        Ok(held.into_iter().flatten().collect())
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
        let shard = self.shard().ok_or_else(|| {
            StoreError::Unavailable("this instance holds no shard lease; nothing written".into())
        })?;
        let parts = group_increments(deltas)?;
        let outcomes: Vec<StoreResult<()>> = stream::iter(0..parts.len())
            .map(|i| self.write_partition(&parts[i], shard))
            .buffer_unordered(self.max_concurrency)
            .collect()
            .await;
        combine_write_outcomes(outcomes)
    }

    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let shards = self.read_shards.load();
        let mine = self.shard.load(Ordering::Relaxed);
        let mut queries = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            if r.from > r.to {
                continue;
            }
            for epoch in epochs_of_range(r.key.grain, r.from, r.to)? {
                for &shard in shards.iter() {
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
                if i32::from(shard) == mine {
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
