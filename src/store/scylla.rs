//! The Cassandra/ScyllaDB store: counters in counter tables, policies in a regular table.
//!
//! Schema: `migrations/0001_counters.cql` and `0002_policies.cql`. Every statement is prepared
//! once in [`ScyllaStore::connect`] with every partition-key column bound, so the driver routes
//! each request to a replica (and, on ScyllaDB, to the owning shard) of its partition.
//!
//! Counters. A bucket is a row `(tenant, subject, limit_id, grain, epoch, shard, bucket_start)`:
//! - `shard` is this instance's write shard ([`ScyllaOptions::shard`]): instances never
//!   increment the same cell, and a read sums `shards` partitions. The part a read finds in
//!   this instance's own shard is [`BucketTotal::mine`].
//! - `epoch` is a coarse time bucket: [`FIXED_EPOCH_BUCKETS`] buckets of a fixed grain, or one
//!   calendar year of monthly buckets. A partition therefore holds at most 64 rows, a window's
//!   buckets (at most 33) lie in at most two partitions per shard, and a partition can be
//!   deleted whole once every bucket in it is past the grain's retention.
//! - Increments are grouped per partition into one COUNTER batch (a batch is routed by its
//!   first statement, so one partition per batch keeps routing right), partitions written in
//!   parallel with bounded concurrency. They are never retried: counter writes are not
//!   idempotent, so a timed-out write is reported as [`StoreError::Uncertain`].
//!
//! Which way counts err: a write that timed out may still land. The caller drops those hits
//! rather than resend them, so the stored count can only be *lower* than the hits admitted
//! (under-count, by at most the uncertain writes), never double-counted.
//!
//! Expiry. Counter tables take no TTL, so [`Store::delete_expired`] sweeps the table's
//! partition keys in token order (a cursor kept in memory, `budget` partitions deleted per
//! call) and deletes a partition when `epoch end + grain.retention_ms() <= now`: by then no
//! window reads any bucket in it and no writer has a reason to write there, because writers
//! only write the buckets of hits they admitted, which are current. The one exception is a
//! flush delayed past retention by a long outage: its increment lands in a deleted partition
//! (a counter deleted then incremented is unreliable) — a count nobody reads, which the next
//! sweep deletes again. Never reused keys therefore never matter to a reader.
//!
//! Policies are written with lightweight transactions (create `IF NOT EXISTS`, replace
//! `IF version = ?`), so two admins on two instances cannot both write version 2. Every change
//! then bumps a counter ([`Store::policies_generation`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Datelike, TimeZone, Utc};
use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::client::execution_profile::ExecutionProfile;
use scylla::client::session::Session;
use scylla::client::session_builder::SessionBuilder;
use scylla::errors::{
    DbError, ExecutionError, NewSessionError, NextPageError, NextRowError, PagerExecutionError,
    PrepareError, RequestAttemptError, RequestError, UseKeyspaceError,
};
use scylla::response::query_result::QueryResult;
use scylla::statement::batch::{Batch, BatchType};
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::{Consistency, SerialConsistency};
use scylla::value::{Counter, CqlTimestamp};

use crate::domain::{ClientId, Grain, TenantId};
use crate::store::{
    BucketTotal, CounterKey, CounterRange, Delta, PolicyKey, PolicyRecord, Store, StoreError,
    StoreResult,
};

/// Buckets of a fixed grain per partition. At least a window's 33 buckets, so a window spans
/// at most two partitions per shard; small, so partitions stay tiny and expire soon after
/// their last bucket.
pub const FIXED_EPOCH_BUCKETS: i64 = 64;
/// Policies are spread over this many partitions. Part of the stored data: changing it needs a
/// data migration.
pub const POLICY_PARTS: i16 = 16;
/// Most shards a deployment may sum on read (each read costs `shards` queries per partition).
pub const MAX_SHARDS: i16 = 256;
/// Most partitions one range may span; a wider range is a caller bug, not a workload.
const MAX_EPOCHS_PER_RANGE: i64 = 64;
/// Tries of a compare-and-set policy write before giving up under contention.
const MAX_CAS_ATTEMPTS: usize = 8;
/// The one row of `policy_generation`.
const GENERATION_ID: &str = "policies";
/// Rows per page when loading every policy: bodies are up to 64 KiB each.
const POLICY_PAGE_SIZE: i32 = 100;

// ---- CQL. Unqualified table names: the session runs in the configured keyspace. ----------
// Each statement has its bind-value type next to it; a unit test checks both against the
// migration schema.

pub const INCREMENT_CQL: &str = "UPDATE counters SET hits = hits + ? WHERE tenant = ? AND \
     subject = ? AND limit_id = ? AND grain = ? AND epoch = ? AND shard = ? AND bucket_start = ?";
type IncrementValues<'a> = (Counter, &'a str, &'a str, &'a str, i64, i64, i16, i64);

pub const READ_BUCKETS_CQL: &str = "SELECT bucket_start, hits FROM counters WHERE tenant = ? \
     AND subject = ? AND limit_id = ? AND grain = ? AND epoch = ? AND shard = ? \
     AND bucket_start >= ? AND bucket_start <= ?";
type ReadBucketsValues<'a> = (&'a str, &'a str, &'a str, i64, i64, i16, i64, i64);
type BucketRow = (i64, Option<Counter>);

/// The janitor's sweep: partition keys in token order after a cursor.
pub const SCAN_PARTITIONS_CQL: &str = "SELECT DISTINCT tenant, subject, limit_id, grain, epoch, \
     shard FROM counters WHERE token(tenant, subject, limit_id, grain, epoch, shard) > ? LIMIT ?";
type ScanValues = (i64, i32);
type PartitionRow = (String, String, String, i64, i64, i16);

pub const DELETE_PARTITION_CQL: &str = "DELETE FROM counters WHERE tenant = ? AND subject = ? \
     AND limit_id = ? AND grain = ? AND epoch = ? AND shard = ?";
type PartitionValues<'a> = (&'a str, &'a str, &'a str, i64, i64, i16);

pub const GET_POLICY_CQL: &str = "SELECT tenant, client, body, version, updated_at FROM \
     policies WHERE part = ? AND kind = ? AND tenant = ? AND client = ?";
type PolicyKeyValues<'a> = (i16, i8, &'a str, &'a str);
type PolicyRow = (String, String, String, i64, CqlTimestamp);

pub const INSERT_POLICY_CQL: &str = "INSERT INTO policies (part, kind, tenant, client, body, \
     version, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS";
type InsertPolicyValues<'a> = (i16, i8, &'a str, &'a str, &'a str, i64, CqlTimestamp);

pub const UPDATE_POLICY_CQL: &str = "UPDATE policies SET body = ?, version = ?, updated_at = ? \
     WHERE part = ? AND kind = ? AND tenant = ? AND client = ? IF version = ?";
type UpdatePolicyValues<'a> = (&'a str, i64, CqlTimestamp, i16, i8, &'a str, &'a str, i64);

pub const DELETE_POLICY_CQL: &str =
    "DELETE FROM policies WHERE part = ? AND kind = ? AND tenant = ? AND client = ? IF EXISTS";

pub const LIST_POLICIES_CQL: &str = "SELECT tenant, client, body, version, updated_at FROM \
     policies WHERE part = ? AND kind = ? AND tenant > ? LIMIT ?";
type ListPoliciesValues<'a> = (i16, i8, &'a str, i32);

pub const LOAD_POLICIES_CQL: &str =
    "SELECT tenant, client, body, version, updated_at FROM policies WHERE part = ?";
type LoadPoliciesValues = (i16,);

pub const BUMP_GENERATION_CQL: &str =
    "UPDATE policy_generation SET generation = generation + ? WHERE id = ?";
type BumpGenerationValues<'a> = (Counter, &'a str);

pub const READ_GENERATION_CQL: &str = "SELECT generation FROM policy_generation WHERE id = ?";
type ReadGenerationValues<'a> = (&'a str,);
type GenerationRow = (Option<Counter>,);

/// `kind` column of `policies`.
const KIND_TENANT: i8 = 0;
const KIND_OVERRIDE: i8 = 1;

/// How to reach the cluster and which shard this instance writes.
#[derive(Clone)]
pub struct ScyllaOptions {
    /// Contact points, `host:port`.
    pub nodes: Vec<String>,
    /// Validated by [`crate::migrate::validate_keyspace`].
    pub keyspace: String,
    /// For every request; LOCAL_QUORUM unless configured.
    pub consistency: Consistency,
    /// Client-side timeout of one request. A counter write that runs out of it is uncertain.
    pub request_timeout: Duration,
    /// Timeout of opening a connection.
    pub connect_timeout: Duration,
    /// This instance's write shard, `0..shards`. Give every instance its own.
    pub shard: i16,
    /// How many shards a read sums. Must be the same on every instance and cover every shard
    /// in use, or reads miss counts.
    pub shards: i16,
    /// CQL replication map for a keyspace `quotad migrate` creates.
    pub replication: String,
    /// The local datacenter: requests go to its nodes first (LOCAL_QUORUM is local to the
    /// coordinator, so with several datacenters set this).
    pub local_dc: Option<String>,
    /// Password authentication, when both are set.
    pub username: Option<String>,
    pub password: Option<String>,
    /// Most requests in flight for one store call (read fan-out, partition writes).
    pub max_concurrency: usize,
}

