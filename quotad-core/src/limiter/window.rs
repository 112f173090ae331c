//! Window arithmetic over counter buckets: the estimate, when it falls, and what may be pruned.
//!
//! A sliding window of width `W` is cut into buckets of width `g` (the limit's grain,
//! [`crate::domain::sliding_grain`]; how many a window holds is in docs/accuracy.md), aligned on Unix time so every instance cuts them the same way. At instant `t`
//! the window is `(t - W, t]`. Buckets that start after `t - W` count in full; the one bucket
//! that straddles `t - W` is weighed by the part of it still inside the window (hits are assumed
//! spread evenly across a bucket), rounded down, unless the bucket before it counted nothing:
//! then traffic began inside the straddling bucket, its hits sit late in it rather than evenly,
//! and it counts in full until it has left the window. (Without that rule a key's first bucket,
//! filled late, lets a fleet over-admit one window later; the fleet simulation shows it.)
//!
//! # Error bound (tested against an exact sliding log below)
//! Every hit at or after `t - W + g` sits in a bucket that counts in full, so the estimate is at
//! least the exact count of `[t - W + g, t]`; and it counts nothing before the straddling
//! bucket's start (after `t - W - g`), so it is at most the exact count of `(t - W - g, t]`. Hence:
//! - over any span of `W - g`, at most `max` hits are admitted;
//! - over any span of `W`, at most `max` + the hits admitted in one bucket width `g`
//!   (at most 1/10 of the window's span, typically `max/10` or less under even load);
//! - a check is never denied while the exact count of the last `W + g`, plus its cost, fits.
//!
//! Calendar periods use one bucket per period and are exact: the count is the bucket's.
//!
//! Token buckets count their hits in buckets too, but their level is not a sum over a window:
//! see [`super::tokens`], which these functions hand them to.
//!
//! # Credits
//! A grant writes a negative count into the current bucket, so a bucket (and an estimate) may
//! be negative: the credit counts for as long as its bucket is in the window or the period,
//! and lets the client go beyond `max` by as much. Negative buckets are summed like the others;
//! a straddling one is weighed like any other, rounded towards zero (the credit errs small). As a credit leaves the
//! window the estimate grows, which [`time_until_at_most`] takes into account.

pub use super::bucket::{add_pending, bucket_at, Bucket};
use super::tokens::{self, Carry};
use crate::domain::LimitKind;

/// The count of a limit at instant `now`: negative when credits exceed the hits. `buckets` is
/// sorted by start, ascending; `carry` is what a token bucket folded its older buckets into
/// (ignored by the other kinds).
pub fn estimate(kind: LimitKind, buckets: &[Bucket], carry: Carry, now: i64) -> i64 {
    estimate_by(kind, buckets, carry, now, Bucket::count)
}

/// The estimate of one part of each bucket (`stored` or `pending` alone), weighed the same way.
pub fn estimate_by(
    kind: LimitKind,
    buckets: &[Bucket],
    carry: Carry,
    now: i64,
    count: impl Fn(&Bucket) -> i64,
) -> i64 {
    match kind {
        LimitKind::Tokens { .. } => tokens::level(kind, buckets, carry, now, count),
        LimitKind::Calendar(p) => {
            let current = p.grain().bucket_start(now);
            buckets
                .iter()
                .filter(|b| b.start >= current)
                .fold(0i64, |a, b| a.saturating_add(count(b)))
        }
        LimitKind::Sliding {
            window_ms,
            grain_ms,
        } => {
            let s = now - window_ms;
            let oldest = s - s.rem_euclid(grain_ms);
            // One pass, oldest first: the bucket before the straddling one (which says how to
            // weigh it, see `follows_traffic`) comes before it.
            let mut evenly = false;
            let mut total: i64 = 0;
            for b in buckets {
                if b.start < oldest {
                    if b.start == oldest - grain_ms {
                        evenly = b.count() > 0;
                    }
                } else if b.start > oldest || !evenly {
                    total = total.saturating_add(count(b));
                } else {
                    // The part of the bucket still inside, in (0, g]. Rounded towards zero:
                    // hits down, credits down. In i64 unless the product overflows it (a
                    // 128-bit division costs several times more).
                    let inside = oldest + grain_ms - s;
                    let part = match count(b).checked_mul(inside) {
                        Some(p) => p / grain_ms,
                        None => (count(b) as i128 * inside as i128 / grain_ms as i128) as i64,
                    };
                    total = total.saturating_add(part);
                }
            }
            total
        }
    }
}

