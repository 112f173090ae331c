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
    PrepareError, RequestAttemptError, RequestError,
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
        NewSessionError::UseKeyspaceError(_) => StoreError::Internal(format!(
            "{e}; does the keyspace exist? run `quotad migrate`"
        )),
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
    /// returns how many partitions went. Each call continues the sweep where the last stopped,
    /// so call it until it returns 0 to clear everything that is expired.
    async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        if budget == 0 {
            return Ok(0);
        }
        let cursor = *self
            .janitor_cursor
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let scan_limit = i32::try_from(budget.saturating_mul(4).clamp(100, 5_000)).unwrap_or(5_000);
        let values: ScanValues = (cursor, scan_limit);
        let res = self
            .session
            .execute_unpaged(&self.st.scan_partitions, values)
            .await
            .map_err(|e| map_exec(e, Op::Read))?;
        let rows = res.into_rows_result().map_err(internal)?;
        let seen = rows.rows_num();
        let mut doomed: Vec<PartitionRow> = Vec::new();
        let mut next = cursor;
        let mut stopped_early = false;
        for row in rows.rows::<PartitionRow>().map_err(internal)? {
            let row = row.map_err(internal)?;
            let (t, s, l, g, e, sh) = (&row.0, &row.1, &row.2, row.3, row.4, row.5);
            // A grain code this version does not know is left alone.
            let expired = Grain::from_code(g).is_some_and(|g| partition_expired(g, e, now_ms));
            if expired && doomed.len() == budget {
                stopped_early = true;
                break;
            }
            let key: PartitionValues<'_> = (t, s, l, g, e, sh);
            next = self
                .st
                .delete_partition
                .calculate_token(&key)
                .map_err(internal)?
                .map(|t| t.value())
                .ok_or_else(|| internal("no token for a counter partition"))?;
            if expired {
                doomed.push(row);
            }
        }
        if !stopped_early && seen < scan_limit as usize {
            // Reached the end of the ring: the next sweep starts over.
            next = i64::MIN;
        }
        let doomed = &doomed;
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
        let deleted = outcomes.iter().filter(|o| o.is_ok()).count() as u64;
        if let Some(Err(e)) = outcomes.into_iter().find(|o| o.is_err()) {
            // Keep the cursor: the next sweep looks at these partitions again (deleting twice
            // is harmless).
            return Err(e);
        }
        *self
            .janitor_cursor
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = next;
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
