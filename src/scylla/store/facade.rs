//! The store itself: [`ScyllaStore`], a facade over its parts, and the only place the seven
//! store traits are implemented for it, each method handing the call to the part that owns
//! what it touches. [`ScyllaStore::connect`] opens the shared connection and builds the parts.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::audit::Audit;
use super::connection::Cql;
use super::counters::Counters;
use super::errors::{internal, map_exec, Op};
use super::first_reads::FirstReads;
use super::history::History;
use super::holds::Holds;
use super::idempotency::Idempotency;
use super::janitor::Janitor;
use super::lease::Leases;
use super::legacy::Legacy;
use super::policies::Policies;
use crate::domain::{ClientId, HoldState, TenantId};
use crate::scylla::cql::ScyllaOptions;
use crate::store::audit::{AuditEntry, AuditQuery, AuditStore};
use crate::store::history::{ClientTotal, HistoryStore, Step, UsageDelta, UsagePoint};
use crate::store::hold::{Ended, Hold, HoldStore};
use crate::store::idempotency::{Begun, IdempotencyStore};
use crate::store::lease::{Claim, LeaseStore, RegionBeat, Roster};
use crate::store::{
    BucketTotal, CounterRange, CounterStore, Delta, Heard, Increments, PolicyKey, PolicyRecord,
    PolicyStore, Reads, StoreError, StoreResult,
};
use scylla::statement::Consistency;

/// The scylla store; cheap to share behind an `Arc` (one session, its own connection pools).
/// The clock of the node that answers (`CounterStore::clock_ms`): every instance of a fleet
/// cuts its buckets on it.
const NODE_CLOCK_CQL: &str = "SELECT toUnixTimestamp(currentTimestamp()) FROM system.local";

pub struct ScyllaStore {
    cql: Arc<Cql>,
    /// The shard this instance writes, the shards reads sum, the region; the counters hold it
    /// too.
    leases: Arc<Leases>,
    counters: Arc<Counters>,
    /// One client's reads (first checks, usage), which go together when they arrive together.
    first_reads: Arc<FirstReads>,
    janitor: Janitor,
    policies: Policies,
    history: History,
    audit: Audit,
    idempotency: Idempotency,
    holds: Holds,
}

impl fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("shard", &self.shard())
            .field("read_shards", &self.leases.read_shards())
            .finish_non_exhaustive()
    }
}

impl ScyllaStore {
    /// Connects to the keyspace (which `quotad migrate` must have created) and prepares every
    /// statement. Fails with `Internal` on bad options or a missing schema, `Unavailable` when
    /// the cluster cannot be reached.
    pub async fn connect(opts: ScyllaOptions) -> Result<ScyllaStore, StoreError> {
        let (cql, local_dc) = Cql::connect(&opts).await?;
        let cql = Arc::new(cql);
        let leases = Arc::new(Leases::new(cql.clone(), local_dc));
        let legacy = Arc::new(Legacy::load(cql.clone(), leases.clone()).await?);
        let counters = Arc::new(Counters::new(cql.clone(), leases.clone(), legacy.clone()));
        Ok(ScyllaStore {
            first_reads: FirstReads::new(counters.clone()),
            counters,
            janitor: Janitor::new(cql.clone(), legacy),
            policies: Policies::new(cql.clone()),
            history: History::new(cql.clone()),
            audit: Audit::new(cql.clone()),
            idempotency: Idempotency::new(cql.clone()),
            holds: Holds::new(cql.clone()),
            cql,
            leases,
        })
    }

    /// This instance's write shard, while it holds a lease.
    pub fn shard(&self) -> Option<i16> {
        self.leases.shard()
    }
}

#[async_trait]
impl CounterStore for ScyllaStore {
    fn kind(&self) -> &'static str {
        "scylla"
    }

    async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        let parts = self.counters.increment(deltas, None).await;
        parts.into_result(deltas.len())
    }

    async fn increment_parts(&self, deltas: &[Delta], deadline: Option<Instant>) -> Increments {
        self.counters.increment(deltas, deadline).await
    }

    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        // One client's (a first check): with the others that arrive with it. Many clients'
        // (a sync round's read back): one read of its own.
        let one_client = ranges.windows(2).all(|w| {
            (&w[0].key.tenant, &w[0].key.subject) == (&w[1].key.tenant, &w[1].key.subject)
        });
        if one_client {
            self.first_reads.read(ranges).await
        } else {
            self.counters.read(ranges, None, None).await.into_result()
        }
    }

    async fn read_parts(&self, ranges: &[CounterRange], deadline: Option<Instant>) -> Reads {
        self.counters.read(ranges, deadline, None).await
    }

    async fn read_final(
        &self,
        ranges: &[CounterRange],
        deadline: Option<Instant>,
        heard: Heard,
    ) -> Reads {
        let at = match heard {
            Heard::Every => Consistency::All,
            Heard::LiveQuorum => Consistency::LocalQuorum,
        };
        self.counters.read(ranges, deadline, Some(at)).await
    }

    async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        self.janitor.delete_expired(now_ms, budget).await
    }

    async fn ping(&self) -> StoreResult<()> {
        // Our own table, not system.local: proves the keyspace and schema answer too.
        self.policies.generation().await.map(|_| ())
    }

    async fn clock_ms(&self) -> StoreResult<Option<i64>> {
        let res = (self.cql.session)
            .query_unpaged(NODE_CLOCK_CQL, ())
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let (ms,) = rows.first_row::<(i64,)>().map_err(internal)?;
        Ok(Some(ms))
    }
}

