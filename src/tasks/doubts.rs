//! Sync writes of unknown outcome, settled by reading them back.
//!
//! A counter increment that was sent and not answered in time (a replica that led it died
//! or stopped answering) may have landed or not, and may still land: counter increments are
//! not idempotent, so it is never resent blindly. Each instance writes only its own shard's
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
    /// Hits written in doubt since.
    sent: i64,
    /// Hits written with an answer since.
    acked: i64,
    /// When the last write in doubt went out.
    last_sent: Instant,
    /// When a read at `ALL` of the cell first succeeded, with every replica up since.
    witnessed: Option<Instant>,
}

/// What a settling read found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Settled {
    /// Increments that did not land, to be sent again.
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
    /// Hits in doubt now (the sum of `sent`).
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

    /// Takes a round's writes: `bases[i]` is what `deltas[i]`'s own cell held before it, and
    /// `outcomes[i]` what became of it. Returns the hits given up on at once (more cells in
    /// doubt than it holds).
    pub fn note(
        &mut self,
        deltas: &[Delta],
        bases: &[i64],
        outcomes: &[Outcome],
        now: Instant,
    ) -> u64 {
        let mut given_up = 0;
        for ((d, &base), &o) in deltas.iter().zip(bases).zip(outcomes) {
            let n = d.delta;
            match o {
                Outcome::Unsent => {}
                Outcome::Landed => {
                    if self.cells.is_empty() {
                        continue;
                    }
                    if let Some(c) = self.cells.get_mut(&(d.key.clone(), d.start)) {
                        c.acked = c.acked.saturating_add(n);
                    }
                }
                Outcome::Doubtful => {
                    let cell = (d.key.clone(), d.start);
                    let full = self.cells.len() >= self.most;
                    if full && !self.cells.contains_key(&cell) {
                        given_up += n.max(0) as u64;
                        continue;
                    }
                    let c = self.cells.entry(cell).or_insert(Doubt {
                        base,
                        sent: 0,
                        acked: 0,
                        last_sent: now,
                        witnessed: None,
                    });
                    c.sent = c.sent.saturating_add(n);
                    c.last_sent = now;
                    c.witnessed = None;
                    self.hits = self.hits.saturating_add(n.max(0) as u64);
                }
            }
        }
        given_up
    }

    /// The cells whose next read is due at `now`, at most `most` of them, as one-bucket ranges.
    pub fn due(&self, now: Instant, most: usize) -> Vec<CounterRange> {
        let ready = |c: &Doubt| {
            now.saturating_duration_since(c.last_sent) >= self.wait
                && c.witnessed
                    .is_none_or(|w| now.saturating_duration_since(w) >= self.wait)
        };
        let mut due: Vec<CounterRange> = self
            .cells
            .iter()
            .filter(|(_, c)| ready(c))
            .take(most)
            .map(|((key, start), _)| CounterRange {
                key: key.clone(),
                from: *start,
                to: *start,
            })
            .collect();
        // A store reads one partition's ranges together.
        due.sort_by(|a, b| (&a.key, a.from).cmp(&(&b.key, b.from)));
        due
    }

    /// Takes what a read at `ALL` (made at `at`) got for `ranges` (from [`Doubts::due`]):
    /// a first read witnesses the replicas up; a read `wait` after that settles the cell.
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
            let landed = mine
                .saturating_sub(c.base)
                .saturating_sub(c.acked)
                .clamp(0, c.sent.max(0));
            let missing = c.sent.max(0) - landed;
            self.hits = self.hits.saturating_sub(c.sent.max(0) as u64);
            out.landed += landed as u64;
            if missing == 0 {
                self.cells.remove(&cell);
                continue;
            }
            // Sent again, and in doubt until that write is answered ([`Doubts::resent`]).
            *c = Doubt {
                base: mine,
                sent: 0,
                acked: 0,
                last_sent: at,
                witnessed: None,
            };
            out.resend.push(Delta {
                key: r.key.clone(),
                start: r.from,
                delta: missing,
            });
        }
        out
    }

    /// What became of the increments [`Doubts::read`] asked to send again: one that landed
    /// is settled; any other is in doubt again against the base that read found.
    pub fn resent(&mut self, resend: &[Delta], outcomes: &[Outcome], now: Instant) {
        for (d, &o) in resend.iter().zip(outcomes) {
            let cell = (d.key.clone(), d.start);
            if o == Outcome::Landed {
                self.cells.remove(&cell);
                continue;
            }
            if let Some(c) = self.cells.get_mut(&cell) {
                c.sent = c.sent.saturating_add(d.delta);
                c.last_sent = now;
                c.witnessed = None;
                self.hits = self.hits.saturating_add(d.delta.max(0) as u64);
            }
        }
    }

    /// Hits in doubt in `key`'s bucket at `start` now (0: none).
    pub fn sent(&self, key: &CounterKey, start: i64) -> i64 {
        self.cells
            .get(&(key.clone(), start))
            .map_or(0, |c| c.sent.max(0))
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

    #[test]
    fn a_doubt_is_settled_by_two_reads_a_wait_apart_and_resends_what_did_not_land() {
        let wait = Duration::from_secs(6);
        let mut d = Doubts::new(wait, 10);
        let t0 = Instant::now();
        // The cell held 10; 5 went out in doubt, then 3 landed with an answer.
        d.note(&[delta("a", 5)], &[10], &[Outcome::Doubtful], t0);
        d.note(&[delta("a", 3)], &[15], &[Outcome::Landed], t0);
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
        let s = d.read(&d.due(at, 100), read_as(15), at);
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
        d.note(&[delta("a", 4)], &[0], &[Outcome::Doubtful], t0);
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
        d.note(&[delta("a", 4)], &[0], &[Outcome::Doubtful], t0);
        let due = d.due(t0 + wait, 100);
        d.read(&due, read_as(0), t0 + wait);
        let s = d.read(&due, read_as(0), t0 + wait * 2);
        assert_eq!(s.resend, vec![delta("a", 4)]);
        d.resent(&s.resend, &[Outcome::Doubtful], t0 + wait * 2);
        assert_eq!(d.hits(), 4);
        let at = t0 + wait * 3;
        d.read(&d.due(at, 100), read_as(4), at);
        let at = t0 + wait * 4;
        let s = d.read(&d.due(at, 100), read_as(4), at);
        assert_eq!((s.landed, s.resend.len(), d.hits()), (4, 0, 0));
    }

    #[test]
    fn doubts_past_the_bound_are_given_up_on() {
        let mut d = Doubts::new(Duration::ZERO, 1);
        let t0 = Instant::now();
        let given_up = d.note(
            &[delta("a", 2), delta("b", 3)],
            &[0, 0],
            &[Outcome::Doubtful, Outcome::Doubtful],
            t0,
        );
        assert_eq!((given_up, d.hits()), (3, 2));
        assert_eq!(d.give_up(), 2);
        assert_eq!(d.hits(), 0);
    }
}
