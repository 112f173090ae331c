//! The table of counters: every entry in memory, in maps sharded behind `std::sync::Mutex`es,
//! with the counts the memory caps keep (`room`) and the sync task's pass over them (`sync`).
//!
//! Client entries and tenant entries (subject `*`) live in two sets of shards, so that a check
//! can hold its client's shard while it takes its tenant's (`Limiter::locked`): no one holds a
//! tenant shard while taking a client shard, nor two shards of one set, so there is no
//! deadlock. A shard's lock is held only for in-memory arithmetic, never across an `.await`.
//!
//! This file holds the table, its lookups, and what a batch brings into the cache ahead of
//! its checks; `room` the memory caps and eviction; `sync` the sync task's pass and what comes
//! back from the store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crossbeam_utils::CachePadded;
use hashbrown::DefaultHashBuilder;

use super::key::{subject_of, EntryRef};
use super::state::{lock, LimitState, Shard, TOKEN_SETTLE_ROUNDS};
use super::{window, CheckInput, LimiterConfig};
use crate::domain::{Limit, TENANT_SUBJECT};
use crate::metrics::Metrics;
use crate::store::CounterKey;

/// How many checks a batch brings into the cache at once ([`Table::bring_in`]): enough for
/// their misses to overlap, few enough that what the first brought is still in the cache when
/// the last is decided.
pub const AHEAD: usize = 16;

/// The counters in memory, and the caps on them.
pub(super) struct Table {
    /// Client entries. Each shard's lock has its cache line(s) to itself: unpadded, a shard
    /// shared a line with its neighbours, and two workers locking two neighbouring shards took
    /// that line from each other at every lock and unlock.
    shards: Box<[CachePadded<Mutex<Shard>>]>,
    /// Tenant entries (subject `*`), apart: see [`Table::shard_of`].
    tenant_shards: Box<[CachePadded<Mutex<Shard>>]>,
    /// Counters (limit states) in memory, for `max_counters`.
    pub(super) counters: AtomicUsize,
    /// Client entries in memory per tenant, for `max_clients_per_tenant`. Locked after a
    /// shard, never before one.
    pub(super) tenant_clients: Mutex<HashMap<Arc<str>, usize>>,
    hasher: DefaultHashBuilder,
    pub(super) max_counters: usize,
    pub(super) max_clients_per_tenant: usize,
    /// An entry untouched this long, with nothing pending, leaves memory.
    pub(super) idle_ms: i64,
    /// How long "idle" is near a memory cap.
    pub(super) short_idle_ms: i64,
    /// How long a token bucket's ended buckets wait to be folded (see `LimitState::prune`).
    pub(super) settle_ms: i64,
    /// For the gauges of what a pass kept.
    pub(super) metrics: Arc<Metrics>,
    /// When eviction last ran near a memory cap (ms; `i64::MIN`: never): counters may then
    /// have left memory sooner than `idle_ms`, which unread admissions count on (`first`).
    pub(super) pressed_at: AtomicI64,
    /// This instance's sync writes in doubt, for read backs ([`InDoubt`]).
    pub(super) in_doubt: InDoubt,
}

impl Table {
    pub(super) fn new(cfg: &LimiterConfig, metrics: Arc<Metrics>) -> Self {
        let shards = || {
            (0..cfg.shards.max(1))
                .map(|_| CachePadded::default())
                .collect()
        };
        Table {
            shards: shards(),
            tenant_shards: shards(),
            counters: AtomicUsize::new(0),
            tenant_clients: Mutex::new(HashMap::new()),
            hasher: DefaultHashBuilder::default(),
            max_counters: cfg.max_counters,
            max_clients_per_tenant: cfg.max_clients_per_tenant,
            idle_ms: cfg.idle_ms,
            short_idle_ms: (2 * cfg.sync_interval_ms).min(cfg.idle_ms),
            settle_ms: TOKEN_SETTLE_ROUNDS * cfg.sync_interval_ms,
            metrics,
            pressed_at: AtomicI64::new(i64::MIN),
            in_doubt: InDoubt::default(),
        }
    }

    pub(super) fn key_ref<'a>(&self, tenant: &'a str, subject: &'a str) -> EntryRef<'a> {
        EntryRef::new(&self.hasher, tenant, subject)
    }

    /// The shard of a key, from bits of its hash the maps do not use for their slots (the low
    /// bits pick a slot and the top 7 tag it). Tenant entries (subject `*`) have shards of
    /// their own.
    #[inline]
    pub(super) fn shard_of(&self, k: EntryRef<'_>) -> &Mutex<Shard> {
        let set = if k.subject == TENANT_SUBJECT {
            &self.tenant_shards
        } else {
            &self.shards
        };
        &set[((k.hash >> 32) % set.len() as u64) as usize]
    }

    /// Every shard, client entries' then tenant entries'.
    pub(super) fn all_shards(&self) -> impl Iterator<Item = &Mutex<Shard>> {
        self.shards
            .iter()
            .chain(self.tenant_shards.iter())
            .map(|s| &**s)
    }

    /// When eviction last ran near a memory cap (`i64::MIN`: never).
    pub(super) fn pressed_at(&self) -> i64 {
        self.pressed_at.load(Ordering::Relaxed)
    }

    /// Runs `f` on a counter's state, if it is in memory.
    pub(super) fn with_state<R>(
        &self,
        key: &CounterKey,
        f: impl FnOnce(&mut LimitState) -> R,
    ) -> Option<R> {
        let r = self.key_ref(&key.tenant, &key.subject);
        let mut g = lock(self.shard_of(r));
        let s = g.get_mut(&r)?.states.iter_mut().find(|s| s.counts(key))?;
        Some(f(s))
    }

