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
//!   assumed to be zero (unless the store fails and the policy says to carry on locally), though
//!   where the limit is far too large for it to matter, a first check may be admitted within a
//!   bound before that read arrives (`first`).
//! - Pending hits only leave memory by being written: buckets with pending hits are never pruned,
//!   and entries with pending hits are never evicted.
//! - In steady state a check allocates nothing: lookups borrow the request's strings, and bucket
//!   vectors keep their capacity as buckets roll.
//!
//! The limiter is a few owned parts, each in its own file:
//! - `table`: the table of counters in memory, with the memory caps and eviction (`room`) and
//!   the sync task's pass over it (`sync`); `state` is what an entry holds, `key` how it is
//!   named in memory and in the store;
//! - `decision`: the pure, synchronous judgement of a check against the states it needs, over
//!   the window arithmetic (`window`) and token buckets (`tokens`, `bucket`);
//! - `share`: this instance's place in the fleet (`membership`) and its share of each
//!   counter's headroom, with what it reserves for the others (`reserve`);
//! - the store side: first reads under way (`loads`), sync writes under way (`writes`), strict
//!   calls that answered late (`late`).
//!
//! `Limiter` holds them and decides with them: this file the checks that memory decides, and
//! the sync task's calls; `miss` what a check does when memory cannot decide it (first reads,
//! strict calls through the store, the failure rule); `admin` usage reads, resets and grants.
//! `config` holds the tuning.

mod admin;
mod allowance;
mod bucket;
mod config;
mod decision;
mod failure;
mod first;
mod key;
mod late;
mod loads;
mod membership;
mod miss;
mod reserve;
mod room;
mod share;
mod state;
mod sync;
mod table;
pub mod tokens;
pub mod window;
mod writes;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;

pub use admin::{Granted, Usage};
pub use config::{CheckInput, LimiterConfig};
pub use decision::{Binding, Decision};
pub use first::{unread_budget, UNREAD_DIVISOR};
pub use key::CLOCK_SKEW_MS;
pub use membership::{Membership, RegionSeen};
pub use share::share_of;
pub use sync::SyncBatch;
pub use table::AHEAD;
pub use writes::Writing;

use crate::clock::Clock;
use crate::domain::{Consistency, Limit, OnStoreFailure, Policy, Scope, TENANT_SUBJECT};
use crate::history::{Answer, Recorder};
use crate::metrics::Metrics;
use crate::store::history::UsageDelta;
use crate::store::{BucketTotal, CounterKey, CounterRange, Delta, DynCounterStore, StoreError};
use decision::{fill, Judging, Slots};
use failure::Rule;
use late::LateAnswers;
use share::Shares;
use state::{lock, AnsweredHour, LimitState};
use table::Table;

/// What the usage history names a denial that no limit bound (none is known to happen).
static UNBOUND: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from("-"));

/// Most limits one check can touch without a heap allocation.
type Applicable<'p> = SmallVec<[&'p Limit; 16]>;

/// The limits of `policy` that a check on any of `resources` meets (in-flight limits only when
/// it takes a hold).
fn applicable<'p>(
    policy: &'p Policy,
    resources: &[Option<&str>],
    reserving: bool,
) -> Applicable<'p> {
    policy
        .limits
        .iter()
        .filter(|l| resources.iter().any(|r| l.applies(*r, reserving)))
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
    /// These applicable limits (a bit per index) have no state in memory yet.
    Missing(u32),
}

/// What deciding in memory came to: a decision (and whether its answer was summed for the
/// usage history), or the store it needs.
enum Now {
    Decided(Decision, bool),
    /// A strict policy, or the last units of a limit: the store decides.
    Store,
    /// These applicable limits (a bit per index) have no state in memory yet.
    Missing(u32),
}

/// The limiter: counter state in memory, the store behind it. Shared by every request
/// handler and the sync task (`Arc<Limiter>`).
pub struct Limiter {
    /// The counters in memory.
    table: Table,
    /// This instance's place in the fleet, and its shares.
    shares: Shares,
    store: DynCounterStore,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    /// Every answer, summed per (tenant, client, hour) for the usage history.
    history: Recorder,
    /// The sync task's writes under way, for reads that sum the store and memory.
    writes: writes::Writes,
    /// First reads under way, shared by concurrent first checks of a client.
    loads: loads::Loads,
    /// The instant of the last sync round's pass: whose turn it is to be written comes from
    /// the time since ([`Limiter::collect`]).
    last_round: AtomicI64,
    /// Strict calls that answered after their deadline, for memory to learn from.
    late: LateAnswers,
    /// Checks decided by the failure rule since the store last answered the check path: one
    /// log line an episode, not one a check.
    failures: failure::Episodes,
    cfg: LimiterConfig,
}

