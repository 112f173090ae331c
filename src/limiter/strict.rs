//! Strict consistency: the store counts a hit before the answer, and a denial takes it back.
//!
//! Used for `strict` policies and for any check a memory cap keeps out of memory. Every instance
//! sees every other's hits at once, at the cost of a store round trip per check. The hit is
//! added and the counts read back in one store call; the decision then judges the counts as
//! they were before this hit, so it agrees with what a cached decision would have said. A denied
//! hit is compensated by a decrement; if that fails, the count errs high (towards denial).
//! Nothing is installed in memory, but counters already held there learn the hit at once.

use super::decision::{decide, Decision};
use super::share::Fleet;
use super::state::{buckets_from, LimitState};
use super::{window, CheckInput, Limiter};
use crate::domain::{Limit, Policy};
use crate::store::{BucketTotal, CounterRange, Delta, StoreError};

impl Limiter {
    /// Decides a check through the store (see the module comment).
    pub(super) async fn check_strict(
        &self,
        policy: &Policy,
        limits: &[&Limit],
        input: CheckInput<'_>,
        now: i64,
    ) -> Decision {
        let deltas = Self::hit_deltas(limits, input, now);
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| Self::range_of(input.tenant, input.client, l, now))
            .collect();
        let totals = match self.count_in_store(&deltas, &ranges, input.cost).await {
            Ok(t) => t,
            Err(e) => return self.on_failure(policy, limits, input, now, &e),
        };
        let mut states = states_before_hit(limits, &totals, input.cost, now);
        let mut refs: Vec<&mut LimitState> = states.iter_mut().collect();
        // The store counted this hit against everyone's: no share to keep to.
        let fleet = Fleet {
            shares: false,
            ..self.fleet(policy)
        };
        let d = decide(policy, limits, &mut refs, now, input.cost, false, fleet);
        if d.allowed && !d.dry_run_denied {
            self.learn_hit(&deltas);
        } else {
            self.compensate(deltas).await;
        }
        d
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

    /// Adds the hit and reads the counts back, in one store call within the deadline. A hit
    /// whose outcome is unknown is counted as uncertain.
    async fn count_in_store(
        &self,
        deltas: &[Delta],
        ranges: &[CounterRange],
        cost: u64,
    ) -> Result<Vec<Vec<BucketTotal>>, StoreError> {
        let res = self
            .with_deadline(
                self.store.increment_and_read(deltas, ranges),
                !deltas.is_empty(),
            )
            .await;
        if let Err(StoreError::Uncertain(_)) = &res {
            self.metrics.uncertain_hits(cost);
        }
        res
    }

    /// Counters this instance also holds in memory learn an admitted hit now, not at the next
    /// read back.
    fn learn_hit(&self, deltas: &[Delta]) {
        for d in deltas {
            self.with_state(&d.key, |s| {
                window::bucket_at(&mut s.buckets, d.start).stored += d.delta.max(0);
            });
        }
    }

    /// Takes a denied hit back out of the store.
    async fn compensate(&self, deltas: Vec<Delta>) {
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
        if let Err(e) = self.store.increment(&undo).await {
            // The denied hit stays counted: the count errs high (towards denial).
            self.metrics.compensation_failed();
            tracing::warn!(error = %e, "strict mode: compensating a denied hit failed");
        }
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
