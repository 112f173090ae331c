//! The store failing on the check path: the deadline of a store call, and the decision the
//! policy's `on_store_failure` rule makes when a call fails (see `miss` for what each rule
//! knows).
//!
//! A check the store decides (a `strict` policy's, the last units of a small limit) is
//! different while the store answers this instance's other calls: its own call failing means
//! a replica it needed was slow or lost, not that the store is gone, and an answer from memory
//! could pass `max` beside the instances the store answers, which cannot see this instance's
//! hits held in memory. Such a check is refused, as `deny` would, whatever the rule
//! ([`Rule::on_decided_failure`]); the rule takes over once no store call has answered for
//! [`ANSWERED_WITHIN_MS`].
//!
//! [`Episodes`] owns what this needs to know: when the store last answered, and the episode of
//! failure decisions under way (one log line begins it, one ends it). [`Rule`] makes the
//! decisions, with what the limiter knows.

use std::future::Future;
use std::ops::Deref;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use super::decision::{Binding, Decision};
use super::{CheckInput, Limiter, Locked};
use crate::domain::{Consistency, Limit, Mode, OnStoreFailure, Policy};
use crate::store::StoreError;

/// How recently a store call of this instance must have answered for the store to count as
/// answering (see the module comment).
pub(super) const ANSWERED_WITHIN_MS: i64 = 2_000;

/// How long the check path's store calls must go without a failure decision for an episode of
/// them to end.
const EPISODE_QUIET_MS: i64 = 5_000;

/// When the store last answered this instance, and the episode of failure decisions under
/// way on the check path (clock ms).
#[derive(Debug, Default)]
pub(super) struct Episodes {
    /// Checks decided by a failure since the episode began; 0 when none is under way.
    failing: AtomicU64,
    /// When a check was last decided by a failure.
    failed_at: AtomicI64,
    /// When a store call of this instance last answered.
    answered_at: AtomicI64,
}

impl Episodes {
    /// A store call answered at `now`.
    pub(super) fn answered(&self, now: i64) {
        self.answered_at.fetch_max(now, Ordering::Relaxed);
    }

    /// Whether a store call answered within [`ANSWERED_WITHIN_MS`] of `now`.
    fn answering(&self, now: i64) -> bool {
        now.saturating_sub(self.answered_at.load(Ordering::Relaxed)) <= ANSWERED_WITHIN_MS
    }

    /// Counts a check decided by a failure at `now`; says whether it begins an episode (the
    /// one to log).
    fn begins(&self, now: i64) -> bool {
        self.failed_at.fetch_max(now, Ordering::Relaxed);
        self.failing.fetch_add(1, Ordering::Relaxed) == 0
    }

    /// A check's store call answered at `now`: ends the episode under way, if none was decided
    /// by a failure for [`EPISODE_QUIET_MS`] (a replica lost makes calls fail now and then
    /// among answers: one episode, not a line each). Returns the checks it decided.
    fn ends(&self, now: i64) -> Option<u64> {
        if self.failing.load(Ordering::Relaxed) == 0
            || now.saturating_sub(self.failed_at.load(Ordering::Relaxed)) < EPISODE_QUIET_MS
        {
            return None;
        }
        Some(self.failing.swap(0, Ordering::Relaxed)).filter(|&n| n > 0)
    }

    /// Whether an episode is under way.
    pub(super) fn on(&self) -> bool {
        self.failing.load(Ordering::Relaxed) > 0
    }
}

/// The failure rule's decisions, made with what the limiter knows.
pub(super) struct Rule<'a>(pub(super) &'a Limiter);

impl Deref for Rule<'_> {
    type Target = Limiter;

    fn deref(&self) -> &Limiter {
        self.0
    }
}

