//! Counters in the layout of `migrations/0006_client_counters.cql`: one partition per
//! (tenant, subject), rows clustered by (bucket start, limit, grain, shard).
//!
//! A write groups a round's increments by client ([`group_by_client`]) and sends each client's
//! rows as one COUNTER batch (one partition: applied atomically on its replicas, routed to
//! them), clients in parallel with bounded concurrency, never retried. A read groups its
//! ranges by client and asks each client's partition once for the exact bucket starts its
//! ranges need (`bucket_start IN ?`, every limit and shard in one answer); a range too wide
//! to list its starts ([`MAX_STARTS_PER_RANGE`]) is read as a span. Rows of buckets no window
//! needs are never read, so how soon the janitor deletes them changes nothing for a read.
//! After an upgrade from the layout of 0001, ranges that began before the new layout served
//! also sum the old table ([`super::legacy`]).
//!
//! [`Counters`] is the part of the store that writes and reads them: it writes this
//! instance's shard and reads every shard, as its leases ([`super::lease`]) say.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::value::Counter;

use super::connection::Cql;
use super::errors::combine_write_outcomes;
use super::lease::Leases;
use super::legacy::Legacy;
use super::partition::{group_by_client, starts_in, ClientWrite, MAX_IN_VALUES};
use super::statements::{CounterRow, IncrementValues, ReadSpanValues, ReadStartsValues};
use crate::store::lease::slot_of;
use crate::store::{BucketTotal, CounterRange, Delta, StoreError, StoreResult};

/// Most rows in one COUNTER batch: Cassandra warns above 5 KiB of batch by default, and a
/// row is about 60 bytes. A client's round rarely holds more than a few dozen.
const MAX_BATCH_ROWS: usize = 64;

/// One query of a read: a client's partition at some bucket starts, or over a span of them,
/// and the ranges (by index) its rows are summed into.
#[derive(Debug, PartialEq, Eq)]
struct Query<'a> {
    tenant: &'a str,
    subject: &'a str,
    ask: Ask,
    ranges: Vec<usize>,
}

#[derive(Debug, PartialEq, Eq)]
enum Ask {
    Starts(Vec<i64>),
    Span(i64, i64),
}

/// The queries that read `ranges`: per client, one for all the starts its narrow ranges name
/// (more only past [`MAX_IN_VALUES`] starts), and one per wide range. No row is asked for by
/// two queries that serve one range, so nothing is summed twice.
fn plan_reads(ranges: &[CounterRange]) -> Vec<Query<'_>> {
    let mut by_client: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    for (i, r) in ranges.iter().enumerate() {
        if r.from <= r.to {
            by_client
                .entry((&*r.key.tenant, &*r.key.subject))
                .or_default()
                .push(i);
        }
    }
    let mut out = Vec::new();
    for ((tenant, subject), idx) in by_client {
        let mut starts: Vec<i64> = Vec::new();
        let mut narrow = Vec::new();
        for i in idx {
            let r = &ranges[i];
            match starts_in(r.key.grain, r.from, r.to) {
                Some(s) => {
                    starts.extend(s);
                    narrow.push(i);
                }
                None => out.push(Query {
                    tenant,
                    subject,
                    ask: Ask::Span(r.from, r.to),
                    ranges: vec![i],
                }),
            }
        }
        starts.sort_unstable();
        starts.dedup();
        for chunk in starts.chunks(MAX_IN_VALUES) {
            out.push(Query {
                tenant,
                subject,
                ask: Ask::Starts(chunk.to_vec()),
                ranges: narrow.clone(),
            });
        }
    }
    out
}

/// The counters of `client_counters`, and of the old table while it holds any.
pub(super) struct Counters {
    cql: Arc<Cql>,
    /// The shard this instance writes, and its region's slot.
    leases: Arc<Leases>,
    legacy: Arc<Legacy>,
}

impl Counters {
    pub(super) fn new(cql: Arc<Cql>, leases: Arc<Leases>, legacy: Arc<Legacy>) -> Self {
        Counters {
            cql,
            leases,
            legacy,
        }
    }

