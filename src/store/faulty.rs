//! A store wrapper whose calls can be made to fail or hang, for tests of outages.
//!
//! Test support only: compiled for the crate's own tests and with the `test-support` feature
//! (which the integration tests enable through a dev-dependency on this crate), never into
//! the shipped binary.
//!
//! It wraps a real store (the embedded one in tests): while healthy every call goes through;
//! while `Failing` every call returns `Unavailable` before touching the inner store (so nothing
//! is written); while `Hanging` every call waits forever (callers' deadlines must save them).
//!
//! Apart from that, the partitions of some clients can fail alone ([`PartFault`]), as those
//! of a cluster with a node down do: their increments refused unsent, or sent and left in
//! doubt, and their reads refused, while every other client's go through.

use crate::store::hold::{Ended, Hold, HoldStore};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::audit::{AuditEntry, AuditQuery, AuditStore};
use super::history::{ClientTotal, HistoryStore, Step, UsageDelta, UsagePoint};
use super::idempotency::{Begun, IdempotencyStore};
use super::lease::{Claim, LeaseStore, Roster};
use super::{
    BucketTotal, CounterRange, CounterStore, Delta, DynStore, Heard, Increments, PolicyKey,
    PolicyRecord, PolicyStore, Reads, StoreError, StoreResult,
};
use crate::domain::TenantId;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    Healthy = 0,
    Failing = 1,
    Hanging = 2,
    /// Every call waits 200 ms, then goes through.
    Slow = 3,
}

/// How one client's partitions fail, apart from the others ([`FaultyStore::fail_part`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartFault {
    /// Increments refused before they are sent (nothing written), reads refused.
    Refused,
    /// Increments written, but answered as of unknown outcome (a node that applied them and
    /// did not answer in time); reads refused.
    Doubtful,
    /// Increments not written, answered as of unknown outcome (a node that died before it
    /// applied them); reads refused.
    Lost,
}

pub struct FaultyStore {
    inner: DynStore,
    fault: AtomicU8,
    /// Subjects (client ids, or `*`) whose partitions fail alone.
    parts: Mutex<HashMap<String, PartFault>>,
    /// Calls refused or hung while faulty.
    pub refused: AtomicU64,
    /// Counter reads asked of it, whatever their outcome.
    pub reads: AtomicU64,
    /// A replica of several is down: reads at every replica are refused, the others answer.
    replica_down: AtomicBool,
}

impl FaultyStore {
    pub fn new(inner: DynStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            fault: AtomicU8::new(Fault::Healthy as u8),
            parts: Mutex::default(),
            refused: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            replica_down: AtomicBool::new(false),
        })
    }

    /// Makes a read at every replica ([`Heard::Every`]) fail, as one down of several would.
    pub fn set_replica_down(&self, down: bool) {
        self.replica_down.store(down, Ordering::SeqCst);
    }

    pub fn set(&self, f: Fault) {
        self.fault.store(f as u8, Ordering::SeqCst);
    }

    /// Makes the partitions of `subject` (of any tenant) fail as `f`; None heals them.
    pub fn fail_part(&self, subject: &str, f: Option<PartFault>) {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        match f {
            Some(f) => parts.insert(subject.to_string(), f),
            None => parts.remove(subject),
        };
    }

    fn part_fault(&self, subject: &str) -> Option<PartFault> {
        let parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        parts.get(subject).copied()
    }

    async fn gate(&self) -> StoreResult<()> {
        match self.fault.load(Ordering::SeqCst) {
            0 => Ok(()),
            3 => {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                Ok(())
            }
            1 => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(StoreError::Unavailable("injected failure".into()))
            }
            _ => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                futures::future::pending::<()>().await;
                unreachable!()
            }
        }
    }
}

