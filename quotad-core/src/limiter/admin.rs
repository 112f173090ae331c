//! What an admin reads and changes of the counters: `/v1/usage`, resets and grants; and the
//! charges a hold (reservation) makes and the changes its end makes.
//!
//! Usage. A read sums the store's totals and this instance's pending hits. It is taken between
//! two sync writes (see `writes`): a hit a round has taken but not yet written is in neither
//! place, so a read that overlaps a write waits for it and reads again.
//!
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

use std::sync::Arc;

use super::failure::Rule;
use super::key::{counter_key, newest_readable, range_of, subject_of};
use super::miss::hit_deltas;
use super::state::buckets_from;
use super::tokens::Carry;
use super::window::{self, Bucket};
use super::{applicable, CheckInput, Decision, Limiter};
use crate::domain::{ClientId, InFlight, Limit, LimitId, Policy, Scope, TenantId, MAX_LIMIT};
use crate::store::hold::Charge;
use crate::store::{CounterKey, CounterRange, Delta, StoreError};

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
    /// An in-flight limit: `count` is what is held now.
    pub in_flight: Option<InFlight>,
}

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
        self.table.with_state(&r.key, |s| {
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
        self.writes
            .between(|| self.usage_now(policy, tenant, client, &pick))
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
        self.writes
            .between(|| self.usage_now(policy, tenant, client, &pick))
            .await
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
            .map(|l| range_of(tenant, client, l, now))
            .collect();
        let totals = Rule(self)
            .with_deadline(self.store.read(&ranges), false)
            .await?;
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
                reset_after_ms: if l.in_flight.is_some() {
                    0
                } else {
                    window::reset_after(l.kind, &buckets, carry, now)
                },
                in_flight: l.in_flight,
            });
        }
        Ok(out)
    }

    /// Resets the client-scoped limits of `policy` for `client` (only `limit` when given);
    /// in-flight limits are left alone: they count reservations still held.
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
            .filter(|l| l.scope == Scope::Client && l.in_flight.is_none())
            .filter(|l| limit.is_none_or(|id| *id == l.id))
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
            self.table.with_state(&r.key, |s| {
                for b in s.buckets.iter_mut() {
                    b.stored = 0;
                    b.pending = 0;
                }
            });
        }
        // Hits a round took before the reset are on their way to the store: read once they
        // are there. (A round taken since holds only hits admitted after the reset.)
        self.writes.wait_done_before(mark).await;
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
            key: counter_key(tenant, client, l),
            start: l.kind.grain().bucket_start(now),
            delta: -(amount.min(i64::MAX as u64) as i64),
        };
        self.store.increment(std::slice::from_ref(&d)).await?;
        self.table.with_state(&d.key, |s| {
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
        let r = range_of(tenant, client, l, now);
        self.writes
            .between(|| async {
                let totals = Rule(self)
                    .with_deadline(self.store.read(std::slice::from_ref(&r)), false)
                    .await?;
                let mut buckets = buckets_from(totals.first().map_or(&[][..], |t| &t[..]));
                let carry = self.add_local(l, &r, &mut buckets);
                Ok(window::estimate(l.kind, &buckets, carry, now))
            })
            .await
    }

    /// What a hold taken by `input` (a reserving check admitted at `now`) charged: each
    /// limit the check met, the bucket `now` fell in, and what it took there.
    pub fn hold_charges(&self, policy: &Policy, input: CheckInput<'_>, now: i64) -> Vec<Charge> {
        applicable(policy, &[input.resource], true)
            .iter()
            .map(|l| Charge {
                limit: l.id.to_string(),
                grain: l.kind.grain().code(),
                subject: subject_of(l, input.client.as_str()).to_owned(),
                start: l.kind.grain().bucket_start(now),
                amount: l.cost_of(input.cost),
                in_flight: l.in_flight.is_some(),
            })
            .collect()
    }

    /// Applies counter changes that are not checks (a hold's end): this instance's states
    /// learn them at once, the others at their next read back. A write the store refuses with
    /// nothing written is tried again every second, for up to ten minutes, until it lands; one
    /// whose outcome is unknown is not tried again (a count never doubles), and is logged.
    pub async fn adjust(&self, deltas: Vec<Delta>) {
        if deltas.is_empty() {
            return;
        }
        for d in &deltas {
            self.table.with_state(&d.key, |s| {
                window::bucket_at(&mut s.buckets, d.start).stored += d.delta;
            });
            self.table.read_back_soon(&d.key);
        }
        let store = self.store.clone();
        let first = store.increment(&deltas).await;
        let Err(e) = first else {
            return;
        };
        if !matches!(e, StoreError::Unavailable(_)) {
            tracing::warn!(error = %e, changes = deltas.len(), "a hold's end may not have reached the store: its counters stay as they were");
            return;
        }
        tracing::warn!(error = %e, "the store refused a hold's end: trying again every second");
        tokio::spawn(async move {
            for _ in 0..600 {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                match store.increment(&deltas).await {
                    Ok(()) => return,
                    Err(StoreError::Unavailable(_)) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "a hold's end may not have reached the store");
                        return;
                    }
                }
            }
            tracing::error!(
                changes = deltas.len(),
                "gave up writing a hold's end after ten minutes"
            );
        });
    }

    /// Counts in the usage history what a hold's end changed of its cost: `delta` (the real
    /// cost less the estimate of a settle, minus the estimate of a release) in the hour the
    /// hold was taken (`taken_ms`), where its check counted the estimate.
    pub fn history_cost(&self, tenant: &str, client: &str, taken_ms: i64, delta: i64) {
        if self.cfg.max_history_rows > 0 && delta != 0 {
            let (t, c): (Arc<str>, Arc<str>) = (tenant.into(), client.into());
            self.history.adjust_cost(&t, &c, taken_ms, delta);
        }
    }

    /// Charges `input.cost` to the limits that apply to any of `resources` (in-flight limits
    /// aside), whatever they have left: usage reported once the work is done (Envoy's rate
    /// limit service called at a stream's end). The usage history counts it as cost without a
    /// check. Returns what a check of cost 0 gets after it.
    pub async fn charge_any(
        &self,
        policy: &Policy,
        input: CheckInput<'_>,
        resources: &[Option<&str>],
    ) -> Decision {
        let now = self.clock.now_ms();
        let limits = applicable(policy, resources, false);
        self.adjust(hit_deltas(&limits, input, now)).await;
        if self.cfg.max_history_rows > 0 && input.cost > 0 {
            let (t, c) = (input.tenant.as_arc(), input.client.as_arc());
            self.history.add_admitted(t, c, now, 0, input.cost);
        }
        let look = CheckInput { cost: 0, ..input };
        self.decide(policy, limits, look, false).await.0
    }
}
