//! The regions of a fleet that spans data centres: each region writes a heartbeat row that the
//! store replicates to the others, and reads theirs from its own replicas. A region whose row
//! has not moved for `fleet.region_stale_ms` is cut off (or its writes lag that far): from
//! then on this region's counters keep to their budgets (`limiter::share`), until it is heard
//! again. The age of each region's row is also its replication lag, give or take a heartbeat.

use super::Fleet;
use crate::limiter::RegionSeen;
use crate::store::lease::{slot_of, Member, RegionBeat};

/// Heartbeat ages kept per region: the replication lag is the least of them (a row is read at
/// some moment after it was written, so each age is the lag plus that moment).
const LAG_SAMPLES: usize = 16;

/// What one reading of the heartbeats says.
#[derive(Debug, PartialEq, Eq)]
pub struct Judged {
    /// Regions heard of, this one included.
    pub regions: u32,
    /// Since when a region has been unheard (its last heartbeat), while one is, or was until
    /// less than the heal grace ago: counters keep to their budgets meanwhile.
    pub cut_since: Option<i64>,
    /// The replication lag from the regions heard now, ms: what a sync round's read back waits
    /// beyond its settle time, so that it sees every region's writes of the same tick.
    pub lag_ms: i64,
    pub seen: Vec<RegionSeen>,
}

/// What this region knows of the others' heartbeats over time.
#[derive(Debug, Default)]
pub struct Watch {
    regions: Vec<Watched>,
}

#[derive(Debug)]
struct Watched {
    region: String,
    /// Its last heartbeat before it went unheard, while it is or heals.
    cut_since: Option<i64>,
    /// When it was heard again after a cut, and the first heartbeat then heard.
    heard_again: Option<(i64, i64)>,
    /// When the heartbeats it wrote just before it was heard again were found here: what it
    /// wrote during the cut has arrived (Cassandra replays it in the order it was written).
    replayed: Option<i64>,
    ages: std::collections::VecDeque<i64>,
}

/// How long a region heard again may take to replay what it wrote during a cut before it is
/// trusted anyway (with a warning): it may have been down rather than cut off, with nothing
/// to replay.
pub const REPLAY_TIMEOUT_MS: i64 = 60_000;

/// A region heard again after a cut, whose heartbeats of the cut have not been found yet: the
/// span `[from, to)` to look for them in.
#[derive(Debug, PartialEq, Eq)]
pub struct Replay {
    pub region: String,
    pub from: i64,
    pub to: i64,
}

impl Watch {
    /// Judges the regions' heartbeats `beats` at `now`, for the region holding `own` slot, with
    /// the live leases `members`. A region is cut off once its heartbeat is older than
    /// `stale_ms`, and stays so until it has been heard for `grace_ms` again: by then every
    /// counter in memory was read back with what it wrote while cut off.
    pub fn judge(
        &mut self,
        beats: &[RegionBeat],
        own: (&str, i16),
        members: &[Member],
        now: i64,
        stale_ms: i64,
        grace_ms: i64,
    ) -> Judged {
        let count = |slot: i16| members.iter().filter(|m| slot_of(m.shard) == slot).count() as u32;
        let mut seen = vec![RegionSeen {
            region: own.0.to_owned(),
            local: true,
            members: count(own.1),
            lag_ms: 0,
            cut_off: false,
        }];
        let (mut cut_since, mut lag_ms) = (None::<i64>, 0);
        for b in beats.iter().filter(|b| b.slot != own.1) {
            let w = match self.regions.iter().position(|w| w.region == b.region) {
                Some(i) => &mut self.regions[i],
                None => {
                    self.regions.push(Watched {
                        region: b.region.clone(),
                        cut_since: None,
                        heard_again: None,
                        replayed: None,
                        ages: Default::default(),
                    });
                    self.regions.last_mut().expect("just pushed")
                }
            };
            let age = (now - b.at_ms).max(0);
            if age > stale_ms {
                if w.cut_since.is_none() {
                    tracing::warn!(region = %w.region, lag_ms = age, "region unheard: counters keep to this region's budget");
                    w.cut_since = Some(b.at_ms);
                }
                w.heard_again = None;
                w.replayed = None;
                w.ages.clear();
            } else {
                if w.ages.len() == LAG_SAMPLES {
                    w.ages.pop_front();
                }
                w.ages.push_back(age);
                lag_ms = lag_ms.max(w.ages.iter().copied().min().unwrap_or(0));
                if w.cut_since.is_some() {
                    let (back, _) = *w.heard_again.get_or_insert((now, b.at_ms));
                    if now - back >= REPLAY_TIMEOUT_MS && w.replayed.is_none() {
                        tracing::warn!(region = %w.region, "the heartbeats of a cut did not arrive in {REPLAY_TIMEOUT_MS} ms: trusting the region anyway (if the cut outlasted the hint window, run nodetool repair)");
                        w.replayed = Some(now);
                    }
                    if w.replayed.is_some_and(|r| now - r >= grace_ms) {
                        tracing::info!(region = %w.region, lag_ms = age, "region heard again: counters share the whole limit");
                        w.cut_since = None;
                        w.heard_again = None;
                        w.replayed = None;
                    }
                }
            }
            if let Some(c) = w.cut_since {
                cut_since = Some(cut_since.map_or(c, |x| x.min(c)));
            }
            seen.push(RegionSeen {
                region: b.region.clone(),
                local: false,
                members: count(b.slot),
                lag_ms: age,
                cut_off: w.cut_since.is_some(),
            });
        }
        seen[1..].sort_by(|a, b| a.region.cmp(&b.region));
        Judged {
            regions: seen.len() as u32,
            cut_since,
            lag_ms,
            seen,
        }
    }
}

