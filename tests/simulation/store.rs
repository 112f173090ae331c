//! The shared counters: one shard per instance, as the scylla store keeps them.

use super::*;

pub(crate) type Cells = BTreeMap<(CounterKey, i64), Vec<i64>>;

/// The shared counters: per (counter, bucket), one count per shard.
#[derive(Default)]
pub(crate) struct Shared {
    pub(crate) cells: Mutex<Cells>,
    /// Checks admitted and denied, as the usage history the instances wrote says.
    pub(crate) history: Arc<Tally>,
    /// Writes of a quiet client's counter (one per client per increment call), all instances.
    pub(crate) quiet_writes: std::sync::atomic::AtomicU64,
    /// Whether the store answers: [`UP`], [`STALLED`] or [`DOWN`].
    pub(crate) outage: std::sync::atomic::AtomicU8,
    /// Checks decided through the store (`increment_and_read` calls), all instances.
    pub(crate) store_checks: std::sync::atomic::AtomicU64,
    /// Increments sent, all instances: under [`LEADER_LOST`], every third is lost.
    pub(crate) sent: std::sync::atomic::AtomicU64,
    /// Hits of the increments lost so (all instances).
    pub(crate) lost_hits: std::sync::atomic::AtomicU64,
}

/// The store answers.
pub(crate) const UP: u8 = 0;
/// A paused store (a JVM's pause, SIGSTOP): calls miss their deadline. Increments land (the
/// store applies them when it resumes) but the caller cannot know: `Uncertain`; reads fail.
pub(crate) const STALLED: u8 = 1;
/// A store that refuses every call at once: nothing lands, and the caller knows it.
pub(crate) const DOWN: u8 = 2;

/// A replica of three lost, the cluster answering through the others: every third increment
/// (a counter update the lost replica was to lead) is not applied and is answered as of
/// unknown outcome; the rest land, and reads answer.
pub(crate) const LEADER_LOST: u8 = 3;

/// The tenant of the clients far below their limits.
pub(crate) const QUIET_TENANT: &str = "calm";

/// One instance's view of the shared counters: it writes its own shard.
pub(crate) struct ShardView {
    pub(crate) shared: Arc<Shared>,
    pub(crate) shard: usize,
    pub(crate) shards: usize,
}

/// The buckets of `ranges` in `cells`, as a reader on `shard` sees them, its region being
/// `region`'s shards.
pub(crate) fn read_cells(
    cells: &Cells,
    ranges: &[CounterRange],
    shard: usize,
    region: std::ops::Range<usize>,
) -> Vec<Vec<BucketTotal>> {
    ranges
        .iter()
        .map(|r| {
            cells
                .range((r.key.clone(), r.from)..=(r.key.clone(), r.to))
                .map(|((_, start), shards)| BucketTotal {
                    start: *start,
                    total: shards.iter().sum(),
                    mine: shards[shard],
                    region: shards[region.clone()].iter().sum(),
                })
                .collect()
        })
        .collect()
}

/// The usage history, tallied (admitted, denied): the simulation holds it equal to what the
/// checks answered.
#[derive(Default)]
pub(crate) struct Tally(pub(crate) Mutex<(u64, u64)>);

#[async_trait]
impl HistoryStore for Tally {
    async fn add_usage(&self, deltas: &[UsageDelta]) -> StoreResult<()> {
        let mut h = self.0.lock().unwrap();
        for d in deltas {
            h.0 += d.counts.admitted;
            h.1 += d.counts.denied;
        }
        Ok(())
    }
    async fn usage_points(
        &self,
        _: &str,
        _: Option<&str>,
        _: Step,
        _: i64,
        _: i64,
    ) -> StoreResult<Vec<UsagePoint>> {
        unreachable!("the simulation only writes history")
    }
    async fn clients_seen(&self, _: &str, _: i64, _: i64) -> StoreResult<Vec<ClientTotal>> {
        unreachable!("the simulation only writes history")
    }
    async fn delete_history_before(&self, _: i64, _: usize) -> StoreResult<u64> {
        Ok(0)
    }
}

#[async_trait]
impl CounterStore for ShardView {
    fn kind(&self) -> &'static str {
        "simulation"
    }
    async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        use std::sync::atomic::Ordering::Relaxed;
        let outage = self.shared.outage.load(Relaxed);
        if outage == DOWN {
            return Err(StoreError::Unavailable("store down".into()));
        }
        let quiet: std::collections::BTreeSet<&str> = deltas
            .iter()
            .filter(|d| &*d.key.tenant == QUIET_TENANT)
            .map(|d| &*d.key.subject)
            .collect();
        self.shared
            .quiet_writes
            .fetch_add(quiet.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let mut cells = self.shared.cells.lock().unwrap();
        for d in deltas {
            let cell = cells
                .entry((d.key.clone(), d.start))
                .or_insert_with(|| vec![0; self.shards]);
            cell[self.shard] += d.delta;
        }
        if outage == STALLED {
            return Err(StoreError::Uncertain("no answer in time".into()));
        }
        Ok(())
    }
    async fn increment_parts(&self, deltas: &[Delta], _: Option<Instant>) -> Increments {
        use std::sync::atomic::Ordering::Relaxed;
        if self.shared.outage.load(Relaxed) != LEADER_LOST {
            return Increments::whole(self.increment(deltas).await, deltas.len());
        }
        let mut out = Increments::default();
        let mut cells = self.shared.cells.lock().unwrap();
        for (i, d) in deltas.iter().enumerate() {
            if self.shared.sent.fetch_add(1, Relaxed) % 3 == 0 {
                self.shared
                    .lost_hits
                    .fetch_add(d.delta.max(0) as u64, Relaxed);
                out.doubtful.push(i);
                continue;
            }
            let cell = cells
                .entry((d.key.clone(), d.start))
                .or_insert_with(|| vec![0; self.shards]);
            cell[self.shard] += d.delta;
        }
        if !out.doubtful.is_empty() {
            out.error = Some(StoreError::Uncertain("its leader was lost".into()));
        }
        out
    }
    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let outage = self
            .shared
            .outage
            .load(std::sync::atomic::Ordering::Relaxed);
        if outage != UP && outage != LEADER_LOST {
            return Err(StoreError::Unavailable("store stalled or down".into()));
        }
        let cells = self.shared.cells.lock().unwrap();
        Ok(read_cells(&cells, ranges, self.shard, 0..self.shards))
    }
    async fn increment_and_read(
        &self,
        deltas: &[Delta],
        ranges: &[CounterRange],
    ) -> StoreResult<Vec<Vec<BucketTotal>>> {
        self.shared
            .store_checks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let parts = self.increment_parts(deltas, None).await;
        if let Some(e) = parts.error {
            return Err(e);
        }
        self.read(ranges).await
    }
    async fn delete_expired(&self, _now_ms: i64, _budget: usize) -> StoreResult<u64> {
        Ok(0)
    }
    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }
}
