//! The sync task: writes admitted hits to the store and reads fresh totals back.
//!
//! Every `sync.interval`: in one pass over the limiter's entries, evict what no longer counts
//! and take a snapshot of the pending hits (as increments, one per bucket), moving exactly the
//! snapshot from pending to stored (hits admitted meanwhile stay pending); write them in one
//! batch (a refused write moves them back to pending); then read back the totals of the
//! counters written or waiting for the others' hits (they include other instances' hits): those
//! near a limit first, the rest within an interval a round (`read_back`). Store write load
//! therefore follows the number of active counters per interval, not the request rate. Old
//! buckets are deleted by a janitor task beside the rounds.
//!
//! Rounds are aligned on wall-clock multiples of the interval (UTC, like buckets), and the read
//! back waits a short settle time after the write: every instance of a fleet then writes at the
//! same instants and reads after all of them wrote, so each one's view (and demand-weighted share)
//! includes the others' hits up to the last tick. Without this, an instance reading between the
//! others' writes misses up to a whole interval of their hits, and the fleet overshoots by that.
//!
//! The first round after each `history_interval` also takes the usage history: what every check
//! was answered, summed per (tenant, client, hour) in memory (`crate::history`), written with
//! the same rules as the hits by a task beside the rounds (`history_writer`), once the round's
//! read back is done. Its write costs a row per active client whatever the interval, so a longer
//! interval divides its load; shutdown writes all of it.
//!
//! When a write fails with nothing written, the hits stay pending and are tried again with
//! back-off; they never leave memory unwritten (entries holding pending hits are never evicted).
//! When a write's outcome is unknown (a timeout after sending), it is NOT resent blindly,
//! because counter increments are not idempotent: the hits are counted in
//! `quotad_store_uncertain_hits_total` and held in doubt (`doubts`) until a read of this
//! instance's own cells at consistency `ALL`, once no replica can still apply them, says
//! whether they landed; what did not is sent again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::doubts::Outcome;
use super::episodes::{Episodes, Trouble};
use super::history_writer::HistoryWriter;
use super::settle::Settler;
use crate::limiter::Limiter;
use crate::metrics::Metrics;
use crate::store::history::UsageDelta;
use crate::store::{CounterRange, Delta, DynHistoryStore, StoreError};
use answered::Answered;
use read_back::Backlog;

mod answered;
mod read_back;

/// Most counter increments written in one store call (a call sends them as batches of many
/// partitions, several at once).
const INCREMENT_CHUNK: usize = 4_096;

/// Where to cut `deltas` after at most about `most`: at the end of a counter's subject, so
/// that one partition's increments go in one call.
fn chunk_end(deltas: &[Delta], most: usize) -> usize {
    if deltas.len() <= most {
        return deltas.len();
    }
    let mut i = most;
    while i < deltas.len() && deltas[i].key.same_subject(&deltas[i - 1].key) {
        i += 1;
    }
    i
}

/// How long past a round's deadline a store call may run before the sync stops waiting for
/// it (a store cuts off its own requests at the deadline).
const CUT_OFF_MARGIN: Duration = Duration::from_millis(500);

/// The longest the janitor keeps going at one wake-up (beside the rounds).
const JANITOR_MAX_BUSY: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub struct SyncConfig {
    pub interval: Duration,
    /// Deadline of a round's writes and of its read: no call starts after it, and a request
    /// it cuts off leaves only its own increments in doubt (`CounterStore::increment_parts`).
    pub timeout: Duration,
    /// How often old buckets are deleted from the store, and how many at most each time.
    pub janitor_interval: Duration,
    pub janitor_budget: usize,
    /// How often the usage history is written (at the first round after it is due).
    pub history_interval: Duration,
    /// How long shutdown keeps trying to write pending hits.
    pub drain_timeout: Duration,
    /// Wait between a round's write and its read back, so other instances' writes of the same
    /// tick land first.
    pub settle: Duration,
    /// How long after a write in doubt no replica can still apply it (above the store's own
    /// request timeouts): the wait of [`Doubts`].
    pub doubt_wait: Duration,
}

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_millis(250),
            timeout: Duration::from_secs(5),
            janitor_interval: Duration::from_secs(60),
            janitor_budget: 10_000,
            history_interval: Duration::from_millis(250),
            drain_timeout: Duration::from_secs(10),
            settle: Duration::from_millis(25),
            doubt_wait: Duration::from_secs(6),
        }
    }
}

