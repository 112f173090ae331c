//! The limiter: the in-memory pre-check and the decision.
//!
//! State is one entry per (tenant, subject), where the subject is a client or `*` for the
//! tenant's shared limits. An entry holds a state per limit: the limit's buckets, each with the
//! count last read from the store and the hits this instance admitted since (pending). The
//! estimate of a limit is over `stored + pending`, so this instance's own hits count at once
//! and other instances' hits count from the next sync.
//!
//! Invariants:
//! - A check sees and updates every counter it touches in one step: the client's entry is locked
//!   from the check's first look to its last write and, when a tenant-scoped limit applies, the
//!   tenant's entry (in a shard of a separate set) inside it, while the tenant's limits are
//!   judged and consumed. So two racing checks can never both take the last unit, and a denial
//!   consumes nothing anywhere.
//! - Locks are `std::sync::Mutex` over a sharded map, held only for in-memory arithmetic: no
//!   `.await` ever happens under one.
//! - A counter not in memory is read from the store before its first decision; it is never
//!   assumed to be zero (unless the store fails and the policy says to carry on locally).
//! - Pending hits only leave memory by being written: buckets with pending hits are never pruned,
//!   and entries with pending hits are never evicted.
//! - In steady state a check allocates nothing: lookups borrow the request's strings, and bucket
//!   vectors keep their capacity as buckets roll.
//!
//! This file holds the limiter, its construction and the check and usage entry points. The
//! rest, one idea a file: `key` (keys hashed once, store keys and ranges), `state` (entries,
//! limit states, shards), `decision` (the verdicts and the answer), `share` (shares of the
//! headroom among instances), `strict` (deciding through the store), `failure` (store
//! deadlines and the `on_store_failure` rules), `caps` (memory caps), `eviction`, `sync` (the
//! sync task's hooks), `window` (the window arithmetic over buckets), `bucket` and `tokens`
//! (token buckets), `loads` (first reads of counters), `reserve` (what was read when, for the
//! share bound), `reset` (resets and grants), `usage` (usage reads), `writes` (what the sync
//! task writes), `membership` (this instance's place in the fleet) and `ahead` (bringing a
//! batch's entries into the cache).

mod ahead;
mod bucket;
mod caps;
mod decision;
mod eviction;
mod failure;
mod key;
mod loads;
mod membership;
mod reserve;
mod reset;
mod share;
mod state;
mod strict;
mod sync;
pub mod tokens;
mod usage;
pub mod window;
mod writes;

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use hashbrown::DefaultHashBuilder;
use smallvec::SmallVec;

pub use ahead::AHEAD;
pub use decision::{Binding, Decision};
pub use key::CLOCK_SKEW_MS;
pub use membership::{Membership, RegionSeen};
pub use reset::Granted;
pub use share::share_of;
pub use sync::SyncBatch;
pub use usage::Usage;
pub use writes::Writing;

use crate::clock::Clock;
use crate::domain::{
    ClientId, Consistency, Limit, OnStoreFailure, Policy, Scope, TenantId, TENANT_SUBJECT,
};
use crate::history::{Answer, Recorder};
use crate::metrics::Metrics;
use crate::store::{CounterRange, DynCounterStore, StoreError};
use caps::{Cap, TenantClients};
use decision::{Judging, Slots};
use state::{buckets_from, lock, Answered, AnsweredHour, Entry, Shard};

/// Tuning of the in-memory state.
#[derive(Clone, Debug)]
pub struct LimiterConfig {
    /// Number of lock shards; more shards, less contention.
    pub shards: usize,
    /// An entry untouched this long, with nothing pending, leaves memory (re-read on next use).
    pub idle_ms: i64,
    /// Deadline of a store call made on the check path (first touch, strict mode).
    pub store_timeout: Duration,
    /// The fleet: how many instances share the store now (N in the shares), and whether this
    /// one holds its shard lease. Alone unless the fleet task says otherwise.
    pub fleet: Arc<Membership>,
    /// The sync interval: how long a denial for an exhausted share lasts at most.
    pub sync_interval_ms: i64,
    /// The longest a counter's admitted hits wait in memory before they are written, when
    /// nothing presses for sooner (`sync.max_delay_ms`): what a crash can lose.
    pub max_sync_delay_ms: i64,
    /// Most counters (key x limit) held in memory. A check that needs one more is decided
    /// through the store instead (as in strict mode), holding nothing.
    pub max_counters: usize,
    /// Most distinct clients of one tenant held in memory; the same applies beyond it.
    pub max_clients_per_tenant: usize,
    /// Most (tenant, client, hour) rows of usage history waiting for the sync task; 0 records
    /// no history at all.
    pub max_history_rows: usize,
}

