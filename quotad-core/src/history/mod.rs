//! Usage history, in memory: what each check was answered, summed per (tenant, client, hour)
//! until the sync task writes it ([`crate::store::history::HistoryStore::add_usage`]).
//!
//! Two places hold it. The commonest answer, a check admitted on a counter held in memory, is
//! summed in the client's limiter entry, under the lock the check holds already (no second
//! hash, lock or row per client; the limiter's `Answered`). Everything else comes here, a
//! row per (tenant, client, hour) under one shard's lock: denials (with the limit that bound
//! them), checks decided through the store (strict mode, beyond a memory cap, store trouble),
//! and an entry's sum that it cannot keep (its hour ended, or it leaves memory). A check adds to
//! a row with no store call, and no allocation once the row exists (the key holds the request's
//! `Arc<str>` ids, and a lookup borrows them).
//!
//! The sync task takes both every `history.write_interval_ms` (the entries' sums in the same
//! pass that collects their pending hits); a batch the store refused (nothing written) comes
//! back here through [`Recorder::restore`] and is tried again; one whose outcome is unknown is
//! not resent (increments are not idempotent) and is counted instead, as counter hits are.
//!
//! Memory is bounded: at most `max_rows` rows wait here (rows live one write interval unless
//! the store fails), and the entries' sums are a few bytes of entries already bounded by the
//! limiter's caps. A check that would need one more row is still answered, and counted in
//! [`Recorder::dropped`] (exported as `quotad_history_unrecorded_checks_total`), never silently.

use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use hashbrown::{DefaultHashBuilder, Equivalent, HashMap};

use crate::keyhash::BuildKeyHash;
use crate::store::history::{Counts, UsageDelta, HOUR_MS};

#[derive(Clone, PartialEq, Eq, Debug)]
struct RowKey {
    hash: u64,
    tenant: Arc<str>,
    client: Arc<str>,
    hour: i64,
}

impl Hash for RowKey {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash)
    }
}

struct RowRef<'a> {
    hash: u64,
    tenant: &'a str,
    client: &'a str,
    hour: i64,
}

impl Hash for RowRef<'_> {
    fn hash<H: Hasher>(&self, h: &mut H) {
        h.write_u64(self.hash)
    }
}

impl Equivalent<RowKey> for RowRef<'_> {
    fn equivalent(&self, k: &RowKey) -> bool {
        k.hash == self.hash
            && k.hour == self.hour
            && *k.tenant == *self.tenant
            && *k.client == *self.client
    }
}

#[derive(Default, Debug)]
struct Row {
    admitted: u64,
    cost: u64,
    denied: u64,
    /// Cost given back by reservations taken in this hour (settled below their estimate, or
    /// released): netted against `cost` when the row is taken.
    returned: u64,
    /// Denials by binding limit id. A `Vec`, empty (no allocation) in the common hour without
    /// a denial: a row is kept per active client, so its size is a cost per client.
    denied_by: Vec<(Arc<str>, u64)>,
}

impl Row {
    /// The row as an increment: its counts, and what it gives back of their cost, netted so
    /// that at most one of the two is not 0.
    fn delta(self, k: RowKey) -> UsageDelta {
        let mut counts = self.counts();
        let back = self.returned.min(counts.cost);
        counts.cost -= back;
        UsageDelta {
            tenant: k.tenant.to_string(),
            client: k.client.to_string(),
            hour: k.hour,
            counts,
            cost_returned: self.returned - back,
        }
    }

    fn counts(&self) -> Counts {
        Counts {
            admitted: self.admitted,
            cost: self.cost,
            denied: self.denied,
            denied_by: self
                .denied_by
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        }
    }
}

/// Keys carry their hash: the maps use the pass-through hasher of `keyhash`.
type Shard = HashMap<RowKey, Row, BuildKeyHash>;

/// What one check was answered, as history counts it.
#[derive(Clone, Copy, Debug)]
pub enum Answer<'a> {
    /// Answered "allowed" (200), taking `cost`.
    Admitted { cost: u64 },
    /// Answered "denied" (429); `by` is the id of the limit that bound the denial.
    Denied { by: &'a Arc<str> },
}

