//! Strict consistency: the store counts a hit before the answer, and a denial takes it back.
//!
//! Used for `strict` policies and for any check a memory cap keeps out of memory. Every instance
//! sees every other's hits at once, at the cost of a store round trip per check. The hit is
//! added and the counts read back in one store call; the decision then judges the counts as
//! they were before this hit, so it agrees with what a cached decision would have said. A denied
//! hit is compensated by a decrement; if that fails, the count errs high (towards denial).
//!
//! Memory keeps what the store said: each answer's totals are remembered in the counter's state
//! (installed if there is room under the memory caps, and evicted when idle like any other), so
//! that if the store fails, the failure rule enforces from the last totals read plus what this
//! instance admitted since, within its share of that headroom (see `failure`), instead of
//! starting from zero. Hits admitted during a failure are pending there; the next strict call
//! on the counter carries them to the store with its own hit (or the sync task writes them
//! first), so that the other instances see them as soon as the store answers again.
//!
//! A call that misses its deadline is not dropped: it goes on in a task of its own, and its
//! answer, when it comes, is learned from (see [`Late`]). Until then its hit counts as taken:
//! pending if the failure rule admitted it, in the last totals if it denied it.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use super::decision::{decide, Decision};
use super::key::subject_of;
use super::share::{self, Fleet};
use super::state::{buckets_from, lock, LimitState};
use super::writes::Writing;
use super::{window, CheckInput, Limiter};
use crate::domain::{Consistency, Limit, Policy};
use crate::store::{BucketTotal, CounterRange, Delta, StoreError};

/// A strict call that answered after its deadline, for memory to learn from at the next
/// strict check or sync round: its totals (which hold its hit), and what the failure rule did
/// with the hit meanwhile. A denied hit was taken back from the store by the task that waited.
#[derive(Debug, Default)]
pub(super) struct Late {
    deltas: Vec<Delta>,
    ranges: Vec<CounterRange>,
    /// None: the call failed, nothing written.
    totals: Option<Vec<Vec<BucketTotal>>>,
    /// The failure rule admitted the hit: it is pending in memory, and the store has it now.
    admitted: bool,
    /// Pending hits the call carried, to be pending again as it wrote nothing.
    unwritten: Vec<Delta>,
}

/// Late answers not learned yet. At most [`MAX_LATE`] wait; beyond, an answer is not learned
/// (its hit stays counted twice where it was admitted: the count errs high).
pub(super) type LateAnswers = Arc<Mutex<Vec<Late>>>;
const MAX_LATE: usize = 100_000;

/// A strict store call, owned so that it can outlive its check.
type Counting = Pin<Box<dyn Future<Output = Result<Vec<Vec<BucketTotal>>, StoreError>> + Send>>;

impl Limiter {
    /// Decides a check through the store: a strict policy's, or one at the last units of a
    /// limit (counted in the metrics).
    pub(super) async fn through_store(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
    ) -> (Decision, bool) {
        if policy.consistency == Consistency::Cached {
            self.metrics.last_units_check();
        }
        (self.check_strict(policy, limits, input, now).await, false)
    }

