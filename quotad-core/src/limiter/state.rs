//! The in-memory state: one [`Entry`] per key, holding one [`LimitState`] per limit, in maps
//! sharded behind `std::sync::Mutex`es.
//!
//! A limit's state holds its buckets, each with the count last read from the store (`stored`)
//! and the hits this instance admitted since (`pending`). The estimate is over `stored +
//! pending`, so this instance's own hits count at once and other instances' from the next sync.
//!
//! Invariants:
//! - Pending hits only leave memory by being written: [`LimitState::prune`] keeps every bucket
//!   holding some.
//! - A shard's lock is held only for in-memory arithmetic, never across an `.await`.
//! - Bucket vectors keep their capacity as buckets roll, so a check in steady state allocates
//!   nothing.

use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::{Equivalent, HashTable};
use smallvec::SmallVec;

use super::key::{EntryKey, EntryRef};
use super::reserve::{Pace, Reserve};
use super::tokens::{self, Carry};
use super::window::{self, Bucket};
use crate::domain::{Limit, LimitKind};
use crate::store::history::HOUR_MS;
use crate::store::{BucketTotal, CounterKey};

#[derive(Debug)]
pub(super) struct LimitState {
    pub(super) id: Arc<str>,
    pub(super) kind: LimitKind,
    /// Sorted by start.
    pub(super) buckets: Vec<Bucket>,
    /// This instance's share of the headroom (1 when it is alone).
    pub(super) share: f32,
    /// Hits this instance wrote since its last read back: in `stored` already, but not yet in
    /// what the other instances know, so they still count against this instance's share.
    pub(super) settling: u64,
    /// A check since the last sync found this instance's unsynced hits past an eighth of its
    /// share of the headroom (or over it): write and read back at the next round, whatever
    /// `sync.max_delay_ms` says.
    pub(super) pressing: bool,
    /// Installed before its first read (`first`): counts only this instance's hits since, and
    /// admits within the counter's unread budget until the next round reads it back.
    pub(super) unread: bool,
    /// What only some states need: a token bucket's level, and in a fleet that writes lazily
    /// the [`Reserve`]. None for the rest, whose states stay as small as they were (one word
    /// here instead of the bytes of both).
    pub(super) aux: Option<Box<Aux>>,
}

/// A state's rarer parts, behind one pointer.
#[derive(Debug, Default)]
pub(super) struct Aux {
    pub(super) tokens: Option<TokenLevel>,
    pub(super) reserve: Option<Reserve>,
    /// In a fleet: the reads of the last spans of `Shares::seen_span`, for what the other
    /// instances may hold unwritten (`allowance::others_hold`).
    pub(super) seen: Option<Reserve>,
    /// In a fleet of several regions: this region's part of the count (`share`).
    pub(super) region: Option<RegionPart>,
    /// In a fleet: the last read back against the one before it (windows).
    pub(super) pace: Option<Pace>,
}

/// This region's part of a counter, as the last read showed it (a fleet of several regions).
#[derive(Debug, Default)]
pub(super) struct RegionPart {
    /// Per bucket, the hits this region's instances wrote (in `stored`; `pending` unused).
    pub(super) buckets: Vec<Bucket>,
    /// This instance's share of the region's headroom (N = the region's members).
    pub(super) share: f32,
    /// The region's share of the limit as its traffic earned it while every region was heard:
    /// its budget while one is not, unless the policy splits the limit.
    pub(super) earned: f32,
}

/// A token bucket's state beyond its buckets.
#[derive(Debug)]
pub(super) struct TokenLevel {
    /// Its level at the start of its oldest bucket that still counts (see `tokens`).
    pub(super) carry: Carry,
    /// When its buckets were last read from the store: only buckets every instance had
    /// written by then are folded.
    pub(super) read_at: i64,
}

/// How long after it ends a token bucket's counter bucket has been written by every instance,
/// in sync intervals (each writes its hits at its next round).
pub(super) const TOKEN_SETTLE_ROUNDS: i64 = 2;
/// A token bucket's counter buckets are folded once this many old at most, whatever the reads:
/// within what the store keeps and what a first read reaches back to.
pub(super) const TOKEN_MAX_UNFOLDED: i64 = 30;

