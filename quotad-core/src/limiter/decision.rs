//! The decision over a check's limits, once their states are in hand (and locked).
//!
//! Each applicable limit gives a [`Verdict`] on the state as it is, before anything is consumed;
//! the check is admitted only if every limit admits it, and only then is its cost added to every
//! limit's pending hits, so a denial consumes nothing anywhere. The answer names the limit that
//! binds it (see [`binding_index`]).
//!
//! Everything here is arithmetic on borrowed state: no lock, no store, no allocation.

use smallvec::SmallVec;
use smol_str::SmolStr;

use super::allowance::{self, share_use, Fleet};
use super::first;
use super::state::{Answered, Entry, LimitState, TOKEN_SETTLE_ROUNDS};
use super::window;
use crate::domain::{Limit, LimitKind, Mode, OnStoreFailure, Policy, Scope, MAX_LIMITS};
use crate::metrics::DecisionLabel;

/// The limit that binds an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    /// The limit's id ([`Limit::answer_id`]).
    pub limit_id: SmolStr,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_ms: i64,
}

/// What a check decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// In `dry_run` mode: enforcement would have denied this check.
    pub dry_run_denied: bool,
    /// None when no limit applies.
    pub binding: Option<Binding>,
    /// 0 when allowed; on a denial the wait until the same request could pass; None if never.
    pub retry_after_ms: Option<i64>,
    /// Set when the store failed and the policy's `on_store_failure` rule decided.
    pub store_failure: Option<OnStoreFailure>,
}

impl Decision {
    pub(super) fn no_limit() -> Self {
        Decision {
            allowed: true,
            dry_run_denied: false,
            binding: None,
            retry_after_ms: Some(0),
            store_failure: None,
        }
    }

    /// What this decision is called in the checks metric.
    pub fn label(&self) -> DecisionLabel {
        if self.binding.is_none() {
            DecisionLabel::NoLimit
        } else if self.dry_run_denied {
            DecisionLabel::DryRunDenied
        } else if self.allowed {
            DecisionLabel::Allowed
        } else {
            DecisionLabel::Denied
        }
    }
}

/// A verdict not given yet (see [`Judging`]).
const UNJUDGED: Verdict = Verdict {
    est: 0,
    held: 0,
    admit: false,
    retry: None,
    pressing: false,
    store: false,
    read: false,
};

/// Per-limit verdict before anything is consumed.
#[derive(Clone, Copy)]
struct Verdict {
    /// The limit's count now, before this check (negative when credits exceed the hits).
    est: i64,
    /// What other instances may hold admitted beyond `est` (`allowance::others_hold`): not
    /// remaining in the answer.
    held: i64,
    admit: bool,
    /// The wait until the same check could pass: 0 when admitted, None if never.
    retry: Option<i64>,
    /// The counter should be synced at the next round (see `allowance::ShareUse`).
    pressing: bool,
    /// The window has room that this instance's share cannot hold: the store decides.
    store: bool,
    /// An unread state that cannot hold the check: read the counter first (`first`).
    read: bool,
}

/// How long a refusal by a full in-flight limit says to wait: a hold may end any moment.
pub(super) const IN_FLIGHT_RETRY_MS: i64 = 1_000;

/// One limit's verdict: over `max` by cost alone (never), by the window's count (until enough
/// hits leave it), or, where this instance's share of the headroom cannot hold the check, by
/// the store (the last units of a limit; until the next sync while the store is failing).
fn judge(l: &Limit, s: &LimitState, now: i64, cost: u64, fleet: Fleet) -> Verdict {
    let buckets = &s.buckets;
    let est = window::estimate(widened(l.kind, fleet.skew_ms), buckets, s.carry(), now);
    let verdict = |admit, retry, pressing| Verdict {
        est,
        held: 0,
        admit,
        retry,
        pressing,
        store: false,
        read: false,
    };
    if cost > l.max {
        return verdict(false, None, false);
    }
    if s.unread {
        // Before its first read: this instance's own hits, within the unread budget.
        let budget = first::unread_budget(l, fleet.members, fleet.idle_ms);
        if est as i128 + cost as i128 <= budget as i128 {
            return verdict(true, Some(0), false);
        }
        return Verdict {
            read: true,
            ..verdict(false, None, false)
        };
    }
    if est as i128 + cost as i128 > l.max as i128 {
        if l.in_flight.is_some() {
            // Holds end at any moment: a refusal says to try again in a second, not when the
            // window would empty. In a fleet they end on other instances too, which this count
            // learns of at its next read: the store decides a full in-flight limit there (in one
            // region, the store answering). Alone, this count is the store's.
            return Verdict {
                store: fleet.last_units && fleet.shares,
                ..verdict(false, Some(IN_FLIGHT_RETRY_MS), true)
            };
        }
        let wait = window::time_until_at_most(l.kind, buckets, s.carry(), now, l.max - cost);
        return verdict(false, Some(wait), false);
    }
    if !(fleet.shares && cost > 0) {
        // A strict check while another region is unheard keeps to this region's budget.
        let over = fleet
            .budget
            .filter(|_| cost > 0 && !l.kind.is_tokens())
            .is_some_and(|b| (cost as i128) > allowance::regional_allowance(l, s, now, b, true));
        if over {
            return verdict(false, Some(fleet.sync_interval_ms), false);
        }
        return verdict(true, Some(0), false);
    }
    let u = share_use(l, s, now, cost, fleet);
    let held = u.held.clamp(0, i64::MAX as i128) as i64;
    if u.within {
        Verdict {
            held,
            ..verdict(true, Some(0), u.pressing)
        }
    } else if fleet.last_units && u.others_hold_none {
        // The window has room that no share holds, and no other instance can hold hits of it
        // unwritten: the store counts the check.
        Verdict {
            held,
            store: true,
            ..verdict(false, Some(0), true)
        }
    } else {
        // This instance has used its share of the headroom since it last heard from the
        // others: nothing is left that it may take until the next sync brings a fresh count
        // and a fresh share.
        Verdict {
            held: i64::MAX,
            ..verdict(false, Some(fleet.sync_interval_ms), true)
        }
    }
}

