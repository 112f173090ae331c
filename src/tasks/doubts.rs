//! Sync writes of unknown outcome, settled by reading them back.
//!
//! A counter increment that was sent and not answered in time (a replica that led it died
//! or stopped answering) may have landed or not, and may still land: counter increments are
//! not idempotent, so it is not resent blindly. Each instance writes only its own shard's
//! cells, so it can tell what happened: it knows what its own cell held before the write
//! (`base`: the bucket's `mine` in the limiter when the round took it) and
//! what it wrote there since with an answer (`acked`), and a read at consistency `ALL` of its
//! own cell then says how much of what is in doubt landed.
//!
//! When the answer is final: Cassandra drops a mutation that waited past its timeout
//! (`counter_write_request_timeout_in_ms`, 5 s by default) before it ran, but a replica that
//! was paused or cut off counts that wait from when the message reached it. So a doubt is
//! read once it is `wait` old (`store.request_timeout_ms`, above the store's own timeouts) and
//! every replica answers at `ALL`; that read only proves the replicas are all up, and the one
//! `wait` after it, with every replica up since, is final: by then whatever reached a replica
//! before the first read has applied or been dropped. A read that fails starts the count
//! again. What did not land is sent again (directly, since its entry may have left memory)
//! and is in doubt again until that write is answered.
//!
//! A counter near its limit cannot wait for that: while a replica is down the read at `ALL`
//! waits for it, and until then the other instances cannot count hits they do not see, so
//! they would take them again. A write in doubt of such a counter is sent again at once, with
//! the next round (the round's caller says which: `again` in [`Doubts::note`]); the count
//! errs high if the first landed too, and the settling read takes back what landed twice.
//!
//! A settling read runs beside the rounds, and a cell's count is only worth comparing with what
//! was written there if no write of the cell was in flight while it was read: a round's write
//! of a cell that is being read waits for the next round ([`Doubts::begin_write`]), and a cell
//! whose write is in flight is not read ([`Doubts::due`]).
//!
//! Bounded: at most `most` cells are held; a doubt beyond that is given up on at once and
//! counted as `unknown`, as is what is still in doubt at exit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::store::{BucketTotal, CounterKey, CounterRange, Delta, Increments};

/// What became of one increment of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Landed,
    /// Sent, no answer: in doubt.
    Doubtful,
    /// Never sent, given back to pending (the limiter's own state says so).
    Unsent,
}

impl Outcome {
    /// Marks in `outcomes` (one a delta of the call, `Landed` before) what a store call's
    /// [`Increments`] say did not land.
    pub fn mark(outcomes: &mut [Outcome], parts: &Increments) {
        for &i in &parts.doubtful {
            outcomes[i] = Outcome::Doubtful;
        }
        for &i in &parts.unsent {
            outcomes[i] = Outcome::Unsent;
        }
    }
}

/// One of this instance's own cells with writes in doubt.
#[derive(Debug)]
struct Doubt {
    /// What the cell held before the first write in doubt.
    base: i64,
    /// What this instance meant the cell to gain since: each hit it admitted there once.
    intended: i64,
    /// Write deltas answered since.
    acked: i64,
    /// Write deltas sent in doubt since (some may be sent again: see [`Doubts::note`]).
    doubtful: i64,
    /// Hits of writes in doubt sent again since (or a taking back in doubt): what the cell
    /// may hold twice, and all a settling read takes back. Other writers of the cell (this
    /// instance's checks decided through the store) can make it hold more than was intended
    /// here, which is theirs.
    again: i64,
    /// When the last write in doubt went out.
    last_sent: Instant,
    /// When a read at `ALL` of the cell first succeeded, with every replica up since.
    witnessed: Option<Instant>,
    /// Round writes of the cell in flight (begun, not yet noted).
    writing: u32,
    /// A settling read of the cell is in flight.
    reading: bool,
}

impl Doubt {
    fn new(base: i64, now: Instant) -> Self {
        Doubt {
            base,
            intended: 0,
            acked: 0,
            doubtful: 0,
            again: 0,
            last_sent: now,
            witnessed: None,
            writing: 0,
            reading: false,
        }
    }

    /// Hits the cell may lack: intended and not written with an answer.
    fn owed(&self) -> u64 {
        self.intended.saturating_sub(self.acked).max(0) as u64
    }
}