/// Whether the bucket before the one starting at `start` counted anything: if so, traffic ran
/// through `start` and the bucket's hits are taken as spread evenly; if not, it began inside it.
fn follows_traffic(buckets: &[Bucket], start: i64, grain_ms: i64) -> bool {
    buckets
        .binary_search_by_key(&(start - grain_ms), |b| b.start)
        .is_ok_and(|i| buckets[i].count() > 0)
}

/// Milliseconds from `now` until the estimate is at most `target`, assuming no new hits.
/// 0 when it already is.
pub fn time_until_at_most(
    kind: LimitKind,
    buckets: &[Bucket],
    carry: Carry,
    now: i64,
    target: u64,
) -> i64 {
    let target = target.min(i64::MAX as u64) as i64;
    match kind {
        LimitKind::Tokens { .. } => tokens::time_until_at_most(kind, buckets, carry, now, target),
        LimitKind::Calendar(p) => {
            if estimate(kind, buckets, carry, now) <= target {
                0
            } else {
                let g = p.grain();
                g.bucket_end(g.bucket_start(now)) - now
            }
        }
        LimitKind::Sliding {
            window_ms,
            grain_ms,
        } => {
            if estimate(kind, buckets, carry, now) <= target {
                return 0;
            }
            let s = now - window_ms;
            let oldest = s - s.rem_euclid(grain_ms);
            let g = grain_ms as i128;
            // As time passes the window's start `s'` moves right. While bucket `b` straddles it,
            // the estimate is F + n * r / g (rounded towards zero), with F the buckets after `b`
            // and r the part of `b` still inside: falling as r shrinks when n > 0, growing when
            // n < 0 (a credit leaving). Walking the buckets oldest first finds the first moment.
            let mut after: i64 = buckets
                .iter()
                .filter(|b| b.start >= oldest)
                .fold(0i64, |a, b| a.saturating_add(b.count()));
            for b in buckets.iter().filter(|b| b.start >= oldest) {
                let n = b.count();
                after = after.saturating_sub(n);
                let seg_start = s.max(b.start);
                // r at the first moment of this segment.
                let r0 = (b.start + grain_ms - seg_start) as i128;
                if !follows_traffic(buckets, b.start, grain_ms) {
                    // Counted in full while it straddles, then gone.
                    if after.saturating_add(n) <= target {
                        return seg_start - s;
                    }
                    if after <= target {
                        return (b.start + grain_ms).max(seg_start) - s;
                    }
                    continue;
                }
                if n <= 0 {
                    // Lowest at the segment's first moment.
                    if after as i128 + n as i128 * r0 / g <= target as i128 {
                        return seg_start - s;
                    }
                    continue;
                }
                if after > target {
                    continue;
                }
                // after + floor(n * r / g) <= target  <=>  r <= ((a + 1) * g - 1) / n
                let a = (target - after) as i128;
                let r_max = ((a + 1) * g - 1) / n as i128;
                if r_max >= r0 {
                    return seg_start - s;
                }
                let at = b.start + grain_ms - r_max as i64;
                return at.max(seg_start) - s;
            }
            0
        }
    }
}

/// The contract's `reset_after_ms`: for a calendar period, the time to its end; for a sliding
/// window, the time until the estimate first falls (the earliest moment `remaining` grows).
pub fn reset_after(kind: LimitKind, buckets: &[Bucket], carry: Carry, now: i64) -> i64 {
    match kind {
        LimitKind::Tokens { .. } => tokens::time_until_at_most(kind, buckets, carry, now, 0),
        LimitKind::Calendar(p) => {
            let g = p.grain();
            g.bucket_end(g.bucket_start(now)) - now
        }
        LimitKind::Sliding { .. } => match estimate(kind, buckets, carry, now) {
            e if e <= 0 => 0,
            e => time_until_at_most(kind, buckets, carry, now, (e - 1) as u64),
        },
    }
}

