//! What a check does when memory cannot decide it: a first read of its counters, a call
//! through the store, and the failure rule when the store does not answer.
//!
//! First reads. A counter not in memory is read before its first decision, never assumed to
//! be zero, unless the limit is far too large for the check to matter: then it may be admitted
//! unread, within a bound, and read at the next round (`first`, `admit_unread`). Concurrent first checks of one client share one read (`loads`); a check that finds
//! no room under a memory cap is decided through the store instead.
//!
//! Strict consistency: the store counts a hit before the answer, and a denial takes it back.
//! Used for `strict` policies and for any check a memory cap keeps out of memory. Every instance
//! sees every other's hits at once, at the cost of a store round trip per check. The hit is
//! added and the counts read back in one store call; the decision then judges the counts as
//! they were before this hit, so it agrees with what a cached decision would have said. A denied
//! hit is compensated by a decrement; if that fails, the count errs high (towards denial).
//!
//! Memory keeps what the store said: each answer's totals are remembered in the counter's state
//! (installed if there is room under the memory caps, and evicted when idle like any other), so
//! that if the store fails, the failure rule enforces from the last totals read plus what this
//! instance admitted since, within its share of that headroom (below), instead of
//! starting from zero. Hits admitted during a failure are pending there; the next strict call
//! on the counter carries them to the store with its own hit (or the sync task writes them
//! first), so that the other instances see them as soon as the store answers again.
//!
//! A call that misses its deadline is not dropped: it goes on in a task of its own, and its
//! answer, when it comes, is learned from (`late`). Until then its hit counts as taken:
//! pending if the failure rule admitted it, in the last totals if it denied it.
//!
//! Store failures on the check path (`failure`): the deadline of a store call, and the
//! decision the policy's `on_store_failure` rule makes when a call fails.
//!
//! A check never fails: `deny` denies; `local` and `allow` carry on with what this instance
//! knows, its hits pending until the store returns (`allow` also admits what the local view
//! would deny). What it knows of a `cached` counter is its state in memory (one it never saw
//! starts empty); of a `strict` counter, the totals its last strict check read, plus what it
//! admitted since (above): one it never read is unknown, and `local` denies it rather
//! than start it at zero. In a fleet every instance keeps to its share of the headroom it last
//! saw, whatever the consistency: the others cannot see its hits until the store returns. When
//! a memory cap leaves no room to hold a hit, `allow` admits it unrecorded (counted and
//! logged) and `local` denies. A call whose outcome is unknown (it may have counted the hit)
//! fails as `Uncertain`.
//!
//! One log line marks the start of an episode (the first check decided so) and one its end
//! (the first store call of a check that succeeds after it), with the checks it decided.

use super::allowance::{self, Fleet};
use super::decision::{decide, Decision};
use super::failure::Rule;
use super::first;
use super::key::{counter_key, range_of};
use super::late::{undo, Counting, Late};
use super::loads::Turn;
use super::room::Cap;
use super::state::{buckets_from, LimitState};
use super::{window, Applicable, CheckInput, Limiter, Locked};
use crate::domain::{Consistency, Limit, Policy};
use crate::store::{BucketTotal, CounterRange, Delta, StoreError};

