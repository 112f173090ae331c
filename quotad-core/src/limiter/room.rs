//! What stays in memory: the memory caps, and eviction of what no longer counts.
//!
//! Caps: at most `max_counters` limit states, and `max_clients_per_tenant` client entries of
//! one tenant, are held in memory. A check needing one more counter than a cap allows is
//! decided through the store, as in strict mode (exact, holding nothing). Near a cap (90% of
//! it), eviction shortens "idle" to two sync intervals, for every entry or for the crowded
//! tenant's clients, so written counters make room. `counters` goes up in
//! [`Table::install`] and down in eviction. The per-tenant client counts are locked after a
//! shard, never before one.
//!
//! Eviction drops what no longer counts (old buckets, empty states, idle entries); it is read
//! back from the store on its next use. A counter holding pending (unwritten) hits never
//! leaves, so the pending-hit buffer is bounded by the caps too. A dropped entry's admitted
//! checks not yet taken for the usage history go to the history's rows.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use super::key::{subject_of, EntryKey, Subject};
use super::state::{lock, AnsweredHour, Entry, LimitState};
use super::table::Table;
use super::CheckInput;
use crate::domain::{Limit, Scope, TENANT_SUBJECT};
use crate::history::Recorder;
use crate::pace::Pacer;

/// A memory cap that kept a counter out of memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Cap {
    Counters,
    TenantClients,
}

impl Cap {
    /// The metric label of the cap.
    pub(super) fn label(self) -> &'static str {
        match self {
            Cap::Counters => "counters",
            Cap::TenantClients => "tenant_clients",
        }
    }
}

/// At 90% of a cap, eviction starts making room.
fn near_cap(n: usize, cap: usize) -> bool {
    n >= cap - cap / 10
}

/// How long an entry may sit unused before eviction, as the caps make it this round.
pub(super) struct IdleRule {
    /// Near `max_counters`: every entry gets the short idle time.
    all_pressed: bool,
    /// Tenants near `max_clients_per_tenant`: their clients get the short idle time.
    crowded: Vec<Arc<str>>,
    short_idle_ms: i64,
    idle_ms: i64,
}

impl IdleRule {
    pub(super) fn idle_ms(&self, k: &EntryKey) -> i64 {
        if self.pressed(k) {
            self.short_idle_ms
        } else {
            self.idle_ms
        }
    }

    /// Near a memory cap for this entry: it leaves as soon as it may.
    pub(super) fn pressed(&self, k: &EntryKey) -> bool {
        self.all_pressed || (is_client(k) && self.crowded.contains(&k.tenant))
    }
}

/// A client's entry, as opposed to a tenant's shared one: it counts against the tenant's cap.
pub(super) fn is_client(k: &EntryKey) -> bool {
    k.subject.as_bytes() != TENANT_SUBJECT.as_bytes()
}

impl Table {
    fn tenant_clients(&self) -> MutexGuard<'_, HashMap<Arc<str>, usize>> {
        // Counts only: a panic elsewhere leaves nothing here worth refusing to serve over.
        self.tenant_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The idle times eviction applies now, from how close each cap is.
    pub(super) fn idle_rule(&self) -> IdleRule {
        let all_pressed = near_cap(self.counters.load(Ordering::Relaxed), self.max_counters);
        let crowded = self
            .tenant_clients()
            .iter()
            .filter(|(_, &n)| near_cap(n, self.max_clients_per_tenant))
            .map(|(t, _)| t.clone())
            .collect();
        IdleRule {
            all_pressed,
            crowded,
            short_idle_ms: self.short_idle_ms,
            idle_ms: self.idle_ms,
        }
    }

    /// Client entries of these tenants left memory.
    pub(super) fn release_clients(&self, left: HashMap<Arc<str>, usize>) {
        if left.is_empty() {
            return;
        }
        let mut per_tenant = self.tenant_clients();
        for (t, n) in left {
            if let Some(c) = per_tenant.get_mut(&t) {
                *c = c.saturating_sub(n);
                if *c == 0 {
                    per_tenant.remove(&t);
                }
            }
        }
    }

