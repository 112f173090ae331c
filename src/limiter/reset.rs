//! Reset: a client's consumption brought to zero now, in the store (so every instance and a
//! restart see it) and in this instance's memory.
//!
//! Counters are increments, never sets, so a reset reads the store's buckets of each of the
//! client's limits that still count and adds minus each one's total: every bucket ends at
//! exactly 0, whatever instances wrote it, and the zero ages out of the window as the hits would
//! have. This instance's unwritten hits are dropped. What no store read can see still counts
//! afterwards: hits other instances admitted in their last sync round (`sync.interval_ms`)
//! before the reset and had not written, and this instance's hits of a write in flight at that
//! moment. Other instances read the new totals back at their next round for a counter in use,
//! within eight rounds for one they only hold.

use super::key::newest_readable;
use super::window;
use super::Limiter;
use crate::domain::{ClientId, Limit, LimitId, Policy, Scope, TenantId};
use crate::store::{CounterKey, CounterRange, Delta, StoreError};

impl Limiter {
    /// Resets the client-scoped limits of `policy` for `client` (only `limit` when given).
    /// Returns each limit with the count it had in the store. On an error, nothing or, when
    /// uncertain, some of the reset may have landed.
    pub async fn reset(
        &self,
        policy: &Policy,
        tenant: &TenantId,
        client: &ClientId,
        limit: Option<&LimitId>,
    ) -> Result<Vec<(LimitId, u64)>, StoreError> {
        let now = self.clock.now_ms();
        let limits: Vec<&Limit> = policy
            .limits
            .iter()
            .filter(|l| l.scope == Scope::Client && limit.is_none_or(|id| *id == l.id))
            .collect();
        let ranges: Vec<CounterRange> = limits
            .iter()
            .map(|l| CounterRange {
                key: CounterKey {
                    tenant: tenant.as_arc().clone(),
                    subject: client.as_arc().clone(),
                    limit: l.id.as_arc().clone(),
                    grain: l.kind.grain(),
                },
                from: window::oldest_needed(l.kind, now),
                to: newest_readable(l.kind, now),
            })
            .collect();
        // This instance's view first: what it read from the store, and what it admitted and has
        // not written yet, are gone. (Its unwritten hits are dropped rather than written and
        // then cancelled.)
        for r in &ranges {
            self.with_state(&r.key, |s| {
                for b in s.buckets.iter_mut() {
                    b.stored = 0;
                    b.pending = 0;
                }
            });
        }
        let read = self.store.read(&ranges).await?;
        let mut deltas = Vec::new();
        let mut before = Vec::new();
        for ((l, r), buckets) in limits.iter().zip(&ranges).zip(&read) {
            let mut counted = 0u64;
            for b in buckets.iter().filter(|b| b.total > 0) {
                counted += b.total as u64;
                deltas.push(Delta {
                    key: r.key.clone(),
                    start: b.start,
                    delta: -b.total,
                });
            }
            before.push((l.id.clone(), counted));
        }
        self.store.increment(&deltas).await?;
        Ok(before)
    }
}
