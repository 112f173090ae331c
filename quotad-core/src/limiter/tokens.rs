//! Token buckets over counter buckets: the level of a bucket of tokens, derived from the same
//! durable per-bucket hit counts as every other limit, so a fleet shares one bucket.
//!
//! A token bucket holds `burst` tokens (the limit's `max`); `rate` tokens come back every
//! `per`, ρ = rate/per per millisecond, up to `burst`; a check of cost `c` spends `c`. What
//! matters is the deficit, the tokens missing from a full bucket. From the hits alone it is
//! (Lindley's recursion, unrolled)
//!
//! ```text
//! D(t) = max(0, max over s <= t of hits(s, t] - ρ (t - s))
//! ```
//!
//! and a check is admitted when `D + c <= burst`. Hits are counted per bucket of width `g`
//! (1/50 of the time an empty bucket takes to fill, see [`crate::domain::token_grain`]), so `s`
//! runs over bucket starts: a bucket's hits are taken as arriving at its start.
//!
//! The maximum runs over *all* the past: a client that keeps its bucket empty keeps the maximum
//! at its first hit, however long ago. So the buckets that have settled (older than a few sync
//! intervals, when every instance's hits in them have been read back) are folded into a
//! [`Carry`]: the deficit at instant `at`. A bucket is folded once it ended two sync intervals
//! before this instance's last read of the store (every instance has written it, and this one
//! has read what they wrote), and in any case once it is 30 buckets old (within what the store
//! keeps, and what a first read reaches back to). Then
//!
//! ```text
//! D(t) = max(0, C + hits[at, t] - ρ (t - at), max over buckets b >= at of hits[b, t] - ρ (t - b.start))
//! ```
//!
//! and folding bucket `b` sets `C = max(0, max(0, C - ρ (b.start - at)) + hits(b) - ρ g)`,
//! which leaves D unchanged. The carry lives in memory with the counter; a counter read for the first time
//! (first use on this instance, after idling out of memory, after a restart) starts from a full
//! bucket `MAX_BUCKETS_READ - 1` buckets back and folds what the store holds since.
//!
//! # Error bound (tested against an exact token bucket below)
//! Every term is one of the exact maximum's (hits at or after `b.start`), so D is never above
//! the exact deficit: a check an exact bucket admits, given the same past, is admitted. Between
//! two bucket starts the exact term can exceed the one at the earlier start by at most the
//! refill of one bucket, so D is below the exact deficit by less than `ρ g` tokens (1/50 of the
//! burst or less once the bucket takes 5 s to fill): over any span `T`, at most
//! `burst + ρ T + ρ g` is admitted. A counter read for the first time may also miss a deficit
//! that began before its first read reaches back (about 2/3 of the fill time): then up to one
//! burst more, once, on that instance.
//!
//! Credits (grants) are negative counts in the current bucket: they lower every term that
//! includes it, so D falls by the credit, down to 0. A bucket never holds more than `burst`
//! tokens, so a credit beyond the deficit is not kept.

use super::bucket::Bucket;
use crate::domain::{LimitKind, MAX_BUCKETS_READ};

/// The deficit of a token bucket at instant `at`, in token-milliseconds-per-`per` (tokens x
/// `per_ms`, so that refill is whole: `rate` units per ms), with every bucket before `at`
/// folded in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Carry {
    pub at: i64,
    /// Up to `burst x per_ms`, about 2^84 at most: wider than an `i64`.
    pub deficit: i128,
}

fn params(kind: LimitKind) -> (i128, i128, i64) {
    match kind {
        LimitKind::Tokens {
            rate,
            per_ms,
            grain_ms,
        } => (rate as i128, per_ms as i128, grain_ms.into()),
        // Not a token bucket: no refill, so the level is the plain sum (never used so).
        _ => (0, 1, kind.grain().bucket_end(0)),
    }
}

/// The scaled deficit (tokens x `per_ms`) at `now`, never below 0, counting each bucket by
/// `count`.
fn deficit(
    kind: LimitKind,
    buckets: &[Bucket],
    carry: Carry,
    now: i64,
    count: impl Fn(&Bucket) -> i64,
) -> i128 {
    let (rate, per, _) = params(kind);
    // Newest first: `suffix` is hits[b.start, now] as the walk goes back.
    let mut suffix: i128 = 0;
    let mut best: i128 = 0;
    for b in buckets.iter().rev().filter(|b| b.start >= carry.at) {
        suffix += count(b) as i128 * per;
        let since = (now - b.start).max(0) as i128;
        best = best.max(suffix - rate * since);
    }
    let since = (now - carry.at).max(0) as i128;
    best.max(carry.deficit + suffix - rate * since)
}

/// The tokens used (the deficit, rounded up): what the limiter compares with `max` like a
/// window's count, since `ceil(D) + cost <= burst` exactly when `D + cost <= burst`.
pub fn level(
    kind: LimitKind,
    buckets: &[Bucket],
    carry: Carry,
    now: i64,
    count: impl Fn(&Bucket) -> i64,
) -> i64 {
    let (_, per, _) = params(kind);
    let d = deficit(kind, buckets, carry, now, count);
    i64::try_from((d + per - 1) / per).unwrap_or(i64::MAX)
}