    /// Installs a counter's state, made by `state` (a read's), within the memory caps. A
    /// state a racing check installed first wins.
    pub(super) fn install(
        &self,
        input: CheckInput<'_>,
        l: &Limit,
        now: i64,
        state: impl FnOnce() -> LimitState,
    ) -> Result<(), Cap> {
        let subject = subject_of(l, input.client.as_str());
        let r = self.key_ref(input.tenant.as_str(), subject);
        let mut g = lock(self.shard_of(r));
        if g.get(&r).is_some_and(|e| e.states.iter().any(|s| s.is(l))) {
            return Ok(());
        }
        if self.counters.load(Ordering::Relaxed) >= self.max_counters {
            return Err(Cap::Counters);
        }
        let entry = match g.get_mut(&r) {
            Some(e) => e,
            None => {
                let tenant = if l.scope == Scope::Client {
                    self.admit_client(input)?
                } else {
                    input.tenant.as_arc().clone()
                };
                g.insert_new(EntryKey {
                    hash: r.hash,
                    tenant,
                    subject: Subject::of(l, input.client),
                })
            }
        };
        entry.last_used = now;
        entry.states.push(state());
        self.counters.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Counts a new client entry of the tenant, unless the tenant is at its cap. Returns the
    /// tenant's id as this count holds it, for the entry's key: the client entries of a tenant
    /// then share one string (not each its own request's copy), which saves its bytes per
    /// entry and a cache miss per lookup.
    fn admit_client(&self, input: CheckInput<'_>) -> Result<Arc<str>, Cap> {
        use std::collections::hash_map::Entry;
        let mut per_tenant = self.tenant_clients();
        match per_tenant.entry(input.tenant.as_arc().clone()) {
            Entry::Occupied(e) if *e.get() >= self.max_clients_per_tenant => {
                Err(Cap::TenantClients)
            }
            Entry::Occupied(mut e) => {
                *e.get_mut() += 1;
                Ok(e.key().clone())
            }
            Entry::Vacant(e) => {
                let tenant = e.key().clone();
                e.insert(1);
                Ok(tenant)
            }
        }
    }
}

/// What one eviction pass kept, and which tenants' client entries it dropped.
#[derive(Default)]
pub(super) struct Tally {
    counters: usize,
    /// Hits pending in the entries kept (before a sync round's snapshot takes them).
    pending: u64,
    /// Client entries dropped, per tenant.
    left: HashMap<Arc<str>, usize>,
    /// What dropped entries had summed for the usage history.
    answers: Vec<(Arc<str>, Arc<str>, AnsweredHour)>,
    /// Counters (limit states) dropped in the shard being walked.
    dropped: usize,
}

/// How one pass over the entries evicts: made once per pass.
pub(super) struct Evicting {
    now: i64,
    /// How long a token bucket's ended buckets wait to be folded (see `LimitState::prune`).
    settle_ms: i64,
    rule: IdleRule,
}

impl Table {
    /// Drops what no longer counts: old buckets, empty states, and entries idle for
    /// `idle_ms` with nothing pending. Near a memory cap (90% of it), "idle" shrinks to two
    /// sync intervals, for all entries or for the crowded tenant's clients: written counters
    /// leave first, and a counter holding unwritten hits never leaves.
    /// Returns (counters in memory, pending hits).
    ///
    /// A sync round evicts in the pass of its snapshot ([`Table::collect`]); this is the same
    /// on its own, for between rounds (`Limiter::evict`): while a round's write is in flight
    /// its hits count as written already, and only the round's own pass may follow them.
    pub(super) fn evict(&self, now: i64, history: &Recorder) -> (usize, u64) {
        let ev = self.evicting(now);
        let mut tally = Tally::default();
        let mut pace = Pacer::new();
        for shard in self.all_shards() {
            lock(shard).retain(|k, e| ev.keep(k, e, &mut tally));
            self.shard_evicted(&mut tally, history);
            pace.step();
        }
        self.evicted(tally)
    }

    pub(super) fn evicting(&self, now: i64) -> Evicting {
        let rule = self.idle_rule();
        if rule.all_pressed || !rule.crowded.is_empty() {
            self.pressed_at.fetch_max(now, Ordering::Relaxed);
        }
        Evicting {
            now,
            settle_ms: self.settle_ms,
            rule,
        }
    }

    /// After a shard's walk, its lock let go: the dropped entries' admitted checks go to the
    /// history's rows, and the counters they held leave the count.
    pub(super) fn shard_evicted(&self, tally: &mut Tally, history: &Recorder) {
        for (tenant, client, h) in tally.answers.drain(..) {
            history.add_admitted(&tenant, &client, h.hour_ms, h.admitted, h.cost);
        }
        self.counters
            .fetch_sub(std::mem::take(&mut tally.dropped), Ordering::Relaxed);
    }

    /// After the whole pass: the tenants' client counts and the gauges. Returns (counters in
    /// memory, pending hits).
    pub(super) fn evicted(&self, tally: Tally) -> (usize, u64) {
        self.release_clients(tally.left);
        self.metrics.set_active_counters(tally.counters);
        self.metrics.set_pending(tally.pending);
        (tally.counters, tally.pending)
    }
}

impl Evicting {
    /// Prunes one entry and says whether it stays, counting it in `tally`.
    pub(super) fn keep(&self, k: &EntryKey, e: &mut Entry, tally: &mut Tally) -> bool {
        let (now, rule) = (self.now, &self.rule);
        let before = e.states.len();
        for s in e.states.iter_mut() {
            s.prune(now, self.settle_ms);
        }
        // A state whose window emptied stays while its entry is in use: dropping it would
        // send the next check of a client slower than its window to the store.
        let idle = now - e.last_used >= rule.idle_ms(k);
        if idle {
            e.states.retain(|s| !s.is_empty(now));
        }
        let p: u64 = e.states.iter().map(LimitState::pending).sum();
        // An idle token bucket that is not full keeps its level in memory (a read from the
        // store reaches back only 32 buckets), unless memory is short.
        let level = idle && !rule.pressed(k) && e.states.iter().any(|s| s.holds_a_level(now));
        let keep = p > 0 || (!e.states.is_empty() && !idle) || level;
        if keep {
            tally.counters += e.states.len();
            tally.pending += p;
            tally.dropped += before - e.states.len();
        } else {
            tally.dropped += before;
            if is_client(k) {
                *tally.left.entry(k.tenant.clone()).or_default() += 1;
            }
            if let Some(h) = e.answered.take() {
                tally
                    .answers
                    .push((k.tenant.clone(), k.subject.to_arc(), h));
            }
        }
        keep
    }
}