impl Watch {
    /// The regions heard again whose heartbeats of the cut are still to be found: each with
    /// the span just before its first heartbeat heard again (`stale_ms` long).
    pub fn replays(&self, stale_ms: i64) -> Vec<Replay> {
        self.regions
            .iter()
            .filter(|w| w.replayed.is_none())
            .filter_map(|w| {
                let (_, fresh) = w.heard_again?;
                Some(Replay {
                    region: w.region.clone(),
                    from: fresh - stale_ms,
                    to: fresh,
                })
            })
            .collect()
    }

    /// Notes the heartbeats `ats` of a region found in its [`Replay`] span: once they cover it,
    /// without a gap of more than two heartbeats, what it wrote during the cut has arrived.
    pub fn found(&mut self, replay: &Replay, ats: &[i64], beat_ms: i64, now: i64) {
        let gap = 2 * beat_ms;
        let covered = ats.first().is_some_and(|&f| f <= replay.from + gap)
            && ats.last().is_some_and(|&l| l >= replay.to - gap)
            && ats.windows(2).all(|w| w[1] - w[0] <= gap);
        if let Some(w) = self.regions.iter_mut().find(|w| w.region == replay.region) {
            if covered && w.heard_again.is_some() && w.replayed.is_none() {
                w.replayed = Some(now);
            }
        }
    }
}

impl Fleet {
    /// One region heartbeat: writes this region's row, then reads every region's and judges
    /// them. A failed read keeps the last judgement (the store failing is the failure rule's).
    pub(super) async fn region_round(&mut self) {
        let Some((region, slot)) = self.region.clone() else {
            return;
        };
        let now = chrono::Utc::now().timestamp_millis();
        if let Err(e) = self.call(self.store.beat(now)).await {
            tracing::debug!(error = %e, "writing the region heartbeat failed");
        }
        let beats = match self.call(self.store.regions()).await {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(error = %e, "reading the regions' heartbeats failed");
                return;
            }
        };
        let stale = self.cfg.region_stale.as_millis() as i64;
        let grace = self.cfg.heal_grace.as_millis() as i64;
        let beat = self.cfg.region_heartbeat.as_millis() as i64;
        for r in self.watch.replays(stale) {
            match self
                .call(self.store.beats_between(&r.region, r.from, r.to))
                .await
            {
                Ok(ats) => self.watch.found(&r, &ats, beat, now),
                Err(e) => tracing::debug!(error = %e, "reading a region's heartbeats failed"),
            }
        }
        let j = self
            .watch
            .judge(&beats, (&region, slot), &self.live, now, stale, grace);
        for r in &j.seen {
            let remote = (!r.local).then_some((r.lag_ms, r.cut_off));
            self.metrics.fleet().region(&r.region, r.members, remote);
        }
        self.view.set_regions(j.regions, j.cut_since);
        self.view.set_replication_lag_ms(j.lag_ms);
        self.view.set_seen(j.seen);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(region: &str, slot: i16, at_ms: i64) -> RegionBeat {
        RegionBeat {
            region: region.into(),
            slot,
            at_ms,
        }
    }

    fn member(shard: i16) -> Member {
        Member::new(shard, format!("o{shard}"))
    }

