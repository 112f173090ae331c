//! What an instance of a fleet that writes lazily holds back for the others' unwritten hits,
//! the reads an instance of any fleet made of a counter lately (`allowance::others_hold`), and
//! how its last read compares with the one before ([`Pace`]).

/// The lowest count the store showed for a counter over the last two periods of
/// `sync.max_delay_ms` + one interval, in a fleet that writes lazily.
///
/// Another instance that does not press on its share holds less than an eighth of its share of
/// the headroom it read unwritten (past that, it writes at its next round), and it read within
/// that span: this instance reserves `(1 - share) x (max - lowest) / 4` for them, twice that,
/// for what they admit between pressing and writing. An instance that
/// reads again (because it presses on its share) sees its own written hits shrink the headroom,
/// but not what the others hold; without this reserve, its share of a shrinking headroom would
/// add up, read after read, to all of it, on top of what the others hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Reserve {
    period: i64,
    /// The period of the first read noted since the last gap: before two more periods have
    /// begun, the reads noted do not cover a whole span.
    first: i64,
    /// The lowest count of the previous period and of the current one.
    lowest: [i64; 2],
    /// This instance's least share in each: the others' shares were at most the rest.
    least_share: [f32; 2],
}

impl Reserve {
    /// Notes a read's count `est` and this instance's new `share` at period `period` (time
    /// divided by the span).
    pub(super) fn note(r: &mut Option<Reserve>, period: i64, est: i64, share: f32) {
        match r {
            None => {
                *r = Some(Reserve {
                    period,
                    first: period,
                    lowest: [est, est],
                    least_share: [share, share],
                })
            }
            Some(x) if period > x.period => {
                let (est0, share0) = if period == x.period + 1 {
                    (x.lowest[1], x.least_share[1])
                } else {
                    x.first = period;
                    (est, share)
                };
                x.lowest = [est0, est];
                x.least_share = [share0, share];
                x.period = period;
            }
            Some(x) => {
                x.lowest[1] = x.lowest[1].min(est);
                x.least_share[1] = x.least_share[1].min(share);
            }
        }
    }

    /// The lowest count over both periods.
    pub(super) fn lowest(&self) -> i64 {
        self.lowest[0].min(self.lowest[1])
    }

    /// Whether the reads noted cover a whole span before `period` (the current one).
    pub(super) fn covers(&self, period: i64) -> bool {
        period == self.period && period >= self.first + 2
    }

    /// Whether a read was noted in `period` or the one before it: reads with no gap of a
    /// whole period up to now.
    pub(super) fn recent(&self, period: i64) -> bool {
        (self.period..=self.period + 1).contains(&period)
    }

    /// This instance's least share over both periods.
    pub(super) fn least_share(&self) -> f32 {
        self.least_share[0].min(self.least_share[1])
    }
}

/// A read back against the read before it, in a fleet: where it shows none of the others'
/// writes since that read, the allowance of this instance is the lesser of what each left it.
///
/// A read that shows this instance's latest writes but not yet the others' of the same round
/// (theirs still under way: a loaded instance, a slow replica) would hand this instance its
/// share of headroom the others have already taken: after a burst both took their shares of,
/// the one whose writes landed first would take half as much again. The allowance the read
/// before left, less what this instance took since, bounds what it may still take as well;
/// once a later read shows the others' writes, that read's allowance stands again.
///
/// A read that shows some of the others' writes stands as it is. In steady traffic, and where
/// a share grows because the settled buckets show this instance's demand (an instance that
/// joined), the lesser allowance would deny for a round what the fleet has room for; the cost
/// is that of three or more instances, one whose writes are late while another's show still
/// leaves its part unseen (docs/accuracy.md).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Pace {
    /// The share, and the count less this instance's writes it did not show, as the read
    /// before left them (weighed at this read's time).
    before: (f32, i64),
    /// The same, as this read left them.
    after: (f32, i64),
    /// This instance's hits written between the two reads that this read shows.
    shown: u64,
}

