//! Shares of the headroom among instances (`cached` consistency, `instances` > 1).
//!
//! With one store shard per instance, each instance may admit, between two syncs, at most its
//! share of the headroom it last read: `pending <= share x (max - stored)`. Shares follow demand,
//! from the per-shard counts every read returns at no extra write: `share = (mine + a) / (total +
//! a x N)` over the limit's window, with `a = 1 + total/100`, so the shares of all instances add
//! up to 1, an instance carrying all the traffic gets nearly all the headroom (98% of it with
//! N = 3), a newcomer or a key nobody has counted gets 1/N, and an instance that stops writing
//! fades out as its hits leave the window. If all instances read the store at the same moment
//! they could never overshoot together; reads at different moments leave a small overshoot,
//! measured by the simulation in `tests/simulation/` and reported in docs/accuracy.md.

use super::state::LimitState;
use super::{window, Limiter};
use crate::domain::{Consistency, Grain, Limit, Policy};
use crate::store::{BucketTotal, CounterRange};

/// An instance's demand-weighted share of a counter's headroom, from the store's per-shard
/// counts over the window (see the module comment).
///
/// Only settled buckets count: those that closed before `settled` (two sync intervals ago),
/// which every instance has written by now. A fresher bucket holds this instance's own hits
/// in full but the others' only up to their last sync, and would make every instance think
/// its share larger than it is (the shares would add up to more than 1).
pub fn share_of(
    totals: &[BucketTotal],
    grain: Grain,
    from: i64,
    settled: i64,
    instances: u32,
) -> f32 {
    if instances <= 1 {
        return 1.0;
    }
    let sum = |only_settled: bool| {
        let (mut mine, mut total) = (0f64, 0f64);
        for t in totals
            .iter()
            .filter(|t| t.start >= from && (!only_settled || grain.bucket_end(t.start) <= settled))
        {
            mine += t.mine.max(0) as f64;
            total += t.total.max(0) as f64;
        }
        (mine, total)
    };
    let (mut mine, mut total) = sum(true);
    if total == 0.0 {
        // A fresh key: nothing has settled yet. What the fleet wrote so far is the only sign of
        // who carries it; waiting for a bucket to settle would hold a busy instance at 1/N
        // for the first buckets, pushing its admissions late into them.
        (mine, total) = sum(false);
    }
    // This instance's part cannot exceed the whole. It can in the store after a reset, whose
    // minus lands in the resetting instance's shard alone while others' shards keep their
    // hits: without this, an instance could take more than all of the headroom.
    let mine = mine.min(total);
    let a = 1.0 + total / 100.0;
    ((mine + a) / (total + a * instances as f64)) as f32
}

/// How a decision sees the rest of the fleet.
#[derive(Clone, Copy)]
pub(super) struct Fleet {
    /// Enforce shares of the headroom (more than one instance, cached consistency).
    pub(super) shares: bool,
    pub(super) sync_interval_ms: i64,
}

/// `pending + cost <= share x (max - stored)`: this instance's unwritten hits stay within its
/// share of the headroom the store last showed.
///
/// Hits written since the last read back (`settling`) still count as this instance's own: the
/// headroom is the one the store showed at that read, before they were added.
///
/// A token bucket's level is not a sum: its pending part is every unwritten hit, and the rest
/// of the level is what the store showed.
pub(super) fn within_share(l: &Limit, s: &LimitState, now: i64, cost: u64) -> bool {
    let (stored, pending) = if l.kind.is_tokens() {
        let pending: i64 = s.buckets.iter().map(|b| b.pending as i64).sum();
        let level = window::estimate(l.kind, &s.buckets, s.carry(), now);
        ((level - pending).max(0), pending)
    } else {
        (
            window::estimate_by(l.kind, &s.buckets, s.carry(), now, |b| b.stored),
            window::estimate_by(l.kind, &s.buckets, s.carry(), now, |b| b.pending as i64),
        )
    };
    let headroom = (l.max as i128 - (stored as i128 - s.settling as i128)).max(0);
    let allowance = (s.share as f64 * headroom as f64).floor() as i128;
    pending as i128 + s.settling as i128 + cost as i128 <= allowance
}

impl Limiter {
    /// This instance's share of a counter read back over `r`.
    pub(super) fn share(&self, totals: &[BucketTotal], r: &CounterRange, now: i64) -> f32 {
        let settled = now - 2 * self.cfg.sync_interval_ms;
        share_of(
            totals,
            r.key.grain,
            r.from,
            settled,
            self.cfg.fleet.members(),
        )
    }

    pub(super) fn fleet(&self, policy: &Policy) -> Fleet {
        Fleet {
            shares: self.cfg.fleet.members() > 1 && policy.consistency == Consistency::Cached,
            sync_interval_ms: self.cfg.sync_interval_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_a_reset_no_instance_takes_more_than_an_equal_share() {
        // This instance's shard holds +3, another's -3 (a reset written there): the total is 0.
        let t = [BucketTotal {
            start: 0,
            total: 0,
            mine: 3,
        }];
        let s = share_of(&t, Grain::Fixed(1_000), 0, 10_000, 2);
        assert!((s - 0.5).abs() < 1e-6, "{s}");
        // In the ordinary case the busy instance still gets most of the headroom.
        let busy = [BucketTotal {
            start: 0,
            total: 100,
            mine: 100,
        }];
        assert!(share_of(&busy, Grain::Fixed(1_000), 0, 10_000, 3) > 0.9);
    }
}
