//! The limiter's side of the sync task (`crate::sync`): what it hands over to write and read
//! back, and how the results come back into memory.
//!
//! A round is: [`Limiter::collect`] a snapshot of the pending hits and the counters to read
//! back; write the snapshot; [`Limiter::written`] moves exactly the snapshot from pending to
//! stored (hits admitted meanwhile stay pending); read back; [`Limiter::refreshed`] installs the
//! totals, which include every instance's hits, and this instance's new share.

use super::key::newest_readable;
use std::sync::{Arc, Mutex, MutexGuard};

use super::state::{lock, AnsweredHour, LimitState, Shard};
use super::{window, Limiter};
use crate::pace::Pacer;
use crate::store::history::{Counts, UsageDelta};
use crate::store::{BucketTotal, CounterKey, CounterRange, Delta};

/// The pending hits the sync task took, and the counters it will read back.
#[derive(Debug, Default)]
pub struct SyncBatch {
    pub deltas: Vec<Delta>,
    pub ranges: Vec<CounterRange>,
    /// The admitted checks the client entries summed for the usage history, when taken.
    pub answers: Vec<UsageDelta>,
}

impl SyncBatch {
    pub fn hits(&self) -> u64 {
        self.deltas.iter().map(|d| d.delta.max(0) as u64).sum()
    }
}

/// An entry's sum for the usage history, as the store takes it.
fn usage_delta((tenant, client, h): (Arc<str>, Arc<str>, AnsweredHour)) -> UsageDelta {
    UsageDelta {
        tenant: tenant.to_string(),
        client: client.to_string(),
        hour: h.hour_ms,
        counts: Counts {
            admitted: h.admitted,
            cost: h.cost,
            ..Counts::default()
        },
    }
}

/// Untouched entries are still read back every this many sync rounds, so what other instances
/// did reaches them even while this one only holds them.
const REFRESH_IDLE_EVERY: u8 = 8;

impl Limiter {
    /// Takes a snapshot of every pending hit (as increments) and lists the counters used since
    /// the last sync (to read back). Clears the "used" marks. With `answers`, also takes what
    /// the client entries summed for the usage history.
    pub fn collect(&self, now: i64, answers: bool) -> SyncBatch {
        let mut batch = SyncBatch::default();
        // Strings are copied after the lock is let go.
        let mut taken: Vec<(Arc<str>, Arc<str>, AnsweredHour)> = Vec::new();
        let mut pace = Pacer::new();
        for shard in self.all_shards() {
            let mut g = lock(shard);
            for (k, e) in g.iter_mut() {
                // The subject as the store names it: made once for the entry, if it is needed.
                let mut subject = None;
                if answers {
                    if let Some(h) = e.answered.take() {
                        let s = subject.get_or_insert_with(|| k.subject.to_arc());
                        taken.push((k.tenant.clone(), s.clone(), h));
                    }
                }
                // Others' hits reach an entry by reading it back: every round once used, while
                // other instances count too; otherwise (and alone, where this instance's own
                // writes already keep it exact) every few rounds, which also picks up hits the
                // store counted directly (strict checks, checks beyond a memory cap).
                let refresh = (e.touched && self.cfg.fleet.members() > 1)
                    || e.stale_rounds >= REFRESH_IDLE_EVERY;
                for s in &e.states {
                    let mut key = || CounterKey {
                        tenant: k.tenant.clone(),
                        subject: subject.get_or_insert_with(|| k.subject.to_arc()).clone(),
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
                            from: s.oldest_needed(now),
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
            drop(g);
            batch.answers.extend(taken.drain(..).map(usage_delta));
            pace.step();
        }
        batch
    }

    /// Takes what the client entries summed for the usage history (what [`Limiter::collect`]
    /// takes with `answers`), and nothing else.
    pub fn take_answers(&self) -> Vec<UsageDelta> {
        let mut taken = Vec::new();
        for shard in self.all_shards() {
            for (k, e) in lock(shard).iter_mut() {
                if let Some(h) = e.answered.take() {
                    taken.push((k.tenant.clone(), k.subject.to_arc(), h));
                }
            }
        }
        taken.into_iter().map(usage_delta).collect()
    }

    /// The snapshot's increments reached the store: move them from pending to stored. Hits
    /// admitted since the snapshot stay pending.
    pub fn written(&self, deltas: &[Delta]) {
        self.each_state(
            deltas,
            |d| &d.key,
            |s, run| {
                for d in run {
                    if let Ok(i) = s.buckets.binary_search_by_key(&d.start, |b| b.start) {
                        let b = &mut s.buckets[i];
                        let n = (d.delta.max(0) as u64).min(b.pending);
                        b.pending -= n;
                        b.stored += n as i64;
                        s.settling += n;
                    }
                }
            },
        );
    }

    /// Installs totals read back from the store: they include every instance's writes.
    pub fn refreshed(&self, ranges: &[CounterRange], totals: Vec<Vec<BucketTotal>>) {
        let now = self.clock.now_ms();
        let read: Vec<(&CounterRange, f32, Vec<BucketTotal>)> = ranges
            .iter()
            .zip(totals)
            .map(|(r, t)| (r, self.share(&t, r, now), t))
            .collect();
        self.each_state(
            &read,
            |x| &x.0.key,
            |s, run| {
                for (r, share, t) in run {
                    s.share = *share;
                    s.settling = 0;
                    s.read_back(now);
                    for b in s.buckets.iter_mut().filter(|b| b.start >= r.from) {
                        b.stored = 0;
                    }
                    for bt in t {
                        window::bucket_at(&mut s.buckets, bt.start).stored = bt.total;
                    }
                }
            },
        );
    }

    /// Runs `f` on the state of each run of `items` naming one counter (with the run), for the
    /// counters in memory. A snapshot lists an entry's counters together and visits the
    /// entries shard by shard, so each run of one entry's counters is one lookup, and each run
    /// of one shard's entries one lock.
    fn each_state<T>(
        &self,
        items: &[T],
        key: impl Fn(&T) -> &CounterKey,
        mut f: impl FnMut(&mut LimitState, &[T]),
    ) {
        let mut held: Option<(&Mutex<Shard>, MutexGuard<'_, Shard>)> = None;
        let mut pace = Pacer::new();
        for entry_run in items.chunk_by(|a, b| key(a).same_subject(key(b))) {
            let k = key(&entry_run[0]);
            let r = self.key_ref(&k.tenant, &k.subject);
            let shard = self.shard_of(r);
            if !held.as_ref().is_some_and(|(m, _)| std::ptr::eq(*m, shard)) {
                // One shard at a time: let go of the last before taking the next.
                if held.take().is_some() {
                    pace.step();
                }
            }
            let (_, g) = held.get_or_insert_with(|| (shard, lock(shard)));
            let Some(e) = g.get_mut(&r) else {
                continue;
            };
            for run in entry_run.chunk_by(|a, b| key(a) == key(b)) {
                if let Some(s) = e.states.iter_mut().find(|s| s.counts(key(&run[0]))) {
                    f(s, run);
                }
            }
        }
    }

    /// Admitted checks the client entries summed that the usage history has not taken yet.
    pub fn answers_waiting(&self) -> u64 {
        self.all_shards()
            .map(|s| lock(s).values().map(|e| e.answered.checks()).sum::<u64>())
            .sum()
    }

    /// Hits admitted and not yet written.
    pub fn pending_hits(&self) -> u64 {
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
