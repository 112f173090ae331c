//! The sync task's settling of its writes in doubt: holds them ([`Doubts`]), reads the due
//! ones back at `ALL` beside the rounds, and sends again what did not land.
//!
//! At exit a replica may still be down, and a read at `ALL` cannot succeed before the process
//! ends: the drain then reads what it holds in doubt at `LOCAL_QUORUM` ([`Heard::LiveQuorum`],
//! two reads a wait apart as at `ALL`), so that what the lost replica never applied is sent
//! again rather than lost. What that replica led and had applied before it went down, without
//! passing it on, is then counted twice once it returns: the store errs high by those, where
//! giving up would leave it low by every write in doubt.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use super::doubts::{Doubts, Outcome};
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::store::{CounterKey, Delta, Heard};

/// Most cells held in doubt at once (about 100 bytes each).
const MOST_DOUBTS: usize = 100_000;

/// Most cells one settling read asks for.
const DOUBTS_PER_READ: usize = 1_024;

/// How long past a deadline a store call may run before the settler stops waiting for it.
const CUT_OFF_MARGIN: Duration = Duration::from_millis(500);

pub(super) struct Settler {
    /// The lock is never held across an `.await`.
    doubts: Mutex<Doubts>,
    /// Hits of sync writes that went into doubt since start (the rest of
    /// `quotad_store_uncertain_hits_total` is strict checks').
    doubted: AtomicU64,
    limiter: Arc<Limiter>,
    metrics: Arc<Metrics>,
    /// Deadline of one write, and of a settling read: it runs beside the rounds, which it
    /// does not hold up, and a replica just back, or slow, answers a read at `ALL` late.
    timeout: Duration,
    /// No settling read before this: one that failed waits a `wait` before the next.
    next_read: Mutex<std::time::Instant>,
    wait: Duration,
    /// The replicas the settling reads hear: every one, until a read at exit failed.
    heard: Mutex<Heard>,
}

impl Settler {
    pub(super) fn new(
        limiter: Arc<Limiter>,
        metrics: Arc<Metrics>,
        timeout: Duration,
        wait: Duration,
    ) -> Self {
        Settler {
            doubts: Mutex::new(Doubts::new(wait, MOST_DOUBTS)),
            doubted: AtomicU64::new(0),
            limiter,
            metrics,
            timeout,
            next_read: Mutex::new(std::time::Instant::now()),
            wait,
            heard: Mutex::new(Heard::Every),
        }
    }

    fn doubts(&self) -> MutexGuard<'_, Doubts> {
        self.doubts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes out of a round's snapshot, before it is sent, the writes of cells a settling read
    /// is reading now ([`Doubts::begin_write`]), and returns them: they are pending again,
    /// for the next round. What is left must be noted ([`Settler::note`]) once answered.
    pub(super) fn hold_back(
        &self,
        deltas: &mut Vec<Delta>,
        bases: &mut Vec<i64>,
        near: &mut Vec<bool>,
    ) -> Vec<Delta> {
        let held = self.doubts().begin_write(deltas);
        if !held.contains(&true) {
            return Vec::new();
        }
        let out = deltas
            .iter()
            .zip(&held)
            .filter(|(_, &h)| h)
            .map(|(d, _)| d.clone())
            .collect();
        drop_held(deltas, &held);
        drop_held(bases, &held);
        drop_held(near, &held);
        out
    }

    /// Holds a round's writes in doubt ([`Doubts::note`]; `doubtful` hits of them); one past
    /// the bound is given up on. Returns the writes in doubt to send again at once, of those
    /// `near` marks (counters near a limit).
    pub(super) fn note(
        &self,
        deltas: &[Delta],
        bases: &[i64],
        outcomes: &[Outcome],
        near: &[bool],
        doubtful: u64,
    ) -> Vec<Delta> {
        self.doubted.fetch_add(doubtful, Ordering::Relaxed);
        let now = std::time::Instant::now();
        let (given_up, again, hits) = {
            let mut d = self.doubts();
            let (given_up, again) = d.note(deltas, bases, outcomes, near, now);
            (given_up, again, d.hits())
        };
        let doubtful = deltas.iter().zip(outcomes);
        self.mirror(
            doubtful
                .filter(|(_, o)| **o == Outcome::Doubtful)
                .map(|(x, _)| (&x.key, x.start)),
        );
        self.metrics.doubts().set_in_doubt(hits);
        if given_up > 0 {
            self.metrics.doubts().settled(0, 0, given_up);
            tracing::warn!(
                hits = given_up,
                "sync: too many writes in doubt to settle; these hits stay unknown"
            );
        }
        let again: Vec<Delta> = again.into_iter().map(|i| deltas[i].clone()).collect();
        let sent_again = again.iter().map(|d| d.delta.max(0) as u64).sum();
        self.metrics.doubts().settled(0, sent_again, 0);
        again
    }

