//! The table's side of the sync task (the server's sync task drives it through `Limiter`):
//! what it hands over to write and read back, and how the results come back into memory.
//!
//! A round is: [`Table::collect`], one pass over the entries that evicts what no longer
//! counts and takes a snapshot of the pending hits (moving exactly them from pending to stored;
//! hits admitted meanwhile stay pending) and the counters to read back; write the snapshot
//! ([`Table::unwritten`] gives it back if the store refused it); read back;
//! [`Table::refreshed`] installs the totals, which include every instance's hits, and this
//! instance's new share. A strict call carries a counter's pending hits to the store the same
//! way ([`Table::carry_pending`]).

use std::sync::{Arc, Mutex, MutexGuard};

use super::key::newest_readable;
use super::room::Tally;
use super::share::Shares;
use super::state::{lock, AnsweredHour, LimitState, Shard};
use super::table::Table;
use super::window;
use super::writes::Writing;
use crate::history::Recorder;
use crate::pace::Pacer;
use crate::store::history::{Counts, UsageDelta};
use crate::store::{BucketTotal, CounterKey, CounterRange, Delta};

/// The pending hits the sync task took, and the counters it will read back.
#[derive(Debug, Default)]
pub struct SyncBatch {
    pub deltas: Vec<Delta>,
    /// For each of `deltas`, this instance's own shard of its bucket before it
    /// ([`super::bucket::Bucket::mine`]): what the store holds there if the write does not land.
    pub bases: Vec<i64>,
    /// For each of `deltas`, whether its counter pressed on its share (near a limit): its
    /// write, if in doubt, is sent again at once (the server's `tasks::doubts`).
    pub near: Vec<bool>,
    pub ranges: Vec<CounterRange>,
    /// How many of `ranges`, at its start, are counters near a limit (pressing on a share, or
    /// admitted before their first read): read those first, and at once.
    pub urgent: usize,
    /// The admitted checks the client entries summed for the usage history, when taken.
    pub answers: Vec<UsageDelta>,
    /// Hits pending in memory when the snapshot was taken: those of `deltas`, and any the
    /// snapshot could not take.
    pub pending: u64,
    /// The write of `deltas`, under way until dropped: drop it once the store has answered.
    pub writing: Option<Writing>,
}

impl SyncBatch {
    pub fn hits(&self) -> u64 {
        self.deltas.iter().map(|d| d.delta.max(0) as u64).sum()
    }
}

/// An entry's sum for the usage history, as the store takes it.
fn usage_delta((tenant, client, h): (Arc<str>, Arc<str>, AnsweredHour)) -> UsageDelta {
    UsageDelta {
        tenant: tenant.to_string(),
        client: client.to_string(),
        hour: h.hour_ms,
        counts: Counts {
            admitted: h.admitted,
            cost: h.cost,
            ..Counts::default()
        },
        cost_returned: 0,
    }
}

/// Which span of time a pass covers, and how often an entry's turn comes
/// (`Shares::round_spans`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Round {
    /// The previous pass's instant (ms): this pass covers the time since. An entry's turn comes
    /// at the instants its hash names, once per span, whether the rounds between took an
    /// interval each or longer: a round slower than the interval does not stretch the wait.
    pub(super) since: i64,
    /// The sync interval (ms): what a round of the turns' spans is.
    pub(super) interval_ms: i64,
    /// Rounds between two writes of a counter that nothing presses.
    pub(super) write_every: u16,
    /// Rounds between two reads back of one nobody writes.
    pub(super) read_every: u16,
    /// More than one instance: what is written is read back in the same round.
    pub(super) fleet: bool,
}

impl Round {
    /// The round at `now` of a fleet timed by `shares`, the pass before it at `since` (None:
    /// this is the first pass, which covers one interval).
    pub(super) fn new(shares: &Shares, since: Option<i64>, now: i64) -> Self {
        let (write_every, read_every) = shares.round_spans();
        let interval_ms = shares.interval_ms();
        Round {
            since: since.unwrap_or(now - interval_ms),
            interval_ms,
            write_every,
            read_every,
            fleet: shares.fleet.members() > 1,
        }
    }
}

