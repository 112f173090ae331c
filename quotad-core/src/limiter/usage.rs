//! `/v1/usage` and the reads that sum the store with this instance's unwritten hits.
//!
//! A read sums the store's totals and this instance's pending hits. It is taken between two
//! sync writes (see `writes`): a hit a round has taken but not yet written is in neither place,
//! so a read that overlaps a write waits for it and reads again.

use std::future::Future;
use std::time::Duration;

use super::state::buckets_from;
use super::tokens::Carry;
use super::window::{self, Bucket};
use super::writes::Writes;
use super::Limiter;
use crate::domain::{ClientId, Limit, LimitId, Policy, Scope, TenantId};
use crate::store::{CounterRange, StoreError};

/// How long a read waits for sync writes under way before it sums what it has: a write takes
/// milliseconds, and one the store does not answer ends at the sync task's own deadline.
const WAIT_FOR_WRITES: Duration = Duration::from_secs(2);

/// One limit's usage, for `/v1/usage`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    pub limit_id: LimitId,
    pub scope: Scope,
    /// The limit's resource pattern, as its policy writes it; None when it has none.
    pub resource: Option<String>,
    pub count: u64,
    pub limit: u64,
    pub remaining: u64,
    pub reset_after_ms: i64,
}

impl Limiter {
    /// Adds this instance's unwritten hits of `l` to `buckets`, read from the store over `r`;
    /// returns the carry to read a token bucket with: this instance's when it holds the counter,
    /// otherwise a full bucket at the start of the read.
    pub(super) fn add_local(
        &self,
        l: &Limit,
        r: &CounterRange,
        buckets: &mut Vec<Bucket>,
    ) -> Carry {
        let mut carry = Carry {
            at: r.from,
            deficit: 0,
        };
        self.with_state(&r.key, |s| {
            for b in s.buckets.iter().filter(|b| b.pending > 0) {
                window::bucket_at(buckets, b.start).pending += b.pending;
            }
            if s.kind == l.kind {
                carry = s.carry();
            }
        });
        carry
    }

    /// `/v1/usage`: the store's totals plus this instance's unwritten hits. Consumes nothing.
    pub async fn usage(
        &self,
        policy: &Policy,
        tenant: &TenantId,
        client: &ClientId,
        resource: Option<&str>,
    ) -> Result<Vec<Usage>, StoreError> {
        let pick = |l: &Limit| l.applies_to(resource);
        self.between_writes(|| self.usage_now(policy, tenant, client, &pick))
            .await
    }

    /// [`Limiter::usage`] of every limit of the policy, whatever resource it names: what a
    /// console shows of a client.
    pub async fn usage_of_every_limit(
        &self,
        policy: &Policy,
        tenant: &TenantId,
        client: &ClientId,
    ) -> Result<Vec<Usage>, StoreError> {
        let pick = |_: &Limit| true;
        self.between_writes(|| self.usage_now(policy, tenant, client, &pick))
            .await
    }

    /// Runs `read` (of the store, then of this instance's unwritten hits) between two sync
    /// writes: after any write under way, and again if a snapshot was taken meanwhile.
    pub(super) async fn between_writes<T, F, Fut>(&self, mut read: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        loop {
            // None when it gave up waiting: the read is then as good as it gets.
            let mark = self.wait_for_writes(Writes::quiet).await;
            let out = read().await?;
            if mark.is_none_or(|m| self.writes.none_since(m)) {
                return Ok(out);
            }
        }
    }

    /// Waits until every sync write of a snapshot taken before `mark` is done, for at most
    /// [`WAIT_FOR_WRITES`].
    pub(super) async fn writes_done_before(&self, mark: u64) {
        self.wait_for_writes(|w| w.done_before(mark).then_some(()))
            .await;
    }

    /// Polls the sync writes every millisecond until `ready` gives something, for at most
    /// [`WAIT_FOR_WRITES`] (then None).
    async fn wait_for_writes<T>(&self, ready: impl Fn(&Writes) -> Option<T>) -> Option<T> {
        let give_up = tokio::time::Instant::now() + WAIT_FOR_WRITES;
        loop {
            if let Some(v) = ready(&self.writes) {
                return Some(v);
            }
            if tokio::time::Instant::now() >= give_up {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The usage of the limits `pick` takes, read once, whatever the sync task does meanwhile.
    async fn usage_now(
        &self,
        policy: &Policy,
        tenant: &TenantId,
        client: &ClientId,
        pick: &dyn Fn(&Limit) -> bool,
    ) -> Result<Vec<Usage>, StoreError> {
        let now = self.clock.now_ms();
        let limits: Vec<&Limit> = policy.limits.iter().filter(|l| pick(l)).collect();
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| Self::range_of(tenant, client, l, now))
            .collect();
        let totals = self.with_deadline(self.store.read(&ranges), false).await?;
        let mut out = Vec::with_capacity(limits.len());
        for ((l, r), t) in limits.iter().zip(&ranges).zip(totals) {
            let mut buckets = buckets_from(&t);
            let carry = self.add_local(l, r, &mut buckets);
            let count = window::estimate(l.kind, &buckets, carry, now);
            out.push(Usage {
                limit_id: l.id.clone(),
                scope: l.scope,
                resource: l.resource.as_ref().map(|r| r.render()),
                count: count.max(0) as u64,
                limit: l.max,
                remaining: (l.max as i128 - count as i128).clamp(0, u64::MAX as i128) as u64,
                reset_after_ms: window::reset_after(l.kind, &buckets, carry, now),
            });
        }
        Ok(out)
    }
}
