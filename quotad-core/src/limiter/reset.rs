//! Reset: a client's consumption brought to zero now, in the store (so every instance and a
//! restart see it) and in this instance's memory.
//!
//! Counters are increments, never sets, so a reset reads the store's buckets of each of the
//! client's limits that still count and adds minus each one's total: every bucket ends at
//! exactly 0, whatever instances wrote it, and the zero ages out of the window as the hits would
//! have. This instance's unwritten hits are dropped, and a write of its hits under way when the
//! reset begins is waited for, so that the read sees them. What no store read can see still
//! counts afterwards: hits other instances admitted in their last sync round
//! (`sync.interval_ms`) before the reset and had not written. Other instances read the new
//! totals back at their next round for a counter in use, within eight rounds for one they only
//! hold.
//!
//! A token bucket's level is not a sum of its buckets (see `tokens`): its reset is a grant of
//! its whole deficit.
//!
//! Grant: a credit of `amount` written as minus `amount` into the current bucket of one limit.
//! It counts as long as that bucket does (the window it is in, the current period), lets the
//! client go beyond `max` by as much, and for a token bucket refills it (never beyond full).
use super::key::newest_readable;
use super::state::buckets_from;
use super::window;
use super::Limiter;
use crate::domain::{ClientId, Limit, LimitId, Policy, Scope, TenantId, MAX_LIMIT};
use crate::store::{CounterKey, CounterRange, Delta, StoreError};

/// What a grant did to one limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Granted {
    /// The limit's count (tokens used, for a token bucket) before the grant, as this instance
    /// sees it: the store's totals and its own unwritten hits; negative when earlier credits
    /// exceed the hits.
    pub before: i64,
    /// The credit written: what was asked, or for a token bucket at most what it lacked.
    pub amount: u64,
}

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
        let all: Vec<&Limit> = policy
            .limits
            .iter()
            .filter(|l| l.scope == Scope::Client && limit.is_none_or(|id| *id == l.id))
            .collect();
        let mut before = Vec::new();
        // Token buckets: a grant of the whole deficit.
        for l in all.iter().filter(|l| l.kind.is_tokens()) {
            let level = self.level_of(tenant, client, l, now).await?;
            if level > 0 {
                self.credit(tenant, client, l, now, level as u64).await?;
            }
            before.push((l.id.clone(), level.max(0) as u64));
        }
        let limits: Vec<&Limit> = all.into_iter().filter(|l| !l.kind.is_tokens()).collect();
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
        let mark = self.writes.begun();
        for r in &ranges {
            self.with_state(&r.key, |s| {
                for b in s.buckets.iter_mut() {
                    b.stored = 0;
                    b.pending = 0;
                }
            });
        }
        // Hits a round took before the reset are on their way to the store: read once they
        // are there. (A round taken since holds only hits admitted after the reset.)
        self.writes_done_before(mark).await;
        let read = self.store.read(&ranges).await?;
        let mut deltas = Vec::new();
        for ((l, r), buckets) in limits.iter().zip(&ranges).zip(&read) {
            let mut counted = 0u64;
            for b in buckets.iter().filter(|b| b.total != 0) {
                counted = counted.saturating_add(b.total.max(0) as u64);
                deltas.push(Delta {
                    key: r.key.clone(),
                    start: b.start,
                    delta: b.total.saturating_neg(),
                });
            }
            before.push((l.id.clone(), counted));
        }
        self.store.increment(&deltas).await?;
        Ok(before)
    }

    /// Credits `amount` to one client-scoped limit of `client` now (see the module comment).
    /// On an error, nothing or, when uncertain, the credit may have landed.
    pub async fn grant(
        &self,
        tenant: &TenantId,
        client: &ClientId,
        l: &Limit,
        amount: u64,
    ) -> Result<Granted, StoreError> {
        let now = self.clock.now_ms();
        let before = self.level_of(tenant, client, l, now).await?;
        // A token bucket holds at most its burst: the credit tops it up, no further.
        let amount = if l.kind.is_tokens() {
            amount.min(before.max(0) as u64)
        } else {
            amount
        };
        // Credits outstanding stop at MAX_LIMIT, so that no count nears the ends of an i64
        // (where the store's counters, and the sums of them, would wrap).
        let room = (i128::from(before) + i128::from(MAX_LIMIT)).max(0);
        let amount = amount.min(room.min(i128::from(u64::MAX)) as u64);
        if amount > 0 {
            self.credit(tenant, client, l, now, amount).await?;
        }
        Ok(Granted { before, amount })
    }

    /// Writes minus `amount` into the current bucket of the client's counter of `l`, and
    /// learns it in memory at once (other instances at their next read back).
    async fn credit(
        &self,
        tenant: &TenantId,
        client: &ClientId,
        l: &Limit,
        now: i64,
        amount: u64,
    ) -> Result<(), StoreError> {
        let d = Delta {
            key: Self::counter_key(tenant, client, l),
            start: l.kind.grain().bucket_start(now),
            delta: -(amount.min(i64::MAX as u64) as i64),
        };
        self.store.increment(std::slice::from_ref(&d)).await?;
        self.with_state(&d.key, |s| {
            window::bucket_at(&mut s.buckets, d.start).stored += d.delta;
        });
        Ok(())
    }

    /// The count of `l` for `client` now: the store's totals, this instance's unwritten hits
    /// and, for a token bucket, its carry when in memory.
    async fn level_of(
        &self,
        tenant: &TenantId,
        client: &ClientId,
        l: &Limit,
        now: i64,
    ) -> Result<i64, StoreError> {
        let r = Self::range_of(tenant, client, l, now);
        self.between_writes(|| async {
            let totals = self
                .with_deadline(self.store.read(std::slice::from_ref(&r)), false)
                .await?;
            let mut buckets = buckets_from(totals.first().map_or(&[][..], |t| &t[..]));
            let carry = self.add_local(l, &r, &mut buckets);
            Ok(window::estimate(l.kind, &buckets, carry, now))
        })
        .await
    }
}
