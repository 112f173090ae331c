//! Eviction: what no longer counts leaves memory (old buckets, empty states, idle entries);
//! it is read back from the store on its next use.
//!
//! Invariant: a counter holding pending (unwritten) hits never leaves; written counters are the
//! only ones eviction can drop. How long "idle" is comes from the memory caps (see `caps`). A
//! dropped entry's admitted checks not yet taken for the usage history go to the history's rows.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::caps::{is_client, IdleRule};
use super::state::{lock, AnsweredHour, LimitState, Shard, TOKEN_SETTLE_ROUNDS};
use super::Limiter;
use crate::pace::Pacer;

/// What one eviction pass kept, and which tenants' client entries it dropped.
#[derive(Default)]
struct Tally {
    counters: usize,
    pending: u64,
    /// Client entries dropped, per tenant.
    left: HashMap<Arc<str>, usize>,
    /// What dropped entries had summed for the usage history.
    answers: Vec<(Arc<str>, Arc<str>, AnsweredHour)>,
}

impl Limiter {
    /// Drops what no longer counts: old buckets, empty states, and entries idle for
    /// `idle_ms` with nothing pending. Near a memory cap (90% of it), "idle" shrinks to two
    /// sync intervals, for all entries or for the crowded tenant's clients: written counters
    /// leave first, and a counter holding unwritten hits never leaves.
    /// Returns (counters in memory, pending hits).
    pub fn evict(&self, now: i64) -> (usize, u64) {
        let rule = self.idle_rule();
        let mut tally = Tally::default();
        let mut pace = Pacer::new();
        for shard in self.all_shards() {
            let settle = TOKEN_SETTLE_ROUNDS * self.cfg.sync_interval_ms;
            let dropped = evict_shard(&mut lock(shard), now, settle, &rule, &mut tally);
            // Admitted checks summed in the dropped entries go to the history's rows.
            for (tenant, client, h) in tally.answers.drain(..) {
                self.history
                    .add_admitted(&tenant, &client, h.hour_ms, h.admitted, h.cost);
            }
            self.counters.fetch_sub(dropped, Ordering::Relaxed);
            pace.step();
        }
        self.release_clients(tally.left);
        self.metrics.set_active_counters(tally.counters);
        self.metrics.set_pending(tally.pending);
        (tally.counters, tally.pending)
    }
}

/// Evicts within one shard; returns how many counters (limit states) it dropped.
fn evict_shard(
    g: &mut Shard,
    now: i64,
    settle_ms: i64,
    rule: &IdleRule,
    tally: &mut Tally,
) -> usize {
    let mut dropped = 0usize;
    g.retain(|k, e| {
        let before = e.states.len();
        for s in e.states.iter_mut() {
            s.prune(now, settle_ms);
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
            dropped += before - e.states.len();
        } else {
            dropped += before;
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
    });
    dropped
}