    /// Has the entry of `key`'s counter read back from the store at the next sync round, alone
    /// or in a fleet: a read of a round under way may have begun before a change written
    /// beside the sync task (a hold's end), and would install the count from before it.
    pub(super) fn read_back_soon(&self, key: &CounterKey) {
        let r = self.key_ref(&key.tenant, &key.subject);
        if let Some(e) = lock(self.shard_of(r)).get_mut(&r) {
            e.stale_rounds = u16::MAX;
        }
    }

    /// Whether memory holds a state for this check's counter of `l`.
    pub(super) fn holds(&self, input: CheckInput<'_>, l: &Limit) -> bool {
        let r = self.key_ref(input.tenant.as_str(), subject_of(l, input.client.as_str()));
        lock(self.shard_of(r))
            .get(&r)
            .is_some_and(|e| e.states.iter().any(|s| s.is(l)))
    }

    /// Marks a counter's entry used at `now`, so that idleness does not evict what a strict
    /// check just read.
    pub(super) fn mark_used(&self, input: CheckInput<'_>, l: &Limit, now: i64) {
        let r = self.key_ref(input.tenant.as_str(), subject_of(l, input.client.as_str()));
        if let Some(e) = lock(self.shard_of(r)).get_mut(&r) {
            e.last_used = now;
        }
    }

    /// Adds the hits pending in memory for `key` to a state built from the store's totals.
    pub(super) fn add_pending(&self, key: &CounterKey, to: &mut LimitState) {
        self.with_state(key, |s| {
            for b in s.buckets.iter().filter(|b| b.pending > 0) {
                window::bucket_at(&mut to.buckets, b.start).pending += b.pending;
            }
        });
    }

    /// Brings the client entries of up to [`AHEAD`] checks, `(tenant, client)`, into the
    /// cache, for a batch whose next checks are known.
    ///
    /// A check in memory waits on a chain of cache misses, one after the other: its client's
    /// node in the shard's table, the node's states (on the heap for two limits or more), each
    /// state's buckets. On the batch path, where no HTTP work sits between two checks, those
    /// waits are most of a check's time. Asked for level by level over several checks (a
    /// prefetch waits for nothing) before the next level reads what the previous one brought,
    /// their misses overlap. Each level reads the table under the shard's lock, taken with
    /// `try_lock`: a shard another thread holds is skipped, never waited for, so this never
    /// blocks and changes no state. Tenants' entries are left alone: every check of a tenant
    /// reads its entry, which is in the cache already.
    pub(super) fn bring_in<'a>(&self, checks: impl Iterator<Item = (&'a str, &'a str)>) {
        let mut keys = [None; AHEAD];
        for (k, (tenant, client)) in keys.iter_mut().zip(checks) {
            *k = Some(self.key_ref(tenant, client));
        }
        let keys = keys.iter().map_while(|k| k.as_ref());
        let each = |f: &dyn Fn(&Shard, &EntryRef<'_>)| {
            for r in keys.clone() {
                if let Ok(g) = self.shard_of(*r).try_lock() {
                    f(&g, r);
                }
            }
        };
        each(&|g, r| g.prefetch_node(r));
        each(&|g, r| {
            if let Some(e) = g.get(r) {
                e.prefetch_states()
            }
        });
        each(&|g, r| {
            if let Some(e) = g.get(r) {
                e.prefetch_buckets()
            }
        });
    }

    /// Admitted checks the client entries summed that the usage history has not taken yet.
    pub(super) fn answers_waiting(&self) -> u64 {
        self.all_shards()
            .map(|s| lock(s).values().map(|e| e.answered.checks()).sum::<u64>())
            .sum()
    }

    /// Hits admitted and not yet written.
    pub(super) fn pending_hits(&self) -> u64 {
        self.all_shards()
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

// This instance's sync writes in doubt, per counter bucket, as the server's settling of them
// holds them ([`InDoubt`]). A read back keeps the instance's own hits that the store does not
// show only as far as they are in doubt here (`sync`, `Table::refreshed`): those the instance
// admitted, whose write may not have landed yet. A store that shows less of this instance's
// shard for any other reason (a reset or a credit another instance wrote into a shard they
// share) is believed.

/// Hits in doubt per (counter, bucket start); empty but for a store that lost or left
/// unanswered some writes. A read back holds it across the shards it visits; nothing takes it
/// while holding a shard.
#[derive(Debug, Default)]
pub(super) struct InDoubt {
    cells: Mutex<HashMap<(CounterKey, i64), i64>>,
    /// Whether `cells` holds any: a read back with none in doubt takes no lock.
    any: AtomicBool,
}

/// The cells in doubt, held for one read back.
pub(super) struct Held<'a>(MutexGuard<'a, HashMap<(CounterKey, i64), i64>>);

impl Held<'_> {
    /// Hits in doubt in `key`'s bucket at `start`.
    pub(super) fn hits(&self, key: &CounterKey, start: i64) -> i64 {
        self.0.get(&(key.clone(), start)).copied().unwrap_or(0)
    }
}

impl InDoubt {
    /// `hits` of this instance's writes to `key`'s bucket at `start` are in doubt now (0: none).
    pub(super) fn set(&self, key: &CounterKey, start: i64, hits: i64) {
        let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        if hits > 0 {
            cells.insert((key.clone(), start), hits);
        } else {
            cells.remove(&(key.clone(), start));
        }
        self.any.store(!cells.is_empty(), Ordering::Relaxed);
    }

    /// The cells in doubt, or None when there are none.
    pub(super) fn held(&self) -> Option<Held<'_>> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        Some(Held(self.cells.lock().unwrap_or_else(|p| p.into_inner())))
    }
}