    /// Decides a check through the store (see the module comment).
    pub(super) async fn check_strict(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
    ) -> Decision {
        self.learn_late();
        let deltas = Self::hit_deltas(limits, input, now);
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| Self::range_of(input.tenant, input.client, l, now))
            .collect();
        // Hits a failure admitted here go to the store with this one (see the module comment).
        let (carried, writing) = match self.carry_pending(&ranges, now) {
            c if c.is_empty() => (c, None),
            c => (c, Some(self.writes.begin())),
        };
        let mut call: Counting = {
            let store = self.store.clone();
            let (mut d, r) = (deltas.clone(), ranges.clone());
            d.extend(carried.iter().cloned());
            Box::pin(async move { store.increment_and_read(&d, &r).await })
        };
        let totals = match tokio::time::timeout(self.cfg.store_timeout, &mut call).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                if !matches!(e, StoreError::Uncertain(_)) {
                    // Nothing written: what it carried is pending again.
                    self.unwritten(&carried);
                }
                let d = self.on_failure(policy, limits, input, now, &e);
                if matches!(e, StoreError::Uncertain(_)) {
                    self.metrics.uncertain_hits(input.cost);
                    self.count_as_taken(&deltas, &d);
                }
                return d;
            }
            Err(_) if deltas.is_empty() && carried.is_empty() => {
                // A peek: it only read, and its answer is of no more use.
                let e = StoreError::Unavailable(format!(
                    "no answer within {:?}",
                    self.cfg.store_timeout
                ));
                return self.on_failure(policy, limits, input, now, &e);
            }
            Err(_) => {
                self.metrics.uncertain_hits(input.cost);
                let e =
                    StoreError::Uncertain(format!("no answer within {:?}", self.cfg.store_timeout));
                let d = self.on_failure(policy, limits, input, now, &e);
                let admitted = self.count_as_taken(&deltas, &d);
                let late = Late {
                    deltas,
                    ranges,
                    admitted,
                    unwritten: carried,
                    ..Late::default()
                };
                self.follow(call, late, writing);
                return d;
            }
        };
        drop(writing);
        self.store_answered();
        let mut states = states_before_hit(limits, &totals, input.cost, now);
        if self.cfg.fleet.cut_since().is_some() {
            self.add_region_parts(limits, &ranges, &totals, &mut states, input.cost, now);
        }
        // Hits a failure admitted here and the sync task has not written yet.
        for (l, s) in limits.iter().zip(states.iter_mut()) {
            self.add_pending(&Self::counter_key(input.tenant, input.client, l), s);
        }
        let mut refs: Vec<&mut LimitState> = states.iter_mut().collect();
        // The store counted this hit against everyone's: no share to keep to, but while
        // another region is unheard, this region's budget (`share::Budget`).
        let fleet = Fleet {
            shares: false,
            ..self.fleet(policy)
        };
        let mut d = decide(policy, limits, &mut refs, now, input.cost, false, fleet);
        // A larger limit of a cached check (here because a small one needs the store) was
        // within this instance's share: what the others may hold of it is not remaining.
        if let Some(b) = d.binding.as_mut() {
            if let Some(i) = limits.iter().position(|l| l.answer_id == b.limit_id) {
                b.remaining = b
                    .remaining
                    .saturating_sub(self.others_hold(policy, limits[i], &ranges[i], now));
            }
        }
        let admitted = d.allowed && !d.dry_run_denied;
        // A cached check refused by the store may have been refused for hits of racing checks
        // that are taken back in turn: memory keeps its own count and reads the store again at
        // the next round, instead of holding the store's count as the truth till then.
        let kept = match (admitted, policy.consistency) {
            (true, _) => Kept::Admitted,
            (false, Consistency::Cached) => Kept::Racing,
            (false, Consistency::Strict) => Kept::Refused,
        };
        self.remember(input, limits, &ranges, totals, kept, now);
        if !admitted {
            undo(&self.store, &self.metrics, deltas).await;
        }
        d
    }

    /// What the other instances may hold admitted and unwritten of `l`
    /// (`share::others_hold`) as this instance has read its counter, for the answer's
    /// `remaining`: nothing in a strict policy, whose hits are all in the store, nor alone, nor
    /// of a small limit, which no instance holds a share of.
    fn others_hold(&self, policy: &Policy, l: &Limit, r: &CounterRange, now: i64) -> u64 {
        if policy.consistency == Consistency::Strict {
            return 0;
        }
        let fleet = self.fleet(policy);
        self.with_state(&r.key, |s| share::others_hold(l, s, now, fleet))
            .map_or(0, |h| h.clamp(0, i64::MAX as i128) as u64)
    }

    /// The check's hit on each limit's current bucket; none for a peek (cost 0).
    fn hit_deltas(limits: &[&Limit], input: CheckInput<'_>, now: i64) -> Vec<Delta> {
        if input.cost == 0 {
            return Vec::new();
        }
        limits
            .iter()
            .map(|l| Delta {
                key: Self::counter_key(input.tenant, input.client, l),
                start: l.kind.grain().bucket_start(now),
                delta: input.cost as i64,
            })
            .collect()
    }

    /// Keeps the totals a strict call read in memory, for a failure to enforce from: with the
    /// hit (admitted) or without it (taken back). A state in memory keeps the higher of its
    /// count and the store's, bucket by bucket (a sync write may be under way that the read
    /// missed), or, [`Kept::Racing`], keeps its own and is read back at the next sync round;
    /// one not in memory is installed if the caps leave room.
    fn remember(
        &self,
        input: CheckInput<'_>,
        limits: &[&Limit],
        ranges: &[CounterRange],
        totals: Vec<Vec<BucketTotal>>,
        kept: Kept,
        now: i64,
    ) {
        let (admitted, racing) = (kept == Kept::Admitted, kept == Kept::Racing);
        for ((l, r), t) in limits.iter().zip(ranges).zip(totals) {
            let mut buckets = buckets_from(&t);
            if !admitted {
                let start = l.kind.grain().bucket_start(now);
                if let Some(b) = buckets.iter_mut().find(|b| b.start == start) {
                    b.stored -= input.cost.min(i64::MAX as u64) as i64;
                }
            }
            let known = self.with_state(&r.key, |s| {
                if racing {
                    s.pressing = true;
                    return;
                }
                for b in &buckets {
                    let mine = window::bucket_at(&mut s.buckets, b.start);
                    mine.stored = mine.stored.max(b.stored);
                }
            });
            if known.is_none() {
                let share = self.share(&t, r, now);
                let part = self.region_part(&t, r, now, None);
                // No room under a cap: nothing remembered, and a failure knows nothing of it.
                if self.install(input, l, buckets, share, now).is_ok() && part.is_some() {
                    self.with_state(&r.key, |s| s.set_region(part));
                }
            } else {
                self.mark_used(input, l, now);
            }
        }
    }

    /// Marks a counter's entry used at `now`, so that idleness does not evict what a strict
    /// check just read.
    fn mark_used(&self, input: CheckInput<'_>, l: &Limit, now: i64) {
        let r = self.key_ref(input.tenant.as_str(), subject_of(l, input.client.as_str()));
        if let Some(e) = lock(self.shard_of(r)).get_mut(&r) {
            e.last_used = now;
        }
    }

    /// Whether memory holds a state for this check's counter of `l`.
    pub(super) fn holds(&self, input: CheckInput<'_>, l: &Limit) -> bool {
        let r = self.key_ref(input.tenant.as_str(), subject_of(l, input.client.as_str()));
        lock(self.shard_of(r))
            .get(&r)
            .is_some_and(|e| e.states.iter().any(|s| s.is(l)))
    }

    /// While another region is unheard: this region's part of each count, before this hit, with
    /// the region's earned share as memory kept it.
    fn add_region_parts(
        &self,
        limits: &[&Limit],
        ranges: &[CounterRange],
        totals: &[Vec<BucketTotal>],
        states: &mut [LimitState],
        cost: u64,
        now: i64,
    ) {
        for (((l, r), t), s) in limits.iter().zip(ranges).zip(totals).zip(states) {
            let kept = self
                .with_state(&r.key, |m| m.region().map(|p| p.earned))
                .flatten();
            let mut part = self.region_part(t, r, now, kept);
            if let Some(p) = part.as_mut() {
                let start = l.kind.grain().bucket_start(now);
                if let Some(b) = p.buckets.iter_mut().find(|b| b.start == start) {
                    b.stored -= cost.min(i64::MAX as u64) as i64;
                }
            }
            s.set_region(part);
        }
    }

    /// Adds the hits pending in memory for `key` to a state built from the store's totals.
    fn add_pending(&self, key: &crate::store::CounterKey, to: &mut LimitState) {
        self.with_state(key, |s| {
            for b in s.buckets.iter().filter(|b| b.pending > 0) {
                window::bucket_at(&mut to.buckets, b.start).pending += b.pending;
            }
        });
    }

    /// A strict hit whose outcome is unknown counts as taken: if the failure rule admitted it,
    /// it is pending already; if not, it is added to the last totals in memory. Says whether
    /// it was admitted.
    fn count_as_taken(&self, deltas: &[Delta], d: &Decision) -> bool {
        let admitted = d.allowed && !d.dry_run_denied;
        if !admitted {
            for x in deltas {
                self.with_state(&x.key, |s| {
                    window::bucket_at(&mut s.buckets, x.start).stored += x.delta;
                });
            }
        }
        admitted
    }

    /// Lets a strict call that missed its deadline finish in a task of its own (its carried
    /// hits' write under way until then). If it counted the hit, a hit the failure rule denied
    /// is taken back; either way its outcome waits in [`Limiter::late`] to be learned from.
    fn follow(&self, call: Counting, mut late: Late, writing: Option<Writing>) {
        let (queue, store) = (self.late.clone(), self.store.clone());
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            match call.await {
                Ok(totals) => {
                    if !late.admitted {
                        undo(&store, &metrics, late.deltas.clone()).await;
                    }
                    late.totals = Some(totals);
                    late.unwritten.clear();
                }
                // Its outcome stays unknown: what it carried counts as written, as a sync
                // write's does.
                Err(StoreError::Uncertain(_)) => return,
                Err(_) => {}
            }
            drop(writing);
            let mut q = queue.lock().unwrap();
            if q.len() < MAX_LATE {
                q.push(late);
            }
        });
    }

    /// Takes the hits pending in memory for these counters, as the sync task's snapshot does
    /// (moved from pending to stored), for a strict call to write.
    fn carry_pending(&self, ranges: &[CounterRange], now: i64) -> Vec<Delta> {
        let mut carried = Vec::new();
        for r in ranges {
            self.with_state(&r.key, |s| {
                if s.pending() == 0 {
                    return;
                }
                let needed = s.oldest_needed(now);
                for b in s.buckets.iter_mut().filter(|b| b.pending > 0) {
                    let n = b.pending.min(i64::MAX as u64);
                    b.pending = 0;
                    if b.start < needed {
                        continue;
                    }
                    carried.push(Delta {
                        key: r.key.clone(),
                        start: b.start,
                        delta: n as i64,
                    });
                    b.stored = b.stored.saturating_add(n as i64);
                    s.settling = s.settling.saturating_add(n);
                }
            });
        }
        carried
    }

    /// Learns the strict answers that came after their deadline (see [`Late`]).
    pub(super) fn learn_late(&self) {
        let late = {
            let mut q = self.late.lock().unwrap();
            if q.is_empty() {
                return;
            }
            std::mem::take(&mut *q)
        };
        for a in late {
            self.unwritten(&a.unwritten);
            let Some(totals) = a.totals else {
                continue;
            };
            if a.admitted {
                // The store counted the hit the failure rule admitted: no longer this
                // instance's to write. (Written already, it is counted twice: errs high.)
                for d in &a.deltas {
                    self.with_state(&d.key, |s| {
                        if let Some(b) = s.buckets.iter_mut().find(|b| b.start == d.start) {
                            b.pending -= (d.delta.max(0) as u64).min(b.pending);
                        }
                    });
                }
            }
            for (r, t) in a.ranges.iter().zip(&totals) {
                self.with_state(&r.key, |s| {
                    for bt in t {
                        let b = window::bucket_at(&mut s.buckets, bt.start);
                        b.stored = b.stored.max(bt.total);
                    }
                    // A late count may hold hits taken back since (this one's, racing
                    // checks'): read the counter again at the next round rather than refuse
                    // from it until an idle reread, seconds later.
                    s.pressing = true;
                });
            }
        }
    }
}

