//! Sliding windows: how long one may be, how it is written, and the grain it is cut into.
//!
//! A window gets the widest grain of a fixed ladder that still fits into it
//! [`MIN_BUCKETS_PER_WINDOW`] times. The bucket counts below are what the rest of the code leans
//! on (the store's retention and partition size, the limiter's error bound); the tests compute
//! them from the ladder for every window length, so the constants are the fact and a change to
//! the ladder that breaks them fails here.

use std::time::Duration;

/// Shortest sliding window.
pub const MIN_WINDOW_MS: i64 = 1_000;
/// Longest sliding window: 31 days.
pub const MAX_WINDOW_MS: i64 = 31 * 86_400_000;

/// Bucket widths a sliding window may be cut into. Each width divides a day, so buckets align
/// with the UTC calendar.
pub(super) const GRAIN_LADDER_MS: [i64; 21] = [
    100, 200, 500, 1_000, 2_000, 5_000, 10_000, 15_000, 30_000, 60_000, 120_000, 300_000, 600_000,
    900_000, 1_800_000, 3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000,
];

/// Fewest buckets a sliding window is cut into: it gets the widest grain of the ladder that
/// fits into it this many times (whole grains).
pub const MIN_BUCKETS_PER_WINDOW: i64 = 10;
/// Most buckets a sliding window is cut into (its length in grains, rounded up): the longest
/// windows, on the ladder's widest grain.
pub const MAX_BUCKETS_PER_WINDOW: i64 = 31;
/// Most buckets a sliding window overlaps at one instant: its buckets, plus one when its start
/// falls inside a bucket (the partly expired bucket it straddles).
pub const MAX_BUCKETS_SPANNED: i64 = MAX_BUCKETS_PER_WINDOW + 1;
/// Most buckets the window estimate reads: those it spans, plus the one before the straddling
/// bucket, which says how to weigh it (see `limiter::window`).
pub const MAX_BUCKETS_READ: i64 = MAX_BUCKETS_SPANNED + 1;

/// The bucket grain of a sliding window of `window_ms`.
pub fn sliding_grain(window_ms: i64) -> i64 {
    let mut g = GRAIN_LADDER_MS[0];
    for &step in GRAIN_LADDER_MS.iter() {
        if step * MIN_BUCKETS_PER_WINDOW <= window_ms {
            g = step;
        }
    }
    g
}

/// Token buckets: the shortest and longest time an empty bucket may take to fill up (`burst`
/// tokens at `rate` per `per`).
pub const MIN_FILL_MS: i64 = MIN_WINDOW_MS;
pub const MAX_FILL_MS: i64 = MAX_WINDOW_MS;
/// The longest refill period `per` of a token bucket.
pub const MAX_PER_MS: i64 = MAX_WINDOW_MS;
/// A token bucket counts its hits in buckets of about this fraction of its fill time (the
/// widest grain of the ladder that fits this many times, the ladder's narrowest at least): the
/// level is known to within the tokens one bucket refills, 1/50 of the burst or less once the
/// fill time reaches 5 s.
pub const TOKEN_BUCKETS_PER_FILL: i64 = 50;

/// The time in ms an empty token bucket of `burst` tokens takes to fill at `rate` per `per_ms`
/// (rounded up), or None beyond `i64`.
pub fn fill_ms(burst: u64, rate: u64, per_ms: i64) -> Option<i64> {
    if rate == 0 || per_ms <= 0 {
        return None;
    }
    let n = burst as i128 * per_ms as i128;
    i64::try_from((n + rate as i128 - 1) / rate as i128).ok()
}

/// The bucket grain of a token bucket that fills in `fill_ms`.
pub fn token_grain(fill_ms: i64) -> i64 {
    let mut g = GRAIN_LADDER_MS[0];
    for &step in GRAIN_LADDER_MS.iter() {
        if step * TOKEN_BUCKETS_PER_FILL <= fill_ms {
            g = step;
        }
    }
    g
}