impl Default for ScyllaOptions {
    fn default() -> Self {
        Self {
            nodes: vec!["127.0.0.1:9042".into()],
            keyspace: "quota".into(),
            consistency: Consistency::LocalQuorum,
            request_timeout: Duration::from_millis(2_000),
            connect_timeout: Duration::from_secs(5),
            shard: 0,
            shards: 1,
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
            local_dc: None,
            username: None,
            password: None,
            max_concurrency: 32,
        }
    }
}

/// Hand-written so the password never reaches a log.
impl fmt::Debug for ScyllaOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScyllaOptions")
            .field("nodes", &self.nodes)
            .field("keyspace", &self.keyspace)
            .field("consistency", &self.consistency)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("shard", &self.shard)
            .field("shards", &self.shards)
            .field("replication", &self.replication)
            .field("local_dc", &self.local_dc)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("max_concurrency", &self.max_concurrency)
            .finish()
    }
}

impl ScyllaOptions {
    /// Checks what the server cannot check for us; the message names the option.
    pub fn validate(&self) -> Result<(), String> {
        crate::migrate::validate_keyspace(&self.keyspace).map_err(|e| format!("keyspace: {e}"))?;
        if self.nodes.is_empty() || self.nodes.iter().any(|n| n.trim().is_empty()) {
            return Err("nodes: at least one host:port is needed".into());
        }
        if !(1..=MAX_SHARDS).contains(&self.shards) {
            return Err(format!("shards: must be 1..={MAX_SHARDS}"));
        }
        if !(0..self.shards).contains(&self.shard) {
            return Err(format!(
                "shard: must be 0..{} (shards is {})",
                self.shards, self.shards
            ));
        }
        if self.request_timeout.is_zero() {
            return Err("timeout_ms: must be positive".into());
        }
        if self.max_concurrency == 0 {
            return Err("max_concurrency: must be positive".into());
        }
        if matches!(
            self.consistency,
            Consistency::Any | Consistency::Serial | Consistency::LocalSerial
        ) {
            return Err(
                "consistency: ANY and SERIAL levels cannot serve both reads and writes".into(),
            );
        }
        Ok(())
    }
}

/// Parses a consistency level as written in CQL (`LOCAL_QUORUM`, `quorum`, `one`...).
pub fn parse_consistency(s: &str) -> Result<Consistency, String> {
    Ok(match s.trim().to_ascii_uppercase().as_str() {
        "ONE" => Consistency::One,
        "TWO" => Consistency::Two,
        "THREE" => Consistency::Three,
        "QUORUM" => Consistency::Quorum,
        "ALL" => Consistency::All,
        "LOCAL_QUORUM" => Consistency::LocalQuorum,
        "EACH_QUORUM" => Consistency::EachQuorum,
        "LOCAL_ONE" => Consistency::LocalOne,
        _ => {
            return Err(format!(
                "consistency {s:?}: one of ONE, TWO, THREE, QUORUM, ALL, LOCAL_QUORUM, \
                 EACH_QUORUM, LOCAL_ONE"
            ))
        }
    })
}

// ---- Partition arithmetic ----------------------------------------------------------------

/// The epoch (coarse time bucket of the partition key) holding the bucket that starts at
/// `start_ms`.
pub fn epoch_of(grain: Grain, start_ms: i64) -> StoreResult<i64> {
    match grain {
        Grain::Fixed(g) => Ok(start_ms.div_euclid(epoch_span(g)?)),
        Grain::Month => Ok(i64::from(
            DateTime::<Utc>::from_timestamp_millis(start_ms)
                .ok_or_else(|| {
                    StoreError::Internal(format!("bucket start {start_ms} out of range"))
                })?
                .year(),
        )),
    }
}

fn epoch_span(g: i64) -> StoreResult<i64> {
    if g <= 0 {
        return Err(StoreError::Internal(format!("grain {g} is not positive")));
    }
    g.checked_mul(FIXED_EPOCH_BUCKETS)
        .ok_or_else(|| StoreError::Internal(format!("grain {g} too large")))
}

/// Where an epoch ends (exclusive, Unix ms); None when out of the representable range.
pub fn epoch_end(grain: Grain, epoch: i64) -> Option<i64> {
    match grain {
        Grain::Fixed(g) => epoch.checked_add(1)?.checked_mul(epoch_span(g).ok()?),
        Grain::Month => {
            let year = i32::try_from(epoch.checked_add(1)?).ok()?;
            Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0)
                .single()
                .map(|d| d.timestamp_millis())
        }
    }
}

/// Whether no window can need any bucket of the partition at `now_ms`: its last bucket ends
/// by `epoch_end`, and a bucket is needed for `retention_ms` after its start.
pub fn partition_expired(grain: Grain, epoch: i64, now_ms: i64) -> bool {
    epoch_end(grain, epoch)
        .and_then(|end| end.checked_add(grain.retention_ms()))
        .is_some_and(|horizon| horizon <= now_ms)
}

/// The epochs a range `[from, to]` of bucket starts touches.
pub fn epochs_of_range(
    grain: Grain,
    from: i64,
    to: i64,
) -> StoreResult<std::ops::RangeInclusive<i64>> {
    let (a, b) = (epoch_of(grain, from)?, epoch_of(grain, to)?);
    if b.saturating_sub(a) >= MAX_EPOCHS_PER_RANGE {
        return Err(StoreError::Internal(format!(
            "a read range of {} ms on grain {:?} spans more than {MAX_EPOCHS_PER_RANGE} partitions",
            to.saturating_sub(from),
            grain
        )));
    }
    Ok(a..=b)
}

/// The policy partition of a tenant: FNV-1a (stable across versions and platforms, unlike
/// std's hasher) modulo [`POLICY_PARTS`].
pub fn policy_part(tenant: &str) -> i16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in tenant.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % POLICY_PARTS as u32) as i16
}

/// Most partition keys one `delete_expired` call examines, so a call stays short even on a
/// huge table with little to delete.
const MAX_SWEEP_PER_CALL: usize = 20_000;

/// What one page of the janitor's sweep does.
#[derive(Debug, PartialEq, Eq)]
struct Sweep {
    /// Expired partitions to delete, at most the budget.
    doomed: Vec<PartitionRow>,
    /// Where the sweep continues: the token of the last partition dealt with, or `i64::MIN`
    /// (start over) when the page reached the end of the ring.
    next: i64,
}

/// Picks the expired partitions of a page of `(key, token)` in token order, up to `budget`.
/// Stops *before* the first expired partition over budget, so the next call starts there.
fn plan_sweep(
    page: &[(PartitionRow, i64)],
    cursor: i64,
    page_limit: usize,
    now_ms: i64,
    budget: usize,
) -> Sweep {
    let mut doomed = Vec::new();
    let mut next = None;
    for (row, token) in page {
        // A grain code this version does not know is left alone.
        let expired = Grain::from_code(row.3).is_some_and(|g| partition_expired(g, row.4, now_ms));
        if expired {
            if doomed.len() == budget {
                return Sweep {
                    doomed,
                    next: next.unwrap_or(cursor),
                };
            }
            doomed.push(row.clone());
        }
        next = Some(*token);
    }
    Sweep {
        doomed,
        next: match next {
            Some(t) if page.len() >= page_limit => t,
            _ => i64::MIN,
        },
    }
}

/// One counter partition written by this instance.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PartitionWrite {
    key: CounterKey,
    epoch: i64,
    /// (bucket start, summed delta), by start, zero sums dropped.
    rows: Vec<(i64, i64)>,
}

/// Groups increments by partition, summing duplicates; an increment that sums to zero is not
/// sent at all.
fn group_increments(deltas: &[Delta]) -> StoreResult<Vec<PartitionWrite>> {
    let mut by_part: BTreeMap<(&CounterKey, i64), BTreeMap<i64, i64>> = BTreeMap::new();
    for d in deltas {
        let epoch = epoch_of(d.key.grain, d.start)?;
        let sum = by_part
            .entry((&d.key, epoch))
            .or_default()
            .entry(d.start)
            .or_insert(0);
        *sum = sum
            .checked_add(d.delta)
            .ok_or_else(|| StoreError::Internal("increment overflows i64".into()))?;
    }
    Ok(by_part
        .into_iter()
        .map(|((key, epoch), rows)| PartitionWrite {
            key: key.clone(),
            epoch,
            rows: rows.into_iter().filter(|&(_, d)| d != 0).collect(),
        })
        .filter(|p| !p.rows.is_empty())
        .collect())
}

/// The outcome of a multi-partition write as one [`StoreError`]: once any partition landed,
/// or any outcome is unknown, a resend would double-count, so the whole call is `Uncertain`.
fn combine_write_outcomes(outcomes: Vec<StoreResult<()>>) -> StoreResult<()> {
    let n = outcomes.len();
    let mut landed = 0;
    let mut errors = Vec::new();
    for o in outcomes {
        match o {
            Ok(()) => landed += 1,
            Err(e) => errors.push(e),
        }
    }
    let Some(first) = errors.first() else {
        return Ok(());
    };
    if landed > 0 || errors.iter().any(|e| matches!(e, StoreError::Uncertain(_))) {
        return Err(StoreError::Uncertain(format!(
            "{landed} of {n} partition writes landed, the others failed or are unknown: {first}"
        )));
    }
    Err(
        match errors
            .iter()
            .find(|e| matches!(e, StoreError::Internal(_)))
            .unwrap_or(first)
        {
            StoreError::Internal(m) => StoreError::Internal(m.clone()),
            e => StoreError::Unavailable(e.to_string()),
        },
    )
}

