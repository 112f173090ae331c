//! The limiter: the in-memory pre-check and the decision.
//!
//! State is one [`Entry`] per (tenant, subject), where the subject is a client or `*` for the
//! tenant's shared limits. An entry holds a [`LimitState`] per limit: the limit's buckets, each
//! with the count last read from the store and the hits this instance admitted since (pending).
//! The estimate of a limit is over `stored + pending`, so this instance's own hits count at once
//! and other instances' hits count from the next sync.
//!
//! Invariants:
//! - A check sees and updates every counter it touches in one step: the client's entry and, when
//!   a tenant-scoped limit applies, the tenant's entry are locked together (shards in index
//!   order), so two racing checks can never both take the last unit, and a denial consumes
//!   nothing anywhere.
//! - Locks are `std::sync::Mutex` over a sharded map, held only for in-memory arithmetic: no
//!   `.await` ever happens under one.
//! - A counter not in memory is read from the store before its first decision; it is never
//!   assumed to be zero (unless the store fails and the policy says to carry on locally).
//! - Pending hits only leave memory by being written: buckets with pending hits are never pruned,
//!   and entries with pending hits are never evicted.
//! - In steady state a check allocates nothing: lookups borrow the request's strings, and bucket
//!   vectors keep their capacity as buckets roll.
//!
//! # Many instances (`cached` consistency)
//! With `instances` > 1 (one store shard per instance), each instance may admit, between two
//! syncs, at most its share of the headroom it last read: `pending <= share x (max - stored)`.
//! Shares follow demand, from the per-shard counts every read returns at no extra write:
//! `share = (mine + a) / (total + a x N)` over the limit's window, with `a = 1 + total/100`, so the
//! shares of all instances add up to 1, an instance carrying all the traffic gets nearly all the
//! headroom (98% of it with N = 3), a newcomer or a key nobody has counted gets 1/N, and an instance that
//! stops writing fades out as its hits leave the window. If all instances read the store at the
//! same moment they could never overshoot together; reads at different moments leave a small
//! overshoot, measured by the simulation in `tests/simulation.rs` and reported in the README.
//!
//! # Memory
//! At most `max_counters` limit states, and `max_clients_per_tenant` client entries of one
//! tenant, are held. A check needing one more is decided through the store as in strict mode
//! (exact, holding nothing). Near a cap, `evict` lets written counters unused for two sync
//! intervals go; counters holding pending hits never go, so the pending-hit buffer is bounded
//! by the cap too.

pub mod window;

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hashbrown::{DefaultHashBuilder, Equivalent, HashMap};
use smallvec::SmallVec;

use crate::clock::Clock;
use crate::domain::{
    ClientId, Consistency, Limit, LimitId, LimitKind, Mode, OnStoreFailure, Policy, Scope,
    TenantId, TENANT_SUBJECT,
};
use crate::metrics::Metrics;
use crate::store::{BucketTotal, CounterKey, CounterRange, Delta, DynStore, StoreError};
use window::Bucket;

/// Tuning of the in-memory state.
#[derive(Clone, Debug)]
pub struct LimiterConfig {
    /// Number of lock shards; more shards, less contention.
    pub shards: usize,
    /// An entry untouched this long, with nothing pending, leaves memory (re-read on next use).
    pub idle_ms: i64,
    /// Deadline of a store call made on the check path (first touch, strict mode).
    pub store_timeout: Duration,
    /// Instances sharing the store (the store's shard count); 1 = no one else counts.
    pub instances: u32,
    /// The sync interval: how long a denial for an exhausted share lasts at most.
    pub sync_interval_ms: i64,
    /// Most counters (key x limit) held in memory. A check that needs one more is decided
    /// through the store instead (as in strict mode), holding nothing.
    pub max_counters: usize,
    /// Most distinct clients of one tenant held in memory; the same applies beyond it.
    pub max_clients_per_tenant: usize,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            shards: 64,
            idle_ms: 60_000,
            store_timeout: Duration::from_millis(50),
            instances: 1,
            sync_interval_ms: 250,
            max_counters: 1_000_000,
            max_clients_per_tenant: 100_000,
        }
    }
}

/// The owned key of an entry, with the hash of its strings computed once: a check hashes each
/// key once, for the shard and for the map.
#[derive(Clone, PartialEq, Eq, Debug)]
struct EntryKey {
    hash: u64,
    tenant: Arc<str>,
    subject: Arc<str>,
}

impl Hash for EntryKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash)
    }
}

/// A borrowed key, so lookups on the check path do not allocate.
#[derive(Clone, Copy)]
struct EntryRef<'a> {
    hash: u64,
    tenant: &'a str,
    subject: &'a str,
}

impl<'a> EntryRef<'a> {
    fn new(hasher: &DefaultHashBuilder, tenant: &'a str, subject: &'a str) -> Self {
        EntryRef {
            hash: hasher.hash_one((tenant, subject)),
            tenant,
            subject,
        }
    }
}