impl LimitState {
    /// A limit's state over `buckets`, read at `now` over `key::range_of`, nothing written
    /// since the read that gave them.
    pub(super) fn new(l: &Limit, buckets: Vec<Bucket>, share: f32, now: i64) -> Self {
        LimitState {
            id: l.id.as_arc().clone(),
            kind: l.kind,
            buckets,
            share,
            settling: 0,
            pressing: false,
            unread: false,
            aux: l.kind.is_tokens().then(|| {
                Box::new(Aux {
                    tokens: Some(TokenLevel {
                        carry: Carry {
                            at: window::oldest_needed(l.kind, now),
                            deficit: 0,
                        },
                        read_at: now,
                    }),
                    ..Aux::default()
                })
            }),
        }
    }

    /// A limit's state before its first read (`first`): nothing known of the store's count.
    pub(super) fn unread(l: &Limit, share: f32, now: i64) -> Self {
        LimitState {
            unread: true,
            ..Self::new(l, Vec::new(), share, now)
        }
    }

    /// The first read of an unread state, made on the check path (`miss::load`), comes in:
    /// the store's totals from `from` on. A sync write of this state's hits may be under way
    /// that the read did or did not see: they are counted once more in the newest bucket
    /// (erring high), and the next round reads the counter back.
    pub(super) fn first_read_in(&mut self, totals: &[BucketTotal], from: i64) {
        for b in self.buckets.iter_mut().filter(|b| b.start >= from) {
            b.stored = 0;
        }
        for t in totals {
            window::bucket_at(&mut self.buckets, t.start).stored = t.total;
        }
        if let Some(b) = self.buckets.last_mut() {
            b.stored = b
                .stored
                .saturating_add(self.settling.min(i64::MAX as u64) as i64);
        }
        self.unread = false;
        self.pressing = true;
    }

    fn token_level(&self) -> Option<&TokenLevel> {
        self.aux.as_ref().and_then(|a| a.tokens.as_ref())
    }

    fn token_level_mut(&mut self) -> Option<&mut TokenLevel> {
        self.aux.as_mut().and_then(|a| a.tokens.as_mut())
    }

    /// This region's part of the count, in a fleet of several regions.
    pub(super) fn region(&self) -> Option<&RegionPart> {
        self.aux.as_ref().and_then(|a| a.region.as_ref())
    }

    /// Keeps this region's part of a read (`None`: one region).
    pub(super) fn set_region(&mut self, part: Option<RegionPart>) {
        match part {
            Some(p) => self.aux.get_or_insert_with(Box::default).region = Some(p),
            None => self.aux.iter_mut().for_each(|a| a.region = None),
        }
    }

    /// What this instance reserves for the others' unwritten hits, if anything.
    pub(super) fn reserve(&self) -> Option<&Reserve> {
        self.aux.as_ref().and_then(|a| a.reserve.as_ref())
    }

    /// Notes a read in the reserve (`Some`), or drops it (`None`: no fleet that writes lazily).
    pub(super) fn note_reserve(&mut self, read: Option<(i64, i64)>) {
        match read {
            Some((period, est)) => {
                let share = self.share;
                let aux = self.aux.get_or_insert_with(Box::default);
                Reserve::note(&mut aux.reserve, period, est, share);
            }
            None => {
                if let Some(a) = self.aux.as_mut() {
                    a.reserve = None;
                }
                if self
                    .aux
                    .as_ref()
                    .is_some_and(|a| a.tokens.is_none() && a.region.is_none() && a.seen.is_none())
                {
                    self.aux = None;
                }
            }
        }
    }

    /// What a token bucket's level is read with (ignored by other kinds).
    pub(super) fn carry(&self) -> Carry {
        self.token_level().map_or_else(Carry::default, |t| t.carry)
    }

    /// The store was read for this state at `now`.
    pub(super) fn read_back(&mut self, now: i64) {
        if let Some(t) = self.token_level_mut() {
            t.read_at = now;
        }
    }

    /// The limit changed how it counts (same id, same grain): the buckets still count; a token
    /// bucket's carry follows the new refill.
    pub(super) fn rekind(&mut self, kind: LimitKind, now: i64) {
        if self.kind != kind {
            let tokens = kind.is_tokens().then(|| TokenLevel {
                carry: tokens::rekind(self.kind, kind, self.carry(), now),
                read_at: self.token_level().map_or(now, |t| t.read_at),
            });
            let reserve = self.aux.as_mut().and_then(|a| a.reserve.take());
            let seen = self.aux.as_mut().and_then(|a| a.seen.take());
            let region = self.aux.as_mut().and_then(|a| a.region.take());
            let any = tokens.is_some() || reserve.is_some() || seen.is_some() || region.is_some();
            self.aux = any.then(|| {
                Box::new(Aux {
                    tokens,
                    reserve,
                    seen,
                    region,
                    pace: None,
                })
            });
            self.kind = kind;
        }
    }