/// What one round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Round {
    /// Hits this round wrote (or sent with an unknown outcome).
    pub written_hits: u64,
    /// Hits still pending after the round's eviction: 0 means everything admitted is written.
    pub pending_after: u64,
}

pub struct Syncer {
    limiter: Arc<Limiter>,
    /// Writes the usage history (the counters go through the limiter's store handle).
    history: Arc<HistoryWriter>,
    metrics: Arc<Metrics>,
    cfg: SyncConfig,
    /// OpenTelemetry traces of the rounds, when on.
    traces: Option<Arc<crate::traces::Traces>>,
    episodes: Episodes,
    /// Writes in doubt, until settled; shared with the settling task beside the rounds.
    settler: Arc<Settler>,
    /// Counters far from their limits that earlier rounds had no time to read back.
    backlog: Backlog,
    /// How long after its tick a round's write was done, at the peak of the recent rounds
    /// (µs; [`Syncer::settle_after`]).
    write_peak_us: AtomicU64,
    /// Which rounds wrote everything they took with an answer: what the fleet task reports.
    answered: Answered,
}

impl Syncer {
    pub fn new(
        limiter: Arc<Limiter>,
        store: DynHistoryStore,
        metrics: Arc<Metrics>,
        cfg: SyncConfig,
    ) -> Self {
        let settler = Arc::new(Settler::new(
            limiter.clone(),
            metrics.clone(),
            cfg.timeout,
            cfg.doubt_wait,
        ));
        Self {
            history: Arc::new(HistoryWriter::new(
                limiter.clone(),
                store,
                metrics.clone(),
                cfg.timeout,
            )),
            limiter,
            metrics,
            cfg,
            traces: None,
            episodes: Episodes::default(),
            settler,
            backlog: Backlog::default(),
            write_peak_us: AtomicU64::new(0),
            answered: Answered::default(),
        }
    }

    /// Traces each round (`sync_round`, with its store write and read as children).
    pub fn with_traces(mut self, traces: Option<Arc<crate::traces::Traces>>) -> Self {
        self.traces = traces;
        self
    }

    /// One sync round of everything, write then read back at once: every pending hit is
    /// written, whatever `sync.max_delay_ms` allows (shutdown's drain, tests). On a failed
    /// write the hits stay pending and the error is returned.
    pub async fn round(&self) -> Result<Round, StoreError> {
        let (ranges, _, mut round, answers) = self.write_round(true, true).await?;
        self.read_back(&ranges).await;
        self.history.write(answers).await;
        round.pending_after = self.limiter.pending_hits();
        Ok(round)
    }

    /// A round's first half, as [`Syncer::run`] does it: evicts what no longer counts, writes
    /// the pending hits of the counters that are due (`Limiter::collect`) and the usage
    /// history; returns the counters to read back.
    pub async fn write(&self) -> Result<(Vec<CounterRange>, Round), StoreError> {
        let (ranges, _, round, answers) = self.write_round(true, false).await?;
        self.history.write(answers).await;
        Ok((ranges, round))
    }

