//! Counters in the layout of `migrations/0006_client_counters.cql`: one partition per
//! (tenant, subject), rows clustered by (bucket start, limit, grain, shard).
//!
//! Requests carry many clients. A node's work per request (parsing, dispatch, the answer) is
//! paid once for all the partitions in it, so a round of 10^5 clients is a few thousand
//! requests rather than 10^5; what a node does per partition stays the same.
//! - A write groups a round's increments by client ([`group_by_client`]) and packs clients
//!   whose partitions live on the same replica ([`Cql::replica_for`]) into COUNTER batches
//!   ([`pack`]), each sent to that replica, so no coordinator forwards a partition: a client's
//!   rows stay in one batch (one partition mutation, applied at once on its replicas) unless
//!   they alone fill one. Batches go in parallel with bounded concurrency, never retried.
//! - A read groups its ranges by client and the clients by tenant and replica, and asks each
//!   group once for the exact bucket starts their ranges need (`subject IN ? AND bucket_start
//!   IN ?`, every limit and shard in one answer, at most [`MAX_IN_VALUES`] clients and starts a
//!   query), sent to that replica; a lone client is asked with its partition's own statement,
//!   routed by token. A range too wide to list its starts ([`MAX_STARTS_PER_RANGE`]) is read as
//!   a span. Rows of buckets no window needs are never read, so how soon the janitor deletes
//!   them changes nothing for a read. After an upgrade from the layout of 0001, ranges that
//!   began before the new layout served also sum the old table ([`super::legacy`]).
//!
//! A batch of several partitions passes Cassandra's `batch_size_warn_threshold_in_kb` (5 KiB)
//! and `unlogged_batch_across_partitions_warn_threshold` (10): the node logs a warning for
//! them (docs/scylla.md). The batches stay far below the size the server refuses.
//!
//! [`Counters`] is the part of the store that writes and reads them: it writes this
//! instance's shard and reads every shard, as its leases ([`super::lease`]) say.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::{self, StreamExt};
use scylla::cluster::Node;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use scylla::value::Counter;

use super::connection::Cql;
use super::lease::Leases;
use super::legacy::Legacy;
#[cfg(doc)]
use super::partition::MAX_STARTS_PER_RANGE;
use super::partition::{group_by_client, starts_in, ClientWrite, MAX_IN_VALUES};
use super::statements::{
    ClientCounterRow, CounterRow, IncrementValues, ReadClientsSpanValues, ReadClientsValues,
    ReadSpanValues, ReadStartsValues,
};
use crate::store::lease::slot_of;
use crate::store::{BucketTotal, CounterRange, Delta, Increments, Reads, StoreError, StoreResult};

/// Most rows in one COUNTER batch. Cassandra and ScyllaDB refuse a batch of several
/// partitions past `batch_size_fail_threshold_in_kb` (50 KiB by default): a batch stays well
/// under it by rows and by [`MAX_BATCH_BYTES`].
const MAX_BATCH_ROWS: usize = 256;
/// About the most bytes of keys in one COUNTER batch (see [`row_bytes`]).
const MAX_BATCH_BYTES: usize = 16 * 1024;

/// What a row of a batch weighs, about, as the server sizes a batch: its partition's and
/// clustering keys and the counter cell.
fn row_bytes(c: &ClientWrite<'_>, limit: &str) -> usize {
    c.tenant.len() + c.subject.len() + limit.len() + 48
}

/// Where a partition's requests go: the node [`Cql::replica_for`] names, by address (None:
/// wherever the driver routes them). Partitions of one place share requests.
type Place = Option<SocketAddr>;

fn place_of(node: &Option<Arc<Node>>) -> Place {
    node.as_ref()
        .map(|n| SocketAddr::new(n.address.ip(), n.address.port()))
}