    /// Writes the increments, a COUNTER batch per client (see the module comment).
    pub(super) async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        let shard = self.leases.shard().ok_or_else(|| {
            StoreError::Unavailable("this instance holds no shard lease; nothing written".into())
        })?;
        let clients = group_by_client(deltas)?;
        let batches: Vec<Vec<IncrementValues<'_>>> = clients
            .iter()
            .flat_map(|c: &ClientWrite<'_>| {
                c.rows.chunks(MAX_BATCH_ROWS).map(move |rows| {
                    rows.iter()
                        .map(|&(start, limit, grain, d)| {
                            (Counter(d), c.tenant, c.subject, start, limit, grain, shard)
                        })
                        .collect()
                })
            })
            .collect();
        // By index: a closure over references trips the compiler's lifetime inference here.
        let outcomes: Vec<StoreResult<()>> = stream::iter(0..batches.len())
            .map(|i| self.cql.counter_batch(&self.cql.st.increment, &batches[i]))
            .buffer_unordered(self.cql.max_concurrency)
            .collect()
            .await;
        combine_write_outcomes(outcomes)
    }

    /// Reads the ranges, a query per client (see the module comment).
    pub(super) async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let mine = self.leases.shard().map_or(-1, i32::from);
        let region = self.leases.region_slot();
        let queries = plan_reads(ranges);
        let queries = &queries;
        let answers: Vec<(usize, Vec<CounterRow>)> = stream::iter(0..queries.len())
            .map(|q| async move { Ok::<_, StoreError>((q, self.ask(&queries[q]).await?)) })
            .buffer_unordered(self.cql.max_concurrency)
            .try_collect()
            .await?;
        let mut sums: Vec<BTreeMap<i64, BucketTotal>> = vec![BTreeMap::new(); ranges.len()];
        for (q, rows) in answers {
            for (start, limit, grain, shard, hits) in rows {
                let n = hits.map_or(0, |Counter(n)| n);
                for &i in &queries[q].ranges {
                    let r = &ranges[i];
                    if *r.key.limit == *limit
                        && r.key.grain.code() == grain
                        && (r.from..=r.to).contains(&start)
                    {
                        let e = sums[i].entry(start).or_insert(BucketTotal::empty(start));
                        e.total += n;
                        if i32::from(shard) == mine {
                            e.mine += n;
                        }
                        if slot_of(shard) == region {
                            e.region += n;
                        }
                    }
                }
            }
        }
        self.legacy.add_to(ranges, &mut sums).await?;
        Ok(sums
            .into_iter()
            .map(|m| m.into_values().collect())
            .collect())
    }

    async fn ask(&self, q: &Query<'_>) -> StoreResult<Vec<CounterRow>> {
        match &q.ask {
            Ask::Starts(starts) => {
                let values: ReadStartsValues<'_> = (q.tenant, q.subject, starts);
                self.cql.read_rows(&self.cql.st.read_starts, values).await
            }
            // A span may hold many rows: page through them.
            Ask::Span(from, to) => {
                let values: ReadSpanValues<'_> = (q.tenant, q.subject, *from, *to);
                self.cql.read_all(&self.cql.st.read_span, values).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::partition::MAX_STARTS_PER_RANGE;
    use super::*;
    use crate::domain::Grain;
    use crate::store::CounterKey;

    fn range(subject: &str, limit: &str, grain: Grain, from: i64, to: i64) -> CounterRange {
        CounterRange {
            key: CounterKey {
                tenant: "acme".into(),
                subject: subject.into(),
                limit: limit.into(),
                grain,
            },
            from,
            to,
        }
    }

    #[test]
    fn a_clients_limits_are_one_query() {
        let s = Grain::Fixed(1_000);
        let ranges = [
            range("k1", "per-sec", Grain::Fixed(100), 1_000, 1_300),
            range("k1", "per-min", s, 0, 2_000),
            range("k2", "per-min", s, 0, 1_000),
            range("k1", "empty", s, 5_000, 4_000),
        ];
        let q = plan_reads(&ranges);
        assert_eq!(q.len(), 2, "{q:?}");
        assert_eq!(
            q[0],
            Query {
                tenant: "acme",
                subject: "k1",
                ask: Ask::Starts(vec![0, 1_000, 1_100, 1_200, 1_300, 2_000]),
                ranges: vec![0, 1],
            }
        );
        assert_eq!(q[1].subject, "k2");
        assert_eq!(q[1].ranges, vec![2]);
    }

    #[test]
    fn wide_ranges_are_spans_and_long_lists_are_split() {
        let s = Grain::Fixed(1_000);
        let wide = 1_000 * MAX_STARTS_PER_RANGE as i64;
        let two = [range("k1", "a", s, 0, wide), range("k1", "b", s, 0, 0)];
        let q = plan_reads(&two);
        assert_eq!(q.len(), 2);
        assert!(q
            .iter()
            .any(|q| q.ask == Ask::Span(0, wide) && q.ranges == [0]));
        assert!(q
            .iter()
            .any(|q| q.ask == Ask::Starts(vec![0]) && q.ranges == [1]));
        // Three limits of 60 distinct starts each: 180 starts in two lists.
        let ranges: Vec<CounterRange> = (0..3)
            .map(|i| {
                let from = i * 60_000;
                range("k1", "l", s, from, from + 59_000)
            })
            .collect();
        let q = plan_reads(&ranges);
        let sizes: Vec<usize> = q
            .iter()
            .map(|q| match &q.ask {
                Ask::Starts(v) => v.len(),
                Ask::Span(..) => 0,
            })
            .collect();
        assert_eq!(sizes, vec![MAX_IN_VALUES, 180 - MAX_IN_VALUES]);
    }
}