    /// Writes the pending hits of the counters that are due (every counter's when `all`);
    /// returns the counters to read back (how many of them, first, are near a limit), and with `history` (it is due) what the client
    /// entries summed for the usage history, for the caller to write.
    async fn write_round(
        &self,
        history: bool,
        all: bool,
    ) -> Result<(Vec<CounterRange>, usize, Round, Vec<UsageDelta>), StoreError> {
        let tick = self.limiter.clock().now_ms();
        let mut batch = self.limiter.collect(tick, history, all);
        let answers = std::mem::take(&mut batch.answers);
        let hits = batch.hits();
        // Cells a settling read is reading now wait for the next round.
        let held = self
            .settler
            .hold_back(&mut batch.deltas, &mut batch.bases, &mut batch.near);
        let mut given_back: u64 = held.iter().map(|d| d.delta.max(0) as u64).sum();
        if !held.is_empty() {
            self.limiter.unwritten(&held);
        }
        let (refused, gave, doubtful) = self
            .write_counters(&batch.deltas, &batch.bases, &batch.near)
            .await;
        given_back += gave;
        // The store has answered: the snapshot is written, or back in pending, or uncertain.
        drop(batch.writing.take());
        // What stays pending of the snapshot: what was refused or not sent in time, and the
        // hits it could not take (none, unless a bucket held more than an increment carries).
        let written = hits - given_back;
        self.metrics
            .set_pending(batch.pending.saturating_sub(written));
        crate::pace::drop_paced(std::mem::take(&mut batch.deltas));
        let answered = given_back == 0 && doubtful == 0 && refused.is_none();
        self.answered.round(&self.limiter, tick, all, answered);
        if let Some(e) = refused {
            // The usage history waits for the next round too.
            self.limiter.history().restore(answers);
            return Err(e);
        }
        let round = Round {
            written_hits: written,
            pending_after: 0,
        };
        Ok((batch.ranges, batch.urgent, round, answers))
    }

