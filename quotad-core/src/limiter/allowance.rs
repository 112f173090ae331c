//! What a check may take of a counter's headroom in a fleet: this instance's share of it
//! ([`super::share`]), less what the others may hold admitted and unwritten.
//!
//! A small limit (`max` up to [`LAST_UNITS`]) is no instance's share: rounded-down shares of
//! it would leave its last units to nobody. Every check of it that memory does not deny (its
//! window full) is decided through the store (strict, `miss`), which sees every hit, so a fleet
//! admits every unit of a small limit and never one more. A larger limit keeps its shares, so
//! that far from it no check pays a round trip; where a share cannot hold a check, the store
//! decides it only once no other instance can hold a share's hits unwritten ([`others_hold`]
//! is 0), and otherwise the check waits for the next sync.

use super::state::LimitState;
use super::window;
use crate::domain::Limit;

/// How a decision sees the rest of the fleet.
#[derive(Clone, Copy)]
pub(super) struct Fleet {
    /// Enforce shares of the headroom (more than one instance, cached consistency).
    pub(super) shares: bool,
    /// Small limits are shared out to nobody, and a check that its share cannot hold may be
    /// decided through the store (one region, the store answering); else such a check is
    /// denied until the next sync.
    pub(super) last_units: bool,
    /// The span over which the others last read a counter they hold hits of
    /// (`Shares::seen_span`; 0 alone).
    pub(super) seen_span: i64,
    pub(super) sync_interval_ms: i64,
    /// While another region is unheard: keep to this region's budget.
    pub(super) budget: Option<Budget>,
    /// The fleet's size and `limiter.idle_ms`: a counter's unread budget (`first`).
    pub(super) members: u32,
    pub(super) idle_ms: i64,
    /// How uncertain this instance's reading of the fleet's clock is (ms): a sliding window
    /// is judged that much wider, up to a bucket (`decision::judge`).
    pub(super) skew_ms: i64,
}

/// A region's budget while another region is unheard: the policy's fixed split, or (`None`)
/// the share of the limit its traffic earned before
/// ([`RegionPart::earned`](super::state::RegionPart::earned)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Budget {
    pub(super) fixed: Option<f32>,
    /// The regions heard of (for a counter without a region part).
    pub(super) regions: u32,
}

/// Where a check leaves this instance's unsynced hits against its share of the headroom.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ShareUse {
    /// `pending + settling + cost <= allowance`: the check fits in the share.
    pub(super) within: bool,
    /// They would be past [`1 / PRESSURE_DIVISOR`](PRESSURE_DIVISOR) of the allowance: the
    /// counter is synced at the next round instead of waiting for `sync.max_delay_ms`.
    pub(super) pressing: bool,
    /// What the other instances may hold admitted and unwritten ([`others_hold`], and in a
    /// fleet that writes lazily its reserve): not remaining, as far as this instance knows.
    pub(super) held: i128,
    /// [`others_hold`] is 0: no other instance can hold a share's hits unwritten.
    pub(super) others_hold_none: bool,
}

/// A counter whose unsynced hits pass this fraction of its allowance is synced at the next round.
/// Smaller syncs sooner (more store calls); larger lets an instance run further on a stale view
/// of the others (more under-admission when traffic shifts, as a share must then fill up
/// before it is rebalanced).
pub(super) const PRESSURE_DIVISOR: i128 = 8;
/// The largest `max` of a limit that no instance of a fleet holds a share of.
pub const LAST_UNITS: u64 = 64;

/// The units of a limit of `max` that no instance holds a share of (see the module comment):
/// all of a small limit, none of a larger one.
pub fn last_units(max: u64) -> u64 {
    if max <= LAST_UNITS {
        max
    } else {
        0
    }
}