    #[test]
    fn a_region_is_cut_off_once_its_heartbeat_is_older_than_the_limit() {
        let members = [member(0), member(1), member(256), member(512)];
        let beats = [
            beat("eu", 0, 9_900),
            beat("us", 1, 9_500),
            beat("ap", 2, 8_000),
        ];
        let mut w = Watch::default();
        let j = w.judge(&beats, ("eu", 0), &members, 10_000, 1_000, 2_000);
        assert_eq!(j.regions, 3);
        assert_eq!(j.cut_since, Some(8_000));
        let got: Vec<(&str, u32, i64, bool)> = j
            .seen
            .iter()
            .map(|r| (r.region.as_str(), r.members, r.lag_ms, r.cut_off))
            .collect();
        assert_eq!(
            got,
            [
                ("eu", 2, 0, false),
                ("ap", 1, 2_000, true),
                ("us", 1, 500, false)
            ]
        );
        // The lag is the least age seen of a region heard.
        assert_eq!(j.lag_ms, 500);
        // Heard again: still cut off until its heartbeats of the cut are found here, and a
        // grace after that.
        let beats = [
            beat("eu", 0, 10_900),
            beat("us", 1, 10_800),
            beat("ap", 2, 10_700),
        ];
        let j = w.judge(&beats, ("eu", 0), &members, 11_000, 1_000, 2_000);
        assert_eq!(j.cut_since, Some(8_000));
        assert!(j.seen.iter().any(|r| r.region == "ap" && r.cut_off));
        let replays = w.replays(1_000);
        let want = Replay {
            region: "ap".into(),
            from: 9_700,
            to: 10_700,
        };
        assert_eq!(replays, [want]);
        let r = &replays[0];
        // A gap, then too little: not yet.
        w.found(r, &[9_700, 10_000, 10_600], 100, 11_500);
        w.found(r, &[9_700, 9_900], 100, 11_500);
        let beats = [
            beat("eu", 0, 13_900),
            beat("us", 1, 13_900),
            beat("ap", 2, 13_950),
        ];
        let j = w.judge(&beats, ("eu", 0), &members, 14_000, 1_000, 2_000);
        assert_eq!(j.cut_since, Some(8_000), "nothing of the cut has arrived");
        // Every heartbeat of the span: replayed; still cut off for the grace, then not.
        let every: Vec<i64> = (0..10).map(|i| 9_700 + i * 100).collect();
        w.found(r, &every, 100, 14_000);
        assert!(w.replays(1_000).is_empty());
        let at = |t: i64| [beat("eu", 0, t), beat("us", 1, t), beat("ap", 2, t)];
        let j = w.judge(&at(14_900), ("eu", 0), &members, 15_000, 1_000, 2_000);
        assert_eq!(j.cut_since, Some(8_000));
        let j = w.judge(&at(15_990), ("eu", 0), &members, 16_000, 1_000, 2_000);
        assert_eq!(j.cut_since, None);
        // ap's ages heard: 300, 50, 50, 100, 10; us's: 500, 200, 100, 100, 100, 10.
        assert_eq!(j.lag_ms, 10);
    }

    #[test]
    fn a_region_whose_cut_never_arrives_is_trusted_after_the_replay_timeout() {
        let mut w = Watch::default();
        let members = [member(0), member(256)];
        w.judge(
            &[beat("us", 1, 0)],
            ("eu", 0),
            &members,
            5_000,
            1_000,
            2_000,
        );
        let j = w.judge(
            &[beat("us", 1, 5_900)],
            ("eu", 0),
            &members,
            6_000,
            1_000,
            2_000,
        );
        assert_eq!(j.cut_since, Some(0));
        let late = 6_000 + REPLAY_TIMEOUT_MS;
        let fresh = [beat("us", 1, late - 100)];
        let j = w.judge(&fresh, ("eu", 0), &members, late, 1_000, 2_000);
        assert_eq!(j.cut_since, Some(0), "trusted from now, after the grace");
        let fresh = [beat("us", 1, late + 1_900)];
        let j = w.judge(&fresh, ("eu", 0), &members, late + 2_000, 1_000, 2_000);
        assert_eq!(j.cut_since, None);
    }

    #[test]
    fn a_region_alone_is_one_region_even_before_its_first_heartbeat_is_read() {
        let j = Watch::default().judge(&[], ("eu", 0), &[member(0)], 10_000, 1_000, 2_000);
        assert_eq!((j.regions, j.cut_since), (1, None));
        assert_eq!(j.seen.len(), 1);
        assert!(j.seen[0].local);
    }
}