// ---- Error mapping -------------------------------------------------------------------------

/// Whether the failed request could have changed data: decides between "nothing written,
/// retry safe" and "may have landed".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Read,
    Write,
}

impl Op {
    /// The error for an outcome we cannot know: a write may have landed, a read changed nothing.
    fn unknown(self, msg: String) -> StoreError {
        match self {
            Op::Read => StoreError::Unavailable(msg),
            Op::Write => StoreError::Uncertain(msg),
        }
    }
}

fn map_db(db: &DbError, msg: &str, op: Op) -> StoreError {
    let text = format!("{db}: {msg}");
    match db {
        // The coordinator refused before anything ran.
        DbError::Unavailable { .. } | DbError::Overloaded | DbError::IsBootstrapping => {
            StoreError::Unavailable(text)
        }
        DbError::RateLimitReached {
            rejected_by_coordinator: true,
            ..
        } => StoreError::Unavailable(text),
        // A read part timed out (including the read phase of a lightweight transaction):
        // nothing was written.
        DbError::ReadTimeout { .. } | DbError::ReadFailure { .. } => StoreError::Unavailable(text),
        DbError::Unprepared { .. } => StoreError::Unavailable(text),
        DbError::SyntaxError
        | DbError::Invalid
        | DbError::AlreadyExists { .. }
        | DbError::FunctionFailure { .. }
        | DbError::AuthenticationError
        | DbError::Unauthorized
        | DbError::ConfigError
        | DbError::ProtocolError
        | DbError::TruncateError => StoreError::Internal(text),
        // WriteTimeout, WriteFailure, ServerError, a replica's rate limit, and codes this
        // driver version does not know: some replica may have applied a write.
        _ => op.unknown(text),
    }
}

fn map_attempt(e: &RequestAttemptError, op: Op) -> StoreError {
    match e {
        RequestAttemptError::DbError(db, msg) => map_db(db, msg, op),
        // Failed before anything was sent.
        RequestAttemptError::SerializationError(_)
        | RequestAttemptError::CqlRequestSerialization(_) => StoreError::Internal(e.to_string()),
        RequestAttemptError::UnableToAllocStreamId => StoreError::Unavailable(e.to_string()),
        // Sent, then the connection broke or the answer was garbled.
        _ => op.unknown(e.to_string()),
    }
}

fn map_exec(e: ExecutionError, op: Op) -> StoreError {
    match &e {
        ExecutionError::LastAttemptError(a) => map_attempt(a, op),
        ExecutionError::BadQuery(_) => StoreError::Internal(e.to_string()),
        ExecutionError::EmptyPlan
        | ExecutionError::ConnectionPoolError(_)
        | ExecutionError::PrepareError(_) => StoreError::Unavailable(e.to_string()),
        // The client stopped waiting; the request may still run on the server.
        ExecutionError::RequestTimeout(_) => op.unknown(e.to_string()),
        _ => op.unknown(e.to_string()),
    }
}

fn map_request(e: &RequestError) -> StoreError {
    match e {
        RequestError::LastAttemptError(a) => map_attempt(a, Op::Read),
        _ => StoreError::Unavailable(e.to_string()),
    }
}

fn map_next_page(e: &NextPageError) -> StoreError {
    match e {
        NextPageError::RequestFailure(r) => map_request(r),
        _ => StoreError::Internal(e.to_string()),
    }
}

fn map_pager(e: PagerExecutionError) -> StoreError {
    match &e {
        PagerExecutionError::NextPageError(n) => map_next_page(n),
        PagerExecutionError::SerializationError(_) => StoreError::Internal(e.to_string()),
        _ => StoreError::Unavailable(e.to_string()),
    }
}

fn map_next_row(e: NextRowError) -> StoreError {
    match &e {
        NextRowError::NextPageError(n) => map_next_page(n),
        _ => StoreError::Internal(e.to_string()),
    }
}

fn map_prepare(cql: &str, e: PrepareError) -> StoreError {
    match &e {
        PrepareError::AllAttemptsFailed {
            first_attempt: RequestAttemptError::DbError(DbError::Invalid | DbError::SyntaxError, _),
        } => StoreError::Internal(format!(
            "preparing `{cql}`: {e}; is the keyspace migrated? run `quotad migrate`"
        )),
        _ => StoreError::Unavailable(format!("preparing `{cql}`: {e}")),
    }
}

fn map_new_session(e: NewSessionError) -> StoreError {
    match &e {
        NewSessionError::EmptyKnownNodesList | NewSessionError::IllegalConfig(_) => {
            StoreError::Internal(e.to_string())
        }
        NewSessionError::UseKeyspaceError(UseKeyspaceError::RequestError(
            RequestAttemptError::DbError(_, _),
        ))
        | NewSessionError::UseKeyspaceError(UseKeyspaceError::BadKeyspaceName(_)) => {
            StoreError::Internal(format!(
                "{e}; does the keyspace exist? run `quotad migrate`"
            ))
        }
        _ => StoreError::Unavailable(e.to_string()),
    }
}

fn internal(e: impl fmt::Display) -> StoreError {
    StoreError::Internal(e.to_string())
}

// ---- The store -----------------------------------------------------------------------------

struct Statements {
    increment: PreparedStatement,
    read_buckets: PreparedStatement,
    scan_partitions: PreparedStatement,
    delete_partition: PreparedStatement,
    get_policy: PreparedStatement,
    /// `get_policy` at LOCAL_SERIAL: the read inside a compare-and-set loop must see the
    /// latest committed (or in-flight) transaction, or the loop spins on stale versions.
    get_policy_serial: PreparedStatement,
    insert_policy: PreparedStatement,
    update_policy: PreparedStatement,
    delete_policy: PreparedStatement,
    list_policies: PreparedStatement,
    load_policies: PreparedStatement,
    bump_generation: PreparedStatement,
    read_generation: PreparedStatement,
}

/// The scylla store; cheap to share behind an `Arc` (one session, its own connection pools).
pub struct ScyllaStore {
    session: Arc<Session>,
    st: Statements,
    shard: i16,
    shards: i16,
    max_concurrency: usize,
    /// Token after which the janitor's next sweep continues. A std mutex: it is only read and
    /// written between awaits, never held across one.
    janitor_cursor: Mutex<i64>,
}

impl fmt::Debug for ScyllaStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScyllaStore")
            .field("shard", &self.shard)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

async fn prepare(session: &Session, cql: &str, idempotent: bool) -> StoreResult<PreparedStatement> {
    let mut p = session
        .prepare(cql)
        .await
        .map_err(|e| map_prepare(cql, e))?;
    // Only statements that change nothing, or whose repetition is harmless, may be retried or
    // speculatively executed by the driver. Counter increments and LWTs stay non-idempotent.
    p.set_is_idempotent(idempotent);
    Ok(p)
}

impl ScyllaStore {
    /// Connects to the keyspace (which `quotad migrate` must have created) and prepares every
    /// statement. Fails with `Internal` on bad options or a missing schema, `Unavailable` when
    /// the cluster cannot be reached.
    pub async fn connect(opts: ScyllaOptions) -> Result<ScyllaStore, StoreError> {
        opts.validate().map_err(StoreError::Internal)?;
        let profile = ExecutionProfile::builder()
            .consistency(opts.consistency)
            .serial_consistency(Some(SerialConsistency::LocalSerial))
            .request_timeout(Some(opts.request_timeout))
            .build();
        let mut builder = SessionBuilder::new()
            .known_nodes(&opts.nodes)
            .use_keyspace(&opts.keyspace, false)
            .connection_timeout(opts.connect_timeout)
            .default_execution_profile_handle(profile.into_handle());
        if let Some(dc) = &opts.local_dc {
            builder = builder.prefer_datacenter(dc.clone());
        }
        if let (Some(u), Some(p)) = (&opts.username, &opts.password) {
            builder = builder.user(u, p);
        }
        let session = builder.build().await.map_err(map_new_session)?;
        let s = &session;
        let mut get_policy_serial = prepare(s, GET_POLICY_CQL, true).await?;
        get_policy_serial.set_consistency(Consistency::LocalSerial);
        let st = Statements {
            increment: prepare(s, INCREMENT_CQL, false).await?,
            read_buckets: prepare(s, READ_BUCKETS_CQL, true).await?,
            scan_partitions: prepare(s, SCAN_PARTITIONS_CQL, true).await?,
            delete_partition: prepare(s, DELETE_PARTITION_CQL, true).await?,
            get_policy: prepare(s, GET_POLICY_CQL, true).await?,
            get_policy_serial,
            insert_policy: prepare(s, INSERT_POLICY_CQL, false).await?,
            update_policy: prepare(s, UPDATE_POLICY_CQL, false).await?,
            delete_policy: prepare(s, DELETE_POLICY_CQL, false).await?,
            list_policies: prepare(s, LIST_POLICIES_CQL, true).await?,
            load_policies: {
                let mut p = prepare(s, LOAD_POLICIES_CQL, true).await?;
                p.set_page_size(POLICY_PAGE_SIZE);
                p
            },
            bump_generation: prepare(s, BUMP_GENERATION_CQL, false).await?,
            read_generation: prepare(s, READ_GENERATION_CQL, true).await?,
        };
        Ok(ScyllaStore {
            session: Arc::new(session),
            st,
            shard: opts.shard,
            shards: opts.shards,
            max_concurrency: opts.max_concurrency,
            janitor_cursor: Mutex::new(i64::MIN),
        })
    }