/// The rows waiting for the sync task.
pub struct Recorder {
    shards: Box<[Mutex<Shard>]>,
    hasher: DefaultHashBuilder,
    rows: AtomicUsize,
    max_rows: usize,
    dropped: AtomicU64,
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Recorder {
    pub fn new(shards: usize, max_rows: usize) -> Self {
        Self {
            shards: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            hasher: DefaultHashBuilder::default(),
            rows: AtomicUsize::new(0),
            max_rows,
            dropped: AtomicU64::new(0),
        }
    }

    /// Adds one check's answer to its (tenant, client, hour) row.
    pub fn record(&self, tenant: &Arc<str>, client: &Arc<str>, now_ms: i64, answer: Answer<'_>) {
        self.with_row(tenant, client, now_ms, 1, |row| add(row, answer));
    }

    /// Adds `admitted` checks taking `cost` in all, answered in the hour of `at_ms`, to their
    /// row. The limiter sums a client's admitted checks in the client's entry, where the check
    /// holds the lock already, and hands them over here when the entry cannot keep them (an
    /// hour ended, the entry leaves memory).
    pub fn add_admitted(
        &self,
        tenant: &Arc<str>,
        client: &Arc<str>,
        at_ms: i64,
        admitted: u64,
        cost: u64,
    ) {
        self.with_row(tenant, client, at_ms, admitted, |row| {
            row.admitted += admitted;
            row.cost = row.cost.saturating_add(cost);
        });
    }

    /// Changes the cost counted in the hour of `at_ms` by `delta`, with no check: a
    /// reservation taken then that settled above its estimate (`delta` > 0), or below it or
    /// released (`delta` < 0), so that history counts the cost settled, not the estimate.
    pub fn adjust_cost(&self, tenant: &Arc<str>, client: &Arc<str>, at_ms: i64, delta: i64) {
        if delta == 0 {
            return;
        }
        // Beyond the row cap it is lost as a check's answer would be, and counted as one.
        self.with_row(tenant, client, at_ms, 1, |row| {
            if delta > 0 {
                row.cost = row.cost.saturating_add(delta.unsigned_abs());
            } else {
                row.returned = row.returned.saturating_add(delta.unsigned_abs());
            }
        });
    }

    /// Runs `f` on the row of (tenant, client, hour of `at_ms`) under its shard's lock, making
    /// the row if needed; when there is no room for one more, counts `checks` as dropped.
    fn with_row(
        &self,
        tenant: &Arc<str>,
        client: &Arc<str>,
        at_ms: i64,
        checks: u64,
        f: impl FnOnce(&mut Row),
    ) {
        let hour = at_ms - at_ms.rem_euclid(HOUR_MS);
        let hash = self.hasher.hash_one((&**tenant, &**client, hour));
        let shard = &self.shards[((hash >> 32) % self.shards.len() as u64) as usize];
        let mut g = lock(shard);
        let r = RowRef {
            hash,
            tenant,
            client,
            hour,
        };
        let row = match g.get_mut(&r) {
            Some(row) => row,
            None => {
                if self.rows.load(Ordering::Relaxed) >= self.max_rows {
                    self.dropped.fetch_add(checks, Ordering::Relaxed);
                    return;
                }
                self.rows.fetch_add(1, Ordering::Relaxed);
                let key = RowKey {
                    hash,
                    tenant: tenant.clone(),
                    client: client.clone(),
                    hour,
                };
                g.entry(key).or_default()
            }
        };
        f(row);
    }

    /// Takes every row, as increments for the store, leaving the maps empty (with their
    /// capacity, so the next round's checks do not allocate).
    pub fn drain(&self) -> Vec<UsageDelta> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            let taken: Vec<(RowKey, Row)> = lock(shard).drain().collect();
            self.rows.fetch_sub(taken.len(), Ordering::Relaxed);
            out.extend(taken.into_iter().map(|(k, row)| row.delta(k)));
        }
        out
    }

    /// Puts back a batch the store refused with nothing written, to be tried again.
    pub fn restore(&self, deltas: Vec<UsageDelta>) {
        for d in deltas {
            let (tenant, client): (Arc<str>, Arc<str>) = (d.tenant.into(), d.client.into());
            // Memory stays bounded while the store is down: beyond the cap, rows put back are
            // counted as unrecorded instead.
            let checks = d.counts.admitted + d.counts.denied;
            let (counts, returned) = (d.counts, d.cost_returned);
            self.with_row(&tenant, &client, d.hour, checks, |row| {
                row.admitted += counts.admitted;
                row.cost = row.cost.saturating_add(counts.cost);
                row.returned = row.returned.saturating_add(returned);
                row.denied += counts.denied;
                for (id, n) in counts.denied_by {
                    add_denied(row, &Arc::from(id), n);
                }
            });
        }
    }

    /// Rows waiting to be written.
    pub fn rows(&self) -> usize {
        self.rows.load(Ordering::Relaxed)
    }

    /// Checks whose answer found no room in memory (`max_rows`), since start.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Takes [`Recorder::dropped`] back to 0 (the sync task exports what it took).
    pub fn take_dropped(&self) -> u64 {
        self.dropped.swap(0, Ordering::Relaxed)
    }
}