/// What the other instances may hold admitted and unwritten, at most: the rest of the
/// headroom shared out as this instance read it over the span in which the others last read
/// it (`Shares::seen_span`), at the lowest count and with the least share it saw. Before its
/// reads cover that span, as though the count had been 0. Nothing of a small limit. Each
/// share's allowance is rounded down, and so is their sum.
///
/// A count read while the window was full says nothing of the room its hits leave as they
/// leave the window: every instance sees that room at once, and takes its share of it without
/// a read. So a window's count is the lower of the lowest read and the last read weighed now.
pub(super) fn others_hold(l: &Limit, s: &LimitState, now: i64, fleet: Fleet) -> i128 {
    if fleet.seen_span <= 0 {
        return 0;
    }
    let (lowest, share) = match s.seen() {
        Some(r) if r.covers(now.div_euclid(fleet.seen_span)) => {
            let lowest = s
                .view(now)
                .map_or(r.lowest(), |(_, read, _)| r.lowest().min(read));
            (lowest, r.least_share())
        }
        Some(r) => (0, r.least_share()),
        None => (0, s.share),
    };
    let zone = if fleet.last_units {
        last_units(l.max)
    } else {
        0
    };
    let shared = (l.max as i128 - zone as i128 - lowest.max(0) as i128).max(0);
    ((1.0 - share.clamp(0.0, 1.0) as f64) * shared as f64).floor() as i128
}
/// What a fleet that writes lazily reserves for the others' unwritten hits, as a fraction of
/// their shares: twice what they hold before they press, for the round between pressing and
/// writing.
const RESERVE_DIVISOR: f64 = (PRESSURE_DIVISOR / 2) as f64;

/// `pending + cost <= share x (max - stored)`: this instance's unwritten hits stay within its
/// share of the headroom the store last showed.
///
/// Hits written since the last read back (`settling`) still count as this instance's own: the
/// headroom is the one the store showed at that read, before they were added.
///
/// A token bucket's level is not a sum: its pending part is every unwritten hit, and the rest
/// of the level is what the store showed.
pub(super) fn share_use(l: &Limit, s: &LimitState, now: i64, cost: u64, fleet: Fleet) -> ShareUse {
    let budget = fleet.budget;
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
    let read = stored as i128 - s.settling as i128;
    let headroom = (l.max as i128 - read).max(0);
    // The last units are shared out to nobody: they are decided through the store.
    let zone = if fleet.last_units {
        last_units(l.max)
    } else {
        0
    };
    let shared = (headroom - zone as i128).max(0);
    // No more than the read before left, less what this instance took since (`Pace`).
    let lag = s.pace().map_or(0, |p| p.lag(l.max, zone));
    let mut allowance = (s.share as f64 * shared as f64).floor() as i128 - lag;
    let others = others_hold(l, s, now, fleet);
    let mut held = others;
    if let Some(r) = s.reserve() {
        // What the others may hold unwritten while they do not press: less than a
        // PRESSURE_DIVISOR-th of their shares of the most headroom they read (past it, they
        // write at their next round, as every instance of an eager fleet does), with room for
        // what they admit until then.
        let widest = (l.max as i128 - r.lowest() as i128).max(0);
        let theirs = 1.0 - r.least_share() as f64;
        let others = (theirs * widest as f64 / RESERVE_DIVISOR).ceil() as i128;
        allowance = allowance.min(shared - others);
        held = held.max(others);
    }
    if let Some(b) = budget.filter(|_| !l.kind.is_tokens()) {
        allowance = allowance.min(regional_allowance(l, s, now, b, false));
    }
    let used = pending as i128 + s.settling as i128 + cost as i128;
    ShareUse {
        within: used <= allowance,
        pressing: used * PRESSURE_DIVISOR > allowance,
        held,
        // A read held back by the one before it may lack the others' latest writes.
        others_hold_none: others == 0 && lag == 0,
    }
}

/// This instance's share of its region's budget while another region is unheard:
/// `share_in_region x (budget - region_stored)`, the region's own fleet formula over
/// the region's part of the count; `exact` (a strict check, whose read counted every hit of
/// the region): the whole of the region's headroom. A counter read before the regions were
/// known (no part) takes the whole count as the region's and an even split as its earned
/// share, until it is read again: it errs low.
pub(super) fn regional_allowance(
    l: &Limit,
    s: &LimitState,
    now: i64,
    b: Budget,
    exact: bool,
) -> i128 {
    // The region's count as of the last read: the part's buckets are only ever set by reads,
    // while the whole count's also take this instance's writes since (`settling`).
    let (stored, share, earned) = match s.region() {
        Some(p) => {
            let est = window::estimate_by(l.kind, &p.buckets, s.carry(), now, |b| b.stored);
            (est as i128, p.share, p.earned)
        }
        None => {
            let est = window::estimate_by(l.kind, &s.buckets, s.carry(), now, |b| b.stored);
            let regions = b.regions.max(1) as f32;
            (est as i128 - s.settling as i128, s.share, 1.0 / regions)
        }
    };
    let fraction = b.fixed.unwrap_or(earned).clamp(0.0, 1.0) as f64;
    let budget = (fraction * l.max as f64).floor() as i128;
    let headroom = (budget - stored).max(0);
    if exact {
        return headroom;
    }
    (share as f64 * headroom as f64).floor() as i128
}