/// What became of a strict call's hit, for [`Limiter::remember`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kept {
    Admitted,
    /// Refused and taken back.
    Refused,
    /// Refused and taken back, in a `cached` policy: the count read may hold racing checks'
    /// hits that are taken back in turn.
    Racing,
}

/// Takes hits back out of the store (a denied strict hit). If that fails, the hit stays
/// counted: the count errs high (towards denial).
async fn undo(
    store: &crate::store::DynCounterStore,
    metrics: &crate::metrics::Metrics,
    deltas: Vec<Delta>,
) {
    if deltas.is_empty() {
        return;
    }
    let undo: Vec<Delta> = deltas
        .into_iter()
        .map(|mut d| {
            d.delta = -d.delta;
            d
        })
        .collect();
    if let Err(e) = store.increment(&undo).await {
        metrics.compensation_failed();
        tracing::warn!(error = %e, "strict mode: compensating a denied hit failed");
    }
}

/// The limits' states as the store counted them before this hit (which it already holds).
fn states_before_hit(
    limits: &[&Limit],
    totals: &[Vec<BucketTotal>],
    cost: u64,
    now: i64,
) -> Vec<LimitState> {
    limits
        .iter()
        .zip(totals)
        .map(|(l, t)| {
            let mut buckets = buckets_from(t);
            let start = l.kind.grain().bucket_start(now);
            if let Some(b) = buckets.iter_mut().find(|b| b.start == start) {
                b.stored -= cost.min(i64::MAX as u64) as i64;
            }
            LimitState::new(l, buckets, 1.0, now)
        })
        .collect()
}