/// A sliding window as a clock `skew_ms` uncertain must judge it: that much wider, up to one
/// bucket (which memory keeps: `window::oldest_needed`), so that hits this instance's clock may
/// have let out of the window early still count. Other kinds as they are.
fn widened(kind: LimitKind, skew_ms: i64) -> LimitKind {
    match kind {
        LimitKind::Sliding {
            window_ms,
            grain_ms,
        } if skew_ms > 0 => LimitKind::Sliding {
            window_ms: window_ms + skew_ms.min(grain_ms),
            grain_ms,
        },
        k => k,
    }
}

/// The binding limit: on a denial the denying one with the longest wait (never = longest);
/// otherwise the one with the least remaining. Ties go to the first in policy order.
fn binding_index(verdicts: &[Verdict], limits: &[&Limit], cost: u64, denied: bool) -> usize {
    let mut best = 0;
    for i in 1..verdicts.len() {
        let (v, b) = (&verdicts[i], &verdicts[best]);
        let better = if denied {
            if v.admit {
                false
            } else if b.admit {
                true
            } else {
                match (v.retry, b.retry) {
                    (None, Some(_)) => true,
                    (Some(x), Some(y)) => x > y,
                    _ => false,
                }
            }
        } else {
            let rem = |i: usize| {
                let v = &verdicts[i];
                let l = limits[i];
                remaining(l.max, v.est.saturating_add(v.held), l.cost_of(cost))
            };
            rem(i) < rem(best)
        };
        if better {
            best = i;
        }
    }
    best
}

/// What is left of `max` after `est` and `cost`: never below 0, above `max` while a credit
/// exceeds the hits.
fn remaining(max: u64, est: i64, cost: u64) -> u64 {
    (max as i128 - est as i128 - cost as i128).clamp(0, u64::MAX as i128) as u64
}

/// Decides over the states of the applicable limits (all in hand at once); consumes `cost` on
/// admission (or when `force_admit`, the `allow` store-failure rule).
pub(super) fn decide(
    policy: &Policy,
    limits: &[&Limit],
    states: &mut [&mut LimitState],
    now: i64,
    cost: u64,
    force_admit: bool,
    fleet: Fleet,
) -> Decision {
    let mut slots: Slots<'_> = states.iter_mut().map(|s| Some(&mut **s)).collect();
    let mut j = Judging::new(limits, now, cost, force_admit, fleet);
    j.judge(&mut slots);
    let outcome = j.outcome().expect("every state is in hand");
    let reset = j.consume(&outcome, &mut slots);
    j.decision(policy, &outcome, reset.unwrap_or_default())
}

/// A limit's state by the limit's index among a check's limits; None where the caller has not
/// got it (another entry's limit, or one not in memory).
pub(super) type Slots<'s> = SmallVec<[Option<&'s mut LimitState>; MAX_LIMITS]>;

/// Puts the states `e` holds for the limits of `scope` in `slots`, by the limit's index, and
/// returns its tally for the usage history; marks the entry used. (Filled in place: returning
/// the slots, 136 bytes, copied them on every check, which the decision bench could see.)
pub(super) fn fill<'e>(
    slots: &mut Slots<'e>,
    e: Option<&'e mut Entry>,
    limits: &[&Limit],
    scope: Scope,
    now: i64,
) -> Option<&'e mut Answered> {
    slots.extend(limits.iter().map(|_| None));
    let Entry {
        states,
        last_used,
        touched,
        answered,
        ..
    } = e?;
    *last_used = now;
    *touched = true;
    for s in states.iter_mut() {
        if let Some(i) = limits.iter().position(|l| l.scope == scope && s.is(l)) {
            slots[i] = Some(s);
        }
    }
    Some(answered)
}