#[async_trait]
impl CounterStore for FaultyStore {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }
    async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        let n = deltas.len();
        self.increment_parts(deltas, None).await.into_result(n)
    }
    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        self.read_parts(ranges, None).await.into_result()
    }
    async fn increment_parts(&self, deltas: &[Delta], deadline: Option<Instant>) -> Increments {
        if let Err(e) = self.gate().await {
            return Increments::whole(Err(e), deltas.len());
        }
        let mut out = Increments::default();
        let mut go: Vec<usize> = Vec::new();
        for (i, d) in deltas.iter().enumerate() {
            match self.part_fault(&d.key.subject) {
                Some(PartFault::Refused) => out.unsent.push(i),
                Some(PartFault::Doubtful) => {
                    out.doubtful.push(i);
                    go.push(i);
                }
                Some(PartFault::Lost) => out.doubtful.push(i),
                None => go.push(i),
            }
        }
        let sent: Vec<Delta> = go.iter().map(|&i| deltas[i].clone()).collect();
        let inner = self.inner.increment_parts(&sent, deadline).await;
        out.unsent.extend(inner.unsent.iter().map(|&j| go[j]));
        out.doubtful.extend(inner.doubtful.iter().map(|&j| go[j]));
        out.doubtful.sort_unstable();
        out.doubtful.dedup();
        out.error = inner.error;
        if out.error.is_none() && !(out.unsent.is_empty() && out.doubtful.is_empty()) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            out.error = Some(StoreError::Unavailable("injected partition failure".into()));
        }
        out
    }
    async fn read_parts(&self, ranges: &[CounterRange], deadline: Option<Instant>) -> Reads {
        self.reads.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.gate().await {
            return Reads::whole(Err(e), ranges.len());
        }
        let ok: Vec<usize> = (0..ranges.len())
            .filter(|&i| self.part_fault(&ranges[i].key.subject).is_none())
            .collect();
        let asked: Vec<CounterRange> = ok.iter().map(|&i| ranges[i].clone()).collect();
        let inner = self.inner.read_parts(&asked, deadline).await;
        let mut out = Reads {
            totals: (0..ranges.len()).map(|_| None).collect(),
            error: inner.error,
        };
        for (j, t) in inner.totals.into_iter().enumerate() {
            out.totals[ok[j]] = t;
        }
        if out.error.is_none() && ok.len() < ranges.len() {
            out.error = Some(StoreError::Unavailable("injected partition failure".into()));
        }
        out
    }
    async fn read_final(
        &self,
        ranges: &[CounterRange],
        deadline: Option<Instant>,
        heard: Heard,
    ) -> Reads {
        if heard == Heard::Every && self.replica_down.load(Ordering::SeqCst) {
            self.reads.fetch_add(1, Ordering::Relaxed);
            let e = StoreError::Unavailable("injected: a replica is down".into());
            return Reads::whole(Err(e), ranges.len());
        }
        self.read_parts(ranges, deadline).await
    }
    async fn increment_and_read(
        &self,
        deltas: &[Delta],
        ranges: &[CounterRange],
    ) -> StoreResult<Vec<Vec<BucketTotal>>> {
        self.gate().await?;
        self.inner.increment_and_read(deltas, ranges).await
    }
    async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        self.gate().await?;
        self.inner.delete_expired(now_ms, budget).await
    }
    async fn ping(&self) -> StoreResult<()> {
        self.gate().await?;
        self.inner.ping().await
    }
    async fn clock_ms(&self) -> StoreResult<Option<i64>> {
        self.gate().await?;
        self.inner.clock_ms().await
    }
    async fn flush(&self) -> StoreResult<()> {
        self.gate().await?;
        self.inner.flush().await
    }
}

