//! Reservations ("holds"): a check that holds its cost until the work it paid for is done and
//! its real cost is known, and the in-flight limits that cap how much is held at once.
//!
//! A hold charges its estimate when it is taken, to the buckets of that instant; settling it
//! charges the difference between the real cost and the estimate to those same buckets (so a
//! minute's budget is charged once, in the minute the work began); releasing it gives the
//! whole estimate back; a hold nobody ends within its time expires, keeping its estimate.
//!
//! An in-flight limit counts a hold (or its cost) from when it is taken to when it ends. It is
//! kept as a sliding window just longer than the longest hold, in minute buckets: a hold's end
//! is written to the bucket its start went to, so the two cancel exactly, and a hold whose end
//! never reached the store (its instance died between the two writes) leaves the window by
//! itself once no hold could still be open.

use super::wire::wire_enum;
use super::LimitKind;

/// The shortest time a hold may be given.
pub const MIN_HOLD_MS: i64 = 1_000;
/// The longest time a hold may be given: what an in-flight limit's window covers.
pub const MAX_HOLD_MS: i64 = 3_600_000;
/// A hold's time when neither the check nor the policy gives one.
pub const DEFAULT_HOLD_MS: i64 = 300_000;
/// The width of an in-flight limit's buckets.
pub const IN_FLIGHT_GRAIN_MS: i64 = 60_000;
/// How an in-flight limit counts: a sliding window of the longest hold plus one bucket, so a
/// hold counts in full for as long as it can be open, whatever instant of its bucket it began.
pub const IN_FLIGHT_KIND: LimitKind = LimitKind::Sliding {
    window_ms: MAX_HOLD_MS + IN_FLIGHT_GRAIN_MS,
    grain_ms: IN_FLIGHT_GRAIN_MS,
};

wire_enum! {
    /// What an in-flight limit counts of the holds open at once: how many (`holds`), or how
    /// much of their cost (`cost`).
    pub enum InFlight {
        Holds = "holds",
        Cost = "cost",
    }
}

wire_enum! {
    /// Where a hold is in its life: `open` until it is settled (the real cost charged),
    /// released (nothing charged) or expired (its estimate charged).
    pub enum HoldState {
        Open = "open",
        Settled = "settled",
        Released = "released",
        Expired = "expired",
    }
}

/// A hold's time: the one asked for, else the policy's, else [`DEFAULT_HOLD_MS`]; within
/// [`MIN_HOLD_MS`] and [`MAX_HOLD_MS`] (the caller has refused anything outside).
pub fn hold_ms(asked: Option<i64>, policy: Option<i64>) -> i64 {
    asked
        .or(policy)
        .unwrap_or(DEFAULT_HOLD_MS)
        .clamp(MIN_HOLD_MS, MAX_HOLD_MS)
}

/// The message of a hold time out of bounds.
pub const HOLD_MESSAGE: &str = "a hold's time is a duration from 1s to 1h, such as 30s, 5m";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_time_comes_from_the_check_then_the_policy_then_the_default() {
        assert_eq!(hold_ms(Some(2_000), Some(9_000)), 2_000);
        assert_eq!(hold_ms(None, Some(9_000)), 9_000);
        assert_eq!(hold_ms(None, None), DEFAULT_HOLD_MS);
        assert_eq!(hold_ms(Some(10 * MAX_HOLD_MS), None), MAX_HOLD_MS);
    }
}