impl Hash for EntryRef<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash)
    }
}

impl Equivalent<EntryKey> for EntryRef<'_> {
    fn equivalent(&self, k: &EntryKey) -> bool {
        // The hash first: a differing key is told apart without reading its strings.
        k.hash == self.hash && *k.tenant == *self.tenant && *k.subject == *self.subject
    }
}

/// The maps' hasher: keys carry their hash already.
#[derive(Clone, Copy, Default)]
struct KeyHash(u64);

impl Hasher for KeyHash {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; anything else still hashes soundly.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[derive(Clone, Copy, Default)]
struct BuildKeyHash;

impl BuildHasher for BuildKeyHash {
    type Hasher = KeyHash;
    fn build_hasher(&self) -> KeyHash {
        KeyHash::default()
    }
}

#[derive(Debug)]
struct LimitState {
    id: Arc<str>,
    kind: LimitKind,
    /// Sorted by start.
    buckets: Vec<Bucket>,
    /// This instance's share of the headroom (1 when it is alone).
    share: f32,
    /// Hits this instance wrote since its last read back: in `stored` already, but not yet in
    /// what the other instances know, so they still count against this instance's share.
    settling: u64,
}

impl LimitState {
    fn is(&self, l: &Limit) -> bool {
        // Installed from the same policy, the ids are one allocation: no string compare.
        (Arc::ptr_eq(&self.id, l.id.as_arc()) || *self.id == *l.id.as_str())
            && self.kind.grain() == l.kind.grain()
    }

    fn pending(&self) -> u64 {
        self.buckets.iter().map(|b| b.pending).sum()
    }

    /// Drops buckets that no longer count and hold nothing to write.
    fn prune(&mut self, now: i64) {
        let oldest = window::oldest_needed(self.kind, now);
        if self
            .buckets
            .first()
            .is_some_and(|b| b.start < oldest && b.pending == 0)
        {
            self.buckets.retain(|b| b.start >= oldest || b.pending > 0);
        }
    }
}

#[derive(Debug, Default)]
struct Entry {
    /// One state inline (a one-limit policy, a tenant's entry); more spill to the heap.
    states: SmallVec<[LimitState; 1]>,
    last_used: i64,
    /// Used since the last sync: its totals are read back then.
    touched: bool,
    /// Sync rounds since its totals were last read back.
    stale_rounds: u8,
}

/// Untouched entries are still read back every this many sync rounds, so what other instances
/// did reaches them even while this one only holds them.
const REFRESH_IDLE_EVERY: u8 = 8;

/// An instance's demand-weighted share of a counter's headroom, from the store's per-shard
/// counts over the window (see the module comment).
///
/// Only settled buckets count: those that closed before `settled` (two sync intervals ago),
/// which every instance has written by now. A fresher bucket holds this instance's own hits
/// in full but the others' only up to their last sync, and would make every instance think
/// its share larger than it is (the shares would add up to more than 1).
pub fn share_of(
    totals: &[BucketTotal],
    grain: crate::domain::Grain,
    from: i64,
    settled: i64,
    instances: u32,
) -> f32 {
    if instances <= 1 {
        return 1.0;
    }
    let sum = |only_settled: bool| {
        let (mut mine, mut total) = (0f64, 0f64);
        for t in totals
            .iter()
            .filter(|t| t.start >= from && (!only_settled || grain.bucket_end(t.start) <= settled))
        {
            mine += t.mine.max(0) as f64;
            total += t.total.max(0) as f64;
        }
        (mine, total)
    };
    let (mut mine, mut total) = sum(true);
    if total == 0.0 {
        // A fresh key: nothing has settled yet. What the fleet wrote so far is the only sign of
        // who carries it; waiting for a bucket to settle would hold a busy instance at 1/N
        // for the first buckets, pushing its admissions late into them.
        (mine, total) = sum(false);
    }
    let a = 1.0 + total / 100.0;
    ((mine + a) / (total + a * instances as f64)) as f32
}

type Shard = HashMap<EntryKey, Entry, BuildKeyHash>;

/// The limit that binds an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub limit_id: LimitId,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_ms: i64,
}

/// What a check decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// In `dry_run` mode: enforcement would have denied this check.
    pub dry_run_denied: bool,
    /// None when no limit applies.
    pub binding: Option<Binding>,
    /// 0 when allowed; on a denial the wait until the same request could pass; None if never.
    pub retry_after_ms: Option<i64>,
    /// Set when the store failed and the policy's `on_store_failure` rule decided.
    pub store_failure: Option<OnStoreFailure>,
}

impl Decision {
    fn no_limit() -> Self {
        Decision {
            allowed: true,
            dry_run_denied: false,
            binding: None,
            retry_after_ms: Some(0),
            store_failure: None,
        }
    }
}

/// A check as the limiter sees it.
#[derive(Clone, Copy, Debug)]
pub struct CheckInput<'a> {
    pub tenant: &'a TenantId,
    pub client: &'a ClientId,
    pub resource: Option<&'a str>,
    pub cost: u64,
}