#[async_trait]
impl PolicyStore for FaultyStore {
    async fn put_policy(
        &self,
        key: &PolicyKey,
        body: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<PolicyRecord> {
        self.gate().await?;
        self.inner.put_policy(key, body, now).await
    }
    async fn get_policy(&self, key: &PolicyKey) -> StoreResult<Option<PolicyRecord>> {
        self.gate().await?;
        self.inner.get_policy(key).await
    }
    async fn delete_policy(&self, key: &PolicyKey) -> StoreResult<bool> {
        self.gate().await?;
        self.inner.delete_policy(key).await
    }
    async fn list_policies(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        self.gate().await?;
        self.inner.list_policies(after, limit).await
    }
    async fn list_overrides(
        &self,
        tenant: &TenantId,
        after: Option<&crate::domain::ClientId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        self.gate().await?;
        self.inner.list_overrides(tenant, after, limit).await
    }
    async fn load_policies(&self) -> StoreResult<Vec<PolicyRecord>> {
        self.gate().await?;
        self.inner.load_policies().await
    }
    async fn policies_generation(&self) -> StoreResult<u64> {
        self.gate().await?;
        self.inner.policies_generation().await
    }
}

/// Leases fail with the rest of the store, so a test can make an instance lose its lease.
#[async_trait]
impl LeaseStore for FaultyStore {
    async fn claim(
        &self,
        owner: &str,
        pin: Option<i16>,
        prefer: Option<i16>,
        ttl: std::time::Duration,
    ) -> StoreResult<Claim> {
        self.gate().await?;
        self.inner.claim(owner, pin, prefer, ttl).await
    }
    async fn renew(&self, shard: i16, owner: &str, ttl: std::time::Duration) -> StoreResult<bool> {
        self.gate().await?;
        self.inner.renew(shard, owner, ttl).await
    }
    async fn release(&self, shard: i16, owner: &str) -> StoreResult<bool> {
        self.gate().await?;
        self.inner.release(shard, owner).await
    }
    async fn report_written(
        &self,
        shard: i16,
        owner: &str,
        written_ms: i64,
        ttl: std::time::Duration,
    ) -> StoreResult<()> {
        self.gate().await?;
        self.inner
            .report_written(shard, owner, written_ms, ttl)
            .await
    }
    async fn roster(&self) -> StoreResult<Roster> {
        self.gate().await?;
        self.inner.roster().await
    }
    fn adopt(&self, write: Option<i16>, read: &[i16]) {
        self.inner.adopt(write, read)
    }
}

/// History fails with the rest of the store: an outage must not lose what checks answered.
#[async_trait]
impl HistoryStore for FaultyStore {
    async fn add_usage(&self, deltas: &[UsageDelta]) -> StoreResult<()> {
        self.gate().await?;
        self.inner.add_usage(deltas).await
    }
    async fn usage_points(
        &self,
        tenant: &str,
        client: Option<&str>,
        step: Step,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<UsagePoint>> {
        self.gate().await?;
        self.inner
            .usage_points(tenant, client, step, from, to)
            .await
    }
    async fn clients_seen(
        &self,
        tenant: &str,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<ClientTotal>> {
        self.gate().await?;
        self.inner.clients_seen(tenant, from, to).await
    }
    async fn delete_history_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        self.gate().await?;
        self.inner.delete_history_before(before, budget).await
    }
}

#[async_trait]
impl AuditStore for FaultyStore {
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        self.gate().await?;
        self.inner.append_audit(entry).await
    }
    async fn audit_page(&self, q: &AuditQuery) -> StoreResult<Vec<AuditEntry>> {
        self.gate().await?;
        self.inner.audit_page(q).await
    }
    async fn delete_audit_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        self.gate().await?;
        self.inner.delete_audit_before(before, budget).await
    }
}

#[async_trait]
impl IdempotencyStore for FaultyStore {
    async fn begin_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<Begun> {
        self.gate().await?;
        self.inner
            .begin_idempotent(scope, key, fingerprint, ttl)
            .await
    }
    async fn finish_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        response: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<()> {
        self.gate().await?;
        self.inner
            .finish_idempotent(scope, key, fingerprint, response, ttl)
            .await
    }
    async fn abandon_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
    ) -> StoreResult<()> {
        self.gate().await?;
        self.inner.abandon_idempotent(scope, key, fingerprint).await
    }
}

#[async_trait]
impl HoldStore for FaultyStore {
    async fn put_hold(&self, hold: &Hold) -> StoreResult<()> {
        self.gate().await?;
        self.inner.put_hold(hold).await
    }
    async fn get_hold(&self, id: &str) -> StoreResult<Option<Hold>> {
        self.gate().await?;
        self.inner.get_hold(id).await
    }
    async fn end_hold(
        &self,
        id: &str,
        state: crate::domain::HoldState,
        cost: Option<u64>,
        now_ms: i64,
    ) -> StoreResult<Ended> {
        self.gate().await?;
        self.inner.end_hold(id, state, cost, now_ms).await
    }
    async fn expired_holds(&self, now_ms: i64, limit: usize) -> StoreResult<Vec<Hold>> {
        self.gate().await?;
        self.inner.expired_holds(now_ms, limit).await
    }
    async fn expire_holds(&self, ids: &[String], now_ms: i64) -> StoreResult<Vec<Hold>> {
        self.gate().await?;
        self.inner.expire_holds(ids, now_ms).await
    }
}
