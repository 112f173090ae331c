//! The Cassandra/ScyllaDB store: counters in counter tables, policies in a regular table.
//!
//! Schema: `migrations/0001_counters.cql`, `0002_policies.cql`, `0003_members.cql`,
//! `0004_history_audit.cql` and `0005_idempotency.cql`. Every statement is prepared once in [`ScyllaStore::connect`] from
//! one table ([`statements`]).
//!
//! Counters. A bucket is a row `(tenant, subject, limit_id, grain, epoch, shard, bucket_start)`:
//! - `shard` is this instance's write shard ([`ScyllaOptions::shard`]): instances never
//!   increment the same cell, and a read sums `shards` partitions.
//! - `epoch` is a coarse time bucket ([`partition`]): a partition holds at most 64 rows, and
//!   a window's buckets lie in at most two partitions per shard.
//! - Increments are never retried ([`store`]); a timed-out write is `Uncertain` ([`errors`]).
//!
//! Which way counts err: a write that timed out may still land. The caller drops those hits
//! rather than resend them, so the stored count can only be *lower* than the hits admitted
//! (under-count, by at most the uncertain writes), never double-counted.
//!
//! Expiry ([`janitor`]) deletes whole partitions once `epoch end + grain.retention_ms() <= now`:
//! by then no window reads any bucket in it and no writer has a reason to write there, because
//! writers only write the buckets of hits they admitted, which are current. The one exception
//! is a flush delayed past retention by a long outage: its increment lands in a deleted
//! partition (a counter deleted then incremented is unreliable) — a count nobody reads, which
//! the next sweep deletes again. Never reused keys therefore never matter to a reader.
//!
//! Policies ([`policies`]) are written with lightweight transactions, so two admins on two
//! instances cannot both write version 2; every change bumps a generation counter.
//!
//! Usage history ([`history`]) and the audit log ([`audit`]) are partitioned by UTC month, and
//! retention deletes whole months through small index tables, never by a scan.
//!
//! Options, session building and the keyspace-name rule live in [`crate::cql`], shared with
//! `quotad migrate`; they are re-exported here under their old paths.

mod audit;
mod errors;
mod history;
mod idempotency;
mod janitor;
mod lease;
mod partition;
mod policies;
mod statements;
mod store;

pub use crate::cql::{parse_consistency, ScyllaOptions};
pub use store::ScyllaStore;
