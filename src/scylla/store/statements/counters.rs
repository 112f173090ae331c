//! The counters' statements (`migrations/0006_client_counters.cql`): writes and reads of one
//! client's partition, and reads of many clients' partitions of one replica.

use scylla::value::Counter;

/// Counters (`migrations/0006_client_counters.cql`): one partition per (tenant, subject).
pub(crate) const INCREMENT_CQL: &str = "UPDATE client_counters SET hits = hits + ? WHERE \
     tenant = ? AND subject = ? AND bucket_start = ? AND limit_id = ? AND grain = ? AND shard = ?";
pub(crate) type IncrementValues<'a> = (Counter, &'a str, &'a str, i64, &'a str, i64, i16);

/// A client's rows at the bucket starts its windows need, every limit and shard at once.
pub(crate) const READ_STARTS_CQL: &str = "SELECT bucket_start, limit_id, grain, shard, hits \
     FROM client_counters WHERE tenant = ? AND subject = ? AND bucket_start IN ?";
pub(crate) type ReadStartsValues<'a> = (&'a str, &'a str, &'a [i64]);
pub(crate) type CounterRow = (i64, String, i64, i16, Option<Counter>);

/// Many clients' rows of one tenant at the bucket starts their windows need, in one request
/// sent to a replica of all their partitions (`counters`).
pub(crate) const READ_CLIENTS_CQL: &str = "SELECT subject, bucket_start, limit_id, grain, \
     shard, hits FROM client_counters WHERE tenant = ? AND subject IN ? AND bucket_start IN ?";
pub(crate) type ReadClientsValues<'a> = (&'a str, &'a [&'a str], &'a [i64]);
pub(crate) type ClientCounterRow = (String, i64, String, i64, i16, Option<Counter>);

/// Many clients' rows of one tenant from one bucket start to another, in one request sent to a
/// replica of all their partitions: for ranges too wide to name each start.
pub(crate) const READ_CLIENTS_SPAN_CQL: &str = "SELECT subject, bucket_start, limit_id, \
     grain, shard, hits FROM client_counters WHERE tenant = ? AND subject IN ? \
     AND bucket_start >= ? AND bucket_start <= ?";
pub(crate) type ReadClientsSpanValues<'a> = (&'a str, &'a [&'a str], i64, i64);

/// A client's rows from one bucket start to another: for ranges too wide to name each start.
pub(crate) const READ_SPAN_CQL: &str = "SELECT bucket_start, limit_id, grain, shard, hits \
     FROM client_counters WHERE tenant = ? AND subject = ? AND bucket_start >= ? \
     AND bucket_start <= ?";
pub(crate) type ReadSpanValues<'a> = (&'a str, &'a str, i64, i64);
