//! A sync round's second half: reading totals back, which include every instance's writes.
//!
//! A round reads back the counters it wrote or that wait for the others' hits. Those near a
//! limit (pressing on this instance's share, or admitted before their first read) are read
//! first and whole: the fleet's bound rests on their views being a round old at most. The
//! rest, counters far from their limits, are read after them for at most an interval a round,
//! oldest first; what that leaves waits in the [`Backlog`] for the next rounds. On a store too
//! slow to read every active counter each round, the rounds then keep their pace (and the
//! counters near a limit their fresh views) while the far counters' views lag, instead of
//! every round taking as long as the slowest read of all of them.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use super::{Syncer, CUT_OFF_MARGIN};
use crate::store::{CounterKey, CounterRange};

/// Most counters read back in one store call of the paced part of a round: a round reads at
/// least one such call of them, and starts another only before its time is up.
const READ_CHUNK: usize = 64;

/// The counters far from their limits that earlier rounds had no time to read back, oldest
/// first, one range per counter.
#[derive(Default)]
pub(super) struct Backlog {
    ranges: Mutex<VecDeque<CounterRange>>,
}

impl Backlog {
    /// The counters to read now: the backlog's, then `fresh` (this round's far ones); a
    /// counter in both is read once, with this round's range, in the backlog's place, and one
    /// this round has read already (`read`) not again: an old range would bring back an old
    /// count over the newer one.
    fn take_with(&self, read: &[CounterRange], fresh: &[CounterRange]) -> VecDeque<CounterRange> {
        let mut old = std::mem::take(&mut *self.ranges.lock().unwrap());
        if old.is_empty() {
            return fresh.iter().cloned().collect();
        }
        if !read.is_empty() {
            let done: HashSet<&CounterKey> = read.iter().map(|r| &r.key).collect();
            old.retain(|r| !done.contains(&r.key));
        }
        let mut newer: std::collections::HashMap<&CounterKey, &CounterRange> =
            fresh.iter().map(|r| (&r.key, r)).collect();
        for r in old.iter_mut() {
            if let Some(n) = newer.remove(&r.key) {
                *r = n.clone();
            }
        }
        let left: HashSet<&CounterKey> = newer.into_keys().collect();
        old.extend(fresh.iter().filter(|r| left.contains(&r.key)).cloned());
        old
    }

    /// What this round had no time for: read at the next rounds, before their own.
    fn keep(&self, left: VecDeque<CounterRange>) {
        *self.ranges.lock().unwrap() = left;
    }
}

impl Syncer {
    /// A round's read back in [`Syncer::run`], for the round of `tick`: the first `urgent` of
    /// `ranges` (counters near a limit) whole, then the backlog and the rest, a call at least
    /// and more until nine tenths of the interval after the tick, so that the next round
    /// starts at the next tick, with every other instance's (see the module comment).
    pub async fn read_back_paced(&self, ranges: &[CounterRange], urgent: usize, tick: Instant) {
        let (near, far) = ranges.split_at(urgent.min(ranges.len()));
        self.read_back(near).await;
        let mut queue = self.backlog.take_with(near, far);
        let until = tick + self.cfg.interval.mul_f64(0.9);
        let mut first = true;
        while !queue.is_empty() && (first || Instant::now() < until) {
            first = false;
            let chunk: Vec<CounterRange> = queue.drain(..READ_CHUNK.min(queue.len())).collect();
            self.read_back(&chunk).await;
        }
        self.metrics.set_read_backlog(queue.len());
        self.backlog.keep(queue);
    }

    /// A round's second half: reads totals back (they include every instance's writes).
    /// What a failed part of the read did not get is logged and read again at the next round;
    /// what the other parts got is installed.
    pub async fn read_back(&self, ranges: &[CounterRange]) {
        if ranges.is_empty() {
            return;
        }
        let started = std::time::Instant::now();
        let deadline = started + self.cfg.timeout;
        let read = self.limiter.store().read_parts(ranges, Some(deadline));
        let res = tokio::time::timeout(self.cfg.timeout + CUT_OFF_MARGIN, read).await;
        let secs = started.elapsed().as_secs_f64();
        let Ok(read) = res else {
            self.metrics.store_op("read", "timeout", secs);
            self.limiter.unread(ranges);
            tracing::warn!("sync: reading totals back timed out");
            return;
        };
        let Some(e) = read.error else {
            self.metrics.store_op("read", "ok", secs);
            let totals = read
                .totals
                .into_iter()
                .map(Option::unwrap_or_default)
                .collect();
            self.limiter.refreshed(ranges, totals);
            return;
        };
        let (mut got, mut got_totals, mut missed) = (Vec::new(), Vec::new(), Vec::new());
        for (r, t) in ranges.iter().zip(read.totals) {
            match t {
                Some(t) => {
                    got.push(r.clone());
                    got_totals.push(t);
                }
                None => missed.push(r.clone()),
            }
        }
        self.metrics.store_op(
            "read",
            if got.is_empty() { "error" } else { "partial" },
            secs,
        );
        if !got.is_empty() {
            self.limiter.refreshed(&got, got_totals);
        }
        self.limiter.unread(&missed);
        tracing::warn!(
            error = %e,
            read = got.len(),
            unread = missed.len(),
            "sync: reading totals back failed in part; the rest is read again next round"
        );
    }
}