/// What a settling read found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Increments that did not land, to be sent again, and takings back of hits that landed
    /// twice (negative).
    pub resend: Vec<Delta>,
    /// Hits found in the store.
    pub landed: u64,
}

/// The cells in doubt (see the module comment). Changes only through its methods.
#[derive(Debug)]
pub struct Doubts {
    cells: HashMap<(CounterKey, i64), Doubt>,
    wait: Duration,
    most: usize,
    /// Hits in doubt now (the sum of the cells' `owed`).
    hits: u64,
}

impl Doubts {
    pub fn new(wait: Duration, most: usize) -> Self {
        Doubts {
            cells: HashMap::new(),
            wait,
            most,
            hits: 0,
        }
    }

    /// Hits in doubt now.
    pub fn hits(&self) -> u64 {
        self.hits
    }

    /// Runs `f` on a cell, keeping `hits` the sum of what the cells owe.
    fn change(&mut self, cell: &(CounterKey, i64), f: impl FnOnce(&mut Doubt)) {
        if let Some(c) = self.cells.get_mut(cell) {
            let before = c.owed();
            f(c);
            self.hits = self.hits.saturating_sub(before).saturating_add(c.owed());
        }
    }

    /// A round is about to send `deltas`: marks the cells in doubt among them as being written,
    /// and returns which of them a settling read is reading now (those are not to be sent
    /// this round: held back, they are pending again). Every delta sent must then be noted
    /// ([`Doubts::note`]).
    pub fn begin_write(&mut self, deltas: &[Delta]) -> Vec<bool> {
        let mut held = vec![false; deltas.len()];
        if self.cells.is_empty() {
            return held;
        }
        for (d, held) in deltas.iter().zip(&mut held) {
            if let Some(c) = self.cells.get_mut(&(d.key.clone(), d.start)) {
                if c.reading {
                    *held = true;
                } else {
                    c.writing += 1;
                }
            }
        }
        held
    }

    /// Takes a round's writes: `bases[i]` is what `deltas[i]`'s own cell held before it, and
    /// `outcomes[i]` what became of it. A write in doubt whose `again[i]` is set is to be sent
    /// again at once, with the next round's writes (a counter near its limit: the other
    /// instances cannot count hits they cannot see): it may then land twice, and the settling
    /// read takes back what did. Returns the hits given up on at once (more cells in doubt than
    /// it holds), and which of those to send again it holds (the others are in doubt as any).
    pub fn note(
        &mut self,
        deltas: &[Delta],
        bases: &[i64],
        outcomes: &[Outcome],
        again: &[bool],
        now: Instant,
    ) -> (u64, Vec<usize>) {
        let mut given_up = 0;
        let mut resend = Vec::new();
        for (i, ((d, &base), &o)) in deltas.iter().zip(bases).zip(outcomes).enumerate() {
            let n = d.delta;
            if let Some(c) = self.cells.get_mut(&(d.key.clone(), d.start)) {
                c.writing = c.writing.saturating_sub(1);
            }
            match o {
                Outcome::Unsent => {}
                Outcome::Landed => {
                    if self.cells.is_empty() {
                        continue;
                    }
                    self.change(&(d.key.clone(), d.start), |c| {
                        c.acked = c.acked.saturating_add(n);
                        c.intended = c.intended.saturating_add(n);
                    });
                }
                Outcome::Doubtful => {
                    let cell = (d.key.clone(), d.start);
                    let full = self.cells.len() >= self.most;
                    if full && !self.cells.contains_key(&cell) {
                        given_up += n.max(0) as u64;
                        continue;
                    }
                    let sent_again = again.get(i).copied().unwrap_or(false) && n > 0;
                    self.cells
                        .entry(cell.clone())
                        .or_insert_with(|| Doubt::new(base, now));
                    self.change(&cell, |c| {
                        c.doubtful = c.doubtful.saturating_add(n);
                        // Hits sent again are intended by the write that carries them.
                        if sent_again {
                            c.again = c.again.saturating_add(n);
                        } else {
                            c.intended = c.intended.saturating_add(n);
                        }
                        c.last_sent = now;
                        c.witnessed = None;
                    });
                    if sent_again {
                        resend.push(i);
                    }
                }
            }
        }
        (given_up, resend)
    }

