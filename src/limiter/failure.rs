//! Store failures on the check path: the deadline of a store call, and the decision the policy's
//! `on_store_failure` rule makes when a call fails.
//!
//! A check never fails: `deny` denies; `local` and `allow` carry on with what this instance
//! knows (counters it never saw start empty, admitted hits stay pending until the store
//! returns; `allow` also admits what the local view would deny). When a memory cap leaves no
//! room to hold a hit, `allow` admits it unrecorded (counted and logged) and `local` denies.
//! A call whose outcome is unknown (it may have counted the hit) fails as `Uncertain`.

use std::future::Future;

use super::decision::{Binding, Decision};
use super::{CheckInput, Limiter, Locked};
use crate::domain::{Limit, Mode, OnStoreFailure, Policy};
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
        tracing::warn!(error = %e, rule = ?policy.on_store_failure, "store failed on the check path");
        let rule = policy.on_store_failure;
        self.metrics.store_failure_decision(rule.as_str());
        let mut d = match rule {
            OnStoreFailure::Deny => self.without_memory(policy, limits, input, rule),
            OnStoreFailure::Local | OnStoreFailure::Allow => {
                // Carry on with what this instance knows: install empty states for counters it
                // has never seen (the next sync reads their real totals back), and decide on
                // them. Admitted hits are pending and reach the store when it returns.
                // Not knowing the others' demand, take an even share.
                let share = 1.0 / self.cfg.fleet.members() as f32;
                let mut room = true;
                for l in limits {
                    room &= self.install(input, l, Vec::new(), share, now).is_ok();
                }
                let force = rule == OnStoreFailure::Allow;
                match self.locked(policy, limits, input, now, force, false) {
                    Locked::Decided(d, _) if room => d,
                    // A memory cap leaves nowhere to hold the hit until the store returns.
                    _ => self.without_memory(policy, limits, input, rule),
                }
            }
        };
        d.store_failure = Some(rule);
        d
    }

    /// The store failed and a memory cap leaves no room to hold a hit until it returns: `allow`
    /// admits anyway (counting and logging the hit as unrecorded); `local` has no local view
    /// to enforce and denies, as `deny` does.
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