/// Buckets that start before this instant are not needed at `now` (nor later): for a sliding
/// window, the straddling bucket and the one before it (which says how to weigh it). For a
/// token bucket, how far back a first read looks (its level is carried in memory after that).
pub fn oldest_needed(kind: LimitKind, now: i64) -> i64 {
    match kind {
        LimitKind::Tokens { .. } => tokens::first_read_from(kind, now),
        LimitKind::Calendar(p) => p.grain().bucket_start(now),
        LimitKind::Sliding {
            window_ms,
            grain_ms,
        } => {
            let s = now - window_ms;
            s - s.rem_euclid(grain_ms) - grain_ms
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{sliding_grain, Period};
    use proptest::prelude::*;

    /// No carry: only token buckets read it.
    const C: Carry = Carry { at: 0, deficit: 0 };

    /// The estimate of buckets that hold no credit.
    fn est_u(k: LimitKind, bs: &[Bucket], now: i64) -> u64 {
        u64::try_from(estimate(k, bs, C, now)).unwrap()
    }

    fn sliding(window_ms: i64) -> LimitKind {
        LimitKind::Sliding {
            window_ms,
            grain_ms: sliding_grain(window_ms),
        }
    }

    fn b(start: i64, n: i64) -> Bucket {
        Bucket {
            start,
            stored: n,
            ..Bucket::default()
        }
    }

    #[test]
    fn straddling_bucket_is_weighed_by_the_part_inside() {
        // W = 1s, g = 100ms. At t = 1050 the window is (50, 1050]: bucket 0 is half inside.
        // Bucket -100 (outside) counted hits, so traffic ran through bucket 0.
        let k = sliding(1_000);
        let bs = [b(-100, 4), b(0, 10), b(500, 3), b(1_000, 2)];
        assert_eq!(estimate(k, &bs, C, 1_050), 5 + 3 + 2);
        // At t = 1000 bucket 0 is fully inside (r = g).
        assert_eq!(estimate(k, &bs, C, 1_000), 15);
        // At t = 1100 bucket 0 is gone.
        assert_eq!(estimate(k, &bs, C, 1_100), 5);
    }

    #[test]
    fn a_straddling_bucket_after_an_empty_one_counts_in_full_until_it_leaves() {
        // Nothing before bucket 0: its hits may all sit at its end, so none has left at 1050.
        let k = sliding(1_000);
        let bs = [b(0, 10), b(500, 3), b(1_000, 2)];
        assert_eq!(estimate(k, &bs, C, 1_050), 10 + 3 + 2);
        assert_eq!(estimate(k, &bs, C, 1_099), 15);
        assert_eq!(estimate(k, &bs, C, 1_100), 5);
        // The same with an empty bucket before it, as the store returns one.
        let bs = [b(-100, 0), b(0, 10), b(500, 3), b(1_000, 2)];
        assert_eq!(estimate(k, &bs, C, 1_050), 15);
        assert_eq!(time_until_at_most(k, &bs, C, 1_050, 5), 50);
        assert_eq!(reset_after(k, &bs, C, 1_050), 50);
    }

    #[test]
    fn time_until_at_most_finds_the_first_instant() {
        let k = sliding(1_000);
        let bs = [b(0, 10), b(500, 3), b(1_000, 2)];
        let now = 1_050;
        for target in 0..15i64 {
            let d = time_until_at_most(k, &bs, C, now, target as u64);
            assert!(estimate(k, &bs, C, now + d) <= target, "target {target}");
            if d > 0 {
                assert!(estimate(k, &bs, C, now + d - 1) > target, "target {target}");
            }
        }
    }

    #[test]
    fn calendar_counts_the_current_period_and_resets_at_its_end() {
        let k = LimitKind::Calendar(Period::Minute);
        let bs = [b(0, 7), b(60_000, 4)];
        assert_eq!(estimate(k, &bs, C, 61_000), 4);
        assert_eq!(reset_after(k, &bs, C, 61_000), 59_000);
        assert_eq!(time_until_at_most(k, &bs, C, 61_000, 3), 59_000);
        assert_eq!(time_until_at_most(k, &bs, C, 61_000, 4), 0);
    }

    #[test]
    fn add_pending_keeps_buckets_sorted() {
        let k = sliding(1_000);
        let mut bs = vec![b(0, 1), b(300, 1)];
        add_pending(k, &mut bs, 150, 2);
        add_pending(k, &mut bs, 399, 1);
        let starts: Vec<i64> = bs.iter().map(|x| x.start).collect();
        assert_eq!(starts, vec![0, 100, 300]);
        assert_eq!(bs[1].pending, 2);
        assert_eq!(bs[2].count(), 2);
    }

    /// Exact count of hits in `[from, to]` of a sliding log.
    fn exact(log: &[(i64, u64)], from: i64, to: i64) -> u64 {
        log.iter()
            .filter(|(t, _)| *t >= from && *t <= to)
            .map(|(_, c)| c)
            .sum()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// The bucketed limiter against an exact sliding log: the documented bound holds on
        /// both sides for random traffic, costs and windows.
        #[test]
        fn bucketed_window_stays_within_the_documented_bound(
            window_ms in prop_oneof![Just(1_000i64), Just(1_500), Just(10_000), Just(60_000)],
            max in 1u64..60,
            gaps in proptest::collection::vec(0i64..400, 50..400),
            costs in proptest::collection::vec(0u64..5, 400),
        ) {
            let k = sliding(window_ms);
            let LimitKind::Sliding { grain_ms: g, .. } = k else { unreachable!() };
            let scale = window_ms / 1_000;
            let mut buckets: Vec<Bucket> = Vec::new();
            let mut log: Vec<(i64, u64)> = Vec::new();
            let mut now = 1_000_000i64;
            for (i, gap) in gaps.iter().enumerate() {
                now += gap * scale;
                let cost = costs[i];
                let est = est_u(k, &buckets, now);
                if est + cost <= max {
                    add_pending(k, &mut buckets, now, cost);
                    log.push((now, cost));
                    // Over any span of W - g ending now, at most max.
                    prop_assert!(exact(&log, now - window_ms + g, now) <= max);
                } else {
                    // Never denied while the last W + g plus the cost fits.
                    prop_assert!(exact(&log, now - window_ms - g + 1, now) + cost > max);
                    // And retry_after points at the first instant it would fit.
                    if cost <= max {
                        let d = time_until_at_most(k, &buckets, C, now, max - cost);
                        prop_assert!(d > 0);
                        prop_assert!(est_u(k, &buckets, now + d) + cost <= max);
                        prop_assert!(est_u(k, &buckets, now + d - 1) + cost > max);
                    }
                }
                // Over any full window W: at most max + the hits of one bucket width.
                let in_window = exact(&log, now - window_ms + 1, now);
                let mut worst_g = 0;
                for (t, _) in log.iter().filter(|(t, _)| *t > now - window_ms) {
                    worst_g = worst_g.max(exact(&log, *t, *t + g - 1));
                }
                prop_assert!(in_window <= max + worst_g);
            }
        }

        /// With credits (negative buckets) the estimate can grow as one leaves the window:
        /// `time_until_at_most` is still the first instant, found by brute force.
        #[test]
        fn time_until_at_most_is_the_first_instant_with_credits(
            counts in proptest::collection::vec(-30i64..50, 1..14),
            offset in 0i64..100,
            target in 0u64..40,
        ) {
            let k = sliding(1_000);
            let bs: Vec<Bucket> = counts.iter().enumerate().map(|(i, n)| b(i as i64 * 100, *n)).collect();
            let now = (counts.len() as i64 - 1) * 100 + offset;
            let d = time_until_at_most(k, &bs, C, now, target);
            prop_assert!(estimate(k, &bs, C, now + d) <= target as i64);
            for e in 0..d {
                prop_assert!(estimate(k, &bs, C, now + e) > target as i64, "at +{e}, d = {d}");
            }
        }

        #[test]
        fn reset_after_is_when_remaining_first_grows(
            counts in proptest::collection::vec(0i64..50, 1..25),
            offset in 0i64..100,
        ) {
            let k = sliding(1_000);
            let bs: Vec<Bucket> = counts.iter().enumerate().map(|(i, n)| b(i as i64 * 100, *n)).collect();
            let now = (counts.len() as i64 - 1) * 100 + offset;
            let e = estimate(k, &bs, C, now);
            let d = reset_after(k, &bs, C, now);
            if e == 0 {
                prop_assert_eq!(d, 0);
            } else {
                prop_assert!(estimate(k, &bs, C, now + d) < e);
                prop_assert!(d == 0 || estimate(k, &bs, C, now + d - 1) == e);
            }
        }
    }

    #[test]
    fn a_hold_counts_in_full_until_it_can_no_longer_be_open() {
        use crate::domain::{IN_FLIGHT_GRAIN_MS, IN_FLIGHT_KIND, MAX_HOLD_MS};
        // A hold taken at the very start of its bucket and one at its very end, each open for
        // the longest time: both still count at their last instant.
        for offset in [0, IN_FLIGHT_GRAIN_MS - 1] {
            let start = 1_000 * IN_FLIGHT_GRAIN_MS;
            let taken = start + offset;
            let b = [Bucket {
                start,
                stored: 1,
                ..Bucket::default()
            }];
            let carry = Default::default();
            assert_eq!(estimate(IN_FLIGHT_KIND, &b, carry, taken), 1);
            assert_eq!(
                estimate(IN_FLIGHT_KIND, &b, carry, taken + MAX_HOLD_MS),
                1,
                "{offset}"
            );
            // And it has left the window one bucket later.
            let gone = start + MAX_HOLD_MS + 2 * IN_FLIGHT_GRAIN_MS;
            assert_eq!(estimate(IN_FLIGHT_KIND, &b, carry, gone), 0);
        }
    }
}