/// A key's place in the rounds: FNV-1a over the tenant and the subject, stable across
/// processes and versions.
fn slot_of(tenant: &str, subject: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in tenant.bytes().chain([0]).chain(subject.iter().copied()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl Table {
    /// A sync round's one pass over the entries: evicts what no longer counts (as
    /// [`Table::evict`]), takes a snapshot of the pending hits of every entry that is due
    /// (as increments), and lists the counters to read back. With `all`, every entry is due;
    /// with `answers`, also takes what the client entries summed for the usage history.
    ///
    /// An entry is due when a check found its unsynced hits pressing on this instance's share
    /// of the headroom (a fleet near a limit: every round), or when its hits have waited
    /// `sync.max_delay_ms`. So the store's work follows the counters near their limits, not
    /// every active client; the fleet bound does not depend on it, as an instance never admits
    /// more than its share of the headroom it last read, however long ago. In a fleet, what is
    /// written is read back in the same round (one query per client); alone, this instance's
    /// own view is exact, and entries are read back only every few writes.
    ///
    /// The hits taken count as written from here on (moved from pending to stored, which a
    /// second pass once did after the write returned): a write that reaches the store, or
    /// whose outcome is unknown, then needs no more passes over the entries. A write refused
    /// with nothing written gives them back with [`Table::unwritten`] before the next pass.
    /// An entry whose hits are taken is not evicted in the same pass, so the next pass finds
    /// them pending again when they were given back: a counter holding unwritten hits still
    /// never leaves memory.
    pub(super) fn collect(
        &self,
        now: i64,
        (answers, all): (bool, bool),
        round: Round,
        writing: Writing,
        history: &Recorder,
    ) -> SyncBatch {
        let mut batch = SyncBatch {
            writing: Some(writing),
            ..SyncBatch::default()
        };
        let evicting = self.evicting(now);
        let mut tally = Tally::default();
        let Round {
            since,
            interval_ms,
            write_every,
            read_every,
            fleet,
        } = round;
        // An entry's turn comes at the instant its hash names within each span of `every`
        // intervals, so the entries a delay lets wait are written a slice a round, not all in
        // one round; a pass that covers that instant (however long since the last) takes it.
        let turn = |slot: u64, every: u16| {
            let span = i64::from(every) * interval_ms.max(1);
            every == 1 || {
                let phase = (slot % span as u64) as i64;
                (now - phase).div_euclid(span) > (since - phase).div_euclid(span)
            }
        };
        // Strings are copied after the lock is let go.
        let mut taken: Vec<(Arc<str>, Arc<str>, AnsweredHour)> = Vec::new();
        let mut pace = Pacer::new();
        let mut dropped = 0u64;
        // The counters to read back that are not near a limit: after the others.
        let mut rest: Vec<CounterRange> = Vec::new();
        for shard in self.all_shards() {
            let mut g = lock(shard);
            g.retain(|k, e| {
                if !evicting.keep(k, e, &mut tally) {
                    return false;
                }
                // The subject as the store names it: made once for the entry, if it is needed.
                let mut subject = None;
                if answers {
                    if let Some(h) = e.answered.take() {
                        let s = subject.get_or_insert_with(|| k.subject.to_arc());
                        taken.push((k.tenant.clone(), s.clone(), h));
                    }
                }
                e.stale_rounds = e.stale_rounds.saturating_add(1);
                let pressing = e.states.iter().any(|s| s.pressing);
                // Its turn comes once every `write_every` intervals of time: its hits wait at
                // most that, and the round that takes them.
                // The slot is a hash of the key that is the same in every process (the maps'
                // hasher is seeded at random), so a run is the same run twice.
                let lazy = write_every > 1;
                let slot = if lazy {
                    slot_of(&k.tenant, k.subject.as_bytes())
                } else {
                    0
                };
                let write = all || pressing || turn(slot, write_every);
                let has_pending = write && e.states.iter().any(|s| s.pending() > 0);
                // Others' hits reach an entry by reading it back: in a fleet, whenever it is
                // written or pressed, or used at its write time; otherwise (and alone, where
                // this instance's own writes keep it exact) every few writes.
                // A state admitted before its first read (`first`) is read at the next round.
                let unread = e.states.iter().any(|s| s.unread);
                let refresh = (fleet && (pressing || (write && (has_pending || e.touched))))
                    || (lazy && turn(slot.rotate_left(32), read_every))
                    || e.stale_rounds >= read_every
                    || unread;
                let reads = if pressing || unread {
                    &mut batch.ranges
                } else {
                    &mut rest
                };
                for s in e.states.iter_mut() {
                    let mut key = || CounterKey {
                        tenant: k.tenant.clone(),
                        subject: subject.get_or_insert_with(|| k.subject.to_arc()).clone(),
                        limit: s.id.clone(),
                        grain: s.kind.grain(),
                    };
                    if write {
                        let mut moved = 0;
                        let near = s.pressing;
                        // A window's bucket that no estimate will read again need not be
                        // written (a token bucket's old buckets feed its carry: they are).
                        let needed = if s.kind.is_tokens() {
                            i64::MIN
                        } else {
                            s.oldest_needed(now)
                        };
                        for b in s.buckets.iter_mut().filter(|b| b.pending > 0) {
                            let n = b.pending.min(i64::MAX as u64);
                            if b.start < needed {
                                b.pending = 0;
                                dropped += n;
                                continue;
                            }
                            batch.deltas.push(Delta {
                                key: key(),
                                start: b.start,
                                delta: n as i64,
                            });
                            batch.bases.push(b.mine);
                            batch.near.push(near);
                            b.mine = b.mine.saturating_add(n as i64);
                            b.pending -= n;
                            b.stored = b.stored.saturating_add(n as i64);
                            moved += n;
                        }
                        s.settling = s.settling.saturating_add(moved);
                    }
                    if refresh {
                        s.pressing = false;
                        reads.push(CounterRange {
                            key: key(),
                            from: s.oldest_needed(now),
                            to: newest_readable(s.kind, now),
                        });
                    }
                }
                if refresh {
                    e.stale_rounds = 0;
                    e.touched = false;
                }
                true
            });
            drop(g);
            self.shard_evicted(&mut tally, history);
            batch.answers.extend(taken.drain(..).map(usage_delta));
            pace.step();
        }
        batch.pending = self.evicted(tally).1.saturating_sub(dropped);
        batch.urgent = batch.ranges.len();
        batch.ranges.append(&mut rest);
        batch
    }

    /// Takes what the client entries summed for the usage history (what [`Table::collect`]
    /// takes with `answers`), and nothing else.
    pub(super) fn take_answers(&self) -> Vec<UsageDelta> {
        let mut taken = Vec::new();
        for shard in self.all_shards() {
            for (k, e) in lock(shard).iter_mut() {
                if let Some(h) = e.answered.take() {
                    taken.push((k.tenant.clone(), k.subject.to_arc(), h));
                }
            }
        }
        taken.into_iter().map(usage_delta).collect()
    }

    /// The snapshot's increments were refused with nothing written, or not sent in the
    /// round's time: they are pending again (hits admitted since the snapshot are pending
    /// already), and their counters are written at the next round, whatever their turn.
    /// What was reset meanwhile is dropped as unwritten hits are (see `reset`).
    /// Marks the counters of `ranges` to be read at the next round (a read back missed them).
    pub(super) fn unread(&self, ranges: &[CounterRange]) {
        self.each_state(ranges, |r| &r.key, |s, _| s.pressing = true);
    }

    pub(super) fn unwritten(&self, deltas: &[Delta]) {
        self.each_state(
            deltas,
            |d| &d.key,
            |s, run| {
                s.pressing = true;
                for d in run {
                    let n = d.delta.max(0);
                    let b = window::bucket_at(&mut s.buckets, d.start);
                    b.stored = b.stored.saturating_sub(n);
                    b.mine = b.mine.saturating_sub(n);
                    b.pending = b.pending.saturating_add(n as u64);
                    s.settling = s.settling.saturating_sub(n as u64);
                }
            },
        );
    }

    /// Installs totals read back from the store: they include every instance's writes.
    pub(super) fn refreshed(
        &self,
        ranges: &[CounterRange],
        totals: Vec<Vec<BucketTotal>>,
        now: i64,
        shares: &Shares,
    ) {
        let read: Vec<(&CounterRange, Vec<BucketTotal>)> = ranges.iter().zip(totals).collect();
        let held = self.in_doubt.held();
        self.each_state(
            &read,
            |x| &x.0.key,
            |s, run| {
                for (r, t) in run {
                    let before = s.view(now);
                    let kept = s.region().map(|p| p.earned);
                    s.set_region(shares.region_part(t, r, now, kept));
                    s.share = shares.reshare(s, t, r, now);
                    s.unread = false;
                    s.read_back(now);
                    // This instance's own written hits the store does not show, as far as
                    // their writes are in doubt (`InDoubt`), stay counted, in `stored` and as
                    // unseen by the others (`settling`), until a read shows them: this
                    // instance knows what it admitted, and the others cannot hold room for
                    // them. Otherwise the store's count stands.
                    let doubted = |start| held.as_ref().map_or(0, |h| h.hits(&r.key, start));
                    let mut unseen = 0i64;
                    // The read covers its range's buckets alone: newer ones (a range taken
                    // rounds ago) keep what memory has.
                    let covered = |b: &&mut window::Bucket| b.start >= r.from && b.start <= r.to;
                    for b in s.buckets.iter_mut().filter(covered) {
                        if t.binary_search_by_key(&b.start, |bt| bt.start).is_err() {
                            let kept = b.mine.clamp(0, doubted(b.start).max(0));
                            (b.stored, b.mine) = (kept, kept);
                            unseen = unseen.saturating_add(kept);
                        }
                    }
                    for bt in t {
                        let b = window::bucket_at(&mut s.buckets, bt.start);
                        let missing = (b.mine - bt.mine).clamp(0, doubted(bt.start).max(0));
                        b.mine = bt.mine.saturating_add(missing);
                        b.stored = bt.total.saturating_add(missing);
                        unseen = unseen.saturating_add(missing);
                    }
                    s.settling = unseen.max(0) as u64;
                    shares.note_read(s, now, before);
                }
            },
        );
    }

    /// Runs `f` on the state of each run of `items` naming one counter (with the run), for the
    /// counters in memory. A snapshot lists an entry's counters together and visits the
    /// entries shard by shard, so each run of one entry's counters is one lookup, and each run
    /// of one shard's entries one lock.
    fn each_state<T>(
        &self,
        items: &[T],
        key: impl Fn(&T) -> &CounterKey,
        mut f: impl FnMut(&mut LimitState, &[T]),
    ) {
        let mut held: Option<(&Mutex<Shard>, MutexGuard<'_, Shard>)> = None;
        let mut pace = Pacer::new();
        for entry_run in items.chunk_by(|a, b| key(a).same_subject(key(b))) {
            let k = key(&entry_run[0]);
            let r = self.key_ref(&k.tenant, &k.subject);
            let shard = self.shard_of(r);
            if !held.as_ref().is_some_and(|(m, _)| std::ptr::eq(*m, shard)) {
                // One shard at a time: let go of the last before taking the next.
                if held.take().is_some() {
                    pace.step();
                }
            }
            let (_, g) = held.get_or_insert_with(|| (shard, lock(shard)));
            let Some(e) = g.get_mut(&r) else {
                continue;
            };
            for run in entry_run.chunk_by(|a, b| key(a) == key(b)) {
                if let Some(s) = e.states.iter_mut().find(|s| s.counts(key(&run[0]))) {
                    f(s, run);
                }
            }
        }
    }

    /// Takes the hits pending in memory for these counters, as a round's snapshot does (moved
    /// from pending to stored), for a strict call to write.
    pub(super) fn carry_pending(&self, ranges: &[CounterRange], now: i64) -> Vec<Delta> {
        let mut carried = Vec::new();
        for r in ranges {
            self.with_state(&r.key, |s| {
                if s.pending() == 0 {
                    return;
                }
                let needed = s.oldest_needed(now);
                for b in s.buckets.iter_mut().filter(|b| b.pending > 0) {
                    let n = b.pending.min(i64::MAX as u64);
                    b.pending = 0;
                    if b.start < needed {
                        continue;
                    }
                    carried.push(Delta {
                        key: r.key.clone(),
                        start: b.start,
                        delta: n as i64,
                    });
                    b.stored = b.stored.saturating_add(n as i64);
                    b.mine = b.mine.saturating_add(n as i64);
                    s.settling = s.settling.saturating_add(n);
                }
            });
        }
        carried
    }
}
