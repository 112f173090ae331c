//! First checks decided before their read: a counter this instance does not hold yet may be
//! admitted from a bound instead of waiting for the store, where the limit is far too large
//! for what is admitted so to matter.
//!
//! A counter not in memory is read before its first decision (`miss`), unless every limit of
//! the check that is missing qualifies here. Then its state is installed *unread*: it counts
//! only what this instance admits from now on, and admits while that stays within the
//! counter's [`unread_budget`], whatever the store holds. The next sync round reads it back
//! like any other (without writing it early), and from then on it is an ordinary state. A
//! check the budget cannot hold reads the counter on the check path first, as before.
//!
//! The bound. Unread, an instance admits at most `B = max / (100 x N x L)` of a counter it
//! does not know, where N is the fleet's size and `L = 1 + ceil(window / limiter.idle_ms)`
//! bounds how often one instance can come to not know a counter within one window: a counter
//! leaves memory only after `idle_ms` unused (and those of a tenant or table near a memory cap
//! sooner: no counter is admitted unread within a window of such an eviction). So within any
//! window, all instances together admit at most `N x L x B <= max / 100` beyond what the
//! counters allow, plus `B` for each instance started within it (a start forgets every
//! counter). A check whose cost on the limit exceeds `B` is read first: where one check
//! could endanger the limit, nothing is admitted unread. So a limit of `max` up to
//! `100 x N x L - 1` is never admitted unread, and small limits (max 1 to 10) never.
//!
//! Only `cached` sliding windows and calendar periods qualify, for a check that takes no
//! hold, with the store answering and the regions all heard: a token bucket's level, an
//! in-flight count and a strict policy keep their reads.

use crate::domain::{Grain, Limit, LimitKind};

/// What unread admissions may add within a window, as a fraction of `max`: 1 / this.
pub const UNREAD_DIVISOR: u64 = 100;

/// The longest calendar period, for how often a counter can be forgotten within one.
const MONTH_MS: i64 = 31 * 86_400_000;

/// The span over which a limit counts, if unread admissions may apply to it.
fn span_ms(l: &Limit) -> Option<i64> {
    if l.in_flight.is_some() {
        return None;
    }
    match l.kind {
        LimitKind::Sliding { window_ms, .. } => Some(window_ms),
        LimitKind::Calendar(p) => Some(match p.grain() {
            Grain::Fixed(w) => w,
            Grain::Month => MONTH_MS,
        }),
        LimitKind::Tokens { .. } => None,
    }
}

/// The most this instance may admit of `l`'s counter before it has read it (module comment):
/// `max / (100 x members x (1 + ceil(window / idle_ms)))`, 0 where nothing may be.
pub fn unread_budget(l: &Limit, members: u32, idle_ms: i64) -> u64 {
    let Some(span) = span_ms(l) else {
        return 0;
    };
    let idle = idle_ms.max(1);
    let loads = 1 + (span + idle - 1) / idle;
    let divisor = (UNREAD_DIVISOR as u128) * u128::from(members.max(1)) * loads as u128;
    (u128::from(l.max) / divisor) as u64
}

/// Whether a check of `cost` on `l`'s counter, not in memory, may be admitted unread (module
/// comment), in a fleet of `members` with `limiter.idle_ms` `idle_ms`, where eviction last ran
/// near a memory cap at `pressed_at`.
pub(super) fn qualifies(
    l: &Limit,
    cost: u64,
    members: u32,
    idle_ms: i64,
    (now, pressed_at): (i64, i64),
) -> bool {
    let budget = unread_budget(l, members, idle_ms);
    let quiet = span_ms(l).is_some_and(|w| now.saturating_sub(pressed_at) > w);
    quiet && budget > 0 && l.cost_of(cost) <= budget
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{Policy, PolicyDoc};

    /// The first limit of a policy of `limit` (its JSON).
    fn limit(limit: serde_json::Value) -> Limit {
        let doc: PolicyDoc =
            serde_json::from_value(serde_json::json!({ "limits": [limit] })).unwrap();
        Policy::from_doc(&doc, false).unwrap().limits[0].clone()
    }

    fn sliding(max: u64, window: &str) -> Limit {
        limit(serde_json::json!({"id": "l", "max": max, "window": window}))
    }

    #[test]
    fn the_budget_keeps_every_load_of_a_window_within_a_hundredth_of_max() {
        // 10 s window, idle 60 s: at most 2 loads a window; alone, 1/200 of max.
        assert_eq!(unread_budget(&sliding(1_000_000, "10s"), 1, 60_000), 5_000);
        // Three instances: a third of that.
        assert_eq!(unread_budget(&sliding(1_000_000, "10s"), 3, 60_000), 1_666);
        // A window of 10 idle times: 11 loads.
        assert_eq!(unread_budget(&sliding(1_100_000, "10m"), 1, 60_000), 1_000);
        for (max, n, window, idle) in [(7_919u64, 3u32, "1h", 60_000i64), (10, 1, "1s", 1)] {
            let l = sliding(max, window);
            let b = unread_budget(&l, n, idle);
            let w = span_ms(&l).unwrap();
            let loads = 1 + (w + idle - 1) / idle;
            assert!(
                u128::from(b) * u128::from(n) * loads as u128 * 100 <= u128::from(max),
                "{max} {n} {window} {idle}: {b}"
            );
        }
    }

    #[test]
    fn small_limits_token_buckets_and_in_flight_limits_are_always_read_first() {
        for max in 1..=10 {
            assert_eq!(unread_budget(&sliding(max, "1s"), 1, 60_000), 0);
        }
        let month =
            limit(serde_json::json!({"id": "m", "max": 1_000_000_000u64, "period": "month"}));
        assert_eq!(
            unread_budget(&month, 1, 60_000),
            1_000_000_000 / (100 * (1 + 31 * 1_440))
        );
        let tokens =
            limit(serde_json::json!({"id": "t", "burst": 1_000_000, "rate": 10, "per": "1s"}));
        assert_eq!(unread_budget(&tokens, 1, 60_000), 0);
        let held = limit(serde_json::json!({"id": "f", "max": 1_000_000, "in_flight": "holds"}));
        assert_eq!(unread_budget(&held, 1, 60_000), 0);
    }
}
