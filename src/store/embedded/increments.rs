//! A batch of counter increments as rows to write ([`Increments`]): what a sync round hands the
//! embedded store, what the counter journal records and holds, and what a fold adds to the rows.

use redb::WriteTransaction;

use super::rows;
use crate::pace::Pacer;
use crate::store::{Delta, StoreResult};

/// A round's increments as rows to write: each counter's row key, built once, and its adds,
/// in row key order (which keeps the B-tree's pages warm as the write walks them). Built on
/// the caller's side from the deltas it lends, so the deltas themselves are not copied to the
/// thread that writes.
#[derive(Default)]
pub(super) struct Increments {
    /// Every row key, one after the other.
    keys: Vec<u8>,
    adds: Vec<(i64, i64)>,
    /// (key bytes, adds) ranges of each counter, sorted by key.
    runs: Vec<Run>,
}

type Run = (std::ops::Range<usize>, std::ops::Range<usize>);

impl Increments {
    /// A round lists a counter's deltas together: each run of one counter's deltas is one read
    /// and one write of its row. A counter in two runs (not what a round sends) is read and
    /// written twice, adding up all the same.
    pub(super) fn of(deltas: &[Delta]) -> Self {
        let mut inc = Increments {
            adds: Vec::with_capacity(deltas.len()),
            ..Default::default()
        };
        // 10^4 clients' rounds take a millisecond or more to build: in slices.
        let mut pace = Pacer::every(64);
        for run in deltas.chunk_by(|a, b| a.key == b.key) {
            let (k, a) = (inc.keys.len(), inc.adds.len());
            rows::put_row_key(&mut inc.keys, &run[0].key);
            inc.adds.extend(run.iter().map(|d| (d.start, d.delta)));
            inc.runs.push((k..inc.keys.len(), a..inc.adds.len()));
            pace.step();
        }
        inc.sort();
        inc
    }

    /// Puts the runs in key order.
    ///
    /// A round's keys mostly share their first bytes (one tenant, clients named alike), so a
    /// plain sort compares every pair byte by byte from the start: 1.5-2 ms for a round of
    /// 10^4 clients, in one stretch no pause can split (`crate::pace`). Instead each run is
    /// sorted first by the 8 bytes after what every key shares, as a number, and only runs
    /// equal there (one client's counters) by their whole keys. The order is the same.
    pub(super) fn sort(&mut self) {
        let keys = &self.keys;
        let key = |r: &Run| &keys[r.0.clone()];
        let Some(first) = self.runs.first().map(key) else {
            return;
        };
        let shared = self.runs.iter().fold(first.len(), |n, r| {
            let k = key(r);
            k.iter()
                .zip(&first[..n])
                .take_while(|(a, b)| a == b)
                .count()
        });
        let window = |k: &[u8]| {
            let mut w = [0u8; 8];
            let tail = &k[shared..];
            let n = tail.len().min(8);
            w[..n].copy_from_slice(&tail[..n]);
            u64::from_be_bytes(w)
        };
        let mut sorted: Vec<(u64, Run)> =
            self.runs.drain(..).map(|r| (window(key(&r)), r)).collect();
        sorted.sort_unstable_by(|x, y| x.0.cmp(&y.0).then_with(|| key(&x.1).cmp(key(&y.1))));
        self.runs.extend(sorted.into_iter().map(|(_, r)| r));
    }

    /// Appends a run (a record of the journal, read back): [`Increments::sort`] them after.
    pub(super) fn push(&mut self, key: &[u8], adds: &[(i64, i64)]) {
        let (k, a) = (self.keys.len(), self.adds.len());
        self.keys.extend_from_slice(key);
        self.adds.extend_from_slice(adds);
        self.runs.push((k..self.keys.len(), a..self.adds.len()));
    }

    /// Each counter's row key and adds, in key order.
    pub(super) fn runs(&self) -> impl Iterator<Item = (&[u8], &[(i64, i64)])> {
        self.runs
            .iter()
            .map(|(k, a)| (&self.keys[k.clone()], &self.adds[a.clone()]))
    }

    /// The adds of the counter at `key`, in every run naming it.
    pub(super) fn adds_of<'a>(&'a self, key: &'a [u8]) -> impl Iterator<Item = &'a (i64, i64)> {
        let first = self
            .runs
            .partition_point(|(k, _)| &self.keys[k.clone()] < key);
        self.runs[first..]
            .iter()
            .take_while(move |(k, _)| &self.keys[k.clone()] == key)
            .flat_map(|(_, a)| &self.adds[a.clone()])
    }

