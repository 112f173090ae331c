//! The decision over a check's limits, once their states are in hand (and locked).
//!
//! Each applicable limit gives a [`Verdict`] on the state as it is, before anything is consumed;
//! the check is admitted only if every limit admits it, and only then is its cost added to every
//! limit's pending hits, so a denial consumes nothing anywhere. The answer names the limit that
//! binds it (see [`binding_index`]).
//!
//! Everything here is arithmetic on borrowed state: no lock, no store, no allocation.

use smallvec::SmallVec;

use super::share::{within_share, Fleet};
use super::state::{LimitState, TOKEN_SETTLE_ROUNDS};
use super::window;
use crate::domain::{Limit, LimitId, Mode, OnStoreFailure, Policy};

/// The limit that binds an answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub limit_id: LimitId,
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
}

/// Per-limit verdict before anything is consumed.
#[derive(Clone, Copy)]
struct Verdict {
    /// The limit's count now, before this check (negative when credits exceed the hits).
    est: i64,
    admit: bool,
    /// The wait until the same check could pass: 0 when admitted, None if never.
    retry: Option<i64>,
}

/// One limit's verdict: over `max` by cost alone (never), by the window's count (until enough
/// hits leave it), or by this instance's share of the headroom (until the next sync).
fn judge(l: &Limit, s: &LimitState, now: i64, cost: u64, fleet: Fleet) -> Verdict {
    let buckets = &s.buckets;
    let est = window::estimate(l.kind, buckets, s.carry(), now);
    if cost > l.max {
        Verdict {
            est,
            admit: false,
            retry: None,
        }
    } else if est as i128 + cost as i128 > l.max as i128 {
        Verdict {
            est,
            admit: false,
            retry: Some(window::time_until_at_most(
                l.kind,
                buckets,
                s.carry(),
                now,
                l.max - cost,
            )),
        }
    } else if fleet.shares && cost > 0 && !within_share(l, s, now, cost) {
        // The window has room, but this instance has used its share of it since it last heard
        // from the others: the next sync brings a fresh count and a fresh share.
        Verdict {
            est,
            admit: false,
            retry: Some(fleet.sync_interval_ms),
        }
    } else {
        Verdict {
            est,
            admit: true,
            retry: Some(0),
        }
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
            let rem = |i: usize| remaining(limits[i].max, verdicts[i].est, cost);
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

/// Decides over the states of the applicable limits; consumes `cost` on admission (or when
/// `force_admit`, the `allow` store-failure rule).
pub(super) fn decide(
    policy: &Policy,
    limits: &[&Limit],
    states: &mut [&mut LimitState],
    now: i64,
    cost: u64,
    force_admit: bool,
    fleet: Fleet,
) -> Decision {
    let mut verdicts: SmallVec<[Verdict; 16]> = SmallVec::new();
    let settle = TOKEN_SETTLE_ROUNDS * fleet.sync_interval_ms;
    for (l, s) in limits.iter().zip(states.iter_mut()) {
        s.rekind(l.kind, now);
        s.prune(now, settle);
        verdicts.push(judge(l, s, now, cost, fleet));
    }
    let denied = !force_admit && verdicts.iter().any(|v| !v.admit);
    if !denied && cost > 0 {
        for (l, s) in limits.iter().zip(states.iter_mut()) {
            window::add_pending(l.kind, &mut s.buckets, now, cost);
        }
    }
    let b = binding_index(&verdicts, limits, cost, denied);
    let (l, v) = (limits[b], verdicts[b]);
    let binding = Binding {
        limit_id: l.id.clone(),
        limit: l.max,
        remaining: remaining(l.max, v.est, if denied { 0 } else { cost }),
        reset_after_ms: window::reset_after(l.kind, &states[b].buckets, states[b].carry(), now),
    };
    let dry_run = policy.mode == Mode::DryRun;
    Decision {
        allowed: !denied || dry_run,
        dry_run_denied: denied && dry_run,
        binding: Some(binding),
        retry_after_ms: if denied && !dry_run { v.retry } else { Some(0) },
        store_failure: None,
    }
}
