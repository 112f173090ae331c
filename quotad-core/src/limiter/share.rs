//! Shares of the headroom among instances (`cached` consistency, `instances` > 1).
//!
//! With one store shard per instance, each instance may admit, between two syncs, at most its
//! share of the headroom it last read: `pending <= share x (max - stored)`. Shares follow demand,
//! from the per-shard counts every read returns at no extra write: `share = (mine + a) / (total +
//! a x N)` over the limit's window, with `a = 1 + total/100`, so the shares of all instances add
//! up to 1, an instance carrying all the traffic gets nearly all the headroom, a newcomer or a key nobody has counted gets 1/N, and an instance that stops writing
//! fades out as its hits leave the window. If all instances read the store at the same moment
//! they could never overshoot together; reads at different moments leave a small overshoot,
//! measured by the simulation in `tests/simulation/` and reported in docs/accuracy.md.
//!
//!
//! What a check may take of its share, and what the others may hold, is [`super::allowance`].

use std::sync::Arc;

use super::allowance::{Budget, Fleet};
use super::membership::Membership;
use super::reserve::{Pace, Reserve};
use super::state::{LimitState, RegionPart};
use super::window::Bucket;
use super::{window, LimiterConfig};
use crate::domain::{Consistency, Grain, LimitKind, Policy};
use crate::store::{BucketTotal, CounterRange};

/// An instance's demand-weighted share of a counter's headroom, from the store's per-shard
/// counts over the window (see the module comment).
///
/// Only settled buckets count: those that closed before `settled`, which every instance has
/// written by now (two sync intervals ago when every instance writes every round; with
/// `sync.max_delay_ms`, that delay more; no later than an instance's last report of its
/// writes while its writes fail: `Shares::settled`). A fresher bucket holds this instance's own hits in
/// full but the others' only up to their last write, and would make every instance think its
/// share larger than it is (the shares would add up to more than 1).
///
/// With nothing settled in the window, the share `kept` from an earlier read stands: no new
/// evidence. Traffic that fills a window in bursts leaves it so between them, and the window's
/// unsettled bucket holds this instance's newest hits but not yet all of the others' (shares
/// from it would add up to more than 1, and a burst would take more than the room). A key not
/// read before (`kept` None) has nothing to keep: `eager` then takes what the fleet wrote so
/// far; without it, every instance gets 1/N until something settles. Only a fleet that writes
/// every round may be eager: where others write lazily, what they wrote so far says nothing of
/// what they hold.
pub fn share_of(
    totals: &[BucketTotal],
    (grain, from, settled): (Grain, i64, i64),
    instances: u32,
    eager: bool,
    kept: Option<f32>,
) -> f32 {
    part_of(
        totals,
        grain,
        from,
        settled,
        instances,
        (eager, kept),
        |t| (t.mine, t.total),
    )
}