/// Milliseconds until the level is at most `target` tokens with no new hits: every term falls
/// by `rate` units a millisecond, so the deficit does too.
pub fn time_until_at_most(
    kind: LimitKind,
    buckets: &[Bucket],
    carry: Carry,
    now: i64,
    target: i64,
) -> i64 {
    let (rate, per, _) = params(kind);
    let over = deficit(kind, buckets, carry, now, Bucket::count) - target as i128 * per;
    if over <= 0 || rate == 0 {
        return 0;
    }
    i64::try_from((over + rate - 1) / rate).unwrap_or(i64::MAX)
}

/// The carry of a limit whose refill changed from `old` to `new` (same grain, so the buckets
/// still count): the deficit in tokens is kept, rescaled to the new `per`. A limit that was not
/// a token bucket starts from a full bucket, as on a first read at `now`.
pub fn rekind(old: LimitKind, new: LimitKind, carry: Carry, now: i64) -> Carry {
    match (old, new) {
        (LimitKind::Tokens { per_ms: a, .. }, LimitKind::Tokens { per_ms: b, .. }) => Carry {
            at: carry.at,
            deficit: carry.deficit * b as i128 / a.max(1) as i128,
        },
        _ => Carry {
            at: first_read_from(new, now),
            deficit: 0,
        },
    }
}

/// Where a first read of a token bucket's counter starts: `MAX_BUCKETS_READ - 1` buckets
/// before the current one, well within what the store keeps ([`crate::domain::Grain::retention_ms`]).
pub fn first_read_from(kind: LimitKind, now: i64) -> i64 {
    let g = kind.grain();
    g.bucket_start(now) - (MAX_BUCKETS_READ - 1) * params(kind).2
}

