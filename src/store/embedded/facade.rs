//! The store itself: [`EmbeddedStore`], a facade over its parts, and the only place the seven
//! store traits are implemented for it, each method handing the call to the part that owns
//! what it touches. [`EmbeddedStore::open_with_cache`] opens the database, creates every
//! part's tables, brings an earlier release's layout up to date, and builds the parts.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use redb::Database;

use super::audit::{self, Audit};
use super::counters::Counters;
use super::db::Db;
use super::history::{self, History};
use super::holds::{self, Holds};
use super::idempotency::{self, Idempotency};
use super::lease::{self, Leases};
use super::policies::{self, Policies};
use super::{err, journal, legacy, rows, DB_FILE};
use crate::domain::HoldState;
use crate::domain::{ClientId, TenantId};
use crate::store::audit::{AuditEntry, AuditQuery, AuditStore};
use crate::store::history::{ClientTotal, HistoryStore, Step, UsageDelta, UsagePoint};
use crate::store::hold::{Ended, Hold, HoldStore};
use crate::store::idempotency::{Begun, IdempotencyStore};
use crate::store::lease::{Claim, LeaseStore, Roster};
use crate::store::{
    BucketTotal, CounterRange, CounterStore, Delta, PolicyKey, PolicyRecord, PolicyStore,
    StoreError, StoreResult,
};

pub struct EmbeddedStore {
    /// The database every part holds a handle to.
    pub(super) db: Db,
    /// The counter rows and the journal.
    pub(super) counters: Counters,
    policies: Policies,
    leases: Leases,
    history: History,
    audit: Audit,
    idempotency: Idempotency,
    holds: Holds,
    path: PathBuf,
}

impl EmbeddedStore {
    /// The page cache of a store opened with [`EmbeddedStore::open`].
    pub const DEFAULT_CACHE_BYTES: usize = 256 << 20;

    /// Opens (creating if needed) the store in directory `dir`.
    pub fn open(dir: &Path) -> StoreResult<Self> {
        Self::open_with_cache(dir, Self::DEFAULT_CACHE_BYTES)
    }

    /// Opens the store with a page cache of at most `cache_bytes` (redb's own default is 1 GiB):
    /// with the limiter's caps, it bounds quotad's memory whatever the store's size.
    pub fn open_with_cache(dir: &Path, cache_bytes: usize) -> StoreResult<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            StoreError::Internal(format!(
                "cannot create store directory {}: {e}",
                dir.display()
            ))
        })?;
        let path = dir.join(DB_FILE);
        let db = Database::builder()
            .set_cache_size(cache_bytes)
            .create(&path)
            .map_err(|e| StoreError::Internal(format!("cannot open {}: {e}", path.display())))?;
        // Create every table up front so read transactions never meet a missing one.
        let tx = db.begin_write().map_err(err)?;
        {
            rows::create_tables(&tx)?;
            journal::create_tables(&tx)?;
            policies::create_tables(&tx)?;
            lease::create_tables(&tx)?;
            history::create_tables(&tx)?;
            audit::create_tables(&tx)?;
            idempotency::create_tables(&tx)?;
            holds::create_tables(&tx)?;
        }
        let moved = legacy::upgrade(&tx)?;
        let recovered = journal::recover(&tx)?;
        tx.commit().map_err(err)?;
        if moved > 0 {
            tracing::info!(
                buckets = moved,
                "embedded store: counters moved to one row per counter"
            );
        }
        if recovered > 0 {
            tracing::info!(
                rounds = recovered,
                "embedded store: counter increments of the journal added to the rows"
            );
        }
        let db = Db::new(db);
        Ok(Self {
            counters: Counters::new(db.clone()),
            policies: Policies::new(db.clone()),
            leases: Leases::new(db.clone()),
            history: History::new(db.clone()),
            audit: Audit::new(db.clone()),
            idempotency: Idempotency::new(db.clone()),
            holds: Holds::new(db.clone()),
            db,
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[async_trait]
impl CounterStore for EmbeddedStore {
    fn kind(&self) -> &'static str {
        "embedded"
    }

    async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        self.counters.increment(deltas).await
    }

    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        self.counters.read(ranges).await
    }

    /// One write transaction, so one step: strict mode is exact on one machine.
    async fn increment_and_read(
        &self,
        deltas: &[Delta],
        ranges: &[CounterRange],
    ) -> StoreResult<Vec<Vec<BucketTotal>>> {
        self.counters.increment_and_read(deltas, ranges).await
    }

    async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        self.counters.delete_expired(now_ms, budget).await
    }

    /// Folds the counter journal into the rows.
    async fn flush(&self) -> StoreResult<()> {
        self.counters.flush().await
    }

    async fn ping(&self) -> StoreResult<()> {
        self.db.ping().await
    }
}

#[async_trait]
impl PolicyStore for EmbeddedStore {
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

// Regions are left to the trait's defaults: this store is always one region of one process.
#[async_trait]
impl LeaseStore for EmbeddedStore {
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
}

#[async_trait]
impl HistoryStore for EmbeddedStore {
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
impl AuditStore for EmbeddedStore {
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
impl IdempotencyStore for EmbeddedStore {
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
impl HoldStore for EmbeddedStore {
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
