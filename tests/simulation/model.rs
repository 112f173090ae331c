//! The traffic and the exact limiters a fleet is measured against.

use super::*;

/// What the simulated policy limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `MAX` per `WINDOW_MS`, a sliding window, against an exact sliding log.
    Window,
    /// `BURST` tokens, `RATE_PER_S` a second, against an exact token bucket.
    Tokens,
}

/// An exact token bucket, in tokens x 1000 (refill is `RATE_PER_S` a ms).
pub(crate) struct ExactBucket {
    pub(crate) milli_tokens: i64,
    pub(crate) at: i64,
}

impl ExactBucket {
    pub(crate) fn admit(&mut self, now: i64) -> bool {
        let full = BURST as i64 * 1_000;
        self.milli_tokens = (self.milli_tokens + (now - self.at) * RATE_PER_S as i64).min(full);
        self.at = now;
        if self.milli_tokens >= 1_000 {
            self.milli_tokens -= 1_000;
            true
        } else {
            false
        }
    }
}

/// The most a log of admitted hits exceeds a token bucket's written bound over any span:
/// `max over i <= j of (j - i + 1) / (BURST + rate x (t_j - t_i) + BUCKET_REFILL) - 1`.
pub(crate) fn worst_over_bound(log: &[i64]) -> f64 {
    let rate = RATE_PER_S as f64 / 1_000.0;
    let mut worst = f64::MIN;
    for i in 0..log.len() {
        for j in i..log.len() {
            let allowed = BURST as f64 + rate * (log[j] - log[i]) as f64 + BUCKET_REFILL;
            worst = worst.max((j - i + 1) as f64 / allowed - 1.0);
        }
    }
    worst
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// Half the limit's rate, spread evenly: nothing should be denied.
    EvenUnderLimit,
    /// 10x the limit's rate, spread evenly over the instances.
    EvenOverload,
    /// 10x the limit's rate, 90% of it on instance 0.
    SkewedOverload,
    /// 10x the limit's rate, all of it in the last 10% of every bucket width of the window.
    EdgeBursts,
    /// 50x the limit's rate, spread evenly: a window that opens is full again within a sync
    /// round, before any instance has written its part (a client as fast as its callers go).
    Flood,
}

/// Arrivals at instant `t` (ms since start), one entry per instance.
pub(crate) fn arrivals(p: Pattern, t: i64, n: usize, rng: &mut rand::rngs::StdRng) -> Vec<u32> {
    let per_ms = MAX as f64 / WINDOW_MS as f64; // the limit's long-run rate
    let rate = match p {
        Pattern::EvenUnderLimit => 0.5 * per_ms,
        Pattern::Flood => 50.0 * per_ms,
        _ => 10.0 * per_ms,
    };
    let mut out = vec![0u32; n];
    let mut draw = |rate: f64| {
        // Poisson-ish: whole part plus a Bernoulli for the fraction.
        rate.floor() as u32 + (rng.random::<f64>() < rate.fract()) as u32
    };
    match p {
        Pattern::EvenUnderLimit | Pattern::EvenOverload | Pattern::Flood => {
            for a in out.iter_mut() {
                *a = draw(rate / n as f64);
            }
        }
        Pattern::SkewedOverload => {
            out[0] = draw(rate * if n == 1 { 1.0 } else { 0.9 });
            for a in out.iter_mut().skip(1) {
                *a = draw(rate * 0.1 / (n - 1) as f64);
            }
        }
        Pattern::EdgeBursts => {
            let g = WINDOW_MS / 10;
            if t % g >= g - g / 10 {
                for a in out.iter_mut() {
                    *a = draw(rate * 10.0 / n as f64);
                }
            }
        }
    }
    out
}

pub(crate) struct Outcome {
    /// Writes of the quiet clients' counters (see `Lazy`).
    pub(crate) quiet_writes: u64,
    /// Over-admission over the windows that start after the first one (the key's start-up left
    /// behind).
    pub(crate) over_steady: f64,
    pub(crate) over: f64,
    pub(crate) under: f64,
    pub(crate) admitted: u64,
    pub(crate) offered: u64,
    /// The largest over-admission the docs allow a failure of the run, in hits (0 without
    /// one): see `Event::Store`.
    pub(crate) failure_bound: f64,
    /// Checks decided through the store, all instances.
    pub(crate) store_checks: u64,
    /// Hits of increments the store lost (`store::LEADER_LOST`), all instances.
    pub(crate) lost_hits: u64,
}

/// Most hits in any span `(t - span, t]` of a sorted log.
pub(crate) fn worst_window(log: &[i64], span: i64) -> u64 {
    let (mut worst, mut lo) = (0usize, 0usize);
    for hi in 0..log.len() {
        while log[hi] - log[lo] >= span {
            lo += 1;
        }
        worst = worst.max(hi - lo + 1);
    }
    worst as u64
}