/// Folds the buckets that ended before `settled` into the carry, and moves the carry up to the
/// start of the bucket holding `settled`. The level is the same before and after (see the
/// module comment); buckets before the carry no longer count (they stay only while they hold
/// hits to write).
pub fn fold(kind: LimitKind, buckets: &[Bucket], carry: &mut Carry, settled: i64) {
    let (rate, per, g) = params(kind);
    let horizon = kind.grain().bucket_start(settled);
    if horizon <= carry.at {
        return;
    }
    let mut c = carry.deficit;
    let mut at = carry.at;
    for b in buckets
        .iter()
        .filter(|b| b.start >= carry.at && b.start + g <= horizon)
    {
        // Refill up to the bucket's start, then its hits and its own refill.
        c = (c - rate * (b.start - at) as i128).max(0);
        c = (c + b.count() as i128 * per - rate * g as i128).max(0);
        at = b.start + g;
    }
    c = (c - rate * (horizon - at) as i128).max(0);
    carry.at = horizon;
    carry.deficit = c;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{fill_ms, token_grain};
    use crate::limiter::bucket::add_pending;
    use proptest::prelude::*;

    fn kind(burst: u64, rate: u64, per_ms: i64) -> LimitKind {
        LimitKind::Tokens {
            rate,
            per_ms: per_ms as u32,
            grain_ms: token_grain(fill_ms(burst, rate, per_ms).unwrap()) as u32,
        }
    }

    /// A token bucket limit as the limiter runs it: buckets, a carry folded as time goes by.
    struct Counted {
        kind: LimitKind,
        burst: u64,
        buckets: Vec<Bucket>,
        carry: Carry,
    }

    impl Counted {
        fn new(kind: LimitKind, burst: u64, now: i64) -> Self {
            Counted {
                kind,
                burst,
                buckets: Vec::new(),
                carry: Carry {
                    at: first_read_from(kind, now),
                    deficit: 0,
                },
            }
        }

        fn check(&mut self, now: i64, cost: u64, settle_ms: i64) -> bool {
            fold(self.kind, &self.buckets, &mut self.carry, now - settle_ms);
            let used = level(self.kind, &self.buckets, self.carry, now, Bucket::count);
            if used + cost as i64 <= self.burst as i64 {
                add_pending(self.kind, &mut self.buckets, now, cost);
                true
            } else {
                false
            }
        }
    }

    /// An exact token bucket over a log of admitted hits: the deficit at `t` in tokens x per.
    fn exact_deficit(log: &[(i64, u64)], rate: u64, per: i64, t: i64) -> i128 {
        let mut d: i128 = 0;
        let mut last = i64::MIN;
        for &(at, c) in log.iter().filter(|(at, _)| *at <= t) {
            if last != i64::MIN {
                d = (d - rate as i128 * (at - last) as i128).max(0);
            }
            d += c as i128 * per as i128;
            last = at;
        }
        if last != i64::MIN {
            d = (d - rate as i128 * (t - last) as i128).max(0);
        }
        d
    }

    #[test]
    fn a_burst_of_50_then_10_per_second_is_admitted_exactly() {
        // burst 50, 10 per second: the bucket fills in 5 s, buckets of 100 ms refill 1 token.
        let k = kind(50, 10, 1_000);
        for offset in [0, 1, 37, 50, 99] {
            let t0 = 1_700_000_000_000 + offset;
            let mut c = Counted::new(k, 50, t0);
            let burst: Vec<bool> = (0..60).map(|_| c.check(t0, 1, 1_000)).collect();
            assert_eq!(burst.iter().filter(|a| **a).count(), 50, "offset {offset}");
            assert!(burst[..50].iter().all(|a| *a) && burst[50..].iter().all(|a| !*a));
            // Then one every 100 ms for a minute: every one admitted...
            for i in 1..=600 {
                assert!(c.check(t0 + i * 100, 1, 1_000), "offset {offset}, {i}");
            }
            // ...and in between, where an exact bucket holds half a token, at most the refill of
            // one counter bucket (1 token) more.
            let extra = (0..5).filter(|_| c.check(t0 + 60_050, 1, 1_000)).count();
            assert!(extra <= 1, "offset {offset}: {extra}");
            // After a pause of 5 s the bucket is full again.
            let t = t0 + 65_100;
            let n = (0..60).filter(|_| c.check(t, 1, 1_000)).count();
            assert_eq!(n, 50, "offset {offset}");
        }
    }

    #[test]
    fn time_until_at_most_is_when_the_refill_gets_there() {
        let k = kind(50, 10, 1_000);
        let now = 1_700_000_000_000;
        let mut c = Counted::new(k, 50, now);
        for _ in 0..50 {
            assert!(c.check(now, 1, 1_000));
        }
        // 5 tokens come back in 500 ms; the bucket is full after 5 s.
        assert_eq!(time_until_at_most(k, &c.buckets, c.carry, now, 45), 500);
        assert_eq!(time_until_at_most(k, &c.buckets, c.carry, now, 0), 5_000);
        assert_eq!(time_until_at_most(k, &c.buckets, c.carry, now, 50), 0);
    }

    #[test]
    fn a_credit_refills_the_bucket() {
        let k = kind(10, 1, 1_000);
        let now = 1_700_000_000_000;
        let mut c = Counted::new(k, 10, now);
        for _ in 0..10 {
            assert!(c.check(now, 1, 1_000));
        }
        assert!(!c.check(now + 10, 1, 1_000));
        // A credit of 4 tokens (minus 4 in the current bucket): 4 more now, and a second later
        // the one refilled.
        let t = now + 10;
        let start = k.grain().bucket_start(t);
        crate::limiter::bucket::bucket_at(&mut c.buckets, start).stored -= 4;
        assert_eq!((0..10).filter(|_| c.check(t, 1, 1_000)).count(), 4);
        assert_eq!((0..10).filter(|_| c.check(t + 1_000, 1, 1_000)).count(), 1);
        // A credit of the whole level fills it: 10 at once, as long after as before.
        let t = t + 1_000;
        let used = level(k, &c.buckets, c.carry, t, Bucket::count);
        assert_eq!(used, 10);
        crate::limiter::bucket::bucket_at(&mut c.buckets, k.grain().bucket_start(t)).stored -= used;
        assert_eq!((0..30).filter(|_| c.check(t, 1, 1_000)).count(), 10);
        assert_eq!((0..30).filter(|_| c.check(t + 5_000, 1, 1_000)).count(), 5);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// The counted bucket against an exact one over the same admitted hits: never denies
        /// what the exact bucket admits, and admits at most one bucket's refill beyond it, for
        /// random traffic, costs, sizes and fold horizons.
        #[test]
        fn counted_bucket_stays_within_one_buckets_refill_of_an_exact_one(
            burst in 1u64..80,
            rate in 1u64..40,
            per_ms in prop_oneof![Just(1_000i64), Just(60_000), Just(250)],
            gaps in proptest::collection::vec(0i64..400, 50..500),
            costs in proptest::collection::vec(0u64..4, 500),
            settle_ms in prop_oneof![Just(0i64), Just(1_000), Just(3_000)],
        ) {
            let Some(fill) = fill_ms(burst, rate, per_ms).filter(|f| *f >= 1_000) else {
                return Ok(());
            };
            let k = kind(burst, rate, per_ms);
            let g = k.grain().bucket_end(0);
            // Scale the gaps to the bucket's fill time, so traffic both drains and idles.
            let scale = (fill / 1_000).max(1);
            let mut now = 1_700_000_000_000i64;
            let mut c = Counted::new(k, burst, now);
            let mut log: Vec<(i64, u64)> = Vec::new();
            let per = per_ms as i128;
            // Refill of one bucket, in tokens x per.
            let slack = rate as i128 * g as i128;
            for (i, gap) in gaps.iter().enumerate() {
                now += gap * scale;
                let cost = costs[i];
                let exact = exact_deficit(&log, rate, per_ms, now);
                if c.check(now, cost, settle_ms) {
                    prop_assert!(
                        exact + cost as i128 * per <= burst as i128 * per + slack,
                        "admitted over the bound: exact {exact}, cost {cost}"
                    );
                    log.push((now, cost));
                } else {
                    prop_assert!(
                        exact + cost as i128 * per > burst as i128 * per,
                        "denied what an exact bucket admits: exact {exact}, cost {cost}"
                    );
                }
            }
        }
    }
}