/// [`share_of`] of any part of a whole that `parts` takes from each bucket: this instance's
/// of the fleet's, this instance's of its region's, or its region's of the fleet's (with
/// `instances` the number of parts).
fn part_of(
    totals: &[BucketTotal],
    grain: Grain,
    from: i64,
    settled: i64,
    instances: u32,
    (eager, kept): (bool, Option<f32>),
    parts: impl Fn(&BucketTotal) -> (i64, i64),
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
            let (part, whole) = parts(t);
            mine += part.max(0) as f64;
            total += whole.max(0) as f64;
        }
        (mine, total)
    };
    let (mut mine, mut total) = sum(true);
    if let Some(k) = kept.filter(|_| total == 0.0) {
        return k;
    }
    if total == 0.0 && eager {
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

impl LimitState {
    /// The reads this instance made of the counter lately (in a fleet).
    pub(super) fn seen(&self) -> Option<&Reserve> {
        self.aux.as_ref().and_then(|a| a.seen.as_ref())
    }

    /// How the last read back compared with the one before (in a fleet; windows only).
    pub(super) fn pace(&self) -> Option<&Pace> {
        self.aux.as_ref().and_then(|a| a.pace.as_ref())
    }

    /// The share, the count as the store last showed it and the hits written since, at
    /// `now`: what a read back compares with the one before ([`Pace`]). None for a token
    /// bucket, whose level is not a sum of shares.
    pub(super) fn view(&self, now: i64) -> Option<(f32, i64, u64)> {
        if self.kind.is_tokens() {
            return None;
        }
        let est = window::estimate_by(self.kind, &self.buckets, self.carry(), now, |b| b.stored);
        let read = est.saturating_sub(self.settling.min(i64::MAX as u64) as i64);
        Some((self.share, read, self.settling))
    }

    /// Notes a read's count `est` at `period` of `Shares::seen_span` (in a fleet).
    pub(super) fn note_seen(&mut self, period: i64, est: i64) {
        let share = self.share;
        let aux = self.aux.get_or_insert_with(Box::default);
        Reserve::note(&mut aux.seen, period, est, share);
    }
}

/// Entries not read back otherwise are read back every this many times the rounds between
/// their writes (`sync.max_delay_ms`), and at least every [`REFRESH_IDLE_EVERY`] rounds: so
/// what other instances did (or the store counted directly: strict checks, checks beyond a
/// memory cap) reaches them even while this one only holds them.
const REFRESH_IDLE_FACTOR: u32 = 4;
const REFRESH_IDLE_EVERY: u32 = 8;

/// This instance's place in the fleet, and the sync timing that shares and spans follow.
pub(super) struct Shares {
    pub(super) fleet: Arc<Membership>,
    idle_ms: i64,
    sync_interval_ms: i64,
    max_sync_delay_ms: i64,
}

impl Shares {
    pub(super) fn new(cfg: &LimiterConfig) -> Self {
        Shares {
            fleet: cfg.fleet.clone(),
            idle_ms: cfg.idle_ms,
            sync_interval_ms: cfg.sync_interval_ms,
            max_sync_delay_ms: cfg.max_sync_delay_ms,
        }
    }

    /// How long a counter that nothing presses waits to be written beyond a round (ms):
    /// `sync.max_delay_ms` less the interval, 0 in a fleet that writes every round.
    pub(super) fn write_lag_ms(&self) -> i64 {
        let interval = self.sync_interval_ms;
        self.max_sync_delay_ms.max(interval) - interval
    }

    /// Sync rounds at every tick from `since` to `tick` (fleet clock, ms) wrote every hit
    /// they took with an answer (`None`: one round took every pending hit). Every hit admitted
    /// before `tick`, less the delay a counter that nothing presses waits, is in the store:
    /// what the fleet task reports to the others ([`Membership::written_ms`]).
    pub(super) fn note_written(&self, since: Option<i64>, tick: i64) {
        let through = since.map_or(tick, |_| tick - self.write_lag_ms());
        if since.is_none_or(|s| through >= s) {
            self.fleet.note_written(through);
        }
    }

    /// The sync interval (ms), at least 1.
    pub(super) fn interval_ms(&self) -> i64 {
        self.sync_interval_ms.max(1)
    }

    /// Sync rounds between two writes of a counter that nothing presses, and between two
    /// reads back of one nobody writes.
    /// The write span is the whole delay, whatever it is in rounds (60 s is 240 rounds of
    /// 250 ms): a cap here would write more often than asked and load the store for nothing.
    pub(super) fn round_spans(&self) -> (u16, u16) {
        let interval = self.sync_interval_ms.max(1);
        let rounds = |n: i64| n.clamp(1, i64::from(u16::MAX)) as u16;
        let write = rounds(self.max_sync_delay_ms / interval);
        let read = i64::from(write) * i64::from(REFRESH_IDLE_FACTOR);
        (write, rounds(read.max(i64::from(REFRESH_IDLE_EVERY))))
    }

    /// This region's part of a counter read back over `r`, in a fleet of several regions
    /// (`None` otherwise). While another region is unheard, the region's earned share is
    /// the one `kept` from before, else what the buckets settled before the cut say.
    pub(super) fn region_part(
        &self,
        totals: &[BucketTotal],
        r: &CounterRange,
        now: i64,
        kept: Option<f32>,
    ) -> Option<RegionPart> {
        let m = &self.fleet;
        if m.regions() <= 1 {
            return None;
        }
        let (settled, eager) = self.settled(now);
        let (g, from) = (r.key.grain, r.from);
        let ways = (eager, None);
        let share = part_of(totals, g, from, settled, m.region_members(), ways, |t| {
            (t.mine, t.region)
        });
        let earned = match (m.cut_since(), kept) {
            (Some(_), Some(k)) => k,
            (cut, _) => {
                let settled = cut.map_or(settled, |c| settled.min(c));
                part_of(totals, g, from, settled, m.regions(), (eager, None), |t| {
                    (t.region, t.total)
                })
            }
        };
        let buckets = totals
            .iter()
            .map(|t| Bucket {
                start: t.start,
                stored: t.region,
                pending: 0,
                mine: 0,
            })
            .collect();
        Some(RegionPart {
            buckets,
            share,
            earned,
        })
    }

    /// The span of a [`Reserve`](super::state::Reserve) period, in a fleet that writes lazily;
    /// None where every instance writes every round (or it is alone).
    pub(super) fn reserve_span(&self) -> Option<i64> {
        let interval = self.sync_interval_ms.max(1);
        (self.fleet.members() > 1 && self.max_sync_delay_ms > interval)
            .then(|| self.max_sync_delay_ms + interval)
    }

    /// The span in which every other instance of a fleet has read a counter it holds hits of:
    /// an instance reads a counter back whenever it writes it, and at least every few rounds
    /// while it holds it ([`Shares::round_spans`]). None alone.
    pub(super) fn seen_span(&self) -> Option<i64> {
        let interval = self.sync_interval_ms.max(1);
        (self.fleet.members() > 1).then(|| {
            let (_, read_every) = self.round_spans();
            (i64::from(read_every) + 1) * interval
        })
    }

    /// Notes a read's count in a state's reserve (windows only: a token bucket's level is not
    /// a sum of shares), and in a fleet in the reads seen lately (`allowance::others_hold`).
    /// `before`, [`LimitState::view`] before a sync's read back came in: how the read compares
    /// with the one before ([`Pace`]); None for a read that leaves that as it was.
    pub(super) fn note_read(&self, s: &mut LimitState, now: i64, before: Option<(f32, i64, u64)>) {
        if let Some(span) = self.seen_span() {
            let est = window::estimate_by(s.kind, &s.buckets, s.carry(), now, |b| b.stored);
            s.note_seen(now.div_euclid(span), est);
            if let Some(b) = before {
                let pace = s.view(now).map(|after| Pace::new(b, after));
                if let Some(a) = s.aux.as_mut() {
                    a.pace = pace;
                }
            }
        }
        let read = self
            .reserve_span()
            .filter(|_| !s.kind.is_tokens())
            .map(|span| {
                let est = window::estimate_by(s.kind, &s.buckets, s.carry(), now, |b| b.stored);
                (now.div_euclid(span), est)
            });
        s.note_reserve(read);
    }

    /// A state's share once a read back over `r` comes in: a sliding window read in this seen
    /// span or the last keeps the share it has while nothing has settled in it (see
    /// [`share_of`]); a calendar period's one bucket settles only as it ends, and a state not
    /// read for longer has no share of its own to keep.
    pub(super) fn reshare(
        &self,
        s: &LimitState,
        totals: &[BucketTotal],
        r: &CounterRange,
        now: i64,
    ) -> f32 {
        let sliding = matches!(s.kind, LimitKind::Sliding { .. });
        let span = self.seen_span().unwrap_or(1).max(1);
        let kept = s
            .seen()
            .filter(|seen| sliding && seen.recent(now.div_euclid(span)))
            .map(|_| s.share);
        self.share(totals, r, now, kept)
    }

    /// This instance's share of a counter read back over `r`; `kept`, the share it has from
    /// an earlier read (see [`share_of`]).
    pub(super) fn share(
        &self,
        totals: &[BucketTotal],
        r: &CounterRange,
        now: i64,
        kept: Option<f32>,
    ) -> f32 {
        let (settled, eager) = self.settled(now);
        let n = self.fleet.members();
        share_of(totals, (r.key.grain, r.from, settled), n, eager, kept)
    }

    /// Until when every instance has written its hits at `now` (buckets that ended before
    /// count in shares: see [`share_of`]), and whether the fleet writes every round (eager).
    ///
    /// Two intervals ago (and `sync.max_delay_ms` more where the fleet writes lazily), while
    /// every other instance's writes are answered. One whose report of its writes
    /// ([`Membership::others_written`]) is older than a healthy one can be (its rounds' writes
    /// fail or go unanswered) has hits after it that the store may not show: no bucket after
    /// its report is settled until it reports again. Taken as settled, such a bucket would
    /// show that instance idle, and the others' shares would grow into the room its unseen
    /// hits already took.
    fn settled(&self, now: i64) -> (i64, bool) {
        let interval = self.sync_interval_ms;
        let lag = self.write_lag_ms();
        let settled = now - 2 * interval - lag;
        let behind = self.fleet.others_written().filter(|&(written, every)| {
            // A report made within a round of its tick, written and read a heartbeat each.
            let fresh = lag
                .saturating_add(2 * interval)
                .saturating_add(2 * every)
                .saturating_add(self.fleet.clock_uncertainty_ms());
            now.saturating_sub(written) > fresh
        });
        let settled = behind.map_or(settled, |(written, _)| settled.min(written));
        (settled, lag == 0)
    }

    pub(super) fn fleet(&self, policy: &Policy) -> Fleet {
        let budget = self.budget(policy);
        // Across regions a store read does not see the others' latest hits: the last units
        // stay shared out there (docs/accuracy.md).
        let one_region = self.fleet.regions() <= 1;
        Fleet {
            shares: (self.fleet.members() > 1 || budget.is_some())
                && policy.consistency == Consistency::Cached,
            last_units: one_region,
            seen_span: self.seen_span().unwrap_or(0),
            sync_interval_ms: self.sync_interval_ms,
            budget,
            members: self.fleet.members(),
            idle_ms: self.idle_ms,
            skew_ms: self.fleet.clock_uncertainty_ms(),
        }
    }

    /// This region's budget, while another region is unheard.
    fn budget(&self, policy: &Policy) -> Option<Budget> {
        let m = &self.fleet;
        m.cut_since()?;
        let fixed = m.region().and_then(|r| policy.region_split(r));
        Some(Budget {
            fixed,
            regions: m.regions(),
        })
    }

    /// How the local view of a failing store sees the fleet: shares bind whatever the
    /// consistency, so that a strict counter too takes only its share of the headroom it last
    /// saw while the others cannot see its hits.
    pub(super) fn fleet_failing(&self, policy: &Policy) -> Fleet {
        let budget = self.budget(policy);
        Fleet {
            shares: self.fleet.members() > 1 || budget.is_some(),
            last_units: false,
            seen_span: self.seen_span().unwrap_or(0),
            sync_interval_ms: self.sync_interval_ms,
            budget,
            members: self.fleet.members(),
            idle_ms: self.idle_ms,
            skew_ms: self.fleet.clock_uncertainty_ms(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_waits_the_whole_delay_it_is_given() {
        let spans = |max_sync_delay_ms| {
            Shares::new(&LimiterConfig {
                sync_interval_ms: 250,
                max_sync_delay_ms,
                ..LimiterConfig::default()
            })
            .round_spans()
        };
        // Every round; then the delay in rounds, however long, and reads four delays apart.
        assert_eq!(spans(250), (1, 8));
        assert_eq!(spans(2_000), (8, 32));
        assert_eq!(spans(10_000), (40, 160));
        assert_eq!(spans(60_000), (240, 960));
    }

    #[test]
    fn a_window_with_nothing_settled_keeps_the_share_it_had() {
        // This instance's 300 written, the other's 100 of its burst so far: none settled.
        let t = [BucketTotal {
            start: 9_000,
            total: 400,
            mine: 300,
            region: 400,
        }];
        let window = (Grain::Fixed(1_000), 0, 9_500);
        assert_eq!(share_of(&t, window, 2, true, Some(0.5)), 0.5);
        // Never read before: what the fleet wrote so far (eager).
        assert!(share_of(&t, window, 2, true, None) > 0.7);
        // Something settled: the settled buckets decide, whatever was kept.
        let settled = (Grain::Fixed(1_000), 0, 10_000);
        assert!(share_of(&t, settled, 2, true, Some(0.5)) > 0.7);
    }

    #[test]
    fn no_bucket_after_a_stalled_instances_report_is_settled() {
        let fleet = Arc::new(Membership::alone());
        fleet.set_members(2);
        let shares = Shares::new(&LimiterConfig {
            sync_interval_ms: 250,
            max_sync_delay_ms: 250,
            fleet: fleet.clone(),
            ..LimiterConfig::default()
        });
        // The last second shows this instance's 400 alone: the other's writes are not seen.
        let t = [BucketTotal::alone(9_000, 400)];
        let r = CounterRange {
            key: crate::store::CounterKey {
                tenant: "acme".into(),
                subject: "k".into(),
                limit: "l".into(),
                grain: Grain::Fixed(1_000),
            },
            from: 0,
            to: 10_000,
        };
        let now = 10_600;
        // The other reports its writes answered until a round ago: the second has settled.
        fleet.set_others_written(Some(10_250), 1_000);
        assert!(shares.share(&t, &r, now, Some(0.5)) > 0.9);
        // Its report is older than a healthy one can be (two heartbeats, two intervals): its
        // writes fail, and the second after it is not settled, so the share kept stands.
        fleet.set_others_written(Some(8_000), 1_000);
        assert_eq!(shares.share(&t, &r, now, Some(0.5)), 0.5);
        // As old as a healthy report may be: taken as current.
        fleet.set_others_written(Some(now - 2_500), 1_000);
        assert!(shares.share(&t, &r, now, Some(0.5)) > 0.9);
        // Its clock read uncertainly: that much older still passes.
        fleet.set_others_written(Some(now - 2_700), 1_000);
        fleet.set_clock_uncertainty(300);
        assert!(shares.share(&t, &r, now, Some(0.5)) > 0.9);
    }

    #[test]
    fn after_a_reset_no_instance_takes_more_than_an_equal_share() {
        // This instance's shard holds +3, another's -3 (a reset written there): the total is 0.
        let t = [BucketTotal {
            start: 0,
            total: 0,
            mine: 3,
            region: 0,
        }];
        let s = share_of(&t, (Grain::Fixed(1_000), 0, 10_000), 2, true, None);
        assert!((s - 0.5).abs() < 1e-6, "{s}");
        // In the ordinary case the busy instance still gets most of the headroom.
        let busy = [BucketTotal::alone(0, 100)];
        assert!(share_of(&busy, (Grain::Fixed(1_000), 0, 10_000), 3, true, None) > 0.9);
    }
}