    /// A token bucket whose level is above 0: the carry holds what the store's buckets no
    /// longer show, so the state must stay in memory.
    pub(super) fn holds_a_level(&self, now: i64) -> bool {
        self.kind.is_tokens() && window::estimate(self.kind, &self.buckets, self.carry(), now) > 0
    }

    /// Buckets that start before this instant no longer count (a token bucket's are folded
    /// into its carry).
    pub(super) fn oldest_needed(&self, now: i64) -> i64 {
        if self.kind.is_tokens() {
            self.carry().at
        } else {
            window::oldest_needed(self.kind, now)
        }
    }

    /// Nothing counts any more: no bucket, and (a token bucket) a full bucket.
    pub(super) fn is_empty(&self, now: i64) -> bool {
        self.buckets.is_empty() && !self.holds_a_level(now)
    }

    pub(super) fn is(&self, l: &Limit) -> bool {
        // Installed from the same policy, the ids are one allocation: no string compare.
        (Arc::ptr_eq(&self.id, l.id.as_arc()) || *self.id == *l.id.as_str())
            && self.kind.grain() == l.kind.grain()
    }

    /// This state counts the store's counter `k` (of its entry).
    pub(super) fn counts(&self, k: &CounterKey) -> bool {
        self.id == k.limit && self.kind.grain() == k.grain
    }

    pub(super) fn pending(&self) -> u64 {
        self.buckets.iter().map(|b| b.pending).sum()
    }

    /// Drops buckets that no longer count and hold nothing to write; a token bucket first folds
    /// those that ended `settle_ms` before its last read (or are `TOKEN_MAX_UNFOLDED` old).
    pub(super) fn prune(&mut self, now: i64, settle_ms: i64) {
        let kind = self.kind;
        if let (LimitKind::Tokens { grain_ms, .. }, Some(t)) = (kind, self.token_level_mut()) {
            let read = t.read_at.min(now) - settle_ms;
            let oldest = kind.grain().bucket_start(now) - TOKEN_MAX_UNFOLDED * i64::from(grain_ms);
            let mut carry = t.carry;
            tokens::fold(kind, &self.buckets, &mut carry, read.max(oldest));
            if let Some(t) = self.token_level_mut() {
                t.carry = carry;
            }
        }
        let oldest = self.oldest_needed(now);
        if self
            .buckets
            .first()
            .is_some_and(|b| b.start < oldest && b.pending == 0)
        {
            self.buckets.retain(|b| b.start >= oldest || b.pending > 0);
        }
    }
}

/// Laid out in this order (`repr(C)`, after the key in [`Node`]): what every check writes
/// comes first, the states last. So a check of a client with two or more limits, whose states
/// live on the heap, reads the node's first two cache lines only: the key and the marks in the
/// first, the tally and the states' pointer in the second. (In the order the compiler chose,
/// the key came last, and a check read all three lines of the node.)
#[derive(Debug, Default)]
#[repr(C)]
pub(super) struct Entry {
    pub(super) last_used: i64,
    /// Used since its totals were last read back: in a fleet, they are read back when it is
    /// next written.
    pub(super) touched: bool,
    /// Sync rounds since its totals were last read back.
    pub(super) stale_rounds: u16,
    /// A client entry: the checks admitted on it since the usage history last took them.
    pub(super) answered: Answered,
    /// One state inline (a one-limit policy, a tenant's entry); more spill to the heap.
    pub(super) states: SmallVec<[LimitState; 1]>,
}

impl Entry {
    /// Asks for the entry's states where they spilled to the heap (inline ones came with the
    /// node).
    pub(super) fn prefetch_states(&self) {
        if self.states.spilled() {
            prefetch(&self.states);
        }
    }

    /// Asks for each state's buckets (which reads the states: ask for them first).
    pub(super) fn prefetch_buckets(&self) {
        for s in &self.states {
            prefetch(&s.buckets);
        }
    }
}

/// A client's admitted checks for the usage history, summed where the check holds the lock
/// already (`crate::history` explains the split with the history's own rows). 16 bytes: one
/// hour at a time, a count that a write interval cannot fill in practice; what does not fit
/// goes to the history's rows.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Answered {
    /// The hour counted, in hours since the epoch; meaningless while `admitted` is 0.
    hour: i32,
    admitted: u32,
    cost: u64,
}

