//! The limiter's side of the sync task (the `sync` module drives it): what it hands over to
//! write and read back, and how the results come back into memory.
//!
//! A round is: [`Limiter::collect`], one pass over the entries that evicts what no longer
//! counts and takes a snapshot of the pending hits (moving exactly them from pending to stored;
//! hits admitted meanwhile stay pending) and the counters to read back; write the snapshot
//! ([`Limiter::unwritten`] gives it back if the store refused it); read back;
//! [`Limiter::refreshed`] installs the totals, which include every instance's hits, and this
//! instance's new share.

use super::key::newest_readable;
use std::sync::{Arc, Mutex, MutexGuard};

use super::eviction::Tally;
use super::state::{lock, AnsweredHour, LimitState, Shard};
use super::writes::Writing;
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
    /// Hits pending in memory when the snapshot was taken: those of `deltas`, and any the
    /// snapshot could not take.
    pub pending: u64,
    /// The write of `deltas`, under way until dropped: drop it once the store has answered.
    pub writing: Option<Writing>,
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
    /// A sync round's one pass over the entries: evicts what no longer counts (as
    /// [`Limiter::evict`]), takes a snapshot of every pending hit (as increments) and lists the
    /// counters used since the last sync (to read back). Clears the "used" marks. With
    /// `answers`, also takes what the client entries summed for the usage history.
    ///
    /// The hits taken count as written from here on (moved from pending to stored, which a
    /// second pass once did after the write returned): a write that reaches the store, or
    /// whose outcome is unknown, then needs no more passes over the entries. A write refused
    /// with nothing written gives them back with [`Limiter::unwritten`] before the next pass.
    /// An entry whose hits are taken is not evicted in the same pass, so the next pass finds
    /// them pending again when they were given back: a counter holding unwritten hits still
    /// never leaves memory.
    pub fn collect(&self, now: i64, answers: bool) -> SyncBatch {
        let mut batch = SyncBatch {
            writing: Some(self.writes.begin()),
            ..SyncBatch::default()
        };
        let evicting = self.evicting(now);
        let mut tally = Tally::default();
        let fleet = self.cfg.fleet.members() > 1;
        // Strings are copied after the lock is let go.
        let mut taken: Vec<(Arc<str>, Arc<str>, AnsweredHour)> = Vec::new();
        let mut pace = Pacer::new();
        for shard in self.all_shards() {
            let mut g = lock(shard);
            g.retain(|k, e| {
                if !evicting.keep(k, e, &mut tally) {
                    return false;
                }
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
                let refresh = (e.touched && fleet) || e.stale_rounds >= REFRESH_IDLE_EVERY;
                for s in e.states.iter_mut() {
                    let mut key = || CounterKey {
                        tenant: k.tenant.clone(),
                        subject: subject.get_or_insert_with(|| k.subject.to_arc()).clone(),
                        limit: s.id.clone(),
                        grain: s.kind.grain(),
                    };
                    let mut moved = 0;
                    for b in s.buckets.iter_mut().filter(|b| b.pending > 0) {
                        let n = b.pending.min(i64::MAX as u64);
                        batch.deltas.push(Delta {
                            key: key(),
                            start: b.start,
                            delta: n as i64,
                        });
                        b.pending -= n;
                        b.stored = b.stored.saturating_add(n as i64);
                        moved += n;
                    }
                    s.settling = s.settling.saturating_add(moved);
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
                true
            });
            drop(g);
            self.shard_evicted(&mut tally);
            batch.answers.extend(taken.drain(..).map(usage_delta));
            pace.step();
        }
        batch.pending = self.evicted(tally).1;
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

    /// The snapshot's increments were refused with nothing written: they are pending again
    /// (hits admitted since the snapshot are pending already), to be taken by the next round.
    /// What was reset meanwhile is dropped as unwritten hits are (see `reset`).
    pub fn unwritten(&self, deltas: &[Delta]) {
        self.each_state(
            deltas,
            |d| &d.key,
            |s, run| {
                for d in run {
                    let n = d.delta.max(0);
                    let b = window::bucket_at(&mut s.buckets, d.start);
                    b.stored = b.stored.saturating_sub(n);
                    b.pending = b.pending.saturating_add(n as u64);
                    s.settling = s.settling.saturating_sub(n as u64);
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