#[async_trait]
impl PolicyStore for ScyllaStore {
    async fn put_policy(
        &self,
        key: &PolicyKey,
        body: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<PolicyRecord> {
        self.policies.put(key, body, now).await
    }

    async fn get_policy(&self, key: &PolicyKey) -> StoreResult<Option<PolicyRecord>> {
        self.policies.get(key).await
    }

    async fn delete_policy(&self, key: &PolicyKey) -> StoreResult<bool> {
        self.policies.delete(key).await
    }

    async fn list_policies(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        self.policies.list(after, limit).await
    }

    async fn list_overrides(
        &self,
        tenant: &TenantId,
        after: Option<&ClientId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        self.policies.list_overrides(tenant, after, limit).await
    }

    async fn load_policies(&self) -> StoreResult<Vec<PolicyRecord>> {
        self.policies.load().await
    }

    async fn policies_generation(&self) -> StoreResult<u64> {
        self.policies.generation().await
    }
}

#[async_trait]
impl LeaseStore for ScyllaStore {
    async fn claim(
        &self,
        owner: &str,
        pin: Option<i16>,
        prefer: Option<i16>,
        ttl: Duration,
    ) -> StoreResult<Claim> {
        self.leases.claim(owner, pin, prefer, ttl).await
    }

    async fn renew(&self, shard: i16, owner: &str, ttl: Duration) -> StoreResult<bool> {
        self.leases.renew(shard, owner, ttl).await
    }

    async fn release(&self, shard: i16, owner: &str) -> StoreResult<bool> {
        self.leases.release(shard, owner).await
    }

    async fn report_written(
        &self,
        shard: i16,
        owner: &str,
        written_ms: i64,
        ttl: Duration,
    ) -> StoreResult<()> {
        self.leases
            .report_written(shard, owner, written_ms, ttl)
            .await
    }
    async fn roster(&self) -> StoreResult<Roster> {
        self.leases.roster().await
    }

    fn adopt(&self, write: Option<i16>, read: &[i16]) {
        self.leases.adopt(write, read)
    }

    async fn local_region(&self) -> StoreResult<Option<String>> {
        self.leases.local_region().await
    }

    async fn join_region(&self, region: &str) -> StoreResult<i16> {
        self.leases.join_region(region).await
    }

    async fn beat(&self, at_ms: i64) -> StoreResult<()> {
        self.leases.beat(at_ms).await
    }

    async fn beats_between(&self, region: &str, from: i64, to: i64) -> StoreResult<Vec<i64>> {
        self.leases.beats_between(region, from, to).await
    }

    async fn regions(&self) -> StoreResult<Vec<RegionBeat>> {
        self.leases.regions().await
    }
}

#[async_trait]
impl HistoryStore for ScyllaStore {
    async fn add_usage(&self, deltas: &[UsageDelta]) -> StoreResult<()> {
        self.history.add(deltas).await
    }

    async fn usage_points(
        &self,
        tenant: &str,
        client: Option<&str>,
        step: Step,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<UsagePoint>> {
        self.history.points(tenant, client, step, from, to).await
    }

    async fn clients_seen(
        &self,
        tenant: &str,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<ClientTotal>> {
        self.history.clients_seen(tenant, from, to).await
    }

    async fn delete_history_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        self.history.delete_before(before, budget).await
    }
}

#[async_trait]
impl AuditStore for ScyllaStore {
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        self.audit.append(entry).await
    }

    async fn audit_page(&self, q: &AuditQuery) -> StoreResult<Vec<AuditEntry>> {
        self.audit.page(q).await
    }

    async fn delete_audit_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        self.audit.delete_before(before, budget).await
    }
}

#[async_trait]
impl IdempotencyStore for ScyllaStore {
    async fn begin_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> StoreResult<Begun> {
        self.idempotency.begin(scope, key, fingerprint, ttl).await
    }

    async fn finish_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        response: &str,
        ttl: Duration,
    ) -> StoreResult<()> {
        self.idempotency
            .finish(scope, key, fingerprint, response, ttl)
            .await
    }

    async fn abandon_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
    ) -> StoreResult<()> {
        self.idempotency.abandon(scope, key, fingerprint).await
    }
}

#[async_trait]
impl HoldStore for ScyllaStore {
    async fn put_hold(&self, hold: &Hold) -> StoreResult<()> {
        self.holds.put(hold).await
    }

    async fn get_hold(&self, id: &str) -> StoreResult<Option<Hold>> {
        self.holds.get(id).await
    }

    async fn end_hold(
        &self,
        id: &str,
        state: HoldState,
        cost: Option<u64>,
        now_ms: i64,
    ) -> StoreResult<Ended> {
        self.holds.end(id, state, cost, now_ms).await
    }

    async fn expired_holds(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<Hold>> {
        self.holds.expired(now_ms, limit).await
    }

    async fn expire_holds(&self, ids: &[String], now_ms: i64) -> StoreResult<Vec<Hold>> {
        self.holds.expire(ids, now_ms).await
    }
}