impl Rule<'_> {
    /// Awaits a store call for at most `store_timeout`. A call that may have changed the store
    /// (`uncertain`) and got no answer fails as `Uncertain`, one that only read as `Unavailable`.
    pub(super) async fn with_deadline<T>(
        &self,
        fut: impl Future<Output = Result<T, StoreError>>,
        uncertain: bool,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.cfg.store_timeout, fut).await {
            Ok(r) => r,
            Err(_) if uncertain => Err(StoreError::Uncertain(format!(
                "no answer within {:?}",
                self.cfg.store_timeout
            ))),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer within {:?}",
                self.cfg.store_timeout
            ))),
        }
    }

    /// The store failed on the check path: apply the policy's rule.
    pub(super) fn on_failure(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
        e: &StoreError,
    ) -> Decision {
        let rule = policy.on_store_failure;
        if self.failures.begins(now) {
            tracing::warn!(error = %e, rule = rule.as_str(), "store failing on the check path: checks decided by on_store_failure until it answers");
        }
        let consistency = policy.consistency;
        self.metrics
            .store_failure_decision(rule.as_str(), consistency.as_str());
        let mut d = match rule {
            OnStoreFailure::Deny => self.without_memory(policy, limits, input, rule),
            OnStoreFailure::Local | OnStoreFailure::Allow => {
                // Carry on with what this instance knows: a cached counter never seen starts
                // empty (the next sync reads its real totals back); a strict one keeps the
                // totals its last check read, and `local` will not make one up. Admitted hits
                // are pending and reach the store when it returns. Not knowing the others'
                // demand, a new state takes an even share.
                let share = 1.0 / self.shares.fleet.members() as f32;
                let remembered_only =
                    consistency == Consistency::Strict && rule == OnStoreFailure::Local;
                let mut room = true;
                for l in limits {
                    room &= if remembered_only {
                        self.table.holds(input, l)
                    } else {
                        self.table
                            .install(input, l, now, || self.read_state(l, Vec::new(), share, now))
                            .is_ok()
                    };
                }
                match self.locked(policy, limits, input, now, Some(rule), false) {
                    Locked::Decided(d, _) if room => d,
                    // Nothing known to enforce, or a memory cap leaves nowhere to hold the hit
                    // until the store returns.
                    _ => self.without_memory(policy, limits, input, rule),
                }
            }
        };
        d.store_failure = Some(rule);
        d
    }

    /// The store failed a check it was to decide (a strict policy's, the last units of a
    /// limit): refused while the store answers this instance's other calls, else the policy's
    /// rule ([`Rule::on_failure`]; see the module comment).
    pub(super) fn on_decided_failure(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
        e: &StoreError,
    ) -> Decision {
        if policy.on_store_failure == OnStoreFailure::Deny || !self.failures.answering(now) {
            return self.on_failure(policy, limits, input, now, e);
        }
        if self.failures.begins(now) {
            tracing::warn!(error = %e, "store failing some checks it decides while it answers others: those checks refused until it answers them");
        }
        let rule = OnStoreFailure::Deny;
        self.metrics
            .store_failure_decision(rule.as_str(), policy.consistency.as_str());
        self.without_memory(policy, limits, input, rule)
    }

    /// A store call of a check succeeded: ends an episode of failure decisions, if one was on
    /// and has gone quiet ([`Episodes::ends`]).
    pub(super) fn store_answered(&self) {
        let now = self.clock.now_ms();
        self.failures.answered(now);
        if let Some(decided) = self.failures.ends(now) {
            tracing::warn!(decided, "store answering the check path again");
        }
    }

    /// The store failed and there is no local view to hold a hit in (a memory cap, or a strict
    /// counter never read): `allow` admits anyway (counting and logging the hit as
    /// unrecorded); `local` has nothing to enforce and denies, as `deny` does.
    pub(super) fn without_memory(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        rule: OnStoreFailure,
    ) -> Decision {
        let l = limits[0];
        let admit = rule == OnStoreFailure::Allow;
        if admit && input.cost > 0 {
            self.metrics.unrecorded_hits(input.cost);
            tracing::warn!(
                tenant = input.tenant.as_str(),
                cost = input.cost,
                "admitted a hit that is neither in the store nor in memory (store down, memory cap reached)"
            );
        }
        // In dry_run mode a denial answers allowed, flagged.
        let dry_run_denied = !admit && policy.mode == Mode::DryRun;
        let allowed = admit || dry_run_denied;
        Decision {
            allowed,
            dry_run_denied,
            binding: Some(Binding {
                limit_id: l.answer_id.clone(),
                limit: l.max,
                remaining: 0,
                reset_after_ms: 1_000,
            }),
            retry_after_ms: Some(if allowed { 0 } else { 1_000 }),
            store_failure: Some(rule),
        }
    }
}