impl Limiter {
    /// Reads the `missing` states from the store (or waits for the check that reads them)
    /// and decides; when `record`, as [`Limiter::decide`].
    pub(super) async fn read_first(
        &self,
        policy: &Policy,
        limits: Applicable<'_>,
        input: CheckInput<'_>,
        now: i64,
        mut missing: u32,
        record: bool,
    ) -> (Decision, bool) {
        let tally = record && self.cfg.max_history_rows > 0;
        for _ in 0..4 {
            let want: Applicable<'_> = (limits.iter().enumerate())
                .filter(|(i, _)| missing & (1 << i) != 0)
                .map(|(_, l)| *l)
                .collect();
            match self
                .loads
                .turn(input.tenant.as_arc(), input.client.as_arc())
            {
                Turn::Lead(_reading) => match self.load(input, &want, now).await {
                    Ok(None) => {}
                    Ok(Some(cap)) => {
                        // No room in memory: let the store count this check.
                        self.metrics.memory_cap_check(cap.label());
                        return (self.check_strict(policy, &limits, input, now).await, false);
                    }
                    Err(e) => {
                        return (
                            Rule(self).on_failure(policy, &limits, input, now, &e),
                            false,
                        )
                    }
                },
                Turn::Follow(mut rx) => {
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
        (
            Rule(self).on_failure(policy, &limits, input, now, &e),
            false,
        )
    }

    /// Installs unread states for the `missing` limits of a check, if every one of them
    /// qualifies (module comment); says whether it did. A state a racing read installed first
    /// stays.
    pub(super) fn admit_unread(
        &self,
        policy: &Policy,
        limits: &Applicable<'_>,
        input: CheckInput<'_>,
        now: i64,
        missing: u32,
    ) -> bool {
        if policy.consistency != Consistency::Cached
            || input.cost == 0
            || input.reserve
            || self.failures.on()
            || self.shares.fleet.cut_since().is_some()
        {
            return false;
        }
        let members = self.shares.fleet.members();
        let pressed_at = self.table.pressed_at();
        let missing_limits = || {
            (limits.iter().enumerate())
                .filter(|(i, _)| missing & (1 << i) != 0)
                .map(|(_, l)| *l)
        };
        let (cost, idle) = (input.cost, self.cfg.idle_ms);
        let qualifies = |l: &Limit| first::qualifies(l, cost, members, idle, (now, pressed_at));
        if !missing_limits().all(qualifies) {
            return false;
        }
        let share = 1.0 / members.max(1) as f32;
        for l in missing_limits() {
            let unread = || LimitState::unread(l, share, now);
            if self.table.install(input, l, now, unread).is_err() {
                // No room under a cap: the read decides, through the store.
                return false;
            }
        }
        true
    }

    /// Reads the missing counters from the store and installs them (unless a racing check
    /// installed them first, whose state then wins). Says which cap, if any, left one out.
    pub(super) async fn load(
        &self,
        input: CheckInput<'_>,
        limits: &[&Limit],
        now: i64,
    ) -> Result<Option<Cap>, StoreError> {
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| range_of(input.tenant, input.client, l, now))
            .collect();
        let totals = Rule(self)
            .with_deadline(self.store.read(&ranges), false)
            .await?;
        Rule(self).store_answered();
        let mut capped = None;
        for (l, (r, t)) in limits.iter().zip(ranges.iter().zip(totals)) {
            let share = self.shares.share(&t, r, now, None);
            let mut part = self.shares.region_part(&t, r, now, None);
            // A state admitted unread (`first`) takes the read in; any other that a racing
            // read installed first stays as it is.
            let read_in = self.table.with_state(&r.key, |s| {
                if s.unread {
                    s.first_read_in(&t, r.from);
                    s.share = share;
                    s.set_region(part.take());
                    self.shares.note_read(s, now, None);
                }
            });
            let state = || self.read_state(l, buckets_from(&t), share, now);
            if read_in.is_some() {
                continue;
            }
            if let Err(cap) = self.table.install(input, l, now, state) {
                capped = Some(cap);
            } else if part.is_some() {
                self.table.with_state(&r.key, |s| {
                    if s.region().is_none() {
                        s.set_region(part);
                    }
                });
            }
        }
        Ok(capped)
    }

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
        self.late.learn(&self.table);
        let deltas = hit_deltas(limits, input, now);
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| range_of(input.tenant, input.client, l, now))
            .collect();
        // Hits a failure admitted here go to the store with this one (see the module comment).
        let (carried, writing) = match self.table.carry_pending(&ranges, now) {
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
                    self.table.unwritten(&carried);
                }
                let d = Rule(self).on_decided_failure(policy, limits, input, now, &e);
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
                return Rule(self).on_failure(policy, limits, input, now, &e);
            }
            Err(_) => {
                self.metrics.uncertain_hits(input.cost);
                let e =
                    StoreError::Uncertain(format!("no answer within {:?}", self.cfg.store_timeout));
                let d = Rule(self).on_decided_failure(policy, limits, input, now, &e);
                let admitted = self.count_as_taken(&deltas, &d);
                let late = Late {
                    deltas,
                    ranges,
                    admitted,
                    unwritten: carried,
                    ..Late::default()
                };
                let (store, metrics) = (self.store.clone(), self.metrics.clone());
                self.late.follow(call, late, writing, store, metrics);
                return d;
            }
        };
        drop(writing);
        Rule(self).store_answered();
        let mut states = states_before_hit(limits, &totals, input.cost, now);
        if self.shares.fleet.cut_since().is_some() {
            self.add_region_parts(limits, &ranges, &totals, &mut states, input.cost, now);
        }
        // Hits a failure admitted here and the sync task has not written yet.
        for (l, s) in limits.iter().zip(states.iter_mut()) {
            let key = counter_key(input.tenant, input.client, l);
            self.table.add_pending(&key, s);
        }
        let mut refs: Vec<&mut LimitState> = states.iter_mut().collect();
        // The store counted this hit against everyone's: no share to keep to, but while
        // another region is unheard, this region's budget (`allowance::Budget`).
        let fleet = Fleet {
            shares: false,
            ..self.shares.fleet(policy)
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
    /// (`allowance::others_hold`) as this instance has read its counter, for the answer's
    /// `remaining`: nothing in a strict policy, whose hits are all in the store, nor alone, nor
    /// of a small limit, which no instance holds a share of.
    fn others_hold(&self, policy: &Policy, l: &Limit, r: &CounterRange, now: i64) -> u64 {
        if policy.consistency == Consistency::Strict {
            return 0;
        }
        let fleet = self.shares.fleet(policy);
        self.table
            .with_state(&r.key, |s| allowance::others_hold(l, s, now, fleet))
            .map_or(0, |h| h.clamp(0, i64::MAX as i128) as u64)
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
                    b.stored -= l.cost_of(input.cost).min(i64::MAX as u64) as i64;
                }
            }
            let known = self.table.with_state(&r.key, |s| {
                if racing {
                    s.pressing = true;
                    return;
                }
                for b in &buckets {
                    let mine = window::bucket_at(&mut s.buckets, b.start);
                    mine.stored = mine.stored.max(b.stored);
                }
                // The store's count is at least what an unread state counted of its own.
                s.unread = false;
            });
            if known.is_none() {
                let share = self.shares.share(&t, r, now, None);
                let part = self.shares.region_part(&t, r, now, None);
                let state = || self.read_state(l, buckets, share, now);
                // No room under a cap: nothing remembered, and a failure knows nothing of it.
                if self.table.install(input, l, now, state).is_ok() && part.is_some() {
                    self.table.with_state(&r.key, |s| s.set_region(part));
                }
            } else {
                self.table.mark_used(input, l, now);
            }
        }
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
            let cost = l.cost_of(cost);
            let kept = self
                .table
                .with_state(&r.key, |m| m.region().map(|p| p.earned))
                .flatten();
            let mut part = self.shares.region_part(t, r, now, kept);
            if let Some(p) = part.as_mut() {
                let start = l.kind.grain().bucket_start(now);
                if let Some(b) = p.buckets.iter_mut().find(|b| b.start == start) {
                    b.stored -= cost.min(i64::MAX as u64) as i64;
                }
            }
            s.set_region(part);
        }
    }

    /// A strict hit whose outcome is unknown counts as taken: if the failure rule admitted it,
    /// it is pending already; if not, it is added to the last totals in memory. Says whether
    /// it was admitted.
    fn count_as_taken(&self, deltas: &[Delta], d: &Decision) -> bool {
        let admitted = d.allowed && !d.dry_run_denied;
        if !admitted {
            for x in deltas {
                self.table.with_state(&x.key, |s| {
                    window::bucket_at(&mut s.buckets, x.start).stored += x.delta;
                });
            }
        }
        admitted
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
                b.stored -= l.cost_of(cost).min(i64::MAX as u64) as i64;
            }
            LimitState::new(l, buckets, 1.0, now)
        })
        .collect()
}

/// The check's hit on each limit's current bucket: none for a peek (cost 0), except the hold
/// a reservation of cost 0 takes of an in-flight limit that counts holds.
pub(super) fn hit_deltas(limits: &[&Limit], input: CheckInput<'_>, now: i64) -> Vec<Delta> {
    limits
        .iter()
        .map(|l| (l, l.cost_of(input.cost)))
        .filter(|(_, amount)| *amount > 0)
        .map(|(l, amount)| Delta {
            key: counter_key(input.tenant, input.client, l),
            start: l.kind.grain().bucket_start(now),
            delta: amount.min(i64::MAX as u64) as i64,
        })
        .collect()
}
