//! The Cassandra/ScyllaDB store: counters in counter tables, policies in a regular table.
//!
//! Schema: `migrations/0001_counters.cql` to `0006_client_counters.cql`. Every statement is
//! prepared once in [`ScyllaStore::connect`] from one table ([`statements`]).
//!
//! [`ScyllaStore`] is a facade over parts, each a type that owns its state ([`facade`]: the
//! six store traits, each method handed to one part):
//! - [`connection`]: `Cql`, the session and the prepared statements, which every part shares;
//! - [`lease`]: `Leases`, the shard this instance writes, the shards reads sum, its region;
//! - [`counters`]: `Counters`, the counter writes and reads, and [`first_reads`]:
//!   `FirstReads`, one client's reads that go together; [`legacy`]: `Legacy`, the old
//!   counter table while it holds anything; [`janitor`]: `Janitor`, expiry and its cursors;
//! - [`policies`], [`history`], [`audit`], [`idempotency`]: `Policies`, `History`, `Audit`,
//!   `Idempotency`.
//!
//! Beside them: [`errors`] (driver errors as store errors) and [`partition`] (partition keys,
//! buckets and months, pure).
//!
//! Counters ([`counters`], `migrations/0006_client_counters.cql`). A partition per (tenant,
//! subject), a row per (bucket start, limit id, grain, shard):
//! - one sync round writes a client's hits, for all its limits and buckets, in one COUNTER
//!   batch shared with other clients of the same replica, and one query reads all of a
//!   client's counters (and other clients' of the same tenant and replica) at the bucket
//!   starts its windows need, every shard at once;
//! - `shard` is this instance's write shard ([`ScyllaOptions::shard`]): instances never
//!   increment the same cell, and a read sums what it gets back;
//! - increments are never retried; a timed-out write is `Uncertain` ([`errors`]).
//!
//! Which way counts err: a write that timed out may still land. The caller drops those hits
//! rather than resend them, so the stored count can only be *lower* than the hits admitted
//! (under-count, by at most the uncertain writes), never double-counted.
//!
//! Expiry ([`janitor`]) sweeps the client partitions and deletes runs of buckets past their
//! grain's retention with range deletes: by then no window reads them and no writer writes
//! there, because writers only write the buckets of hits they admitted, which are current.
//! Reads name exact bucket starts, so rows waiting for the sweep cost storage, not reads.
//! The layout of earlier releases (`counters`, a partition per counter, epoch and shard) is
//! still read and expired after an upgrade until it is empty ([`legacy`]).
//!
//! Policies ([`policies`]) are written with lightweight transactions, so two admins on two
//! instances cannot both write version 2; every change bumps a generation counter.
//!
//! Usage history ([`history`]) and the audit log ([`audit`]) are partitioned by UTC month, and
//! retention deletes whole months through small index tables, never by a scan.
//!
//! Holds ([`holds`], reservations) are a partition each, ended with a lightweight transaction
//! so that one end wins; the open ones are listed by the minute they expire.
//!
//! Options, session building and the keyspace-name rule live in [`crate::scylla::cql`], shared with
//! `quotad migrate`; they are re-exported here under their old paths.

mod audit;
mod connection;
mod counters;
mod errors;
mod facade;
mod first_reads;
mod history;
mod holds;
mod idempotency;
mod janitor;
mod lease;
mod legacy;
mod partition;
mod policies;
mod statements;

pub use crate::scylla::cql::{parse_consistency, ScyllaOptions};
pub use facade::ScyllaStore;
