//! Store failures on the check path: the deadline of a store call, and the decision the policy's
//! `on_store_failure` rule makes when a call fails.
//!
//! A check never fails: `deny` denies; `local` and `allow` carry on with what this instance
//! knows, its hits pending until the store returns (`allow` also admits what the local view
//! would deny). What it knows of a `cached` counter is its state in memory (one it never saw
//! starts empty); of a `strict` counter, the totals its last strict check read, plus what it
//! admitted since (see `strict`): one it never read is unknown, and `local` denies it rather
//! than start it at zero. In a fleet every instance keeps to its share of the headroom it last
//! saw, whatever the consistency: the others cannot see its hits until the store returns. When
//! a memory cap leaves no room to hold a hit, `allow` admits it unrecorded (counted and
//! logged) and `local` denies. A call whose outcome is unknown (it may have counted the hit)
//! fails as `Uncertain`.
//!
//! One log line marks the start of an episode (the first check decided so) and one its end
//! (the first store call of a check that succeeds after it), with the checks it decided.

use std::future::Future;
use std::sync::atomic::Ordering;

use super::decision::{Binding, Decision};
use super::{CheckInput, Limiter, Locked};
use crate::domain::{Consistency, Limit, Mode, OnStoreFailure, Policy};
use crate::store::StoreError;

impl Limiter {
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
        if self.failing.fetch_add(1, Ordering::Relaxed) == 0 {
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
                let share = 1.0 / self.cfg.fleet.members() as f32;
                let remembered_only =
                    consistency == Consistency::Strict && rule == OnStoreFailure::Local;
                let mut room = true;
                for l in limits {
                    room &= if remembered_only {
                        self.holds(input, l)
                    } else {
                        self.install(input, l, Vec::new(), share, now).is_ok()
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

    /// A store call of a check succeeded: ends an episode of failure decisions, if one was on.
    pub(super) fn store_answered(&self) {
        if self.failing.load(Ordering::Relaxed) == 0 {
            return;
        }
        let decided = self.failing.swap(0, Ordering::Relaxed);
        if decided > 0 {
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