    /// Reads back the cells whose writes are in doubt and due ([`Doubts::due`]) at consistency
    /// `ALL`, and sends again what did not land. Returns the hits still in doubt. `at_exit`
    /// (the drain): no round waits on the reads, and once one at `ALL` fails, the rest are
    /// at `LOCAL_QUORUM` (see the module comment).
    pub(super) async fn settle(&self, at_exit: bool) -> u64 {
        let next_read = *self.next_read.lock().unwrap_or_else(|p| p.into_inner());
        if !at_exit && std::time::Instant::now() < next_read {
            return self.doubts().hits();
        }
        // Each due cell is being read until `Doubts::read` takes the answer, below.
        let due = self
            .doubts()
            .due(std::time::Instant::now(), DOUBTS_PER_READ);
        if due.is_empty() {
            return self.doubts().hits();
        }
        let heard = *self.heard.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = std::time::Instant::now() + self.timeout;
        let read = self.limiter.store().read_final(&due, Some(deadline), heard);
        let totals = match tokio::time::timeout(self.timeout + CUT_OFF_MARGIN, read).await {
            Ok(r) => r.totals,
            Err(_) => vec![None; due.len()],
        };
        if totals.iter().any(Option::is_none) {
            // A replica is down or slow: the next read waits a `wait`.
            *self.next_read.lock().unwrap_or_else(|p| p.into_inner()) =
                std::time::Instant::now() + self.wait;
            if at_exit && heard == Heard::Every {
                *self.heard.lock().unwrap_or_else(|p| p.into_inner()) = Heard::LiveQuorum;
                tracing::warn!(
                    "shutdown: writes in doubt cannot be read back at ALL (a replica is down); \
                     settling them at LOCAL_QUORUM, which may count twice what the lost \
                     replica led and had not passed on"
                );
            }
        }
        let settled = self.doubts().read(&due, totals, std::time::Instant::now());
        self.mirror(due.iter().map(|r| (&r.key, r.from)));
        let (mut resent, mut taken_back) = (0, 0);
        if !settled.resend.is_empty() {
            // Sent directly: the counters may have left the limiter's memory meanwhile.
            // With a deadline of its own: the read may have used up most of the last one.
            let resend_by = std::time::Instant::now() + self.timeout;
            let parts = self
                .limiter
                .store()
                .increment_parts(&settled.resend, Some(resend_by))
                .await;
            let mut outcomes = vec![Outcome::Landed; settled.resend.len()];
            Outcome::mark(&mut outcomes, &parts);
            self.doubts()
                .resent(&settled.resend, &outcomes, std::time::Instant::now());
            self.mirror(settled.resend.iter().map(|d| (&d.key, d.start)));
            resent = settled.resend.iter().map(|d| d.delta.max(0) as u64).sum();
            taken_back = settled
                .resend
                .iter()
                .map(|d| (-d.delta).max(0) as u64)
                .sum();
        }
        let left = self.doubts().hits();
        self.metrics.doubts().set_in_doubt(left);
        if settled.landed + resent + taken_back > 0 {
            self.metrics.doubts().settled(settled.landed, resent, 0);
            self.metrics.doubts().taken_back(taken_back);
            tracing::info!(
                landed_hits = settled.landed,
                resent_hits = resent,
                landed_twice_taken_back = taken_back,
                still_in_doubt = left,
                consistency = match heard {
                    Heard::Every => "ALL",
                    Heard::LiveQuorum => "LOCAL_QUORUM",
                },
                "sync: writes in doubt settled by reading them back"
            );
        }
        left
    }

    /// Tells the limiter what is in doubt now in these cells ([`Limiter::in_doubt`]): a read
    /// back keeps this instance's own hits the store does not show only as far as they are.
    fn mirror<'a>(&self, cells: impl Iterator<Item = (&'a CounterKey, i64)>) {
        let d = self.doubts();
        for (key, start) in cells {
            self.limiter.in_doubt(key, start, d.owed(key, start));
        }
    }

    /// Hits known to be in doubt at exit, or given up on: strict checks' writes that had no
    /// answer (never settled), sync writes given up on, and those still in doubt.
    pub(super) fn unknown_hits(&self) -> u64 {
        let doubted = self.doubted.load(Ordering::Relaxed);
        let strict = self.metrics.uncertain_hits_seen().saturating_sub(doubted);
        strict
            .saturating_add(self.metrics.doubts().unknown())
            .saturating_add(self.doubts().hits())
    }
}

/// Drops the items of `v` that `held` marks.
fn drop_held<T>(v: &mut Vec<T>, held: &[bool]) {
    let mut it = held.iter();
    v.retain(|_| !it.next().copied().unwrap_or(false));
}