impl Default for LimiterConfig {
    fn default() -> Self {
        Self {
            shards: 64,
            idle_ms: 60_000,
            store_timeout: Duration::from_millis(50),
            fleet: Arc::new(Membership::alone()),
            sync_interval_ms: 250,
            max_sync_delay_ms: 250,
            max_counters: 1_000_000,
            max_clients_per_tenant: 100_000,
            max_history_rows: 1_000_000,
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

/// What the usage history names a denial that no limit bound (none is known to happen).
static UNBOUND: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from("-"));

/// Most limits one check can touch without a heap allocation.
type Applicable<'p> = SmallVec<[&'p Limit; 16]>;

/// Puts the states `e` holds for the limits of `scope` in `slots`, by the limit's index, and
/// returns its tally for the usage history; marks the entry used. (Filled in place: returning
/// the slots, 136 bytes, copied them on every check, which the decision bench could see.)
fn fill<'e>(
    slots: &mut Slots<'e>,
    e: Option<&'e mut Entry>,
    limits: &[&Limit],
    scope: Scope,
    now: i64,
) -> Option<&'e mut Answered> {
    slots.extend(limits.iter().map(|_| None));
    let Entry {
        states,
        last_used,
        touched,
        answered,
        ..
    } = e?;
    *last_used = now;
    *touched = true;
    for s in states.iter_mut() {
        if let Some(i) = limits.iter().position(|l| l.scope == scope && s.is(l)) {
            slots[i] = Some(s);
        }
    }
    Some(answered)
}

/// The limits of `policy` that a check on any of `resources` meets.
fn applicable<'p>(policy: &'p Policy, resources: &[Option<&str>]) -> Applicable<'p> {
    policy
        .limits
        .iter()
        .filter(|l| resources.iter().any(|r| l.applies_to(*r)))
        .collect()
}

/// Whether a check's answer was summed in its client's entry for the usage history.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tallied {
    No,
    Yes,
    /// Yes, and the entry's earlier sum came out (another hour, or full): for the history's
    /// rows.
    HandedOver(AnsweredHour),
}

/// The outcome of one evaluation under the locks.
enum Locked {
    Decided(Decision, Tallied),
    /// The last units of a limit: the store decides (see `share`).
    Store,
    /// These applicable limits (indices) have no state in memory yet.
    Missing(SmallVec<[usize; 16]>),
}

/// What deciding in memory came to: a decision (and whether its answer was summed for the
/// usage history), or the store it needs.
enum Now {
    Decided(Decision, bool),
    /// A strict policy, or the last units of a limit: the store decides.
    Store,
    /// These applicable limits (indices) have no state in memory yet.
    Missing(SmallVec<[usize; 16]>),
}

/// The limiter: counter state in memory, the store behind it. Shared by every request
/// handler and the sync task (`Arc<Limiter>`).
pub struct Limiter {
    /// Client entries. Each shard's lock has its cache line(s) to itself: unpadded, a shard
    /// (40 bytes) shared a line with its neighbours, and two workers locking two neighbouring
    /// shards took that line from each other at every lock and unlock.
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    /// Tenant entries (subject `*`), apart: see [`Limiter::locked`].
    tenant_shards: Box<[CachePadded<Mutex<Shard>>]>,
    /// Counters (limit states) in memory, for `max_counters`.
    counters: AtomicUsize,
    /// Client entries in memory per tenant, for `max_clients_per_tenant`. Locked after a
    /// shard, never before one.
    tenant_clients: Mutex<TenantClients>,
    hasher: DefaultHashBuilder,
    store: DynCounterStore,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    /// Every answer, summed per (tenant, client, hour) for the usage history.
    history: Recorder,
    /// The sync task's writes under way, for reads that sum the store and memory.
    writes: writes::Writes,
    /// First reads under way, shared by concurrent first checks of a client.
    loads: loads::Loads,
    /// Sync rounds so far: whose turn it is to be written (`Limiter::collect`).
    rounds: std::sync::atomic::AtomicU64,
    /// Strict calls that answered after their deadline, for memory to learn from.
    late: strict::LateAnswers,
    /// Checks decided by the failure rule since the store last answered the check path: one
    /// log line an episode, not one a check.
    failing: std::sync::atomic::AtomicU64,
    cfg: LimiterConfig,
}