/// One limit's usage, for `/v1/usage`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    pub limit_id: LimitId,
    pub count: u64,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_ms: i64,
}

/// Most limits one check can touch without a heap allocation.
type Applicable<'p> = SmallVec<[&'p Limit; 16]>;

/// The outcome of one evaluation under the locks.
enum Locked {
    Decided(Decision),
    /// These applicable limits (indices) have no state in memory yet.
    Missing(SmallVec<[usize; 16]>),
}

/// A memory cap that kept a counter out of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cap {
    Counters,
    TenantClients,
}

impl Cap {
    fn label(self) -> &'static str {
        match self {
            Cap::Counters => "counters",
            Cap::TenantClients => "tenant_clients",
        }
    }
}

pub struct Limiter {
    shards: Box<[Mutex<Shard>]>,
    /// Counters (limit states) in memory, for `max_counters`.
    counters: AtomicUsize,
    /// Client entries in memory per tenant, for `max_clients_per_tenant`. Locked after a
    /// shard, never before one.
    tenant_clients: Mutex<std::collections::HashMap<Arc<str>, usize>>,
    hasher: DefaultHashBuilder,
    store: DynStore,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    cfg: LimiterConfig,
}

fn subject_of<'a>(l: &Limit, client: &'a str) -> &'a str {
    match l.scope {
        Scope::Client => client,
        Scope::Tenant => TENANT_SUBJECT,
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding a shard cannot leave it half-updated in a way that matters more
    // than losing the whole service, so keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Per-limit verdict before anything is consumed.
#[derive(Clone, Copy)]
struct Verdict {
    est: u64,
    admit: bool,
    retry: Option<i64>,
}

/// How a decision sees the rest of the fleet.
#[derive(Clone, Copy)]
struct Fleet {
    /// Enforce shares of the headroom (more than one instance, cached consistency).
    shares: bool,
    sync_interval_ms: i64,
}

fn judge(l: &Limit, s: &LimitState, now: i64, cost: u64, fleet: Fleet) -> Verdict {
    let buckets = &s.buckets;
    let est = window::estimate(l.kind, buckets, now);
    if cost > l.max {
        Verdict {
            est,
            admit: false,
            retry: None,
        }
    } else if est.saturating_add(cost) > l.max {
        Verdict {
            est,
            admit: false,
            retry: Some(window::time_until_at_most(
                l.kind,
                buckets,
                now,
                l.max - cost,
            )),
        }
    } else if fleet.shares && cost > 0 && !within_share(l, s, now, cost) {
        // The window has room, but this instance has used its share of it since it last heard
        // from the others: the next sync brings a fresh count and a fresh share.
        Verdict {
            est,
            admit: false,
            retry: Some(fleet.sync_interval_ms),
        }
    } else {
        Verdict {
            est,
            admit: true,
            retry: Some(0),
        }
    }
}

/// `pending + cost <= share x (max - stored)`: this instance's unwritten hits stay within its
/// share of the headroom the store last showed.
///
/// Hits written since the last read back (`settling`) still count as this instance's own: the
/// headroom is the one the store showed at that read, before they were added.
fn within_share(l: &Limit, s: &LimitState, now: i64, cost: u64) -> bool {
    let stored = window::estimate_by(l.kind, &s.buckets, now, |b| b.stored);
    let pending = window::estimate_by(l.kind, &s.buckets, now, |b| b.pending);
    let headroom = l.max.saturating_sub(stored.saturating_sub(s.settling));
    let allowance = (s.share as f64 * headroom as f64).floor() as u64;
    pending.saturating_add(s.settling).saturating_add(cost) <= allowance
}

/// The binding limit: on a denial the denying one with the longest wait (never = longest);
/// otherwise the one with the least remaining. Ties go to the first in policy order.
fn binding_index(verdicts: &[Verdict], limits: &[&Limit], cost: u64, denied: bool) -> usize {
    let mut best = 0;
    for i in 1..verdicts.len() {
        let (v, b) = (&verdicts[i], &verdicts[best]);
        let better = if denied {
            if v.admit {
                false
            } else if b.admit {
                true
            } else {
                match (v.retry, b.retry) {
                    (None, Some(_)) => true,
                    (Some(x), Some(y)) => x > y,
                    _ => false,
                }
            }
        } else {
            let rem = |i: usize| limits[i].max.saturating_sub(verdicts[i].est + cost);
            rem(i) < rem(best)
        };
        if better {
            best = i;
        }
    }
    best
}

/// Decides over the states of the applicable limits; consumes `cost` on admission (or when
/// `force_admit`, the `allow` store-failure rule).
fn decide(
    policy: &Policy,
    limits: &[&Limit],
    states: &mut [&mut LimitState],
    now: i64,
    cost: u64,
    force_admit: bool,
    fleet: Fleet,
) -> Decision {
    let mut verdicts: SmallVec<[Verdict; 16]> = SmallVec::new();
    for (l, s) in limits.iter().zip(states.iter_mut()) {
        s.kind = l.kind;
        s.prune(now);
        verdicts.push(judge(l, s, now, cost, fleet));
    }
    let denied = !force_admit && verdicts.iter().any(|v| !v.admit);
    if !denied && cost > 0 {
        for (l, s) in limits.iter().zip(states.iter_mut()) {
            window::add_pending(l.kind, &mut s.buckets, now, cost);
        }
    }
    let b = binding_index(&verdicts, limits, cost, denied);
    let (l, v) = (limits[b], verdicts[b]);
    let binding = Binding {
        limit_id: l.id.clone(),
        limit: l.max,
        remaining: if denied {
            l.max.saturating_sub(v.est)
        } else {
            l.max.saturating_sub(v.est.saturating_add(cost))
        },
        reset_after_ms: window::reset_after(l.kind, &states[b].buckets, now),
    };
    let dry_run = policy.mode == Mode::DryRun;
    Decision {
        allowed: !denied || dry_run,
        dry_run_denied: denied && dry_run,
        binding: Some(binding),
        retry_after_ms: if denied && !dry_run { v.retry } else { Some(0) },
        store_failure: None,
    }
}

/// How far ahead of this instance's clock another instance's clock may run and still have its
/// buckets counted here.
pub const CLOCK_SKEW_MS: i64 = 60_000;

/// The newest bucket start a read covers: the current bucket, or a slightly later one written
/// by an instance whose clock runs ahead. Reads stay bounded (the scylla store refuses ranges
/// over many partitions).
fn newest_readable(kind: LimitKind, now: i64) -> i64 {
    kind.grain().bucket_start(now + CLOCK_SKEW_MS)
}

fn buckets_from(totals: &[BucketTotal]) -> Vec<Bucket> {
    totals
        .iter()
        .map(|t| Bucket {
            start: t.start,
            stored: t.total.max(0) as u64,
            pending: 0,
        })
        .collect()
}

/// The pending hits the sync task took, and the counters it will read back.
#[derive(Debug, Default)]
pub struct SyncBatch {
    pub deltas: Vec<Delta>,
    pub ranges: Vec<CounterRange>,
}

impl SyncBatch {
    pub fn hits(&self) -> u64 {
        self.deltas.iter().map(|d| d.delta.max(0) as u64).sum()
    }
}

impl Limiter {
    pub fn new(
        store: DynStore,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        cfg: LimiterConfig,
    ) -> Self {
        let shards = (0..cfg.shards.max(1))
            .map(|_| Mutex::new(Shard::default()))
            .collect();
        Self {
            shards,
            counters: AtomicUsize::new(0),
            tenant_clients: Mutex::new(Default::default()),
            hasher: DefaultHashBuilder::default(),
            store,
            clock,
            metrics,
            cfg,
        }
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    fn share(&self, totals: &[BucketTotal], r: &CounterRange, now: i64) -> f32 {
        let settled = now - 2 * self.cfg.sync_interval_ms;
        share_of(totals, r.key.grain, r.from, settled, self.cfg.instances)
    }

    fn fleet(&self, policy: &Policy) -> Fleet {
        Fleet {
            shares: self.cfg.instances > 1 && policy.consistency == Consistency::Cached,
            sync_interval_ms: self.cfg.sync_interval_ms,
        }
    }

    /// The shard of a key, from bits of its hash the maps do not use for their slots (the low
    /// bits pick a slot and the top 7 tag it).
    fn shard_of(&self, k: EntryRef<'_>) -> usize {
        ((k.hash >> 32) % self.shards.len() as u64) as usize
    }

    fn key_ref<'a>(&self, tenant: &'a str, subject: &'a str) -> EntryRef<'a> {
        EntryRef::new(&self.hasher, tenant, subject)
    }

    /// Decides one check. Never fails: store trouble is decided by the policy's
    /// `on_store_failure` rule, and the decision says so.
    pub async fn check(&self, policy: &Policy, input: CheckInput<'_>) -> Decision {
        let limits: Applicable<'_> = policy
            .limits
            .iter()
            .filter(|l| l.applies_to(input.resource))
            .collect();
        if limits.is_empty() {
            return Decision::no_limit();
        }
        let now = self.clock.now_ms();
        if policy.consistency == Consistency::Strict {
            return self.check_strict(policy, &limits, input, now).await;
        }
        for _ in 0..4 {
            match self.locked(policy, &limits, input, now, false) {
                Locked::Decided(d) => return d,
                Locked::Missing(missing) => {
                    let want: Applicable<'_> = missing.iter().map(|&i| limits[i]).collect();
                    match self.load(input, &want, now).await {
                        Ok(None) => {}
                        Ok(Some(cap)) => {
                            // No room in memory: let the store count this check.
                            self.metrics.memory_cap_check(cap.label());
                            return self.check_strict(policy, &limits, input, now).await;
                        }
                        Err(e) => return self.on_failure(policy, &limits, input, now, &e),
                    }
                }
            }
        }
        // Only reachable if entries are evicted as fast as they are loaded.
        let e = StoreError::Unavailable("counter state kept being evicted".into());
        self.on_failure(policy, &limits, input, now, &e)
    }

    /// Locks the entries the limits need (tenant entry and client entry, shards in index
    /// order) and decides, or says which states are missing.
    fn locked(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
        force_admit: bool,
    ) -> Locked {
        let tenant = input.tenant.as_str();
        let client = input.client.as_str();
        let kc = self.key_ref(tenant, client);
        let kt = self.key_ref(tenant, TENANT_SUBJECT);
        let need_c = limits.iter().any(|l| l.scope == Scope::Client);
        let need_t = limits.iter().any(|l| l.scope == Scope::Tenant);
        let (sc, st) = (self.shard_of(kc), self.shard_of(kt));
        let fleet = self.fleet(policy);
        let decide = |t: Option<&mut Entry>, c: Option<&mut Entry>| {
            Self::decide_in(fleet, policy, limits, t, c, now, input.cost, force_admit)
        };
        match (need_t, need_c) {
            (true, true) if sc == st => {
                let mut g = lock(&self.shards[sc]);
                let [t, c] = g.get_disjoint_mut([&kt, &kc]);
                decide(t, c)
            }
            (true, true) => {
                let (first, second) = if st < sc { (st, sc) } else { (sc, st) };
                let mut g1 = lock(&self.shards[first]);
                let mut g2 = lock(&self.shards[second]);
                let (gt, gc) = if st < sc {
                    (&mut g1, &mut g2)
                } else {
                    (&mut g2, &mut g1)
                };
                decide(gt.get_mut(&kt), gc.get_mut(&kc))
            }
            (true, false) => decide(lock(&self.shards[st]).get_mut(&kt), None),
            _ => decide(None, lock(&self.shards[sc]).get_mut(&kc)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn decide_in(
        fleet: Fleet,
        policy: &Policy,
        limits: &[&Limit],
        t: Option<&mut Entry>,
        c: Option<&mut Entry>,
        now: i64,
        cost: u64,
        force_admit: bool,
    ) -> Locked {
        let mut slots: SmallVec<[Option<&mut LimitState>; 16]> =
            (0..limits.len()).map(|_| None).collect();
        for (entry, scope) in [(t, Scope::Tenant), (c, Scope::Client)] {
            if let Some(e) = entry {
                e.last_used = now;
                e.touched = true;
                for s in e.states.iter_mut() {
                    if let Some(i) = limits.iter().position(|l| l.scope == scope && s.is(l)) {
                        slots[i] = Some(s);
                    }
                }
            }
        }
        if slots.iter().any(Option::is_none) {
            return Locked::Missing(
                slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(i, _)| i)
                    .collect(),
            );
        }
        let mut states: SmallVec<[&mut LimitState; 16]> = slots.into_iter().flatten().collect();
        Locked::Decided(decide(
            policy,
            limits,
            &mut states,
            now,
            cost,
            force_admit,
            fleet,
        ))
    }

    fn counter_key(tenant: &TenantId, client: &ClientId, l: &Limit) -> CounterKey {
        CounterKey {
            tenant: tenant.as_arc().clone(),
            subject: match l.scope {
                Scope::Client => client.as_arc().clone(),
                Scope::Tenant => Arc::from(TENANT_SUBJECT),
            },
            limit: l.id.as_arc().clone(),
            grain: l.kind.grain(),
        }
    }

    fn range_of(tenant: &TenantId, client: &ClientId, l: &Limit, now: i64) -> CounterRange {
        CounterRange {
            key: Self::counter_key(tenant, client, l),
            from: window::oldest_needed(l.kind, now),
            to: newest_readable(l.kind, now),
        }
    }

    async fn with_deadline<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, StoreError>>,
        uncertain: bool,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.cfg.store_timeout, fut).await {
            Ok(r) => r,
            Err(_) if uncertain => Err(StoreError::Uncertain(format!(
                "no answer within {:?}",
                self.cfg.store_timeout
            ))),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {:?}",
                self.cfg.store_timeout
            ))),
        }
    }

    /// Reads the missing counters from the store and installs them (unless a racing check
    /// installed them first, whose state then wins). Says which cap, if any, left one out.
    async fn load(
        &self,
        input: CheckInput<'_>,
        limits: &[&Limit],
        now: i64,
    ) -> Result<Option<Cap>, StoreError> {
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| Self::range_of(input.tenant, input.client, l, now))
            .collect();
        let totals = self.with_deadline(self.store.read(&ranges), false).await?;
        let mut capped = None;
        for (l, (r, t)) in limits.iter().zip(ranges.iter().zip(totals)) {
            let share = self.share(&t, r, now);
            if let Err(cap) = self.install(input, l, buckets_from(&t), share, now) {
                capped = Some(cap);
            }
        }
        Ok(capped)
    }

    /// Installs a counter's state, within the memory caps.
    fn install(
        &self,
        input: CheckInput<'_>,
        l: &Limit,
        buckets: Vec<Bucket>,
        share: f32,
        now: i64,
    ) -> Result<(), Cap> {
        let subject = subject_of(l, input.client.as_str());
        let r = self.key_ref(input.tenant.as_str(), subject);
        let mut g = lock(&self.shards[self.shard_of(r)]);
        if g.get(&r).is_some_and(|e| e.states.iter().any(|s| s.is(l))) {
            return Ok(());
        }
        if self.counters.load(Ordering::Relaxed) >= self.cfg.max_counters {
            return Err(Cap::Counters);
        }
        let entry = match g.get_mut(&r) {
            Some(e) => e,
            None => {
                if l.scope == Scope::Client {
                    let mut per_tenant = self
                        .tenant_clients
                        .lock()
                        .unwrap_or_else(|p| p.into_inner());
                    match per_tenant.get_mut(input.tenant.as_str()) {
                        Some(n) if *n >= self.cfg.max_clients_per_tenant => {
                            return Err(Cap::TenantClients)
                        }
                        Some(n) => *n += 1,
                        None => {
                            per_tenant.insert(input.tenant.as_arc().clone(), 1);
                        }
                    }
                }
                g.entry(EntryKey {
                    hash: r.hash,
                    tenant: input.tenant.as_arc().clone(),
                    subject: match l.scope {
                        Scope::Client => input.client.as_arc().clone(),
                        Scope::Tenant => Arc::from(TENANT_SUBJECT),
                    },
                })
                .or_default()
            }
        };
        entry.last_used = now;
        entry.states.push(LimitState {
            id: l.id.as_arc().clone(),
            kind: l.kind,
            buckets,
            share,
            settling: 0,
        });
        self.counters.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The store failed on the check path: apply the policy's rule.
    fn on_failure(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
        e: &StoreError,
    ) -> Decision {
        tracing::warn!(error = %e, rule = ?policy.on_store_failure, "store failed on the check path");
        let rule = policy.on_store_failure;
        self.metrics.store_failure_decision(match rule {
            OnStoreFailure::Local => "local",
            OnStoreFailure::Allow => "allow",
            OnStoreFailure::Deny => "deny",
        });
        let mut d = match rule {
            OnStoreFailure::Deny => self.without_memory(policy, limits, input, rule),
            OnStoreFailure::Local | OnStoreFailure::Allow => {
                // Carry on with what this instance knows: install empty states for counters it
                // has never seen (the next sync reads their real totals back), and decide on
                // them. Admitted hits are pending and reach the store when it returns.
                // Not knowing the others' demand, take an even share.
                let share = 1.0 / self.cfg.instances.max(1) as f32;
                let mut room = true;
                for l in limits {
                    room &= self.install(input, l, Vec::new(), share, now).is_ok();
                }
                match self.locked(policy, limits, input, now, rule == OnStoreFailure::Allow) {
                    Locked::Decided(d) if room => d,
                    // A memory cap leaves nowhere to hold the hit until the store returns.
                    _ => self.without_memory(policy, limits, input, rule),
                }
            }
        };
        d.store_failure = Some(rule);
        d
    }

    /// The store failed and a memory cap leaves no room to hold a hit until it returns: `allow`
    /// admits anyway (counting and logging the hit as unrecorded); `local` has no local view
    /// to enforce and denies, as `deny` does.
    fn without_memory(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        rule: OnStoreFailure,
    ) -> Decision {
        let l = limits[0];
        let admit = rule == OnStoreFailure::Allow;
        if admit && input.cost > 0 {
            self.metrics.unrecorded_hits(input.cost);
            tracing::warn!(
                tenant = input.tenant.as_str(),
                cost = input.cost,
                "admitted a hit that is neither in the store nor in memory (store down, memory cap reached)"
            );
        }
        // In dry_run mode a denial answers allowed, flagged.
        let dry_run_denied = !admit && policy.mode == Mode::DryRun;
        let allowed = admit || dry_run_denied;
        Decision {
            allowed,
            dry_run_denied,
            binding: Some(Binding {
                limit_id: l.id.clone(),
                limit: l.max,
                remaining: 0,
                reset_after_ms: 1_000,
            }),
            retry_after_ms: Some(if allowed { 0 } else { 1_000 }),
            store_failure: Some(rule),
        }
    }

    /// Strict consistency: the store counts the hit before the answer; a denial compensates.
    async fn check_strict(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
    ) -> Decision {
        let deltas: Vec<Delta> = if input.cost > 0 {
            limits
                .iter()
                .map(|l| Delta {
                    key: Self::counter_key(input.tenant, input.client, l),
                    start: l.kind.grain().bucket_start(now),
                    delta: input.cost as i64,
                })
                .collect()
        } else {
            Vec::new()
        };
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| Self::range_of(input.tenant, input.client, l, now))
            .collect();
        let totals = match self
            .with_deadline(
                self.store.increment_and_read(&deltas, &ranges),
                !deltas.is_empty(),
            )
            .await
        {
            Ok(t) => t,
            Err(e) => {
                if matches!(e, StoreError::Uncertain(_)) {
                    self.metrics.uncertain_hits(input.cost);
                }
                return self.on_failure(policy, limits, input, now, &e);
            }
        };
        // Judge the counts as they were before this hit, which the store already holds.
        let mut states: Vec<LimitState> = limits
            .iter()
            .zip(&totals)
            .map(|(l, t)| {
                let mut buckets = buckets_from(t);
                let start = l.kind.grain().bucket_start(now);
                if let Some(b) = buckets.iter_mut().find(|b| b.start == start) {
                    b.stored = b.stored.saturating_sub(input.cost);
                }
                LimitState {
                    id: l.id.as_arc().clone(),
                    kind: l.kind,
                    buckets,
                    share: 1.0,
                    settling: 0,
                }
            })
            .collect();
        let mut refs: Vec<&mut LimitState> = states.iter_mut().collect();
        // The store counted this hit against everyone's: no share to keep to.
        let fleet = Fleet {
            shares: false,
            ..self.fleet(policy)
        };
        let d = decide(policy, limits, &mut refs, now, input.cost, false, fleet);
        let consumed = d.allowed && !d.dry_run_denied;
        if consumed {
            // Counters this instance also holds in memory learn the hit now, not at a read back.
            for d in &deltas {
                self.with_state(&d.key, |s| {
                    window::bucket_at(&mut s.buckets, d.start).stored += d.delta.max(0) as u64;
                });
            }
        }
        if !consumed && !deltas.is_empty() {
            let undo: Vec<Delta> = deltas
                .into_iter()
                .map(|mut d| {
                    d.delta = -d.delta;
                    d
                })
                .collect();
            if let Err(e) = self.store.increment(&undo).await {
                // The denied hit stays counted: the count errs high (towards denial).
                self.metrics.compensation_failed();
                tracing::warn!(error = %e, "strict mode: compensating a denied hit failed");
            }
        }
        d
    }

    /// `/v1/usage`: the store's totals plus this instance's unwritten hits. Consumes nothing.
    pub async fn usage(
        &self,
        policy: &Policy,
        tenant: &TenantId,
        client: &ClientId,
        resource: Option<&str>,
    ) -> Result<Vec<Usage>, StoreError> {
        let now = self.clock.now_ms();
        let limits: Vec<&Limit> = policy
            .limits
            .iter()
            .filter(|l| l.applies_to(resource))
            .collect();
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| Self::range_of(tenant, client, l, now))
            .collect();
        let totals = self.with_deadline(self.store.read(&ranges), false).await?;
        let mut out = Vec::with_capacity(limits.len());
        for (l, t) in limits.iter().zip(totals) {
            let mut buckets = buckets_from(&t);
            let r = self.key_ref(tenant.as_str(), subject_of(l, client.as_str()));
            {
                let g = lock(&self.shards[self.shard_of(r)]);
                if let Some(s) = g.get(&r).and_then(|e| e.states.iter().find(|s| s.is(l))) {
                    for b in s.buckets.iter().filter(|b| b.pending > 0) {
                        window::bucket_at(&mut buckets, b.start).pending += b.pending;
                    }
                }
            }
            let count = window::estimate(l.kind, &buckets, now);
            out.push(Usage {
                limit_id: l.id.clone(),
                count,
                limit: l.max,
                remaining: l.max.saturating_sub(count),
                reset_after_ms: window::reset_after(l.kind, &buckets, now),
            });
        }
        Ok(out)
    }

    // ---- The sync task's side -------------------------------------------------------------

    /// Takes a snapshot of every pending hit (as increments) and lists the counters used since
    /// the last sync (to read back). Clears the "used" marks.
    pub fn collect(&self, now: i64) -> SyncBatch {
        let mut batch = SyncBatch::default();
        for shard in self.shards.iter() {
            let mut g = lock(shard);
            for (k, e) in g.iter_mut() {
                // Others' hits reach an entry by reading it back: every round once used, while
                // other instances count too; otherwise (and alone, where this instance's own
                // writes already keep it exact) every few rounds, which also picks up hits the
                // store counted directly (strict checks, checks beyond a memory cap).
                let refresh =
                    (e.touched && self.cfg.instances > 1) || e.stale_rounds >= REFRESH_IDLE_EVERY;
                for s in &e.states {
                    let key = || CounterKey {
                        tenant: k.tenant.clone(),
                        subject: k.subject.clone(),
                        limit: s.id.clone(),
                        grain: s.kind.grain(),
                    };
                    for b in s.buckets.iter().filter(|b| b.pending > 0) {
                        batch.deltas.push(Delta {
                            key: key(),
                            start: b.start,
                            delta: b.pending.min(i64::MAX as u64) as i64,
                        });
                    }
                    if refresh {
                        batch.ranges.push(CounterRange {
                            key: key(),
                            from: window::oldest_needed(s.kind, now),
                            to: newest_readable(s.kind, now),
                        });
                    }
                }
                if refresh {
                    e.stale_rounds = 0;
                } else {
                    e.stale_rounds = e.stale_rounds.saturating_add(1);
                }
                e.touched = false;
            }
        }
        batch
    }

    fn with_state<R>(&self, key: &CounterKey, f: impl FnOnce(&mut LimitState) -> R) -> Option<R> {
        let r = self.key_ref(&key.tenant, &key.subject);
        let mut g = lock(&self.shards[self.shard_of(r)]);
        let s = g
            .get_mut(&r)?
            .states
            .iter_mut()
            .find(|s| s.id == key.limit && s.kind.grain() == key.grain)?;
        Some(f(s))
    }

    /// The snapshot's increments reached the store: move them from pending to stored. Hits
    /// admitted since the snapshot stay pending.
    pub fn written(&self, deltas: &[Delta]) {
        for d in deltas {
            self.with_state(&d.key, |s| {
                if let Ok(i) = s.buckets.binary_search_by_key(&d.start, |b| b.start) {
                    let b = &mut s.buckets[i];
                    let n = (d.delta.max(0) as u64).min(b.pending);
                    b.pending -= n;
                    b.stored += n;
                    s.settling += n;
                }
            });
        }
    }

    /// Installs totals read back from the store: they include every instance's writes.
    pub fn refreshed(&self, ranges: &[CounterRange], totals: Vec<Vec<BucketTotal>>) {
        let now = self.clock.now_ms();
        for (r, t) in ranges.iter().zip(totals) {
            let share = self.share(&t, r, now);
            self.with_state(&r.key, |s| {
                s.share = share;
                s.settling = 0;
                for b in s.buckets.iter_mut().filter(|b| b.start >= r.from) {
                    b.stored = 0;
                }
                for bt in t {
                    window::bucket_at(&mut s.buckets, bt.start).stored = bt.total.max(0) as u64;
                }
            });
        }
    }

    /// Drops what no longer counts: old buckets, empty states, and entries idle for
    /// `idle_ms` with nothing pending. Near a memory cap (90% of it), "idle" shrinks to two
    /// sync intervals, for all entries or for the crowded tenant's clients: written counters
    /// leave first, and a counter holding unwritten hits never leaves.
    /// Returns (counters in memory, pending hits).
    pub fn evict(&self, now: i64) -> (usize, u64) {
        let (mut counters, mut pending) = (0usize, 0u64);
        let pressed = |n: usize, cap: usize| n >= cap - cap / 10;
        let short_idle = (2 * self.cfg.sync_interval_ms).min(self.cfg.idle_ms);
        let all_pressed = pressed(self.counters.load(Ordering::Relaxed), self.cfg.max_counters);
        let crowded: Vec<Arc<str>> = self
            .tenant_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, &n)| pressed(n, self.cfg.max_clients_per_tenant))
            .map(|(t, _)| t.clone())
            .collect();
        let mut left: std::collections::HashMap<Arc<str>, usize> = Default::default();
        for shard in self.shards.iter() {
            let mut g = lock(shard);
            let mut dropped = 0usize;
            g.retain(|k, e| {
                let before = e.states.len();
                for s in e.states.iter_mut() {
                    s.prune(now);
                }
                let is_client = &*k.subject != TENANT_SUBJECT;
                let idle_ms = if all_pressed || (is_client && crowded.contains(&k.tenant)) {
                    short_idle
                } else {
                    self.cfg.idle_ms
                };
                // A state whose window emptied stays while its entry is in use: dropping it would
                // send the next check of a client slower than its window to the store.
                let idle = now - e.last_used >= idle_ms;
                if idle {
                    e.states.retain(|s| !s.buckets.is_empty());
                }
                let p: u64 = e.states.iter().map(LimitState::pending).sum();
                let keep = p > 0 || (!e.states.is_empty() && !idle);
                if keep {
                    counters += e.states.len();
                    pending += p;
                    dropped += before - e.states.len();
                } else {
                    dropped += before;
                    if is_client {
                        *left.entry(k.tenant.clone()).or_default() += 1;
                    }
                }
                keep
            });
            self.counters.fetch_sub(dropped, Ordering::Relaxed);
        }
        if !left.is_empty() {
            let mut per_tenant = self
                .tenant_clients
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for (t, n) in left {
                if let Some(c) = per_tenant.get_mut(&t) {
                    *c = c.saturating_sub(n);
                    if *c == 0 {
                        per_tenant.remove(&t);
                    }
                }
            }
        }
        self.metrics.set_active_counters(counters);
        self.metrics.set_pending(pending);
        (counters, pending)
    }

    /// Hits admitted and not yet written.
    pub fn pending_hits(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| {
                lock(s)
                    .values()
                    .flat_map(|e| e.states.iter())
                    .map(LimitState::pending)
                    .sum::<u64>()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests;