    /// The driver session, e.g. for driver metrics.
    pub fn session(&self) -> &Arc<Session> {
        &self.session
    }

    /// This instance's write shard.
    pub fn shard(&self) -> i16 {
        self.shard
    }

    async fn write_partition(&self, p: &PartitionWrite) -> StoreResult<()> {
        let k = &p.key;
        let values: Vec<IncrementValues<'_>> = p
            .rows
            .iter()
            .map(|&(start, delta)| {
                (
                    Counter(delta),
                    &*k.tenant,
                    &*k.subject,
                    &*k.limit,
                    k.grain.code(),
                    p.epoch,
                    self.shard,
                    start,
                )
            })
            .collect();
        if let [one] = values.as_slice() {
            self.session
                .execute_unpaged(&self.st.increment, one)
                .await
                .map_err(|e| map_exec(e, Op::Write))?;
            return Ok(());
        }
        // One partition, so the batch is applied atomically on its replicas and routed right.
        let mut batch = Batch::new(BatchType::Counter);
        for _ in &values {
            batch.append_statement(self.st.increment.clone());
        }
        self.session
            .batch(&batch, values)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        Ok(())
    }

    async fn read_partition(
        &self,
        key: &CounterKey,
        epoch: i64,
        shard: i16,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<(i64, i64)>> {
        let values: ReadBucketsValues<'_> = (
            &key.tenant,
            &key.subject,
            &key.limit,
            key.grain.code(),
            epoch,
            shard,
            from,
            to,
        );
        let res = self
            .session
            .execute_unpaged(&self.st.read_buckets, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let mut out = Vec::with_capacity(rows.rows_num());
        for row in rows.rows::<BucketRow>().map_err(internal)? {
            let (start, hits) = row.map_err(internal)?;
            out.push((start, hits.map_or(0, |Counter(n)| n)));
        }
        Ok(out)
    }

    /// Runs a prepared lightweight transaction; returns its `[applied]`.
    async fn lwt(
        &self,
        st: &PreparedStatement,
        values: impl scylla::serialize::row::SerializeRow,
    ) -> StoreResult<bool> {
        let res = self
            .session
            .execute_unpaged(st, values)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        applied(res)
    }

    async fn read_policy(
        &self,
        key: &PolicyKey,
        serial: bool,
    ) -> StoreResult<Option<PolicyRecord>> {
        let (kind, client) = policy_kind(key);
        let values: PolicyKeyValues<'_> = (
            policy_part(key.tenant.as_str()),
            kind,
            key.tenant.as_str(),
            client,
        );
        let st = if serial {
            &self.st.get_policy_serial
        } else {
            &self.st.get_policy
        };
        let res = self
            .session
            .execute_unpaged(st, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        match rows.maybe_first_row::<PolicyRow>().map_err(internal)? {
            None => Ok(None),
            Some(row) => record_from_row(row).map(Some),
        }
    }

    /// The next `limit` counter partition keys after `cursor` in token order, with tokens.
    async fn scan_partitions(
        &self,
        cursor: i64,
        limit: usize,
    ) -> StoreResult<Vec<(PartitionRow, i64)>> {
        let values: ScanValues = (cursor, i32::try_from(limit).unwrap_or(i32::MAX));
        let res = self
            .session
            .execute_unpaged(&self.st.scan_partitions, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let mut out = Vec::with_capacity(rows.rows_num());
        for row in rows.rows::<PartitionRow>().map_err(internal)? {
            let row = row.map_err(internal)?;
            // The driver computes the token exactly as the server does (Murmur3 over the
            // serialized key), so the cursor needs no token() in the SELECT.
            let key: PartitionValues<'_> = (&row.0, &row.1, &row.2, row.3, row.4, row.5);
            let token = self
                .st
                .delete_partition
                .calculate_token(&key)
                .map_err(internal)?
                .map(|t| t.value())
                .ok_or_else(|| internal("no token for a counter partition"))?;
            out.push((row, token));
        }
        Ok(out)
    }

    async fn delete_partitions(&self, doomed: &[PartitionRow]) -> StoreResult<()> {
        let outcomes: Vec<StoreResult<()>> = stream::iter(0..doomed.len())
            .map(|i| async move {
                let row = &doomed[i];
                let key: PartitionValues<'_> = (&row.0, &row.1, &row.2, row.3, row.4, row.5);
                self.session
                    .execute_unpaged(&self.st.delete_partition, key)
                    .await
                    .map(|_| ())
                    .map_err(|e| map_exec(e, Op::Write))
            })
            .buffer_unordered(self.max_concurrency)
            .collect()
            .await;
        outcomes.into_iter().collect()
    }

    /// Bumps the policy generation. Retried: an extra bump costs every instance one reload,
    /// a missing one would hide a change, so here (and only here) a counter write is resent.
    async fn bump_generation(&self) -> StoreResult<()> {
        let mut last = None;
        for _ in 0..3 {
            let values: BumpGenerationValues<'_> = (Counter(1), GENERATION_ID);
            match self
                .session
                .execute_unpaged(&self.st.bump_generation, values)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) => last = Some(map_exec(e, Op::Write)),
            }
        }
        Err(StoreError::Uncertain(format!(
            "the policy was written but the change counter could not be bumped: {}",
            last.map(|e| e.to_string()).unwrap_or_default()
        )))
    }
}

fn policy_kind(key: &PolicyKey) -> (i8, &str) {
    match &key.client {
        None => (KIND_TENANT, ""),
        Some(c) => (KIND_OVERRIDE, c.as_str()),
    }
}

fn record_from_row(
    (tenant, client, body, version, updated_at): PolicyRow,
) -> StoreResult<PolicyRecord> {
    let tenant = TenantId::parse(&tenant).map_err(internal)?;
    let client = if client.is_empty() {
        None
    } else {
        Some(ClientId::parse(&client).map_err(internal)?)
    };
    Ok(PolicyRecord {
        key: PolicyKey { tenant, client },
        body,
        version: u64::try_from(version).map_err(internal)?,
        updated_at: DateTime::<Utc>::from_timestamp_millis(updated_at.0)
            .ok_or_else(|| internal("updated_at out of range"))?,
    })
}

/// The `[applied]` column of a lightweight transaction's answer (first column, boolean).
fn applied(res: QueryResult) -> StoreResult<bool> {
    let rows = res.into_rows_result().map_err(internal)?;
    let row = rows.first_row::<scylla::value::Row>().map_err(internal)?;
    match row.columns.first() {
        Some(Some(scylla::value::CqlValue::Boolean(b))) => Ok(*b),
        _ => Err(internal("a conditional write answered without [applied]")),
    }
}