    /// The cells whose next read is due at `now`, at most `most` of them, as one-bucket ranges,
    /// none with a round's write in flight; each is being read until [`Doubts::read`] takes
    /// what the read got.
    pub fn due(&mut self, now: Instant, most: usize) -> Vec<CounterRange> {
        let wait = self.wait;
        let ready = |c: &Doubt| {
            c.writing == 0
                && !c.reading
                && now.saturating_duration_since(c.last_sent) >= wait
                && c.witnessed
                    .is_none_or(|w| now.saturating_duration_since(w) >= wait)
        };
        let mut due: Vec<CounterRange> = self
            .cells
            .iter_mut()
            .filter(|(_, c)| ready(c))
            .take(most)
            .map(|((key, start), c)| {
                c.reading = true;
                CounterRange {
                    key: key.clone(),
                    from: *start,
                    to: *start,
                }
            })
            .collect();
        // A store reads one partition's ranges together.
        due.sort_by(|a, b| (&a.key, a.from).cmp(&(&b.key, b.from)));
        due
    }

    /// Takes what a read at `ALL` (made at `at`) got for `ranges` (from [`Doubts::due`]):
    /// a first read witnesses the replicas up; a read `wait` after that settles the cell: what
    /// it lacks of what was intended is sent again, and what it holds beyond (hits sent again
    /// that had landed the first time too) is taken back.
    pub fn read(
        &mut self,
        ranges: &[CounterRange],
        totals: Vec<Option<Vec<BucketTotal>>>,
        at: Instant,
    ) -> Settled {
        let mut out = Settled::default();
        for (r, t) in ranges.iter().zip(totals) {
            let cell = (r.key.clone(), r.from);
            let Some(c) = self.cells.get_mut(&cell) else {
                continue;
            };
            c.reading = false;
            let Some(t) = t else {
                // A replica did not answer: the count starts again.
                c.witnessed = None;
                continue;
            };
            match c.witnessed {
                Some(w) if at.saturating_duration_since(w) >= self.wait => {}
                _ => {
                    c.witnessed = Some(at);
                    continue;
                }
            }
            let mine = t.iter().find(|b| b.start == r.from).map_or(0, |b| b.mine);
            let owed = c.owed();
            let fix = c
                .intended
                .saturating_sub(mine.saturating_sub(c.base))
                .clamp(-c.again.max(0), owed as i64);
            self.hits = self.hits.saturating_sub(owed);
            out.landed += owed.saturating_sub(fix.max(0) as u64);
            if fix == 0 {
                self.cells.remove(&cell);
                continue;
            }
            // Sent again (or taken back), and in doubt until that write is answered
            // ([`Doubts::resent`]).
            *c = Doubt::new(mine, at);
            out.resend.push(Delta {
                key: r.key.clone(),
                start: r.from,
                delta: fix,
            });
        }
        out
    }

    /// What became of the increments [`Doubts::read`] asked to send: one that landed is
    /// settled; any other is in doubt again against the base that read found.
    pub fn resent(&mut self, resend: &[Delta], outcomes: &[Outcome], now: Instant) {
        for (d, &o) in resend.iter().zip(outcomes) {
            let cell = (d.key.clone(), d.start);
            if o == Outcome::Landed {
                self.cells.remove(&cell);
                continue;
            }
            self.change(&cell, |c| {
                c.doubtful = c.doubtful.saturating_add(d.delta);
                c.intended = c.intended.saturating_add(d.delta);
                if d.delta < 0 {
                    c.again = c.again.saturating_sub(d.delta);
                }
                c.last_sent = now;
                c.witnessed = None;
            });
        }
    }

    /// Hits in doubt in `key`'s bucket at `start` now (0: none): what the store may lack.
    pub fn owed(&self, key: &CounterKey, start: i64) -> i64 {
        self.cells
            .get(&(key.clone(), start))
            .map_or(0, |c| c.owed() as i64)
    }