    /// Writes a snapshot's increments, in calls of at most [`INCREMENT_CHUNK`] (a counter's
    /// subject whole in one) within one `sync.timeout`: a round's time grows with its
    /// counters, and one call over all of them, were the store slower than the round needs,
    /// would leave every hit not yet sent at its deadline of unknown outcome. So what has not
    /// been sent when the deadline passes goes back to pending, written at the next round
    /// (`Limiter::unwritten`), and only the call in flight is uncertain. Within a call, the
    /// store tells the increments it never sent (back to pending) from those in doubt
    /// (`CounterStore::increment_parts`): a cluster that refuses some partitions (no quorum
    /// for them) takes the others. A call refused whole gives back it and the rest and is
    /// returned. An increment in doubt of a counter near its limit (`near`) is pending again
    /// too, sent at the next round ([`Settler::note`]). Also returns the hits given back, and
    /// the hits in doubt.
    async fn write_counters(
        &self,
        deltas: &[Delta],
        bases: &[i64],
        near: &[bool],
    ) -> (Option<StoreError>, u64, u64) {
        let store = self.limiter.store();
        let hits = |d: &[Delta]| d.iter().map(|d| d.delta.max(0) as u64).sum::<u64>();
        let started = std::time::Instant::now();
        let deadline = started + self.cfg.timeout;
        let mut rest = deltas;
        let mut outcome = "ok";
        let mut refused = None;
        // Increments a call never sent while it sent others: pending again.
        let mut unsent: Vec<Delta> = Vec::new();
        let mut trouble = Trouble::default();
        let mut outcomes = vec![Outcome::Landed; deltas.len()];
        while !rest.is_empty() {
            let at = deltas.len() - rest.len();
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                break;
            }
            let cut = chunk_end(rest, INCREMENT_CHUNK);
            let (chunk, tail) = rest.split_at(cut);
            // The snapshot counts as written already (`Limiter::collect`), unless given back.
            // The store cuts off what is not answered by the deadline, request by request;
            // the margin is for a store that does not.
            let parts = store.increment_parts(chunk, Some(deadline));
            let mut parts = match tokio::time::timeout(left + CUT_OFF_MARGIN, parts).await {
                Ok(parts) => parts,
                Err(_) => {
                    outcome = "timeout";
                    outcomes[at..at + chunk.len()].fill(Outcome::Doubtful);
                    trouble.doubtful += hits(chunk);
                    trouble.first.get_or_insert_with(|| "timed out".into());
                    rest = tail;
                    break;
                }
            };
            let Some(e) = parts.error.take() else {
                rest = tail;
                continue;
            };
            if parts.unsent.len() == chunk.len() {
                // Refused whole: this call and the rest wait, with back-off.
                outcome = if e.is_transient() {
                    "unavailable"
                } else {
                    "error"
                };
                refused = Some(e);
                break;
            }
            Outcome::mark(&mut outcomes[at..at + chunk.len()], &parts);
            let doubtful: u64 = parts.doubtful.iter().map(|&i| hits(&chunk[i..=i])).sum();
            trouble.doubtful += doubtful;
            let mut idx = parts.unsent;
            idx.sort_unstable();
            trouble.unsent += idx.iter().map(|&i| hits(&chunk[i..=i])).sum::<u64>();
            unsent.extend(idx.into_iter().map(|i| chunk[i].clone()));
            trouble.first.get_or_insert_with(|| e.to_string());
            outcome = if doubtful > 0 { "uncertain" } else { "partial" };
            rest = tail;
        }
        if !deltas.is_empty() {
            let secs = started.elapsed().as_secs_f64();
            self.metrics.store_op("increment", outcome, secs);
        }
        // What was not sent (refused, or past the deadline) is pending again.
        outcomes[deltas.len() - rest.len()..].fill(Outcome::Unsent);
        if trouble.doubtful > 0 {
            self.metrics.uncertain_hits(trouble.doubtful);
        }
        let again = self
            .settler
            .note(deltas, bases, &outcomes, near, trouble.doubtful);
        let mut given_back = 0;
        if !again.is_empty() {
            given_back += hits(&again);
            self.limiter.unwritten(&again);
        }
        if !unsent.is_empty() {
            given_back += hits(&unsent);
            self.limiter.unwritten(&unsent);
        }
        let degraded = trouble.doubtful + trouble.unsent > 0 || refused.is_some();
        self.episodes.round(degraded, &trouble, refused.as_ref());
        self.metrics.set_store_degraded(degraded);
        if rest.is_empty() {
            return (refused, given_back, trouble.doubtful);
        }
        let left = hits(rest);
        if refused.is_none() {
            self.metrics.deferred_hits(left);
            tracing::warn!(
                hits = left,
                "sync: the round's writes outlasted sync.timeout; the rest waits for the next round"
            );
        }
        self.limiter.unwritten(rest);
        (refused, given_back + left, trouble.doubtful)
    }

    /// Settles the writes in doubt that are due ([`Settler::settle`]); returns the hits
    /// still in doubt.
    pub async fn settle_doubts(&self) -> u64 {
        self.settler.settle(false).await
    }

    /// Deletes what is past retention, a budget at a time, until a call finds less than its
    /// budget due (caught up) or [`JANITOR_MAX_BUSY`] has passed: under a sustained load a
    /// single budget a wake-up could fall behind the buckets written, and the store would grow.
    /// A task beside the rounds: its deletes take seconds on a slow store, and rounds that
    /// waited on them would leave every counter's view that much staler.
    fn janitor(&self) -> tokio::task::JoinHandle<()> {
        let (limiter, metrics) = (self.limiter.clone(), self.metrics.clone());
        let (timeout, budget) = (self.cfg.timeout, self.cfg.janitor_budget);
        tokio::spawn(async move {
            let busy_since = std::time::Instant::now();
            loop {
                let now = limiter.clock().now_ms();
                let started = std::time::Instant::now();
                let call = limiter.store().delete_expired(now, budget);
                let res = tokio::time::timeout(timeout, call).await;
                let secs = started.elapsed().as_secs_f64();
                let n = match res {
                    Ok(Ok(n)) => {
                        metrics.store_op("delete_expired", "ok", secs);
                        if n > 0 {
                            tracing::debug!(deleted = n, "janitor: deleted expired buckets");
                        }
                        n
                    }
                    Ok(Err(e)) => {
                        metrics.store_op("delete_expired", "error", secs);
                        tracing::warn!(error = %e, "janitor failed");
                        return;
                    }
                    Err(_) => {
                        metrics.store_op("delete_expired", "timeout", secs);
                        return;
                    }
                };
                if n < budget as u64 || busy_since.elapsed() >= JANITOR_MAX_BUSY {
                    return;
                }
            }
        })
    }

    /// How long a round's read back waits after its write: the settle time, plus, in a fleet of
    /// several regions, the replication lag the regions' heartbeats show, so that the read sees
    /// every region's writes of the tick. At most nine tenths of the interval: a lag longer than
    /// that is read at the next round.
    pub fn settle(&self) -> Duration {
        let lag = Duration::from_millis(self.limiter.replication_lag_ms().max(0) as u64);
        let most = self.cfg.interval.mul_f64(0.9).max(self.cfg.settle);
        (self.cfg.settle + lag).min(most)
    }

    /// How long a round's read back waits once its write is done, `wrote` after the tick: until
    /// the other instances' writes of the tick have landed too, then [`Syncer::settle`]. Theirs
    /// began at the tick as this one did, and are taken to last at most as long as this
    /// instance's slowest of late (the peak of its recent rounds, falling by a sixteenth a
    /// round). A read that came before them would count their hits as headroom, and this
    /// instance would take its share of it on top of what they admitted. At most nine tenths
    /// of the interval.
    fn settle_after(&self, wrote: Duration) -> Duration {
        let old = Duration::from_micros(self.write_peak_us.load(Ordering::Relaxed));
        let peak = wrote.max(old.mul_f64(15.0 / 16.0));
        let micros = peak.as_micros().min(u128::from(u64::MAX)) as u64;
        self.write_peak_us.store(micros, Ordering::Relaxed);
        let most = self.cfg.interval.mul_f64(0.9).max(self.cfg.settle);
        (peak.saturating_sub(wrote) + self.settle()).min(most)
    }

    /// Runs rounds every interval (backing off while the store fails) until `shutdown` turns
    /// true, then drains. Returns the hits not known to be in the store: unwritten, or sent
    /// and never answered (0: every admitted hit written).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) -> u64 {
        let mut failures: u32 = 0;
        let mut next_janitor = tokio::time::Instant::now() + self.cfg.janitor_interval;
        let mut next_history = tokio::time::Instant::now() + self.cfg.history_interval;
        let mut history_task: Option<tokio::task::JoinHandle<()>> = None;
        let mut janitor_task: Option<tokio::task::JoinHandle<()>> = None;
        let mut settle_task: Option<tokio::task::JoinHandle<u64>> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.until_next_tick(failures)) => {}
                _ = shutdown.wait_for(|stop| *stop) => break,
            }
            // Due, and the last one done: a slow store's history write may outlast rounds.
            let history = tokio::time::Instant::now() >= next_history
                && history_task.as_ref().is_none_or(|t| t.is_finished());
            let t = self.traces.as_deref();
            let round = t.map(|t| t.start_span("sync_round", None, None));
            let write = t.zip(round.as_ref()).map(|(t, r)| t.child(r, "sync.write"));
            let tick = std::time::Instant::now();
            let written = self.write_round(history, false).await;
            if let (Some(t), Some(w)) = (t, write) {
                let hits = written.as_ref().ok().map(|(_, _, r, _)| r.written_hits);
                t.end_store(w, hits, written.as_ref().err().map(ToString::to_string));
            }
            match written {
                Ok((ranges, urgent, _, answers)) => {
                    failures = 0;
                    tokio::select! {
                        _ = tokio::time::sleep(self.settle_after(tick.elapsed())) => {}
                        _ = shutdown.wait_for(|stop| *stop) => {}
                    }
                    let read = t.zip(round.as_ref()).map(|(t, r)| t.child(r, "sync.read"));
                    self.read_back_paced(&ranges, urgent, tick).await;
                    if let (Some(t), Some(r)) = (t, read) {
                        t.end_store(r, Some(ranges.len() as u64), None);
                    }
                    // Beside the rounds, the last one done: a read at ALL waits for every
                    // replica, up to the sync timeout when one is slow or just back.
                    if settle_task.as_ref().is_none_or(|t| t.is_finished()) {
                        let settler = self.settler.clone();
                        settle_task =
                            Some(tokio::spawn(async move { settler.settle(false).await }));
                    }
                    // Beside the rounds, after this one's read back: a history write takes
                    // a row per active client, seconds on a slow store, and a read back that
                    // waited on it would leave every counter that much staler.
                    if history {
                        next_history = tokio::time::Instant::now() + self.cfg.history_interval;
                        let writer = self.history.clone();
                        history_task =
                            Some(tokio::spawn(async move { writer.write(answers).await }));
                    }
                }
                // Logged once an episode (`Episodes`).
                Err(_) => failures += 1,
            }
            if let (Some(t), Some(r)) = (t, round) {
                t.end_store(r, None, None);
            }
            if tokio::time::Instant::now() >= next_janitor
                && janitor_task.as_ref().is_none_or(|t| t.is_finished())
            {
                janitor_task = Some(self.janitor());
                next_janitor = tokio::time::Instant::now() + self.cfg.janitor_interval;
            }
        }
        if let Some(t) = history_task {
            let _ = t.await;
        }
        if let Some(t) = janitor_task {
            let _ = t.await;
        }
        if let Some(t) = settle_task {
            let _ = t.await;
        }
        // What the process reports at exit: hits not written, and hits whose writes were sent
        // and never answered since start.
        let unwritten = self.drain().await;
        unwritten.saturating_add(self.settler.unknown_hits())
    }

    /// The wait until the next round: the interval, doubled per failed write in a row (at most
    /// 10 s), up to its next wall-clock multiple, so every instance of a fleet wakes together.
    fn until_next_tick(&self, failures: u32) -> Duration {
        let wait = if failures == 0 {
            self.cfg.interval
        } else {
            (self.cfg.interval * 2u32.saturating_pow(failures.min(6))).min(Duration::from_secs(10))
        };
        let wait_ms = wait.as_millis().max(1) as i64;
        let now = self.limiter.clock().now_ms();
        Duration::from_millis((wait_ms - now.rem_euclid(wait_ms)) as u64)
    }

    /// Writes every pending hit, retrying until the drain deadline. Returns the hits that
    /// could not be written (0 on success), which are also logged and exported.
    pub async fn drain(&self) -> u64 {
        let deadline = tokio::time::Instant::now() + self.cfg.drain_timeout;
        loop {
            match self.round().await {
                Ok(r)
                    if r.pending_after == 0
                        && self.limiter.history().rows() == 0
                        && self.limiter.answers_waiting() == 0 =>
                {
                    if let Err(e) = self.limiter.store().flush().await {
                        tracing::error!(error = %e, "flushing the store at shutdown failed");
                    }
                    // Writes in doubt are settled while the drain has time; what is left may
                    // or may not be in the store: not "written" (`Syncer::run` counts it in
                    // what the process reports at exit).
                    while self.settler.settle(true).await > 0
                        && tokio::time::Instant::now() < deadline
                    {
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    let doubtful = self.settler.unknown_hits();
                    if doubtful > 0 {
                        tracing::error!(
                            doubtful_hits = doubtful,
                            "shutdown: every pending hit written, but these hits' writes had no \
                             answer and could not be settled by reading them back: the store may \
                             lack them"
                        );
                    } else {
                        tracing::info!("sync: every admitted hit written");
                    }
                    return 0;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "sync: drain write failed; retrying"),
            }
            if tokio::time::Instant::now() >= deadline {
                let left = self.limiter.pending_hits();
                self.metrics.unsynced_at_exit(left);
                self.history.export_dropped();
                let mut unrecorded = self.limiter.history().drain();
                unrecorded.extend(self.limiter.take_answers());
                if !unrecorded.is_empty() {
                    self.history.lost(&unrecorded, "shutdown gave up");
                }
                tracing::error!(hits = left, "shutdown: could not write these admitted hits");
                return left;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}