#[async_trait]
impl Store for ScyllaStore {
    fn kind(&self) -> &'static str {
        "scylla"
    }

    async fn increment(&self, deltas: &[Delta]) -> StoreResult<()> {
        let parts = group_increments(deltas)?;
        let outcomes: Vec<StoreResult<()>> = stream::iter(0..parts.len())
            .map(|i| self.write_partition(&parts[i]))
            .buffer_unordered(self.max_concurrency)
            .collect()
            .await;
        combine_write_outcomes(outcomes)
    }

    async fn read(&self, ranges: &[CounterRange]) -> StoreResult<Vec<Vec<BucketTotal>>> {
        let mut queries = Vec::new();
        for (i, r) in ranges.iter().enumerate() {
            if r.from > r.to {
                continue;
            }
            for epoch in epochs_of_range(r.key.grain, r.from, r.to)? {
                for shard in 0..self.shards {
                    queries.push((i, epoch, shard));
                }
            }
        }
        let results: Vec<(usize, i16, Vec<(i64, i64)>)> =
            stream::iter(queries.into_iter().map(|(i, epoch, shard)| async move {
                let r = &ranges[i];
                let rows = self
                    .read_partition(&r.key, epoch, shard, r.from, r.to)
                    .await?;
                Ok::<_, StoreError>((i, shard, rows))
            }))
            .buffer_unordered(self.max_concurrency)
            .try_collect()
            .await?;
        let mut sums: Vec<BTreeMap<i64, (i64, i64)>> = vec![BTreeMap::new(); ranges.len()];
        for (i, shard, rows) in results {
            for (start, n) in rows {
                let e = sums[i].entry(start).or_insert((0, 0));
                e.0 += n;
                if shard == self.shard {
                    e.1 += n;
                }
            }
        }
        Ok(sums
            .into_iter()
            .map(|m| {
                m.into_iter()
                    .map(|(start, (total, mine))| BucketTotal { start, total, mine })
                    .collect()
            })
            .collect())
    }

    /// Deletes whole expired partitions (see the module comment), at most `budget` per call;
    /// returns how many partitions went (a partition holds up to 64 buckets). Each call
    /// continues the sweep where the last stopped and ends at the end of a lap of the token
    /// ring, or after examining `MAX_SWEEP_PER_CALL` keys. So 0 means "nothing expired from
    /// where this call started to the end of the ring" (on a table under 20,000 partitions);
    /// calling until 0 twice in a row sweeps everything.
    async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        let mut deleted = 0u64;
        let mut scanned = 0usize;
        let scan_limit = budget.saturating_mul(4).clamp(100, 5_000);
        while (deleted as usize) < budget && scanned < MAX_SWEEP_PER_CALL {
            let cursor = *self
                .janitor_cursor
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let page = self.scan_partitions(cursor, scan_limit).await?;
            scanned += page.len();
            let sweep = plan_sweep(&page, cursor, scan_limit, now_ms, budget - deleted as usize);
            self.delete_partitions(&sweep.doomed).await?;
            deleted += sweep.doomed.len() as u64;
            // Only now: if a delete failed, the next sweep looks at the same partitions again
            // (deleting twice is harmless).
            *self
                .janitor_cursor
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = sweep.next;
            if sweep.next == i64::MIN {
                // A lap is complete; the next call starts the next one.
                break;
            }
        }
        Ok(deleted)
    }

    async fn put_policy(
        &self,
        key: &PolicyKey,
        body: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<PolicyRecord> {
        let (kind, client) = policy_kind(key);
        let part = policy_part(key.tenant.as_str());
        let tenant = key.tenant.as_str();
        let at = CqlTimestamp(now.timestamp_millis());
        for _ in 0..MAX_CAS_ATTEMPTS {
            let current = self.read_policy(key, true).await?;
            let (done, version) = match current {
                None => {
                    let v: InsertPolicyValues<'_> = (part, kind, tenant, client, body, 1, at);
                    (self.lwt(&self.st.insert_policy, v).await?, 1u64)
                }
                Some(cur) => {
                    let old = i64::try_from(cur.version).map_err(internal)?;
                    let v: UpdatePolicyValues<'_> =
                        (body, old + 1, at, part, kind, tenant, client, old);
                    (self.lwt(&self.st.update_policy, v).await?, cur.version + 1)
                }
            };
            if done {
                self.bump_generation().await?;
                return Ok(PolicyRecord {
                    key: key.clone(),
                    body: body.to_owned(),
                    version,
                    updated_at: DateTime::<Utc>::from_timestamp_millis(at.0).unwrap_or(now),
                });
            }
        }
        Err(StoreError::Unavailable(format!(
            "policy {} changed concurrently {MAX_CAS_ATTEMPTS} times; try again",
            key.tenant
        )))
    }

    async fn get_policy(&self, key: &PolicyKey) -> StoreResult<Option<PolicyRecord>> {
        self.read_policy(key, false).await
    }

    async fn delete_policy(&self, key: &PolicyKey) -> StoreResult<bool> {
        let (kind, client) = policy_kind(key);
        let values: PolicyKeyValues<'_> = (
            policy_part(key.tenant.as_str()),
            kind,
            key.tenant.as_str(),
            client,
        );
        let existed = self.lwt(&self.st.delete_policy, values).await?;
        if existed {
            self.bump_generation().await?;
        }
        Ok(existed)
    }

    async fn list_policies(
        &self,
        after: Option<&TenantId>,
        limit: usize,
    ) -> StoreResult<Vec<PolicyRecord>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        // Tenant ids are never empty, so every tenant sorts after "".
        let after = after.map_or("", |t| t.as_str());
        let lim = i32::try_from(limit).unwrap_or(i32::MAX);
        let parts: Vec<Vec<PolicyRow>> = stream::iter((0..POLICY_PARTS).map(|part| async move {
            let values: ListPoliciesValues<'_> = (part, KIND_TENANT, after, lim);
            let res = self
                .session
                .execute_unpaged(&self.st.list_policies, values)
                .await
                .map_err(|e| map_exec(e, Op::Read))?;
            let rows = res.into_rows_result().map_err(internal)?;
            let out = rows
                .rows::<PolicyRow>()
                .map_err(internal)?
                .collect::<Result<Vec<_>, _>>()
                .map_err(internal)?;
            Ok::<_, StoreError>(out)
        }))
        .buffer_unordered(self.max_concurrency)
        .try_collect()
        .await?;
        // Each partition is sorted by tenant; merging the few heads is a sort of <= 16*limit.
        let mut all: Vec<PolicyRow> = parts.into_iter().flatten().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all.truncate(limit);
        all.into_iter().map(record_from_row).collect()
    }

    async fn load_policies(&self) -> StoreResult<Vec<PolicyRecord>> {
        let parts: Vec<Vec<PolicyRow>> = stream::iter((0..POLICY_PARTS).map(|part| async move {
            let values: LoadPoliciesValues = (part,);
            let pager = self
                .session
                .execute_iter(self.st.load_policies.clone(), values)
                .await
                .map_err(map_pager)?;
            pager
                .rows_stream::<PolicyRow>()
                .map_err(internal)?
                .map_err(map_next_row)
                .try_collect::<Vec<_>>()
                .await
        }))
        .buffer_unordered(self.max_concurrency)
        .try_collect()
        .await?;
        let mut out: Vec<PolicyRecord> = parts
            .into_iter()
            .flatten()
            .map(record_from_row)
            .collect::<StoreResult<_>>()?;
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    async fn policies_generation(&self) -> StoreResult<u64> {
        let values: ReadGenerationValues<'_> = (GENERATION_ID,);
        let res = self
            .session
            .execute_unpaged(&self.st.read_generation, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let n = rows
            .maybe_first_row::<GenerationRow>()
            .map_err(internal)?
            .and_then(|(c,)| c)
            .map_or(0, |Counter(n)| n);
        Ok(u64::try_from(n).unwrap_or(0))
    }

    async fn ping(&self) -> StoreResult<()> {
        // Our own table, not system.local: proves the keyspace and schema answer too.
        self.policies_generation().await.map(|_| ())
    }
}

/// Checks CQL text against the migrations' schema without a server: the tables and columns a
/// statement names exist, every partition-key column is bound, and the Rust types the code
/// binds and reads are the columns' CQL types. A wrong column or type would otherwise only
/// show up as a failed `prepare` or a type-check error against a live cluster.
#[cfg(test)]
pub(crate) mod schema_check {
    use scylla::value::{Counter, CqlTimestamp};

    #[derive(Debug, Clone)]
    pub struct Table {
        pub name: String,
        pub columns: Vec<(String, String)>,
        pub partition_key: Vec<String>,
        pub clustering: Vec<String>,
    }

    impl Table {
        pub fn column_type(&self, c: &str) -> Option<&str> {
            self.columns
                .iter()
                .find(|(n, _)| n == c)
                .map(|(_, t)| t.as_str())
        }
    }

    /// The CQL type a Rust value binds or reads as.
    pub trait CqlName {
        const NAME: &'static str;
    }
    macro_rules! cql_name {
        ($($t:ty => $n:literal),* $(,)?) => { $(impl CqlName for $t { const NAME: &'static str = $n; })* };
    }
    cql_name!(i8 => "tinyint", i16 => "smallint", i32 => "int", i64 => "bigint",
        &str => "text", String => "text", Counter => "counter", CqlTimestamp => "timestamp",
        bool => "boolean");
    impl<T: CqlName> CqlName for Option<T> {
        const NAME: &'static str = T::NAME;
    }

    /// The CQL types of a tuple of bind values or a row type, in order.
    pub trait CqlNames {
        fn names() -> Vec<&'static str>;
    }
    macro_rules! cql_names {
        ($($t:ident),+) => {
            impl<$($t: CqlName),+> CqlNames for ($($t,)+) {
                fn names() -> Vec<&'static str> { vec![$($t::NAME),+] }
            }
        };
    }
    cql_names!(A);
    cql_names!(A, B);
    cql_names!(A, B, C);
    cql_names!(A, B, C, D);
    cql_names!(A, B, C, D, E);
    cql_names!(A, B, C, D, E, F);
    cql_names!(A, B, C, D, E, F, G);
    cql_names!(A, B, C, D, E, F, G, H);

    pub fn names<T: CqlNames>() -> Vec<&'static str> {
        T::names()
    }

    /// Splits CQL into words, `?`, quoted strings and punctuation (`>=`, `<=` kept whole).
    pub fn tokens(cql: &str) -> Vec<String> {
        let mut out = Vec::new();
        let cs: Vec<char> = cql.chars().collect();
        let mut i = 0;
        while i < cs.len() {
            let c = cs[i];
            if c.is_whitespace() {
                i += 1;
            } else if c.is_ascii_alphanumeric() || c == '_' {
                let j = (i..cs.len())
                    .find(|&j| !(cs[j].is_ascii_alphanumeric() || cs[j] == '_'))
                    .unwrap_or(cs.len());
                out.push(cs[i..j].iter().collect());
                i = j;
            } else if c == '\'' {
                let j = (i + 1..cs.len())
                    .find(|&j| cs[j] == '\'')
                    .unwrap_or(cs.len() - 1);
                out.push(cs[i..=j].iter().collect());
                i = j + 1;
            } else if (c == '>' || c == '<') && cs.get(i + 1) == Some(&'=') {
                out.push(format!("{c}="));
                i += 2;
            } else {
                out.push(c.to_string());
                i += 1;
            }
        }
        out
    }

    fn is_ident(t: &str) -> bool {
        t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
    }

    /// The tables created by a set of CQL statements.
    pub fn parse_tables(statements: &[String]) -> Vec<Table> {
        let mut out = Vec::new();
        for s in statements {
            let t = tokens(s);
            let upper: Vec<String> = t.iter().map(|w| w.to_ascii_uppercase()).collect();
            if upper.len() < 3 || upper[0] != "CREATE" || upper[1] != "TABLE" {
                continue;
            }
            let open = t.iter().position(|w| w == "(").expect("a table body");
            let name = t[open - 1].clone();
            // Split the body at top-level commas.
            let mut items: Vec<Vec<String>> = vec![Vec::new()];
            let mut depth = 0;
            for w in &t[open + 1..] {
                match w.as_str() {
                    "(" => depth += 1,
                    ")" if depth == 0 => break,
                    ")" => depth -= 1,
                    "," if depth == 0 => {
                        items.push(Vec::new());
                        continue;
                    }
                    _ => {}
                }
                items.last_mut().unwrap().push(w.clone());
            }
            let mut table = Table {
                name,
                columns: Vec::new(),
                partition_key: Vec::new(),
                clustering: Vec::new(),
            };
            for item in items {
                if item.len() >= 2
                    && item[0].eq_ignore_ascii_case("PRIMARY")
                    && item[1].eq_ignore_ascii_case("KEY")
                {
                    // PRIMARY KEY ((a, b), c, d) or PRIMARY KEY (a, c)
                    let inner = &item[3..item.len() - 1];
                    if inner[0] == "(" {
                        let close = inner.iter().position(|w| w == ")").unwrap();
                        table.partition_key = inner[1..close]
                            .iter()
                            .filter(|w| *w != ",")
                            .cloned()
                            .collect();
                        table.clustering = inner[close + 1..]
                            .iter()
                            .filter(|w| *w != ",")
                            .cloned()
                            .collect();
                    } else {
                        let cols: Vec<String> =
                            inner.iter().filter(|w| *w != ",").cloned().collect();
                        table.partition_key = vec![cols[0].clone()];
                        table.clustering = cols[1..].to_vec();
                    }
                } else {
                    table
                        .columns
                        .push((item[0].clone(), item[1].to_ascii_lowercase()));
                    if item.len() >= 4 && item[2].eq_ignore_ascii_case("PRIMARY") {
                        table.partition_key = vec![item[0].clone()];
                    }
                }
            }
            out.push(table);
        }
        out
    }

    const KEYWORDS: &[&str] = &[
        "SELECT", "DISTINCT", "FROM", "WHERE", "AND", "UPDATE", "SET", "INSERT", "INTO", "VALUES",
        "DELETE", "IF", "NOT", "EXISTS", "LIMIT", "TOKEN",
    ];

    /// Checks one statement; returns a description of the first problem.
    pub fn check(
        tables: &[Table],
        cql: &str,
        binds: &[&str],
        row: Option<&[&str]>,
    ) -> Result<(), String> {
        let t = tokens(cql);
        let upper: Vec<String> = t.iter().map(|w| w.to_ascii_uppercase()).collect();
        let kw = |i: usize, k: &str| upper.get(i).is_some_and(|w| w == k);
        let table_at = match upper[0].as_str() {
            "SELECT" | "DELETE" => upper.iter().position(|w| w == "FROM").map(|i| i + 1),
            "UPDATE" => Some(1),
            "INSERT" => Some(2),
            _ => None,
        }
        .ok_or("unknown statement kind")?;
        let table = tables
            .iter()
            .find(|tb| tb.name == t[table_at])
            .ok_or_else(|| format!("no table {}", t[table_at]))?;
        if upper.iter().any(|w| w == "USING") {
            return Err("USING (TTL/TIMESTAMP) is refused on counter tables".into());
        }
        let is_counter_table = table.columns.iter().any(|(_, ty)| ty == "counter");
        if is_counter_table && upper[0] == "INSERT" {
            return Err("INSERT is refused on counter tables".into());
        }
        // Every identifier is a keyword, the table, or one of its columns.
        for (i, w) in t.iter().enumerate() {
            if i == table_at || !is_ident(w) || KEYWORDS.contains(&upper[i].as_str()) {
                continue;
            }
            if table.column_type(w).is_none() {
                return Err(format!("no column {w} in {}", table.name));
            }
        }
        // What each marker binds.
        let mut bound: Vec<String> = Vec::new();
        if upper[0] == "INSERT" {
            let cols: Vec<&String> = t[table_at + 2..]
                .iter()
                .take_while(|w| *w != ")")
                .filter(|w| *w != ",")
                .collect();
            let markers = t.iter().filter(|w| *w == "?").count();
            if markers != cols.len() {
                return Err(format!("{} columns, {markers} markers", cols.len()));
            }
            for c in &cols {
                bound.push(table.column_type(c).unwrap().to_owned());
            }
            for pk in table.partition_key.iter().chain(&table.clustering) {
                if !cols.contains(&pk) {
                    return Err(format!("key column {pk} not inserted"));
                }
            }
        } else {
            for (i, w) in t.iter().enumerate() {
                if w != "?" {
                    continue;
                }
                let prev = upper[i - 1].as_str();
                let ty = if prev == "LIMIT" {
                    "int".to_owned()
                } else if prev == "+" {
                    table.column_type(&t[i - 2]).unwrap().to_owned()
                } else if ["=", ">", "<", ">=", "<="].contains(&prev) {
                    if t[i - 2] == ")" {
                        // token(...) > ?: Murmur3 tokens are bigints.
                        "bigint".to_owned()
                    } else {
                        table
                            .column_type(&t[i - 2])
                            .ok_or_else(|| format!("marker after {}", t[i - 2]))?
                            .to_owned()
                    }
                } else {
                    return Err(format!("cannot tell what marker {i} binds"));
                };
                bound.push(ty);
            }
            // Every partition-key column bound by equality (or all of them inside token()).
            // A SELECT without WHERE is a deliberate full scan (tiny bookkeeping tables only).
            let where_at = match upper.iter().position(|w| w == "WHERE") {
                Some(i) => i,
                None if upper[0] == "SELECT" => t.len() - 1,
                None => return Err("no WHERE".into()),
            };
            let end = upper
                .iter()
                .rposition(|w| w == "IF")
                .filter(|&i| i > where_at);
            let clause = &t[where_at + 1..end.unwrap_or(t.len())];
            let eq: Vec<&String> = clause
                .windows(3)
                .filter(|w| w[1] == "=" && w[2] == "?")
                .map(|w| &w[0])
                .collect();
            if where_at == t.len() - 1 {
                // Full scan: nothing to bind.
            } else if kw(where_at + 1, "TOKEN") {
                let args: Vec<&String> = clause[2..]
                    .iter()
                    .take_while(|w| *w != ")")
                    .filter(|w| *w != ",")
                    .collect();
                if args
                    .iter()
                    .map(|s| s.as_str())
                    .ne(table.partition_key.iter().map(|s| s.as_str()))
                {
                    return Err(format!(
                        "token() over {args:?}, key is {:?}",
                        table.partition_key
                    ));
                }
            } else {
                for pk in &table.partition_key {
                    if !eq.contains(&pk) {
                        return Err(format!("partition-key column {pk} not bound by ="));
                    }
                }
            }
        }
        if bound != binds {
            return Err(format!("markers bind {bound:?}, the code binds {binds:?}"));
        }
        if let Some(row) = row {
            let from = upper
                .iter()
                .position(|w| w == "FROM")
                .ok_or("SELECT without FROM")?;
            let start = if kw(1, "DISTINCT") { 2 } else { 1 };
            let selected: Vec<&str> = t[start..from]
                .iter()
                .filter(|w| *w != ",")
                .map(|w| table.column_type(w).unwrap_or("?"))
                .collect();
            if selected != row {
                return Err(format!("selects {selected:?}, the code reads {row:?}"));
            }
        } else if upper[0] == "SELECT" {
            return Err("a SELECT without a row type".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::schema_check::{check, names, parse_tables, Table};
    use super::*;
    use crate::migrate;
    use proptest::prelude::*;

    fn schema() -> Vec<Table> {
        let statements: Vec<String> = migrate::migrations()
            .unwrap()
            .iter()
            .flat_map(|m| migrate::split_statements(m.text))
            .collect();
        parse_tables(&statements)
    }

    /// Every statement the store prepares, with the Rust types bound to it and read from it.
    /// (constant name, CQL, bound types, row types)
    type Entry = (
        &'static str,
        &'static str,
        Vec<&'static str>,
        Option<Vec<&'static str>>,
    );

    fn catalog() -> Vec<Entry> {
        vec![
            (
                "INCREMENT_CQL",
                INCREMENT_CQL,
                names::<IncrementValues<'static>>(),
                None,
            ),
            (
                "READ_BUCKETS_CQL",
                READ_BUCKETS_CQL,
                names::<ReadBucketsValues<'static>>(),
                Some(names::<BucketRow>()),
            ),
            (
                "SCAN_PARTITIONS_CQL",
                SCAN_PARTITIONS_CQL,
                names::<ScanValues>(),
                Some(names::<PartitionRow>()),
            ),
            (
                "DELETE_PARTITION_CQL",
                DELETE_PARTITION_CQL,
                names::<PartitionValues<'static>>(),
                None,
            ),
            (
                "GET_POLICY_CQL",
                GET_POLICY_CQL,
                names::<PolicyKeyValues<'static>>(),
                Some(names::<PolicyRow>()),
            ),
            (
                "INSERT_POLICY_CQL",
                INSERT_POLICY_CQL,
                names::<InsertPolicyValues<'static>>(),
                None,
            ),
            (
                "UPDATE_POLICY_CQL",
                UPDATE_POLICY_CQL,
                names::<UpdatePolicyValues<'static>>(),
                None,
            ),
            (
                "DELETE_POLICY_CQL",
                DELETE_POLICY_CQL,
                names::<PolicyKeyValues<'static>>(),
                None,
            ),
            (
                "LIST_POLICIES_CQL",
                LIST_POLICIES_CQL,
                names::<ListPoliciesValues<'static>>(),
                Some(names::<PolicyRow>()),
            ),
            (
                "LOAD_POLICIES_CQL",
                LOAD_POLICIES_CQL,
                names::<LoadPoliciesValues>(),
                Some(names::<PolicyRow>()),
            ),
            (
                "BUMP_GENERATION_CQL",
                BUMP_GENERATION_CQL,
                names::<BumpGenerationValues<'static>>(),
                None,
            ),
            (
                "READ_GENERATION_CQL",
                READ_GENERATION_CQL,
                names::<ReadGenerationValues<'static>>(),
                Some(names::<GenerationRow>()),
            ),
        ]
    }

    #[test]
    fn the_schema_parser_reads_the_migrations() {
        let tables = schema();
        let counters = tables.iter().find(|t| t.name == "counters").unwrap();
        assert_eq!(
            counters.partition_key,
            ["tenant", "subject", "limit_id", "grain", "epoch", "shard"]
        );
        assert_eq!(counters.clustering, ["bucket_start"]);
        assert_eq!(counters.column_type("hits"), Some("counter"));
        let gen = tables
            .iter()
            .find(|t| t.name == "policy_generation")
            .unwrap();
        assert_eq!(gen.partition_key, ["id"]);
        let pol = tables.iter().find(|t| t.name == "policies").unwrap();
        assert_eq!(pol.partition_key, ["part"]);
        assert_eq!(pol.clustering, ["kind", "tenant", "client"]);
    }

    #[test]
    fn no_column_or_table_is_a_reserved_cql_word() {
        // ScyllaDB's and Cassandra's reserved keywords (a column named `limit` would fail).
        const RESERVED: &[&str] = &[
            "add",
            "allow",
            "alter",
            "and",
            "apply",
            "asc",
            "authorize",
            "batch",
            "begin",
            "by",
            "columnfamily",
            "create",
            "default",
            "delete",
            "desc",
            "describe",
            "drop",
            "entries",
            "execute",
            "for",
            "from",
            "full",
            "grant",
            "if",
            "in",
            "index",
            "infinity",
            "insert",
            "into",
            "is",
            "keyspace",
            "keyspaces",
            "limit",
            "materialized",
            "mbean",
            "mbeans",
            "modify",
            "nan",
            "norecursive",
            "not",
            "null",
            "of",
            "on",
            "or",
            "order",
            "primary",
            "rename",
            "replace",
            "revoke",
            "schema",
            "select",
            "set",
            "table",
            "to",
            "token",
            "truncate",
            "unlogged",
            "unset",
            "update",
            "use",
            "using",
            "view",
            "where",
            "with",
        ];
        for t in schema() {
            assert!(!RESERVED.contains(&t.name.as_str()), "table {}", t.name);
            for (c, _) in &t.columns {
                assert!(!RESERVED.contains(&c.as_str()), "{}.{c}", t.name);
            }
        }
    }

    #[test]
    fn every_statement_matches_the_schema_and_the_bound_types() {
        let tables = schema();
        for (name, cql, binds, row) in catalog() {
            if let Err(e) = check(&tables, cql, &binds, row.as_deref()) {
                panic!("{name}: {e}\n{cql}");
            }
        }
    }

    #[test]
    fn the_checker_catches_wrong_statements() {
        let tables = schema();
        let inc = names::<IncrementValues<'static>>();
        // A missing partition-key column (no routing, and the server refuses it).
        let no_shard = INCREMENT_CQL.replace(" AND shard = ?", "");
        let e = check(&tables, &no_shard, &inc[..7], None).unwrap_err();
        assert!(e.contains("partition-key column shard"), "{e}");
        // A misspelt column.
        let typo = INCREMENT_CQL.replace("limit_id", "limitid");
        let e = check(&tables, &typo, &inc, None).unwrap_err();
        assert!(e.contains("no column limitid"), "{e}");
        // Binding an i64 where the schema has a smallint.
        let mut wrong = inc.clone();
        wrong[6] = "bigint";
        let e = check(&tables, INCREMENT_CQL, &wrong, None).unwrap_err();
        assert!(e.contains("markers bind"), "{e}");
        // Counter tables refuse TTLs and INSERT.
        let ttl = INCREMENT_CQL.replace("SET", "USING TTL 60 SET");
        assert!(check(&tables, &ttl, &inc, None).is_err());
        // A row type that does not match the selection.
        assert!(check(
            &tables,
            READ_BUCKETS_CQL,
            &names::<ReadBucketsValues<'static>>(),
            Some(&["bigint", "bigint"])
        )
        .is_err());
    }

    #[test]
    fn the_catalog_covers_every_statement_in_this_file() {
        let src = include_str!("scylla.rs");
        let mut consts: Vec<&str> = src
            .lines()
            .filter_map(|l| l.strip_prefix("pub const "))
            .filter_map(|l| l.split(':').next())
            .filter(|n| n.ends_with("_CQL"))
            .collect();
        consts.sort();
        let mut covered: Vec<&str> = catalog().iter().map(|c| c.0).collect();
        covered.sort();
        assert_eq!(consts, covered);
    }

    #[test]
    fn fixed_epochs_hold_64_buckets_and_a_window_spans_at_most_two() {
        for g in [100, 1_000, 60_000, 3_600_000, 86_400_000] {
            let grain = Grain::Fixed(g);
            assert_eq!(epoch_of(grain, 0).unwrap(), 0);
            assert_eq!(epoch_of(grain, 64 * g - 1).unwrap(), 0);
            assert_eq!(epoch_of(grain, 64 * g).unwrap(), 1);
            assert_eq!(epoch_of(grain, -1).unwrap(), -1);
            assert_eq!(epoch_end(grain, 0), Some(64 * g));
            // The longest window: 32 buckets plus the partial one.
            let t = 63 * g;
            let r = epochs_of_range(grain, t - 32 * g, t).unwrap();
            assert!(r.end() - r.start() <= 1);
        }
        assert!(epoch_of(Grain::Fixed(0), 5).is_err());
        assert!(epochs_of_range(Grain::Fixed(1_000), 0, 1_000 * 64 * 100).is_err());
    }

    #[test]
    fn monthly_buckets_are_grouped_by_year() {
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis();
        assert_eq!(
            epoch_of(Grain::Month, t("2024-02-01T00:00:00Z")).unwrap(),
            2024
        );
        assert_eq!(
            epoch_of(Grain::Month, t("2024-12-01T00:00:00Z")).unwrap(),
            2024
        );
        assert_eq!(
            epoch_end(Grain::Month, 2024),
            Some(t("2025-01-01T00:00:00Z"))
        );
        let dec = t("2024-12-01T00:00:00Z");
        let needed_until = dec + Grain::Month.retention_ms();
        assert!(!partition_expired(Grain::Month, 2024, needed_until - 1));
        assert!(partition_expired(
            Grain::Month,
            2024,
            t("2025-01-01T00:00:00Z") + Grain::Month.retention_ms()
        ));
    }

    #[test]
    fn a_partition_expires_only_after_its_last_bucket_did() {
        let g = Grain::Fixed(1_000);
        let last_start = 64_000 - 1_000;
        assert!(!partition_expired(g, 0, last_start + g.retention_ms() - 1));
        assert!(!partition_expired(g, 0, 64_000 + g.retention_ms() - 1));
        assert!(partition_expired(g, 0, 64_000 + g.retention_ms()));
        // Out-of-range arithmetic never expires anything.
        assert!(!partition_expired(g, i64::MAX / 2, i64::MAX));
        assert!(!partition_expired(Grain::Month, i64::MAX, i64::MAX));
    }

    proptest! {
        #[test]
        fn no_needed_bucket_is_ever_in_an_expired_partition(
            start in -4_000_000_000_000i64..4_000_000_000_000,
            gi in 0usize..6,
            age in 0i64..10_000_000_000,
        ) {
            let grain = [Grain::Fixed(100), Grain::Fixed(1_000), Grain::Fixed(60_000),
                Grain::Fixed(3_600_000), Grain::Fixed(86_400_000), Grain::Month][gi];
            let start = grain.bucket_start(start);
            let epoch = epoch_of(grain, start).unwrap();
            let now = start + age;
            if partition_expired(grain, epoch, now) {
                prop_assert!(now >= start + grain.retention_ms());
            }
            // And the bucket is inside its epoch.
            prop_assert!(start < epoch_end(grain, epoch).unwrap());
            prop_assert!(epoch == i64::MIN || start >= epoch_end(grain, epoch - 1).unwrap());
        }
    }

    fn key(tenant: &str, limit: &str, grain: Grain) -> CounterKey {
        CounterKey {
            tenant: tenant.into(),
            subject: "k1".into(),
            limit: limit.into(),
            grain,
        }
    }

    #[test]
    fn the_sweep_deletes_expired_partitions_within_budget_and_resumes_after_them() {
        let g = Grain::Fixed(1_000);
        let now = 10 * 64_000 + g.retention_ms();
        // epoch 0..9 are expired at `now`, epoch 10 is not; an unknown grain code never is.
        let row = |epoch: i64, grain: i64| -> PartitionRow {
            ("t".into(), "s".into(), "l".into(), grain, epoch, 0)
        };
        let page: Vec<(PartitionRow, i64)> = vec![
            (row(10, 1_000), -50),
            (row(1, 1_000), -40),
            (row(2, 0), -30),
            (row(3, 1_000), -20),
            (row(4, 1_000), -10),
        ];
        let s = plan_sweep(&page, i64::MIN, 5, now, 2);
        assert_eq!(s.doomed, vec![row(1, 1_000), row(3, 1_000)]);
        assert_eq!(
            s.next, -20,
            "resumes before the first partition over budget"
        );
        let s = plan_sweep(&page[4..], -20, 5, now, 2);
        assert_eq!(s.doomed, vec![row(4, 1_000)]);
        assert_eq!(s.next, i64::MIN, "a short page ends the lap");
        let s = plan_sweep(&page, i64::MIN, 5, now, 10);
        assert_eq!(s.doomed.len(), 3);
        assert_eq!(s.next, -10, "a full page continues after its last key");
        let s = plan_sweep(&page[1..], -45, 4, now, 1);
        // Past the deleted one and the one it leaves alone, up to the next it has no budget for.
        assert_eq!((s.doomed.len(), s.next), (1, -30));
        assert_eq!(plan_sweep(&[], 7, 5, now, 1).next, i64::MIN);
        // Nothing expires early.
        assert!(plan_sweep(&page, i64::MIN, 5, 0, 10).doomed.is_empty());
    }

    #[test]
    fn increments_are_grouped_per_partition_and_summed() {
        let a = key("acme", "l1", Grain::Fixed(1_000));
        let b = key("acme", "l2", Grain::Fixed(1_000));
        let d = |k: &CounterKey, start, delta| Delta {
            key: k.clone(),
            start,
            delta,
        };
        let parts = group_increments(&[
            d(&a, 1_000, 2),
            d(&a, 1_000, 3),
            d(&a, 2_000, 1),
            d(&a, 64_000, 7), // next epoch
            d(&b, 1_000, 1),
            d(&b, 2_000, 4),
            d(&b, 2_000, -4), // sums to nothing: not sent
        ])
        .unwrap();
        type Got<'a> = (&'a str, i64, Vec<(i64, i64)>);
        let got: Vec<Got<'_>> = parts
            .iter()
            .map(|p| (&*p.key.limit, p.epoch, p.rows.clone()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("l1", 0, vec![(1_000, 5), (2_000, 1)]),
                ("l1", 1, vec![(64_000, 7)]),
                ("l2", 0, vec![(1_000, 1)]),
            ]
        );
        assert!(group_increments(&[d(&a, 0, 1), d(&b, 0, -1)])
            .unwrap()
            .iter()
            .all(|p| p.rows.len() == 1));
        assert!(group_increments(&[]).unwrap().is_empty());
    }

    #[test]
    fn a_partly_landed_write_is_uncertain_never_retryable() {
        let un = || Err(StoreError::Unavailable("down".into()));
        assert!(combine_write_outcomes(vec![Ok(()), Ok(())]).is_ok());
        assert!(combine_write_outcomes(vec![]).is_ok());
        assert!(matches!(
            combine_write_outcomes(vec![un(), un()]),
            Err(StoreError::Unavailable(_))
        ));
        assert!(matches!(
            combine_write_outcomes(vec![Ok(()), un()]),
            Err(StoreError::Uncertain(_))
        ));
        assert!(matches!(
            combine_write_outcomes(vec![un(), Err(StoreError::Uncertain("t".into()))]),
            Err(StoreError::Uncertain(_))
        ));
        assert!(matches!(
            combine_write_outcomes(vec![un(), Err(StoreError::Internal("bug".into()))]),
            Err(StoreError::Internal(_))
        ));
    }

    #[test]
    fn driver_errors_map_to_what_a_caller_may_do() {
        let wt = DbError::WriteTimeout {
            consistency: Consistency::LocalQuorum,
            received: 1,
            required: 2,
            write_type: scylla::errors::WriteType::Counter,
        };
        assert!(matches!(
            map_db(&wt, "", Op::Write),
            StoreError::Uncertain(_)
        ));
        let unavailable = DbError::Unavailable {
            consistency: Consistency::LocalQuorum,
            required: 2,
            alive: 1,
        };
        assert!(matches!(
            map_db(&unavailable, "", Op::Write),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            map_db(&DbError::Overloaded, "", Op::Write),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            map_db(&DbError::Invalid, "unconfigured table", Op::Read),
            StoreError::Internal(_)
        ));
        assert!(matches!(
            map_db(&DbError::ServerError, "", Op::Write),
            StoreError::Uncertain(_)
        ));
        assert!(matches!(
            map_db(&DbError::ServerError, "", Op::Read),
            StoreError::Unavailable(_)
        ));
        let rl = |by_coordinator| DbError::RateLimitReached {
            op_type: scylla::errors::OperationType::Write,
            rejected_by_coordinator: by_coordinator,
        };
        assert!(matches!(
            map_db(&rl(true), "", Op::Write),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            map_db(&rl(false), "", Op::Write),
            StoreError::Uncertain(_)
        ));
        let timeout = || ExecutionError::RequestTimeout(Duration::from_millis(5));
        assert!(matches!(
            map_exec(timeout(), Op::Write),
            StoreError::Uncertain(_)
        ));
        assert!(matches!(
            map_exec(timeout(), Op::Read),
            StoreError::Unavailable(_)
        ));
        assert!(matches!(
            map_exec(ExecutionError::EmptyPlan, Op::Write),
            StoreError::Unavailable(_)
        ));
        let db =
            |e| ExecutionError::LastAttemptError(RequestAttemptError::DbError(e, String::new()));
        assert!(matches!(
            map_exec(db(wt.clone()), Op::Write),
            StoreError::Uncertain(_)
        ));
    }

    #[test]
    fn options_are_validated_and_the_password_never_printed() {
        let ok = ScyllaOptions::default();
        assert!(ok.validate().is_ok());
        let with = |f: fn(&mut ScyllaOptions)| {
            let mut o = ScyllaOptions::default();
            f(&mut o);
            o.validate()
        };
        assert!(with(|o| o.shards = 0).unwrap_err().starts_with("shards"));
        assert!(with(|o| o.shards = MAX_SHARDS + 1).is_err());
        assert!(with(|o| {
            o.shards = 2;
            o.shard = 2
        })
        .unwrap_err()
        .starts_with("shard:"));
        assert!(with(|o| o.shard = -1).is_err());
        assert!(with(|o| {
            o.shards = 4;
            o.shard = 3
        })
        .is_ok());
        assert!(with(|o| o.nodes.clear()).unwrap_err().starts_with("nodes"));
        assert!(with(|o| o.keyspace = "Bad-Name".into())
            .unwrap_err()
            .starts_with("keyspace"));
        assert!(with(|o| o.request_timeout = Duration::ZERO).is_err());
        assert!(with(|o| o.consistency = Consistency::Serial).is_err());
        let o = ScyllaOptions {
            username: Some("quotad".into()),
            password: Some("hunter2".into()),
            ..ScyllaOptions::default()
        };
        let printed = format!("{o:?}");
        assert!(
            !printed.contains("hunter2") && printed.contains("<redacted>"),
            "{printed}"
        );
    }

    #[test]
    fn consistency_names_parse_as_in_cql() {
        assert_eq!(
            parse_consistency("LOCAL_QUORUM"),
            Ok(Consistency::LocalQuorum)
        );
        assert_eq!(parse_consistency("quorum"), Ok(Consistency::Quorum));
        assert_eq!(parse_consistency(" local_one "), Ok(Consistency::LocalOne));
        assert!(parse_consistency("serial").is_err());
        assert!(parse_consistency("").is_err());
    }

    #[test]
    fn policy_parts_are_stable_and_in_range() {
        // Pinned: these values are part of the stored data.
        assert_eq!(policy_part(""), (0x811c_9dc5u32 % 16) as i16);
        assert_eq!(policy_part("a"), (0xe40c_292cu32 % 16) as i16);
        let mut seen = [false; POLICY_PARTS as usize];
        for i in 0..1000 {
            let p = policy_part(&format!("tenant-{i}"));
            assert!((0..POLICY_PARTS).contains(&p));
            seen[p as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "tenants spread over every part");
    }
}