impl Limiter {
    pub fn new(
        store: DynCounterStore,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        cfg: LimiterConfig,
    ) -> Self {
        let shards = || {
            (0..cfg.shards.max(1))
                .map(|_| CachePadded::default())
                .collect()
        };
        Self {
            shards: shards(),
            tenant_shards: shards(),
            counters: AtomicUsize::new(0),
            tenant_clients: Mutex::new(Default::default()),
            hasher: DefaultHashBuilder::default(),
            store,
            clock,
            metrics,
            history: Recorder::new(cfg.shards, cfg.max_history_rows),
            writes: writes::Writes::default(),
            loads: loads::Loads::default(),
            rounds: Default::default(),
            late: Default::default(),
            failing: Default::default(),
            cfg,
        }
    }

    /// Every shard's lock, held: for tests of what must never wait for one.
    #[cfg(any(test, feature = "test-support"))]
    pub fn lock_every_shard(&self) -> Vec<impl Drop + '_> {
        self.all_shards().map(|m| m.lock().unwrap()).collect()
    }

    /// Every shard, client entries' then tenant entries'.
    fn all_shards(&self) -> impl Iterator<Item = &Mutex<Shard>> {
        self.shards
            .iter()
            .chain(self.tenant_shards.iter())
            .map(|s| &**s)
    }

    /// The answers waiting to be written to the usage history.
    pub fn history(&self) -> &Recorder {
        &self.history
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn store(&self) -> &DynCounterStore {
        &self.store
    }

    /// Decides one check, and adds its answer to the usage history. Never fails: store
    /// trouble is decided by the policy's `on_store_failure` rule, and the decision says so.
    pub async fn check(&self, policy: &Policy, input: CheckInput<'_>) -> Decision {
        let limits = applicable(policy, &[input.resource]);
        let (d, recorded) = self.decide(policy, limits, input, true).await;
        if !recorded {
            self.record(policy, input, &d);
        }
        d
    }

    /// [`Limiter::check`], when memory alone decides it: no store call, and none of the state
    /// that awaiting one needs (the future of `check` is large, and moving it costs a check
    /// on the hit path as much as deciding). None: nothing was taken; call `check`.
    pub fn check_now(&self, policy: &Policy, input: CheckInput<'_>) -> Option<Decision> {
        self.check_now_at(policy, input, self.clock.now_ms())
    }

    /// [`Limiter::check_now`] at `now` (ms since the epoch, from [`Limiter::clock`]): a batch
    /// reads the clock once for its checks, which then all happen at that instant.
    pub fn check_now_at(
        &self,
        policy: &Policy,
        input: CheckInput<'_>,
        now: i64,
    ) -> Option<Decision> {
        let limits = applicable(policy, &[input.resource]);
        let Now::Decided(d, recorded) = self.decide_now(policy, &limits, input, now, true) else {
            return None;
        };
        if !recorded {
            self.record(policy, input, &d);
        }
        Some(d)
    }

    /// One check over the limits that apply to any of `resources` (`input.resource` is not
    /// read): decided together, all or nothing, as one check. Envoy's rate limit service sends
    /// a request's descriptors of one client so.
    pub async fn check_any(
        &self,
        policy: &Policy,
        input: CheckInput<'_>,
        resources: &[Option<&str>],
    ) -> Decision {
        let limits = applicable(policy, resources);
        let (d, recorded) = self.decide(policy, limits, input, true).await;
        if !recorded {
            self.record(policy, input, &d);
        }
        d
    }

    /// What a check of `input` would answer now, consuming nothing and recorded nowhere (the
    /// per-descriptor statuses of Envoy's rate limit service).
    pub async fn peek(&self, policy: &Policy, input: CheckInput<'_>) -> Decision {
        let limits = applicable(policy, &[input.resource]);
        self.decide(policy, limits, CheckInput { cost: 0, ..input }, false)
            .await
            .0
    }

    /// Adds a check's answer to the usage history's rows (one admitted on a client entry in
    /// memory was summed there already).
    fn record(&self, policy: &Policy, input: CheckInput<'_>, d: &Decision) {
        if self.cfg.max_history_rows == 0 {
            return;
        }
        let answer = if d.allowed {
            Answer::Admitted { cost: input.cost }
        } else {
            Answer::Denied {
                // The policy's own id, shared: a row keeps it.
                by: d
                    .binding
                    .as_ref()
                    .and_then(|b| policy.limits.iter().find(|l| l.id.as_str() == b.limit_id))
                    .map_or(&UNBOUND, |l| l.id.as_arc()),
            }
        };
        self.history.record(
            input.tenant.as_arc(),
            input.client.as_arc(),
            self.clock.now_ms(),
            answer,
        );
    }

    /// Decides a check; when `record`, its answer is summed in the client's entry for the
    /// usage history if it can be, and the second value says so.
    async fn decide(
        &self,
        policy: &Policy,
        limits: Applicable<'_>,
        input: CheckInput<'_>,
        record: bool,
    ) -> (Decision, bool) {
        let now = self.clock.now_ms();
        let mut missing = match self.decide_now(policy, &limits, input, now, record) {
            Now::Decided(d, recorded) => return (d, recorded),
            Now::Store => return self.through_store(policy, &limits, input, now).await,
            Now::Missing(missing) => missing,
        };
        let tally = record && self.cfg.max_history_rows > 0;
        for _ in 0..4 {
            let want: Applicable<'_> = missing.iter().map(|&i| limits[i]).collect();
            match self
                .loads
                .turn(input.tenant.as_arc(), input.client.as_arc())
            {
                loads::Turn::Lead(_reading) => match self.load(input, &want, now).await {
                    Ok(None) => {}
                    Ok(Some(cap)) => {
                        // No room in memory: let the store count this check.
                        self.metrics.memory_cap_check(cap.label());
                        return (self.check_strict(policy, &limits, input, now).await, false);
                    }
                    Err(e) => return (self.on_failure(policy, &limits, input, now, &e), false),
                },
                loads::Turn::Follow(mut rx) => {
                    // What the read installs is decided from below; a leader that failed or
                    // read other limits leaves this check to read at its next turn.
                    let wait = rx.wait_for(|done| *done);
                    let _ = tokio::time::timeout(self.cfg.store_timeout, wait).await;
                }
            }
            match self.locked(policy, &limits, input, now, None, tally) {
                Locked::Decided(d, tallied) => return self.tallied(input, d, tallied),
                Locked::Store => return self.through_store(policy, &limits, input, now).await,
                Locked::Missing(m) => missing = m,
            }
        }
        // Only reachable if entries are evicted as fast as they are loaded.
        let e = StoreError::Unavailable("counter state kept being evicted".into());
        (self.on_failure(policy, &limits, input, now, &e), false)
    }

    /// What [`Limiter::decide`] answers without awaiting anything, or what it must wait for.
    fn decide_now(
        &self,
        policy: &Policy,
        limits: &Applicable<'_>,
        input: CheckInput<'_>,
        now: i64,
        record: bool,
    ) -> Now {
        if limits.is_empty() {
            return Now::Decided(Decision::no_limit(), false);
        }
        if !self.cfg.fleet.holds_lease() {
            // This instance may be counting from a share another instance holds now (its
            // lease could not be renewed): decide as the policy says for a failing store.
            let e = StoreError::Unavailable("this instance holds no shard lease".into());
            return Now::Decided(self.on_failure(policy, limits, input, now, &e), false);
        }
        if policy.consistency == Consistency::Strict {
            return Now::Store;
        }
        let tally = record && self.cfg.max_history_rows > 0;
        match self.locked(policy, limits, input, now, None, tally) {
            Locked::Decided(d, tallied) => {
                let (d, recorded) = self.tallied(input, d, tallied);
                Now::Decided(d, recorded)
            }
            Locked::Store => Now::Store,
            Locked::Missing(missing) => Now::Missing(missing),
        }
    }

    /// A decision made in memory, and whether its answer was summed for the usage history (a
    /// sum the entry handed over goes to the history's rows).
    fn tallied(&self, input: CheckInput<'_>, d: Decision, tallied: Tallied) -> (Decision, bool) {
        if let Tallied::HandedOver(h) = tallied {
            self.history.add_admitted(
                input.tenant.as_arc(),
                input.client.as_arc(),
                h.hour_ms,
                h.admitted,
                h.cost,
            );
        }
        (d, tallied != Tallied::No)
    }

    /// Locks the entries the limits need and decides, or says which states are missing. When
    /// `tally`, an admitted check is summed in the client's entry for the usage history. With
    /// `failing`, the store failed and this is that rule's local view (see `failure`).
    ///
    /// With both entries, the client's shard is locked first, its entry found and its limits
    /// judged, and only then the tenant's shard, held while the tenant's limits are judged and
    /// consumed: every check of the tenant waits on that one, so neither the cache misses of
    /// reaching a client entry nor the client's arithmetic is paid while holding it. The client's
    /// shard stays locked to the end, so the check is still one step on each counter: a denial
    /// consumes nothing anywhere, and two racing checks never both take the last unit. No
    /// deadlock: tenant entries live in shards of their own, and no one holds a tenant shard
    /// while taking a client shard, nor two shards of one set.
    fn locked(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
        failing: Option<OnStoreFailure>,
        tally: bool,
    ) -> Locked {
        let tenant = input.tenant.as_str();
        let kc = self.key_ref(tenant, input.client.as_str());
        let kt = self.key_ref(tenant, TENANT_SUBJECT);
        let need_c = limits.iter().any(|l| l.scope == Scope::Client);
        let need_t = limits.iter().any(|l| l.scope == Scope::Tenant);
        let (force_admit, fleet) = match failing {
            None => (false, self.fleet(policy)),
            Some(rule) => (rule == OnStoreFailure::Allow, self.fleet_failing(policy)),
        };
        let mut j = Judging::new(limits, now, input.cost, force_admit, fleet);
        let mut gc = need_c.then(|| lock(self.shard_of(kc)));
        let mut cs = Slots::new();
        let answered = fill(
            &mut cs,
            gc.as_mut().and_then(|g| g.get_mut(&kc)),
            limits,
            Scope::Client,
            now,
        );
        j.judge(&mut cs);
        let (outcome, reset) = {
            let mut gt = need_t.then(|| lock(self.shard_of(kt)));
            let mut ts = Slots::new();
            fill(
                &mut ts,
                gt.as_mut().and_then(|g| g.get_mut(&kt)),
                limits,
                Scope::Tenant,
                now,
            );
            j.judge(&mut ts);
            let Some(outcome) = j.outcome() else {
                return Locked::Missing(j.unjudged());
            };
            if outcome.through_store {
                return Locked::Store;
            }
            let reset = j.consume(&outcome, &mut ts);
            (outcome, reset)
        };
        // The client's states take the cost whatever the tenant's reset said.
        let client_reset = j.consume(&outcome, &mut cs);
        let reset = reset.or(client_reset);
        let d = j.decision(policy, &outcome, reset.unwrap_or_default());
        let tallied = match answered {
            Some(a) if tally && d.allowed => match a.add(now, input.cost) {
                Ok(None) => Tallied::Yes,
                Ok(Some(h)) => Tallied::HandedOver(h),
                Err(()) => Tallied::No,
            },
            _ => Tallied::No,
        };
        Locked::Decided(d, tallied)
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
        self.store_answered();
        let mut capped = None;
        for (l, (r, t)) in limits.iter().zip(ranges.iter().zip(totals)) {
            let share = self.share(&t, r, now);
            let part = self.region_part(&t, r, now, None);
            if let Err(cap) = self.install(input, l, buckets_from(&t), share, now) {
                capped = Some(cap);
            } else if part.is_some() {
                self.with_state(&r.key, |s| {
                    if s.region().is_none() {
                        s.set_region(part);
                    }
                });
            }
        }
        Ok(capped)
    }
}