    /// Gives up on every doubt (shutdown): returns the hits that stay unknown.
    pub fn give_up(&mut self) -> u64 {
        self.cells.clear();
        std::mem::take(&mut self.hits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Grain;

    fn delta(subject: &str, n: i64) -> Delta {
        Delta {
            key: CounterKey {
                tenant: "t".into(),
                subject: subject.into(),
                limit: "l".into(),
                grain: Grain::Fixed(1_000),
            },
            start: 0,
            delta: n,
        }
    }

    fn read_as(mine: i64) -> Vec<Option<Vec<BucketTotal>>> {
        vec![Some(vec![BucketTotal {
            start: 0,
            total: mine,
            mine,
            region: mine,
        }])]
    }

    /// A settling read at `at` of the cells due then, answered with `totals`.
    fn read_due(d: &mut Doubts, at: Instant, totals: Vec<Option<Vec<BucketTotal>>>) -> Settled {
        let due = d.due(at, 100);
        d.read(&due, totals, at)
    }

    #[test]
    fn a_doubt_is_settled_by_two_reads_a_wait_apart_and_resends_what_did_not_land() {
        let wait = Duration::from_secs(6);
        let mut d = Doubts::new(wait, 10);
        let t0 = Instant::now();
        // The cell held 10; 5 went out in doubt, then 3 landed with an answer.
        d.note(&[delta("a", 5)], &[10], &[Outcome::Doubtful], &[false], t0);
        d.note(&[delta("a", 3)], &[15], &[Outcome::Landed], &[false], t0);
        assert_eq!(d.hits(), 5);
        assert!(d.due(t0 + wait / 2, 100).is_empty(), "too early");
        let due = d.due(t0 + wait, 100);
        assert_eq!(due.len(), 1);
        // The first read only witnesses the replicas up.
        let s = d.read(&due, read_as(15), t0 + wait);
        assert_eq!(s, Settled::default());
        assert!(d.due(t0 + wait + wait / 2, 100).is_empty());
        // Final: 15 = 10 + 3 acked + 2 of the 5 in doubt.
        let at = t0 + wait * 2;
        let s = read_due(&mut d, at, read_as(15));
        assert_eq!(s.landed, 2);
        assert_eq!(s.resend, vec![delta("a", 3)]);
        assert_eq!(d.hits(), 0);
        d.resent(&s.resend, &[Outcome::Landed], at);
        assert!(d.due(at + wait * 3, 100).is_empty(), "settled");
    }

    #[test]
    fn a_failed_read_starts_the_wait_again_and_a_landed_doubt_is_not_resent() {
        let wait = Duration::from_millis(10);
        let mut d = Doubts::new(wait, 10);
        let t0 = Instant::now();
        d.note(&[delta("a", 4)], &[0], &[Outcome::Doubtful], &[false], t0);
        let due = d.due(t0 + wait, 100);
        d.read(&due, read_as(4), t0 + wait);
        // A replica stops answering: the witness is gone.
        d.read(&due, vec![None], t0 + wait * 2);
        let s = d.read(&due, read_as(4), t0 + wait * 3);
        assert_eq!(s, Settled::default(), "witnessed again, not settled");
        let s = d.read(&due, read_as(4), t0 + wait * 4);
        assert_eq!((s.landed, s.resend.len(), d.hits()), (4, 0, 0));
    }

    #[test]
    fn a_resend_in_doubt_is_settled_against_the_base_it_was_read_at() {
        let wait = Duration::from_millis(10);
        let mut d = Doubts::new(wait, 10);
        let t0 = Instant::now();
        d.note(&[delta("a", 4)], &[0], &[Outcome::Doubtful], &[false], t0);
        let due = d.due(t0 + wait, 100);
        d.read(&due, read_as(0), t0 + wait);
        let s = d.read(&due, read_as(0), t0 + wait * 2);
        assert_eq!(s.resend, vec![delta("a", 4)]);
        d.resent(&s.resend, &[Outcome::Doubtful], t0 + wait * 2);
        assert_eq!(d.hits(), 4);
        let at = t0 + wait * 3;
        read_due(&mut d, at, read_as(4));
        let at = t0 + wait * 4;
        let s = read_due(&mut d, at, read_as(4));
        assert_eq!((s.landed, s.resend.len(), d.hits()), (4, 0, 0));
    }

    #[test]
    fn doubts_past_the_bound_are_given_up_on() {
        let mut d = Doubts::new(Duration::ZERO, 1);
        let t0 = Instant::now();
        let (given_up, _) = d.note(
            &[delta("a", 2), delta("b", 3)],
            &[0, 0],
            &[Outcome::Doubtful, Outcome::Doubtful],
            &[false, false],
            t0,
        );
        assert_eq!((given_up, d.hits()), (3, 2));
        assert_eq!(d.give_up(), 2);
        assert_eq!(d.hits(), 0);
    }

    #[test]
    fn a_write_sent_again_at_once_is_taken_back_where_it_landed_twice() {
        let wait = Duration::from_millis(10);
        let mut d = Doubts::new(wait, 10);
        let t0 = Instant::now();
        // The cell held 10; 5 went out in doubt, to be sent again at once.
        let (_, again) = d.note(&[delta("a", 5)], &[10], &[Outcome::Doubtful], &[true], t0);
        assert_eq!(again, vec![0]);
        assert_eq!(d.hits(), 0, "not missing: on their way again");
        assert_eq!(d.owed(&delta("a", 0).key, 0), 0);
        // The next round carries them with 2 new hits, and is answered.
        d.note(&[delta("a", 7)], &[10], &[Outcome::Landed], &[true], t0);
        assert_eq!(d.hits(), 0);
        let due = d.due(t0 + wait, 100);
        d.read(&due, read_as(22), t0 + wait);
        // Final: 22 = 10 + 7 + the first 5 too: those are taken back.
        let at = t0 + wait * 2;
        let s = read_due(&mut d, at, read_as(22));
        assert_eq!(s.resend, vec![delta("a", -5)]);
        d.resent(&s.resend, &[Outcome::Landed], at);
        assert!(d.due(at + wait * 3, 100).is_empty(), "settled");
    }

    #[test]
    fn a_write_sent_again_at_once_that_landed_once_is_left_alone() {
        let wait = Duration::from_millis(10);
        let mut d = Doubts::new(wait, 10);
        let t0 = Instant::now();
        d.note(&[delta("a", 5)], &[10], &[Outcome::Doubtful], &[true], t0);
        d.note(&[delta("a", 5)], &[10], &[Outcome::Landed], &[true], t0);
        let due = d.due(t0 + wait, 100);
        d.read(&due, read_as(15), t0 + wait);
        let at = t0 + wait * 2;
        let s = read_due(&mut d, at, read_as(15));
        assert_eq!(s, Settled::default());
        assert!(d.due(at + wait * 3, 100).is_empty(), "settled");
        // Another writer of the cell (a check decided through the store) adds to it: what
        // is taken back is at most what was sent twice.
        d.note(&[delta("a", 3)], &[15], &[Outcome::Doubtful], &[true], at);
        d.note(&[delta("a", 3)], &[15], &[Outcome::Landed], &[true], at);
        let at = at + wait;
        read_due(&mut d, at, read_as(30));
        let s = read_due(&mut d, at + wait, read_as(30));
        assert_eq!(s.resend, vec![delta("a", -3)]);
    }

    #[test]
    fn a_cell_is_never_read_and_written_at_once() {
        let wait = Duration::from_millis(10);
        let mut d = Doubts::new(wait, 10);
        let t0 = Instant::now();
        d.note(&[delta("a", 5)], &[10], &[Outcome::Doubtful], &[false], t0);
        // A round's write of the cell in flight: the cell is not read meanwhile.
        assert_eq!(d.begin_write(&[delta("a", 2)]), vec![false]);
        assert!(d.due(t0 + wait, 100).is_empty(), "written now");
        d.note(&[delta("a", 2)], &[15], &[Outcome::Landed], &[false], t0);
        // Being read: the next round's write of it waits; other cells go out.
        let due = d.due(t0 + wait, 100);
        assert_eq!(due.len(), 1);
        assert_eq!(
            d.begin_write(&[delta("b", 1), delta("a", 3)]),
            vec![false, true]
        );
        d.note(&[delta("b", 1)], &[0], &[Outcome::Landed], &[false], t0);
        d.read(&due, read_as(17), t0 + wait);
        // Read: written again as any.
        assert_eq!(d.begin_write(&[delta("a", 3)]), vec![false]);
        d.note(&[delta("a", 3)], &[17], &[Outcome::Landed], &[false], t0);
        // Final: 20 = 10 + 2 + 3 acked + the 5 in doubt.
        let s = read_due(&mut d, t0 + wait * 2, read_as(20));
        assert_eq!((s.landed, s.resend.len(), d.hits()), (5, 0, 0));
    }
}