/// Parses a duration such as `250ms`, `1s`, `10m`, `1h 30m` into milliseconds.
pub fn parse_duration_ms(s: &str) -> Option<i64> {
    let d: Duration = humantime::parse_duration(s.trim()).ok()?;
    i64::try_from(d.as_millis()).ok()
}

/// Renders milliseconds the way `parse_duration_ms` reads them (`10m`, `1s 500ms`).
pub fn format_duration_ms(ms: i64) -> String {
    humantime::format_duration(Duration::from_millis(ms.max(0) as u64)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every window length where the bucket count can reach an extreme, and a sweep between.
    ///
    /// `sliding_grain` only changes where a rung starts to fit `MIN_BUCKETS_PER_WINDOW` times,
    /// and between two such points the bucket count grows with the window; so its extremes lie at
    /// the bounds and on either side of each point. The sweep at 1 s steps backs that up.
    fn windows() -> Vec<i64> {
        let mut w: Vec<i64> = (MIN_WINDOW_MS..=MAX_WINDOW_MS).step_by(1_000).collect();
        for step in GRAIN_LADDER_MS {
            w.extend([
                step * MIN_BUCKETS_PER_WINDOW - 1,
                step * MIN_BUCKETS_PER_WINDOW,
            ]);
        }
        w.push(MAX_WINDOW_MS);
        w.retain(|w| (MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(w));
        w
    }

    #[test]
    fn the_ladder_cuts_every_window_into_min_to_max_buckets() {
        let (mut fewest, mut most) = (i64::MAX, 0);
        for w in windows() {
            let g = sliding_grain(w);
            assert!(GRAIN_LADDER_MS.contains(&g), "{w}: {g}");
            fewest = fewest.min(w / g);
            most = most.max((w + g - 1) / g);
        }
        assert_eq!(
            (fewest, most),
            (MIN_BUCKETS_PER_WINDOW, MAX_BUCKETS_PER_WINDOW)
        );
    }

    #[test]
    fn a_window_spans_at_most_max_buckets_spanned() {
        // The buckets from the one holding the window's start (`now - W`, as the estimate takes
        // it) to the one holding `now`, at instants across one grain (the count repeats with
        // period `g`), for the windows that have the most buckets on each rung.
        let spanned = |w: i64, g: i64, now: i64| {
            let s = now - w;
            let oldest = s - s.rem_euclid(g);
            (now - now.rem_euclid(g) - oldest) / g + 1
        };
        let mut most = 0;
        for step in GRAIN_LADDER_MS {
            for w in [step * MIN_BUCKETS_PER_WINDOW - 1, MAX_WINDOW_MS] {
                if !(MIN_WINDOW_MS..=MAX_WINDOW_MS).contains(&w) {
                    continue;
                }
                let g = sliding_grain(w);
                for now in
                    [0, 1, g / 2, g - 1].map(|o| 1_700_000_000_000 - 1_700_000_000_000 % g + o)
                {
                    most = most.max(spanned(w, g, now));
                }
            }
        }
        assert_eq!(most, MAX_BUCKETS_SPANNED);
    }

    #[test]
    fn sliding_grains_cut_windows_into_min_to_max_buckets() {
        for w in [
            1_000,
            1_500,
            10_000,
            60_000,
            600_000,
            3_600_000,
            86_400_000,
            MAX_WINDOW_MS,
        ] {
            let g = sliding_grain(w);
            let n = w / g;
            assert!(
                (MIN_BUCKETS_PER_WINDOW..=MAX_BUCKETS_PER_WINDOW).contains(&n),
                "{w}: {n}"
            );
        }
    }

    #[test]
    fn the_ladder_is_sorted_and_divides_a_day() {
        assert!(GRAIN_LADDER_MS.windows(2).all(|p| p[0] < p[1]));
        assert!(GRAIN_LADDER_MS.iter().all(|g| 86_400_000 % g == 0));
    }
}