/// An entry's admitted checks of one hour, handed over to the usage history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AnsweredHour {
    /// The hour's start, ms since the epoch.
    pub(super) hour_ms: i64,
    pub(super) admitted: u64,
    pub(super) cost: u64,
}

impl Answered {
    /// Adds one check admitted at `now` taking `cost`. When the sum cannot take it (it holds
    /// another hour, or is full), returns the sum it held, and starts over with this check;
    /// `Err` when `now` lies outside the hours this can name at all (the check is left out:
    /// the caller records it elsewhere).
    pub(super) fn add(&mut self, now: i64, cost: u64) -> Result<Option<AnsweredHour>, ()> {
        let hour = i32::try_from(now.div_euclid(HOUR_MS)).map_err(|_| ())?;
        if self.admitted > 0 && self.hour == hour && self.admitted < u32::MAX {
            self.admitted += 1;
            self.cost = self.cost.saturating_add(cost);
            return Ok(None);
        }
        let before = self.take();
        *self = Answered {
            hour,
            admitted: 1,
            cost,
        };
        Ok(before)
    }

    /// The checks summed.
    pub(super) fn checks(&self) -> u64 {
        u64::from(self.admitted)
    }

    /// Takes the sum, leaving nothing.
    pub(super) fn take(&mut self) -> Option<AnsweredHour> {
        (self.admitted > 0).then(|| {
            let a = std::mem::take(self);
            AnsweredHour {
                hour_ms: i64::from(a.hour) * HOUR_MS,
                admitted: u64::from(a.admitted),
                cost: a.cost,
            }
        })
    }
}

/// One shard's entries. The table holds a pointer per entry and the entries live in their own
/// allocations: a hash table is never full, so a slot as large as the whole key and entry
/// leaves most of its empty slots' bytes unused, where a pointer's slot leaves a few (memory
/// per counter: `docs/performance.md`).
#[derive(Default)]
pub(super) struct Shard {
    table: HashTable<Box<Node>>,
}

/// The key first (its hash first of all: the probe's compare reads it), then the entry.
#[repr(C)]
struct Node {
    key: EntryKey,
    entry: Entry,
}

impl Shard {
    pub(super) fn get(&self, r: &EntryRef<'_>) -> Option<&Entry> {
        self.table
            .find(r.hash, |n| r.equivalent(&n.key))
            .map(|n| &n.entry)
    }

    pub(super) fn get_mut(&mut self, r: &EntryRef<'_>) -> Option<&mut Entry> {
        self.table
            .find_mut(r.hash, |n| r.equivalent(&n.key))
            .map(|n| &mut n.entry)
    }

    /// Inserts an empty entry for a key that is not in the shard.
    pub(super) fn insert_new(&mut self, key: EntryKey) -> &mut Entry {
        let hash = key.hash;
        let node = Box::new(Node {
            key,
            entry: Entry::default(),
        });
        &mut self
            .table
            .insert_unique(hash, node, |n| n.key.hash)
            .into_mut()
            .entry
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&EntryKey, &mut Entry)> {
        self.table.iter_mut().map(|n| {
            let n = &mut **n;
            (&n.key, &mut n.entry)
        })
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Entry> {
        self.table.iter().map(|n| &n.entry)
    }

    /// Keeps the entries `keep` says to, visiting every entry (a sync round's pass).
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&EntryKey, &mut Entry) -> bool) {
        self.warm();
        self.table.retain(|n| {
            let n = &mut **n;
            keep(&n.key, &mut n.entry)
        });
    }

    /// Asks for the node of `r`'s entry without reading it: the first slot whose tag matches
    /// (a slot of another key now and then, which costs a useless load and nothing else).
    pub(super) fn prefetch_node(&self, r: &EntryRef<'_>) {
        self.table.find(r.hash, |n| {
            prefetch(std::slice::from_ref(&**n));
            true
        });
    }

    /// Brings the shard's entries into the cache before a pass over all of them. An entry is
    /// three allocations deep (the node, its states, each state's buckets), so a pass that
    /// walks them in turn waits for three cache misses an entry, one after the other: at 10^4
    /// active clients, two thirds of the pass's time. Asked for level by level over the whole
    /// shard (a few hundred entries, well within the core's cache), the misses of one level
    /// overlap each other instead.
    fn warm(&self) {
        for n in self.table.iter() {
            prefetch(std::slice::from_ref(&**n));
        }
        for n in self.table.iter() {
            n.entry.prefetch_states();
        }
        for n in self.table.iter() {
            n.entry.prefetch_buckets();
        }
    }
}