/// The COUNTER batches of a round, as (client, its rows) lists: clients of one place (`places`,
/// one per client) share batches, each client's rows in one batch (one partition, applied at
/// once on its replicas) unless they alone pass a batch's size; at most [`MAX_BATCH_ROWS`] rows
/// and about [`MAX_BATCH_BYTES`] a batch.
fn pack(clients: &[ClientWrite<'_>], places: &[Place]) -> Vec<Vec<(usize, Range<usize>)>> {
    let mut order: Vec<usize> = (0..clients.len()).collect();
    order.sort_by_key(|&i| places[i]);
    let mut out = Vec::new();
    let mut batch: Vec<(usize, Range<usize>)> = Vec::new();
    let (mut rows, mut bytes) = (0, 0);
    let mut place = None;
    for i in order {
        let c = &clients[i];
        let weights: Vec<usize> = c.rows.iter().map(|r| row_bytes(c, r.1)).collect();
        let total: usize = weights.iter().sum();
        let starts_anew = place != Some(places[i])
            || rows + c.rows.len() > MAX_BATCH_ROWS
            || bytes + total > MAX_BATCH_BYTES;
        if starts_anew && !batch.is_empty() {
            out.push(std::mem::take(&mut batch));
            (rows, bytes) = (0, 0);
        }
        place = Some(places[i]);
        // A client too big for one batch: in as many as it needs, alone.
        let mut from = 0;
        for (j, w) in weights.iter().enumerate() {
            if j > from && (rows + 1 > MAX_BATCH_ROWS || bytes + w > MAX_BATCH_BYTES) {
                batch.push((i, from..j));
                out.push(std::mem::take(&mut batch));
                (rows, bytes, from) = (0, 0, j);
            }
            rows += 1;
            bytes += w;
        }
        batch.push((i, from..c.rows.len()));
    }
    if !batch.is_empty() {
        out.push(batch);
    }
    out
}

/// One query of a read: some clients' partitions (of one place) at some bucket starts, or one
/// client's over a span of them, and the ranges (by index) its rows are summed into.
#[derive(Debug, PartialEq, Eq)]
struct Query<'a> {
    tenant: &'a str,
    /// One client, or several whose partitions live at the same place.
    subjects: Vec<&'a str>,
    ask: Ask,
    ranges: Vec<usize>,
}

#[derive(Debug, PartialEq, Eq)]
enum Ask {
    Starts(Vec<i64>),
    Span(i64, i64),
}

/// The queries that read `ranges`: the narrow ranges of the clients of one tenant and place
/// ([`Place`], from `place`) in one query for all the starts they name, up to
/// [`MAX_IN_VALUES`] clients and starts a query (more past that), and one per wide range. No
/// row is asked for by two queries that serve one range, so nothing is summed twice.
fn plan_reads<'a>(
    ranges: &'a [CounterRange],
    place: impl Fn(&str, &str) -> Place,
) -> Vec<Query<'a>> {
    type Clients<'a> = BTreeMap<&'a str, Vec<usize>>;
    let mut narrow: BTreeMap<(&str, Place), Clients<'a>> = BTreeMap::new();
    let mut wide: BTreeMap<(&str, Place), Clients<'a>> = BTreeMap::new();
    let mut out = Vec::new();
    for (i, r) in ranges.iter().enumerate() {
        if r.from > r.to {
            continue;
        }
        let (tenant, subject) = (&*r.key.tenant, &*r.key.subject);
        let by = if starts_in(r.key.grain, r.from, r.to).is_some() {
            &mut narrow
        } else {
            &mut wide
        };
        by.entry((tenant, place(tenant, subject)))
            .or_default()
            .entry(subject)
            .or_default()
            .push(i);
    }
    // Wide ranges: the clients of a place over the span that covers all of theirs (a row
    // beyond a range's own span is not summed into it).
    for ((tenant, _), clients) in wide {
        let clients: Vec<(&str, Vec<usize>)> = clients.into_iter().collect();
        for group in clients.chunks(MAX_IN_VALUES) {
            let idx: Vec<usize> = group.iter().flat_map(|(_, i)| i.iter().copied()).collect();
            let from = idx.iter().map(|&i| ranges[i].from).min().unwrap_or(0);
            let to = idx.iter().map(|&i| ranges[i].to).max().unwrap_or(0);
            out.push(Query {
                tenant,
                subjects: group.iter().map(|(s, _)| *s).collect(),
                ask: Ask::Span(from, to),
                ranges: idx,
            });
        }
    }
    for ((tenant, _), clients) in narrow {
        let clients: Vec<(&str, Vec<usize>)> = clients.into_iter().collect();
        for group in clients.chunks(MAX_IN_VALUES) {
            let idx: Vec<usize> = group.iter().flat_map(|(_, i)| i.iter().copied()).collect();
            let mut starts: Vec<i64> = idx
                .iter()
                .flat_map(|&i| {
                    let r = &ranges[i];
                    starts_in(r.key.grain, r.from, r.to).unwrap_or_default()
                })
                .collect();
            starts.sort_unstable();
            starts.dedup();
            for chunk in starts.chunks(MAX_IN_VALUES) {
                out.push(Query {
                    tenant,
                    subjects: group.iter().map(|(s, _)| *s).collect(),
                    ask: Ask::Starts(chunk.to_vec()),
                    ranges: idx.clone(),
                });
            }
        }
    }
    out
}