fn add(row: &mut Row, answer: Answer<'_>) {
    match answer {
        Answer::Admitted { cost } => {
            row.admitted += 1;
            row.cost = row.cost.saturating_add(cost);
        }
        Answer::Denied { by } => {
            row.denied += 1;
            add_denied(row, by, 1);
        }
    }
}

fn add_denied(row: &mut Row, by: &Arc<str>, n: u64) {
    match row.denied_by.iter_mut().find(|(id, _)| **id == **by) {
        Some((_, c)) => *c += n,
        None => row.denied_by.push((by.clone(), n)),
    }
}

/// The number of checks in a batch of deltas (admitted and denied).
pub fn checks_in(deltas: &[UsageDelta]) -> u64 {
    deltas
        .iter()
        .map(|d| d.counts.admitted + d.counts.denied)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arc(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn answers_add_up_per_client_and_hour() {
        let r = Recorder::new(4, 100);
        let (t, a, b, lim) = (arc("t"), arc("a"), arc("b"), arc("per-min"));
        let h0 = 10 * HOUR_MS;
        r.record(&t, &a, h0 + 5, Answer::Admitted { cost: 3 });
        r.record(&t, &a, h0 + HOUR_MS - 1, Answer::Admitted { cost: 2 });
        r.record(&t, &a, h0 + 7, Answer::Denied { by: &lim });
        r.record(&t, &a, h0 + HOUR_MS, Answer::Admitted { cost: 1 });
        r.record(&t, &b, h0, Answer::Denied { by: &lim });
        assert_eq!(r.rows(), 3);
        let mut got = r.drain();
        got.sort_by(|x, y| (&x.client, x.hour).cmp(&(&y.client, y.hour)));
        assert_eq!(r.rows(), 0);
        assert_eq!(got.len(), 3);
        assert_eq!((got[0].client.as_str(), got[0].hour), ("a", h0));
        assert_eq!(
            (
                got[0].counts.admitted,
                got[0].counts.cost,
                got[0].counts.denied
            ),
            (2, 5, 1)
        );
        assert_eq!(got[0].counts.denied_by.get("per-min"), Some(&1));
        assert_eq!((got[1].hour, got[1].counts.admitted), (h0 + HOUR_MS, 1));
        assert_eq!((got[2].client.as_str(), got[2].counts.denied), ("b", 1));
        assert!(r.drain().is_empty());
    }

    #[test]
    fn a_refused_batch_comes_back_whole_and_merges() {
        let r = Recorder::new(2, 100);
        let (t, a, lim) = (arc("t"), arc("a"), arc("l"));
        r.record(&t, &a, 0, Answer::Admitted { cost: 4 });
        r.record(&t, &a, 0, Answer::Denied { by: &lim });
        let first = r.drain();
        r.record(&t, &a, 1, Answer::Denied { by: &lim });
        r.restore(first);
        let got = r.drain();
        assert_eq!(got.len(), 1);
        let c = &got[0].counts;
        assert_eq!((c.admitted, c.cost, c.denied), (1, 4, 2));
        assert_eq!(c.denied_by.get("l"), Some(&2));
    }

    #[test]
    fn cost_adjustments_net_against_the_hour_they_belong_to() {
        let r = Recorder::new(2, 100);
        let (t, a) = (arc("t"), arc("a"));
        r.record(&t, &a, 5, Answer::Admitted { cost: 300 });
        r.adjust_cost(&t, &a, 6, -180);
        r.adjust_cost(&t, &a, HOUR_MS + 1, -50);
        r.adjust_cost(&t, &a, 2 * HOUR_MS, 25);
        r.adjust_cost(&t, &a, 3 * HOUR_MS, 0);
        let mut got = r.drain();
        got.sort_by_key(|d| d.hour);
        let figures: Vec<(i64, u64, u64, u64)> = got
            .iter()
            .map(|d| (d.hour, d.counts.admitted, d.counts.cost, d.cost_returned))
            .collect();
        assert_eq!(
            figures,
            [(0, 1, 120, 0), (HOUR_MS, 0, 0, 50), (2 * HOUR_MS, 0, 25, 0)]
        );
        // A refused batch keeps what it gave back.
        r.restore(got);
        let back: u64 = r.drain().iter().map(|d| d.cost_returned).sum();
        assert_eq!(back, 50);
    }

    #[test]
    fn beyond_the_row_cap_answers_are_counted_not_kept() {
        let r = Recorder::new(1, 2);
        let t = arc("t");
        for c in ["a", "b", "c", "c"] {
            r.record(&t, &arc(c), 0, Answer::Admitted { cost: 1 });
        }
        // An existing row still takes more.
        r.record(&t, &arc("a"), 0, Answer::Admitted { cost: 1 });
        assert_eq!((r.rows(), r.dropped()), (2, 2));
        assert_eq!(checks_in(&r.drain()), 3);
    }
}