/// Most cache lines [`prefetch`] asks for at once (a 1 s window of 100 ms buckets takes five).
const PREFETCH_LINES: usize = 8;

/// Asks the CPU to start loading `items` (their first [`PREFETCH_LINES`] cache lines) and goes
/// on without waiting for them.
#[inline]
fn prefetch<T>(items: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = items.as_ptr().cast::<i8>();
        let bytes = std::mem::size_of_val(items).min(PREFETCH_LINES * 64);
        for off in (0..bytes).step_by(64) {
            // SAFETY: `off` is inside the slice; a prefetch reads nothing into the program
            // and cannot fault.
            unsafe { _mm_prefetch(p.add(off), _MM_HINT_T0) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = items;
}

pub(super) fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic holding a shard cannot leave it half-updated in a way worse than no service.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Buckets as the store counted them, with nothing pending.
pub(super) fn buckets_from(totals: &[BucketTotal]) -> Vec<Bucket> {
    totals
        .iter()
        .map(|t| Bucket {
            start: t.start,
            stored: t.total,
            pending: 0,
            mine: t.mine,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{Answered, AnsweredHour};
    use crate::store::history::HOUR_MS;

    #[test]
    fn answered_sums_one_hour_and_hands_over_the_last_when_the_hour_moves() {
        let mut a = Answered::default();
        assert_eq!(a.take(), None);
        let h = 490_000 * HOUR_MS;
        assert_eq!(a.add(h + 5, 3), Ok(None));
        assert_eq!(a.add(h + HOUR_MS - 1, 0), Ok(None));
        assert_eq!(
            a.add(h + HOUR_MS, 2),
            Ok(Some(AnsweredHour {
                hour_ms: h,
                admitted: 2,
                cost: 3
            }))
        );
        let next = AnsweredHour {
            hour_ms: h + HOUR_MS,
            admitted: 1,
            cost: 2,
        };
        assert_eq!(a.take(), Some(next));
        assert_eq!(a.take(), None);
        // Before the epoch too (hours round down).
        assert_eq!(a.add(-1, 1), Ok(None));
        assert_eq!(a.take().map(|t| t.hour_ms), Some(-HOUR_MS));
        // An hour no i32 names is refused, not wrapped.
        assert_eq!(a.add(i64::MAX, 1), Err(()));
        assert_eq!(a.take(), None);
    }

    #[test]
    fn a_full_sum_is_handed_over_whole() {
        let mut a = Answered {
            hour: 7,
            admitted: u32::MAX,
            cost: u64::MAX,
        };
        let full = a.add(7 * HOUR_MS, 1).unwrap().unwrap();
        assert_eq!((full.admitted, full.cost), (u64::from(u32::MAX), u64::MAX));
        assert_eq!(a.take().map(|t| (t.admitted, t.cost)), Some((1, 1)));
    }

    /// A check of a multi-limit client reads the node's first two cache lines only: the hash,
    /// the key and the marks, then the tally and the states' pointer. And the node is no
    /// larger for the order.
    #[test]
    fn what_a_check_reads_of_a_node_sits_in_its_first_two_lines() {
        use super::{Entry, Node};
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(Node, key), 0);
        assert_eq!(offset_of!(super::EntryKey, hash), 0);
        let entry = offset_of!(Node, entry);
        assert!(entry + offset_of!(Entry, stale_rounds) < 64);
        // A spilled SmallVec keeps its pointer within its first 32 bytes, whatever order the
        // compiler gives its fields: its capacity, the storage's tag and the heap variant's
        // (pointer, length) come before the rest of the inline storage.
        assert!(entry + offset_of!(Entry, states) + 32 <= 128);
        assert!(size_of::<Node>() <= 184, "{}", size_of::<Node>());
    }

    /// Every counter in memory holds one: what a token bucket alone needs lives behind a
    /// pointer, and a kind is no wider than a sliding window's (`docs/performance.md` counts
    /// bytes per counter).
    #[test]
    fn a_limit_state_stays_small() {
        assert!(std::mem::size_of::<super::LimitState>() <= 88);
        assert!(std::mem::size_of::<crate::domain::LimitKind>() <= 24);
    }
}
