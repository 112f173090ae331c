//! Memory caps: at most `max_counters` limit states, and `max_clients_per_tenant` client
//! entries of one tenant, are held in memory.
//!
//! A check needing one more counter than a cap allows is decided through the store, as in
//! strict mode (exact, holding nothing). Near a cap (90% of it), eviction shortens "idle" to two
//! sync intervals, for every entry or for the crowded tenant's clients, so written counters
//! make room; counters holding pending hits never leave, so the pending-hit buffer is bounded by
//! the caps too.
//!
//! Counting: `counters` goes up in `install` and down in eviction. The per-tenant
//! client counts are locked after a shard, never before one.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};

use super::key::{subject_of, EntryKey, Subject};
use super::state::{lock, LimitState};
use super::window::Bucket;
use super::{CheckInput, Limiter};
use crate::domain::{Limit, Scope, TENANT_SUBJECT};

/// Client entries in memory, per tenant.
pub(super) type TenantClients = HashMap<Arc<str>, usize>;

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

impl Limiter {
    fn tenant_clients(&self) -> MutexGuard<'_, TenantClients> {
        // Counts only: a panic elsewhere leaves nothing here worth refusing to serve over.
        self.tenant_clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The idle times eviction applies now, from how close each cap is.
    pub(super) fn idle_rule(&self) -> IdleRule {
        let all_pressed = near_cap(self.counters.load(Ordering::Relaxed), self.cfg.max_counters);
        let crowded = self
            .tenant_clients()
            .iter()
            .filter(|(_, &n)| near_cap(n, self.cfg.max_clients_per_tenant))
            .map(|(t, _)| t.clone())
            .collect();
        IdleRule {
            all_pressed,
            crowded,
            short_idle_ms: (2 * self.cfg.sync_interval_ms).min(self.cfg.idle_ms),
            idle_ms: self.cfg.idle_ms,
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

    /// Installs a counter's state, within the memory caps. A state a racing check installed
    /// first wins.
    pub(super) fn install(
        &self,
        input: CheckInput<'_>,
        l: &Limit,
        buckets: Vec<Bucket>,
        share: f32,
        now: i64,
    ) -> Result<(), Cap> {
        let subject = subject_of(l, input.client.as_str());
        let r = self.key_ref(input.tenant.as_str(), subject);
        let mut g = lock(self.shard_of(r));
        if g.get(&r).is_some_and(|e| e.states.iter().any(|s| s.is(l))) {
            return Ok(());
        }
        if self.counters.load(Ordering::Relaxed) >= self.cfg.max_counters {
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
        let mut state = LimitState::new(l, buckets, share, now);
        self.note_read(&mut state, now);
        entry.states.push(state);
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
            Entry::Occupied(e) if *e.get() >= self.cfg.max_clients_per_tenant => {
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