impl Pace {
    /// From [`LimitState::view`](super::state::LimitState::view) before and after a read.
    pub(super) fn new(before: (f32, i64, u64), after: (f32, i64, u64)) -> Pace {
        Pace {
            before: (before.0, before.1),
            after: (after.0, after.1),
            shown: before.2.saturating_sub(after.2),
        }
    }

    /// How much more this read's allowance is than the one the read before left (a limit of
    /// `max`, `zone` of it shared out to nobody), where the read shows none of the others'
    /// writes since: held back until the next read. 0 otherwise.
    pub(super) fn lag(&self, max: u64, zone: u64) -> i128 {
        let room = |(share, count): (f32, i64)| {
            let shared = (max as i128 - zone as i128 - count as i128).max(0);
            (share.clamp(0.0, 1.0) as f64 * shared as f64).floor() as i128
        };
        let grew = self.after.1 as i128 - self.before.1 as i128 - self.shown as i128;
        if grew > 0 {
            return 0;
        }
        (room(self.after) - room(self.before) + self.shown as i128).max(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_remembers_the_lowest_count_and_least_share_of_two_periods() {
        let mut r = None;
        Reserve::note(&mut r, 10, 50, 0.5);
        Reserve::note(&mut r, 10, 80, 0.9);
        let x = r.unwrap();
        assert_eq!((x.lowest(), x.least_share()), (50, 0.5));
        // The next period keeps the last one's lowest.
        Reserve::note(&mut r, 11, 90, 0.9);
        let x = r.unwrap();
        assert_eq!((x.lowest(), x.least_share()), (50, 0.5));
        // Two periods later, the first is forgotten.
        Reserve::note(&mut r, 12, 95, 0.95);
        let x = r.unwrap();
        assert_eq!((x.lowest(), x.least_share()), (90, 0.9));
        // A gap of more than a period forgets everything before it.
        Reserve::note(&mut r, 20, 99, 0.99);
        let x = r.unwrap();
        assert_eq!((x.lowest(), x.least_share()), (99, 0.99));
    }

    #[test]
    fn it_covers_a_span_once_a_whole_period_has_been_noted() {
        let mut r = None;
        Reserve::note(&mut r, 10, 50, 0.5);
        Reserve::note(&mut r, 11, 60, 0.5);
        assert!(
            !r.unwrap().covers(11),
            "period 10 was noted only from its middle"
        );
        Reserve::note(&mut r, 12, 70, 0.5);
        assert!(r.unwrap().covers(12));
        assert!(
            !r.unwrap().covers(13),
            "nothing noted in the current period"
        );
        // A gap forgets the reads before it, and their cover.
        Reserve::note(&mut r, 20, 99, 0.99);
        assert!(!r.unwrap().covers(20));
    }

    #[test]
    fn reads_are_recent_until_a_whole_period_passes_without_one() {
        let mut r = None;
        Reserve::note(&mut r, 10, 50, 0.5);
        let x = r.unwrap();
        assert!(
            x.recent(10) && x.recent(11),
            "read in this period or the last"
        );
        assert!(!x.recent(12), "period 11 passed with no read");
    }

    #[test]
    fn a_read_that_shows_only_this_instances_burst_leaves_no_more_than_the_one_before() {
        // Both of two instances took their 500 of a window of 1000. This one's writes show,
        // the other's not yet; the share looks larger, from this instance's hits alone.
        let p = Pace::new((0.5, 0, 500), (0.75, 500, 0));
        assert_eq!(
            p.lag(1_000, 0),
            375,
            "0.75 x 500 of room, none left by the read before"
        );
        // Once the other's writes show, the read leaves nothing anyway.
        let p = Pace::new((0.75, 500, 0), (0.5, 1_000, 0));
        assert_eq!(p.lag(1_000, 0), 0);
        // Steady traffic: the other's writes grew the count by its share of the pace.
        let p = Pace::new((0.5, 200, 50), (0.5, 300, 0));
        assert_eq!(p.lag(1_000, 0), 0);
        // Alone, nothing is held back.
        let p = Pace::new((1.0, 200, 50), (1.0, 250, 0));
        assert_eq!(p.lag(1_000, 0), 0);
    }
}