/// `request`'s outcome, or, when `deadline` passes first, `Uncertain` (a write may land
/// still; a read changed nothing).
async fn by<T>(
    deadline: Option<Instant>,
    request: impl std::future::Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    let Some(d) = deadline else {
        return request.await;
    };
    match tokio::time::timeout_at(d.into(), request).await {
        Ok(res) => res,
        Err(_) => Err(StoreError::Uncertain(
            "no answer by the caller's deadline".into(),
        )),
    }
}

/// A row read back, with the client it belongs to when the query read several.
type Row = (Option<String>, CounterRow);

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

    /// Writes the increments: COUNTER batches of many clients, each sent first to a replica
    /// of all its clients' partitions (see the module comment). Says which increments were
    /// never sent and which are in doubt, by batch: one batch's failure is not another's. A
    /// batch not answered by `deadline` is given up on, in doubt.
    pub(super) async fn increment(
        &self,
        deltas: &[Delta],
        deadline: Option<Instant>,
    ) -> Increments {
        let Some(shard) = self.leases.shard() else {
            let e = StoreError::Unavailable(
                "this instance holds no shard lease; nothing written".into(),
            );
            return Increments::whole(Err(e), deltas.len());
        };
        let clients = match group_by_client(deltas) {
            Ok(c) => c,
            Err(e) => return Increments::whole(Err(e), deltas.len()),
        };
        let nodes: Vec<Option<Arc<Node>>> = clients
            .iter()
            .map(|c| self.cql.replica_for(c.tenant, c.subject))
            .collect();
        let places: Vec<Place> = nodes.iter().map(place_of).collect();
        let packed = pack(&clients, &places);
        let batches: Vec<(Option<&Arc<Node>>, Vec<IncrementValues<'_>>)> = packed
            .iter()
            .map(|b| {
                let node = nodes[b[0].0].as_ref();
                let values = b
                    .iter()
                    .flat_map(|(i, rows)| {
                        let c = &clients[*i];
                        c.rows[rows.clone()]
                            .iter()
                            .map(move |&(start, limit, grain, d)| {
                                (Counter(d), c.tenant, c.subject, start, limit, grain, shard)
                            })
                    })
                    .collect();
                (node, values)
            })
            .collect();
        // By index: a closure over references trips the compiler's lifetime inference here.
        let outcomes: Vec<(usize, StoreResult<()>)> = stream::iter(0..batches.len())
            .map(|i| {
                let (node, values) = &batches[i];
                async move {
                    let write = self
                        .cql
                        .counter_batch_on(&self.cql.st.increment, values, *node);
                    let res = by(deadline, write).await;
                    // Cut off unanswered: the node it went to first may have stopped.
                    if let (Err(StoreError::Uncertain(_)), Some(n)) = (&res, node) {
                        self.cql.suspect(n);
                    }
                    (i, res)
                }
            })
            .buffer_unordered(self.cql.max_concurrency)
            .collect()
            .await;
        let mut out = Increments::default();
        let failed: Vec<(usize, StoreError)> = outcomes
            .into_iter()
            .filter_map(|(i, r)| r.err().map(|e| (i, e)))
            .collect();
        if failed.is_empty() {
            return out;
        }
        // Which increments each failed batch carried: a batch holds rows of clients, and a
        // row sums every increment of its cell.
        let mut of_row: HashMap<(&str, &str, i64, &str, i64), Vec<usize>> = HashMap::new();
        for (i, d) in deltas.iter().enumerate() {
            let k = &d.key;
            of_row
                .entry((&k.tenant, &k.subject, d.start, &k.limit, k.grain.code()))
                .or_default()
                .push(i);
        }
        for (b, e) in failed {
            let list = match e {
                StoreError::Uncertain(_) => &mut out.doubtful,
                _ => &mut out.unsent,
            };
            for (i, rows) in &packed[b] {
                let c = &clients[*i];
                for &(start, limit, grain, _) in &c.rows[rows.clone()] {
                    if let Some(idx) = of_row.get(&(c.tenant, c.subject, start, limit, grain)) {
                        list.extend_from_slice(idx);
                    }
                }
            }
            out.error.get_or_insert(e);
        }
        out
    }

    /// Reads the ranges, a query per place's clients (see the module comment).
    /// A query that fails fails only the ranges it serves: the others are kept.
    /// With `at`, at that consistency (`CounterStore::read_final`).
    pub(super) async fn read(
        &self,
        ranges: &[CounterRange],
        deadline: Option<Instant>,
        at: Option<Consistency>,
    ) -> Reads {
        let mine = self.leases.shard().map_or(-1, i32::from);
        let region = self.leases.region_slot();
        let queries = plan_reads(ranges, |t, s| place_of(&self.cql.replica_for(t, s)));
        let queries = &queries;
        let answers: Vec<(usize, StoreResult<Vec<Row>>)> = stream::iter(0..queries.len())
            .map(|q| async move { (q, by(deadline, self.ask(&queries[q], at)).await) })
            .buffer_unordered(self.cql.max_concurrency)
            .collect()
            .await;
        let mut sums: Vec<BTreeMap<i64, BucketTotal>> = vec![BTreeMap::new(); ranges.len()];
        let mut failed = vec![false; ranges.len()];
        let mut error = None;
        for (q, rows) in answers {
            let query = &queries[q];
            let rows = match rows {
                Ok(rows) => rows,
                Err(e) => {
                    for &i in &query.ranges {
                        failed[i] = true;
                    }
                    error.get_or_insert(e);
                    continue;
                }
            };
            // The query's ranges by client, for rows that say whose they are.
            let mut of: HashMap<&str, Vec<usize>> = HashMap::new();
            if query.subjects.len() > 1 {
                for &i in &query.ranges {
                    of.entry(&*ranges[i].key.subject).or_default().push(i);
                }
            }
            for (subject, (start, limit, grain, shard, hits)) in rows {
                let n = hits.map_or(0, |Counter(n)| n);
                let idx = match &subject {
                    Some(s) => of.get(s.as_str()).map_or(&[][..], Vec::as_slice),
                    None => &query.ranges[..],
                };
                for &i in idx {
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
        if let Err(e) = self.legacy.add_to(ranges, &mut sums).await {
            return Reads::whole(Err(e), ranges.len());
        }
        Reads {
            totals: sums
                .into_iter()
                .zip(failed)
                .map(|(m, failed)| (!failed).then(|| m.into_values().collect()))
                .collect(),
            error,
        }
    }

    async fn ask(&self, q: &Query<'_>, level: Option<Consistency>) -> StoreResult<Vec<Row>> {
        // A read that settles doubts hears the replicas it must: a copy of the statement at
        // its consistency.
        let at = |st: &PreparedStatement| {
            let mut st = st.clone();
            if let Some(c) = level {
                st.set_consistency(c);
            }
            st
        };
        let mine = |rows: Vec<CounterRow>| rows.into_iter().map(|r| (None, r)).collect();
        let theirs = |rows: Vec<ClientCounterRow>| {
            rows.into_iter()
                .map(|(s, start, limit, grain, shard, hits)| {
                    (Some(s), (start, limit, grain, shard, hits))
                })
                .collect()
        };
        match (&q.ask, q.subjects.as_slice()) {
            (Ask::Starts(starts), [subject]) => {
                let values: ReadStartsValues<'_> = (q.tenant, subject, starts);
                Ok(mine(
                    self.cql
                        .read_rows(&at(&self.cql.st.read_starts), values)
                        .await?,
                ))
            }
            // Several clients of one place: sent there, paged (a page per 5000 rows).
            (Ask::Starts(starts), subjects) => {
                let st = at(&self
                    .cql
                    .to_replica(&self.cql.st.read_clients, q.tenant, subjects[0]));
                let values: ReadClientsValues<'_> = (q.tenant, subjects, starts);
                Ok(theirs(self.cql.read_all(&st, values).await?))
            }
            // A span may hold many rows: page through them.
            (Ask::Span(from, to), [subject]) => {
                let values: ReadSpanValues<'_> = (q.tenant, subject, *from, *to);
                Ok(mine(
                    self.cql
                        .read_all(&at(&self.cql.st.read_span), values)
                        .await?,
                ))
            }
            (Ask::Span(from, to), subjects) => {
                let st =
                    at(&self
                        .cql
                        .to_replica(&self.cql.st.read_clients_span, q.tenant, subjects[0]));
                let values: ReadClientsSpanValues<'_> = (q.tenant, subjects, *from, *to);
                Ok(theirs(self.cql.read_all(&st, values).await?))
            }
        }
    }
}

#[cfg(test)]
mod tests;