    /// `self` and `other` together, with one run per counter, its adds summed per bucket start
    /// and sorted by it: a linear merge of the two (each sorted by key).
    pub(super) fn merged(&self, other: &Increments) -> Increments {
        let mut out = Increments {
            keys: Vec::with_capacity(self.keys.len() + other.keys.len()),
            adds: Vec::with_capacity(self.adds.len() + other.adds.len()),
            runs: Vec::with_capacity(self.runs.len() + other.runs.len()),
        };
        let (mut a, mut b) = (self.runs().peekable(), other.runs().peekable());
        let mut pace = Pacer::every(64);
        loop {
            pace.step();
            let key = match (a.peek(), b.peek()) {
                (None, None) => break,
                (Some(x), None) => x.0,
                (None, Some(y)) => y.0,
                (Some(x), Some(y)) => x.0.min(y.0),
            };
            let (k, at) = (out.keys.len(), out.adds.len());
            out.keys.extend_from_slice(key);
            for runs in [&mut a, &mut b] {
                while let Some((_, adds)) = runs.next_if(|r| r.0 == key) {
                    out.adds.extend_from_slice(adds);
                }
            }
            // Sorted by start, and one add a start: summed into the first of equal ones, in
            // place (a scratch run through `Vec::dedup_by` made store_rounds 30 % slower).
            let mine = &mut out.adds[at..];
            mine.sort_unstable_by_key(|x| x.0);
            let mut n = 0;
            for i in 0..mine.len() {
                if n > 0 && mine[n - 1].0 == mine[i].0 {
                    mine[n - 1].1 = mine[n - 1].1.saturating_add(mine[i].1);
                } else {
                    mine[n] = mine[i];
                    n += 1;
                }
            }
            out.adds.truncate(at + n);
            out.runs.push((k..out.keys.len(), at..out.adds.len()));
        }
        out
    }

    /// How many adds, over every counter.
    pub(super) fn adds_len(&self) -> usize {
        self.adds.len()
    }

    /// The bytes of every row key.
    pub(super) fn keys_len(&self) -> usize {
        self.keys.len()
    }

    /// Adds every run to its row.
    pub(super) fn apply(&self, tx: &WriteTransaction) -> StoreResult<()> {
        rows::add_runs(tx, self.runs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Grain;
    use crate::store::CounterKey;
    use rows::row_key;

    fn key(limit: &str, grain: Grain) -> CounterKey {
        CounterKey {
            tenant: "t".into(),
            subject: "c".into(),
            limit: limit.into(),
            grain,
        }
    }

    #[test]
    fn merged_increments_have_a_run_per_counter_in_key_order_summed_per_bucket() {
        let g = Grain::Fixed(100);
        let d = |limit: &str, start, delta| Delta {
            key: key(limit, g),
            start,
            delta,
        };
        let a = Increments::of(&[d("b", 200, 1), d("b", 100, 2), d("d", 0, 5)]);
        // "b" twice in one round (not what a round sends), and in both sides.
        let b = Increments::of(&[d("c", 0, 1), d("b", 100, 3), d("a", 7, 1), d("b", 300, 4)]);
        let m = a.merged(&b);
        type Runs = Vec<(Vec<u8>, Vec<(i64, i64)>)>;
        let runs: Runs = m.runs().map(|(k, a)| (k.to_vec(), a.to_vec())).collect();
        let want = [
            ("a", vec![(7, 1)]),
            ("b", vec![(100, 5), (200, 1), (300, 4)]),
            ("c", vec![(0, 1)]),
            ("d", vec![(0, 5)]),
        ];
        let want: Runs = want
            .into_iter()
            .map(|(l, a)| (row_key(&key(l, g)), a))
            .collect();
        assert_eq!(runs, want);
        assert_eq!(m.adds_of(&row_key(&key("b", g))).count(), 3);
        assert_eq!(m.adds_of(&row_key(&key("e", g))).count(), 0);
        // Merging with nothing changes nothing but the order.
        let again: Vec<_> = Increments::default()
            .merged(&m)
            .runs()
            .map(|(k, a)| (k.to_vec(), a.to_vec()))
            .collect();
        assert_eq!(again, want);
    }

    #[test]
    fn runs_sort_in_byte_order_whatever_their_keys_share() {
        // Keys that share a long start, keys that end inside the 8 bytes after it, a key that
        // is the start of another, and equal windows that differ after them.
        let mut names: Vec<String> = vec!["".into(), "a".into(), "ab".into(), "abcdefgh".into()];
        for i in 0..300u32 {
            let n = i.wrapping_mul(2_654_435_761) % 1000;
            names.push(format!("client-{n}"));
            names.push(format!("client-{n:04}-long-name-{i}"));
            names.push(format!("client-{:x}", n * 7));
        }
        let mut inc = Increments::default();
        for (i, n) in names.iter().enumerate() {
            inc.push(format!("tenant\0{n}").as_bytes(), &[(i as i64, 1)]);
        }
        type Runs = Vec<(Vec<u8>, Vec<(i64, i64)>)>;
        let pairs = |inc: &Increments| -> Runs {
            inc.runs().map(|(k, a)| (k.to_vec(), a.to_vec())).collect()
        };
        let mut want = pairs(&inc);
        want.sort();
        inc.sort();
        let got = pairs(&inc);
        // In byte order, and every run with its own adds (equal keys in any order).
        let keys = |r: &Runs| r.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
        assert_eq!(keys(&got), keys(&want));
        let mut got = got;
        got.sort();
        assert_eq!(got, want);
    }
}