/// A decision taken in steps over groups of states, so that a caller can hold each group's lock
/// only as long as the group is needed: the client's entry from the first step to the last, the
/// tenant's (which every check of the tenant waits on) only while its limits are judged and
/// consumed. Judge every group, take the [`Outcome`], consume it in every group, then build
/// the [`Decision`]: a denial consumes nothing anywhere, as in one step.
pub(super) struct Judging<'l> {
    limits: &'l [&'l Limit],
    /// By the limit's index; meaningful where `judged` has the index's bit.
    verdicts: SmallVec<[Verdict; MAX_LIMITS]>,
    judged: u32,
    now: i64,
    cost: u64,
    force_admit: bool,
    fleet: Fleet,
}

// `Judging::judged` has a bit per limit of a policy.
const _: () = assert!(MAX_LIMITS <= u32::BITS as usize);

/// Whether a check is admitted, and the limit that binds its answer.
pub(super) struct Outcome {
    denied: bool,
    binding: usize,
    /// Every limit that does not admit it leaves the check to the store: nothing is decided
    /// in memory (see [`Judging::outcome`]).
    pub(super) through_store: bool,
}

impl<'l> Judging<'l> {
    #[inline]
    pub(super) fn new(
        limits: &'l [&'l Limit],
        now: i64,
        cost: u64,
        force_admit: bool,
        fleet: Fleet,
    ) -> Self {
        Judging {
            limits,
            verdicts: SmallVec::new(),
            judged: 0,
            now,
            cost,
            force_admit,
            fleet,
        }
    }

    /// The verdicts of the limits whose states are in `slots`, on the states as they are.
    #[inline]
    pub(super) fn judge(&mut self, slots: &mut Slots<'_>) {
        if self.verdicts.is_empty() {
            // Filled here rather than in `new`, which would copy them when it returns.
            self.verdicts.resize(self.limits.len(), UNJUDGED);
        }
        let settle = TOKEN_SETTLE_ROUNDS * self.fleet.sync_interval_ms;
        for (i, (l, s)) in self.limits.iter().zip(slots.iter_mut()).enumerate() {
            if let Some(s) = s {
                s.rekind(l.kind, self.now);
                s.prune(self.now, settle);
                let v = judge(l, s, self.now, l.cost_of(self.cost), self.fleet);
                if v.read {
                    // Left unjudged: the check reads the counter first.
                    continue;
                }
                s.pressing |= v.pressing;
                self.verdicts[i] = v;
                self.judged |= 1 << i;
            }
        }
    }

    /// The limits no group has judged (a bit per limit's index): their states are not in
    /// memory.
    pub(super) fn unjudged(&self) -> u32 {
        let all = 1u32
            .checked_shl(self.limits.len() as u32)
            .map_or(u32::MAX, |b| b - 1);
        all & !self.judged
    }

    /// Admitted or denied, and the binding limit; None until every limit is judged.
    #[inline]
    pub(super) fn outcome(&self) -> Option<Outcome> {
        if self.judged.count_ones() as usize != self.limits.len() {
            return None;
        }
        let denied = !self.force_admit && self.verdicts.iter().any(|v| !v.admit);
        // A limit whose window is full denies in memory; only where every limit that does not
        // admit has room that no share holds does the store decide.
        let through_store = denied && self.verdicts.iter().all(|v| v.admit || v.store);
        let binding = binding_index(&self.verdicts, self.limits, self.cost, denied);
        Some(Outcome {
            denied,
            binding,
            through_store,
        })
    }

    /// Takes the cost in the states of `slots` if the check is admitted; when the binding limit's
    /// state is among them, its reset time (read after the cost is taken, as the answer says).
    #[inline]
    pub(super) fn consume(&self, o: &Outcome, slots: &mut Slots<'_>) -> Option<i64> {
        if !o.denied {
            for (l, s) in self.limits.iter().zip(slots.iter_mut()) {
                let amount = l.cost_of(self.cost);
                if let (Some(s), true) = (s, amount > 0) {
                    window::add_pending(l.kind, &mut s.buckets, self.now, amount);
                }
            }
        }
        let (l, s) = (self.limits[o.binding], slots[o.binding].as_deref()?);
        Some(window::reset_after(l.kind, &s.buckets, s.carry(), self.now))
    }

    /// The answer, given the binding limit's reset time from [`Judging::consume`].
    #[inline]
    pub(super) fn decision(&self, policy: &Policy, o: &Outcome, reset_after_ms: i64) -> Decision {
        let (l, v) = (self.limits[o.binding], self.verdicts[o.binding]);
        let binding = Binding {
            limit_id: l.answer_id.clone(),
            limit: l.max,
            remaining: remaining(
                l.max,
                v.est.saturating_add(v.held),
                if o.denied { 0 } else { l.cost_of(self.cost) },
            ),
            reset_after_ms,
        };
        let dry_run = policy.mode == Mode::DryRun;
        Decision {
            allowed: !o.denied || dry_run,
            dry_run_denied: o.denied && dry_run,
            binding: Some(binding),
            retry_after_ms: if o.denied && !dry_run {
                v.retry
            } else {
                Some(0)
            },
            store_failure: None,
        }
    }
}
