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
use super::key::EntryKey;
use super::state::{lock, AnsweredHour, Entry, LimitState, TOKEN_SETTLE_ROUNDS};
use super::Limiter;
use crate::pace::Pacer;

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

impl Limiter {
    /// Drops what no longer counts: old buckets, empty states, and entries idle for
    /// `idle_ms` with nothing pending. Near a memory cap (90% of it), "idle" shrinks to two
    /// sync intervals, for all entries or for the crowded tenant's clients: written counters
    /// leave first, and a counter holding unwritten hits never leaves.
    /// Returns (counters in memory, pending hits).
    ///
    /// A sync round evicts in the pass of its snapshot ([`Limiter::collect`]); this is the same
    /// on its own, for between rounds: while a round's write is in flight its hits count as
    /// written already, and only the round's own pass may follow them.
    pub fn evict(&self, now: i64) -> (usize, u64) {
        let ev = self.evicting(now);
        let mut tally = Tally::default();
        let mut pace = Pacer::new();
        for shard in self.all_shards() {
            lock(shard).retain(|k, e| ev.keep(k, e, &mut tally));
            self.shard_evicted(&mut tally);
            pace.step();
        }
        self.evicted(tally)
    }

    pub(super) fn evicting(&self, now: i64) -> Evicting {
        Evicting {
            now,
            settle_ms: TOKEN_SETTLE_ROUNDS * self.cfg.sync_interval_ms,
            rule: self.idle_rule(),
        }
    }

    /// After a shard's walk, its lock let go: the dropped entries' admitted checks go to the
    /// history's rows, and the counters they held leave the count.
    pub(super) fn shard_evicted(&self, tally: &mut Tally) {
        for (tenant, client, h) in tally.answers.drain(..) {
            self.history
                .add_admitted(&tenant, &client, h.hour_ms, h.admitted, h.cost);
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
