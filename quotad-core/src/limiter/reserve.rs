//! What an instance of a fleet that writes lazily holds back for the others' unwritten hits,
//! and the reads an instance of any fleet made of a counter lately (`share::others_hold`).

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

    /// This instance's least share over both periods.
    pub(super) fn least_share(&self) -> f32 {
        self.least_share[0].min(self.least_share[1])
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
}