/// A check memory could not decide ([`Limiter::check_now_at`]): what it waits for. Finish it
/// with [`Limiter::check_missed`], under the same policy and input.
#[derive(Debug)]
pub struct Miss {
    now: i64,
    store: bool,
    /// The applicable limits with no state in memory yet, a bit per limit's index.
    missing: u32,
}

impl Limiter {
    pub fn new(
        store: DynCounterStore,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
        cfg: LimiterConfig,
    ) -> Self {
        Self {
            table: Table::new(&cfg, metrics.clone()),
            shares: Shares::new(&cfg),
            store,
            clock,
            metrics,
            history: Recorder::new(cfg.shards, cfg.max_history_rows),
            writes: writes::Writes::default(),
            loads: loads::Loads::default(),
            last_round: AtomicI64::new(i64::MIN),
            late: LateAnswers::default(),
            failures: failure::Episodes::default(),
            cfg,
        }
    }

    /// Every shard's lock, held: for tests of what must never wait for one.
    #[cfg(any(test, feature = "test-support"))]
    pub fn lock_every_shard(&self) -> Vec<impl Drop + '_> {
        self.table.all_shards().map(|m| m.lock().unwrap()).collect()
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
        match self.check_now(policy, input) {
            Ok(d) => d,
            Err(miss) => self.check_missed(policy, input, miss).await,
        }
    }

    /// [`Limiter::check`], as far as memory decides it: the decision, or the [`Miss`] to finish
    /// with [`Limiter::check_missed`] (a first read, a strict call). The memory path has no
    /// future to build or move: the future of a store call is large, and moving it costs a
    /// check on the hit path as much as deciding.
    pub fn check_now(&self, policy: &Policy, input: CheckInput<'_>) -> Result<Decision, Miss> {
        self.check_now_at(policy, input, self.clock.now_ms())
    }

    /// [`Limiter::check_now`] at `now` (ms since the epoch, from [`Limiter::clock`]): a batch
    /// reads the clock once for its checks, which then all happen at that instant.
    pub fn check_now_at(
        &self,
        policy: &Policy,
        input: CheckInput<'_>,
        now: i64,
    ) -> Result<Decision, Miss> {
        let limits = applicable(policy, &[input.resource], input.reserve);
        let (d, recorded) = match self.decide_now(policy, &limits, input, now, true) {
            Now::Decided(d, recorded) => (d, recorded),
            Now::Store => {
                return Err(Miss {
                    now,
                    store: true,
                    missing: 0,
                })
            }
            Now::Missing(missing) => {
                return Err(Miss {
                    now,
                    store: false,
                    missing,
                })
            }
        };
        if !recorded {
            self.record(policy, input, &d);
        }
        Ok(d)
    }

    /// Finishes a check memory could not decide, from where [`Limiter::check_now_at`] left
    /// it: memory's part is not judged again before the read.
    pub async fn check_missed(
        &self,
        policy: &Policy,
        input: CheckInput<'_>,
        miss: Miss,
    ) -> Decision {
        let limits = applicable(policy, &[input.resource], input.reserve);
        let (d, recorded) = if miss.store {
            self.through_store(policy, &limits, input, miss.now).await
        } else {
            self.read_first(policy, limits, input, miss.now, miss.missing, true)
                .await
        };
        if !recorded {
            self.record(policy, input, &d);
        }
        d
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
        let limits = applicable(policy, resources, input.reserve);
        let (d, recorded) = self.decide(policy, limits, input, true).await;
        if !recorded {
            self.record(policy, input, &d);
        }
        d
    }

    /// What a check of `input` would answer now, consuming nothing and recorded nowhere (the
    /// per-descriptor statuses of Envoy's rate limit service).
    pub async fn peek(&self, policy: &Policy, input: CheckInput<'_>) -> Decision {
        let limits = applicable(policy, &[input.resource], input.reserve);
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
        match self.decide_now(policy, &limits, input, now, record) {
            Now::Decided(d, recorded) => (d, recorded),
            Now::Store => self.through_store(policy, &limits, input, now).await,
            Now::Missing(missing) => {
                self.read_first(policy, limits, input, now, missing, record)
                    .await
            }
        }
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
        if !self.shares.fleet.holds_lease() {
            // This instance may be counting from a share another instance holds now (its
            // lease could not be renewed): decide as the policy says for a failing store.
            let e = StoreError::Unavailable("this instance holds no shard lease".into());
            return Now::Decided(Rule(self).on_failure(policy, limits, input, now, &e), false);
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
            Locked::Missing(missing) => {
                // A first check the limits are too large to be endangered by need not wait
                // for its read (`first`).
                if !self.admit_unread(policy, limits, input, now, missing) {
                    return Now::Missing(missing);
                }
                match self.locked(policy, limits, input, now, None, tally) {
                    Locked::Decided(d, tallied) => {
                        self.metrics.unread_first_check();
                        let (d, recorded) = self.tallied(input, d, tallied);
                        Now::Decided(d, recorded)
                    }
                    Locked::Store => Now::Store,
                    Locked::Missing(missing) => Now::Missing(missing),
                }
            }
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
    /// `failing`, the store failed and this is that rule's local view (see `miss`).
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
        let kc = self.table.key_ref(tenant, input.client.as_str());
        let kt = self.table.key_ref(tenant, TENANT_SUBJECT);
        let need_c = limits.iter().any(|l| l.scope == Scope::Client);
        let need_t = limits.iter().any(|l| l.scope == Scope::Tenant);
        let (force_admit, fleet) = match failing {
            None => (false, self.shares.fleet(policy)),
            Some(rule) => (
                rule == OnStoreFailure::Allow,
                self.shares.fleet_failing(policy),
            ),
        };
        let mut j = Judging::new(limits, now, input.cost, force_admit, fleet);
        let mut gc = need_c.then(|| lock(self.table.shard_of(kc)));
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
            let mut gt = need_t.then(|| lock(self.table.shard_of(kt)));
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

    /// A counter's state as a read over `buckets` gives it, noted in its shares' reads.
    fn read_state(
        &self,
        l: &Limit,
        buckets: Vec<window::Bucket>,
        share: f32,
        now: i64,
    ) -> LimitState {
        let mut s = LimitState::new(l, buckets, share, now);
        self.shares.note_read(&mut s, now, None);
        s
    }

    /// Brings the client entries of up to [`AHEAD`] checks, `(tenant, client)`, into the
    /// cache before a batch decides them.
    pub fn bring_in<'a>(&self, checks: impl Iterator<Item = (&'a str, &'a str)>) {
        self.table.bring_in(checks);
    }

    /// Drops what no longer counts: old buckets, empty states, and entries idle for
    /// `idle_ms` with nothing pending (shorter near a memory cap); a counter holding unwritten
    /// hits never leaves. Returns (counters in memory, pending hits). A sync round evicts in
    /// the pass of its snapshot ([`Limiter::collect`]); this is the same between rounds.
    pub fn evict(&self, now: i64) -> (usize, u64) {
        self.table.evict(now, &self.history)
    }

    /// A sync round's snapshot: one pass over the entries that evicts what no longer counts,
    /// takes the pending hits of every entry that is due (all of them with `all`) and lists
    /// the counters to read back; with `answers`, also takes what the client entries summed
    /// for the usage history. See the `sync` module for when an entry is due.
    pub fn collect(&self, now: i64, answers: bool, all: bool) -> SyncBatch {
        // Strict answers that came late: what they say counts in this round's snapshot.
        self.late.learn(&self.table);
        let since = self.last_round.swap(now, Ordering::Relaxed);
        let round = sync::Round::new(&self.shares, (since != i64::MIN).then_some(since), now);
        let writing = self.writes.begin();
        self.table
            .collect(now, (answers, all), round, writing, &self.history)
    }

    /// Takes what the client entries summed for the usage history, and nothing else.
    pub fn take_answers(&self) -> Vec<UsageDelta> {
        self.table.take_answers()
    }

    /// A snapshot's increments were refused with nothing written: they are pending again, to
    /// be taken by the next round.
    pub fn unwritten(&self, deltas: &[Delta]) {
        self.table.unwritten(deltas);
    }

    /// Counters a read back did not get: read again at the next round, judged meanwhile on
    /// what they hold (the last totals and this instance's hits since).
    pub fn unread(&self, ranges: &[CounterRange]) {
        self.table.unread(ranges);
    }

    /// `hits` of this instance's sync writes to `key`'s bucket at `start` are in doubt (`table::InDoubt`).
    pub fn in_doubt(&self, key: &CounterKey, start: i64, hits: i64) {
        self.table.in_doubt.set(key, start, hits);
    }

    /// Installs totals read back from the store: they include every instance's writes.
    pub fn refreshed(&self, ranges: &[CounterRange], totals: Vec<Vec<BucketTotal>>) {
        let now = self.clock.now_ms();
        self.failures.answered(now);
        self.table.refreshed(ranges, totals, now, &self.shares);
    }

    /// Admitted checks the client entries summed that the usage history has not taken yet.
    pub fn answers_waiting(&self) -> u64 {
        self.table.answers_waiting()
    }

    /// Hits admitted and not yet written.
    pub fn pending_hits(&self) -> u64 {
        self.table.pending_hits()
    }

    /// Sync rounds at every tick from `since` to `tick` wrote every hit they took with an
    /// answer (`None`: one round took every pending hit): [`Membership::note_written`].
    pub fn note_written(&self, since: Option<i64>, tick: i64) {
        self.shares.note_written(since, tick);
    }

    /// The replication lag between regions the fleet task measured (0 in one region).
    pub fn replication_lag_ms(&self) -> i64 {
        self.shares.fleet.replication_lag_ms()
    }
}
