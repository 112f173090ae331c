//! Every CQL statement the store runs, in one table (the `statements!` invocation below): its
//! text, whether the driver may retry it, and the Rust types bound to it and read from it.
//!
//! The table makes both the prepared set ([`Statements`], prepared once at connect) and the
//! catalog a unit test checks against the migrations' schema, so a statement cannot be
//! prepared without being checked. Unqualified table names: the session runs in the
//! configured keyspace. Every partition-key column is bound, so the driver routes each request
//! to a replica (and, on ScyllaDB, to the owning shard) of its partition, except in the reads
//! of many clients' counters, which the code sends to a replica of them all. The counters'
//! statements are in [`counters`].

use scylla::client::session::Session;
use scylla::statement::prepared::PreparedStatement;
use scylla::statement::Consistency;
use scylla::value::{Counter, CqlTimestamp, MaybeUnset};

use super::errors::map_prepare;
use crate::store::StoreResult;

mod counters;
pub(crate) use counters::*;

/// Rows per page when loading every policy: bodies are up to 64 KiB each.
const POLICY_PAGE_SIZE: i32 = 100;
/// Rows per page when the janitor reads a client's every row.
const JANITOR_PAGE_SIZE: i32 = 1_000;
/// Rows per page of the audit log: an entry holds up to two policy bodies.
const AUDIT_PAGE_SIZE: i32 = 50;

/// The janitor: a client's every row (keys and counts; the counts tell nothing it needs, but a
/// counter table has no cheaper way to list its rows).
pub(crate) const READ_CLIENT_CQL: &str = "SELECT bucket_start, limit_id, grain, shard, hits \
     FROM client_counters WHERE tenant = ? AND subject = ?";
pub(crate) type ClientValues<'a> = (&'a str, &'a str);

/// The janitor's sweep: client partitions in token order after a cursor.
pub(crate) const SCAN_CLIENTS_CQL: &str = "SELECT DISTINCT tenant, subject FROM \
     client_counters WHERE token(tenant, subject) > ? LIMIT ?";
pub(crate) type ClientRow = (String, String);

/// A run of expired buckets of one client, deleted as one range.
pub(crate) const DELETE_STARTS_CQL: &str = "DELETE FROM client_counters WHERE tenant = ? AND \
     subject = ? AND bucket_start >= ? AND bucket_start <= ?";

/// When the layout of 0006 first served a keyspace holding counts in the layout of 0001.
pub(crate) const CLAIM_LAYOUT_CQL: &str =
    "INSERT INTO counter_layouts (name, since) VALUES (?, ?) IF NOT EXISTS";
pub(crate) type ClaimLayoutValues<'a> = (&'a str, i64);
pub(crate) const READ_LAYOUT_CQL: &str = "SELECT since FROM counter_layouts WHERE name = ?";
pub(crate) type ReadLayoutValues<'a> = (&'a str,);
pub(crate) type LayoutRow = (Option<i64>,);

/// The layout of 0001 (`counters`), read and expired after an upgrade, never written.
pub(crate) const LEGACY_READ_BUCKETS_CQL: &str = "SELECT bucket_start, hits FROM counters WHERE \
     tenant = ? AND subject = ? AND limit_id = ? AND grain = ? AND epoch = ? AND shard = ? \
     AND bucket_start >= ? AND bucket_start <= ?";
pub(crate) type ReadBucketsValues<'a> = (&'a str, &'a str, &'a str, i64, i64, i16, i64, i64);
pub(crate) type BucketRow = (i64, Option<Counter>);

/// Whether the old table holds anything at all.
pub(crate) const LEGACY_ANY_CQL: &str = "SELECT DISTINCT tenant, subject, limit_id, grain, \
     epoch, shard FROM counters LIMIT 1";

/// The janitor's sweep of the old table: partition keys in token order after a cursor.
pub(crate) const SCAN_PARTITIONS_CQL: &str = "SELECT DISTINCT tenant, subject, limit_id, grain, \
     epoch, shard FROM counters WHERE token(tenant, subject, limit_id, grain, epoch, shard) > ? \
     LIMIT ?";
pub(crate) type ScanValues = (i64, i32);
pub(crate) type PartitionRow = (String, String, String, i64, i64, i16);

pub(crate) const DELETE_PARTITION_CQL: &str = "DELETE FROM counters WHERE tenant = ? AND \
     subject = ? AND limit_id = ? AND grain = ? AND epoch = ? AND shard = ?";
pub(crate) type PartitionValues<'a> = (&'a str, &'a str, &'a str, i64, i64, i16);

pub(crate) const GET_POLICY_CQL: &str = "SELECT tenant, client, body, version, updated_at FROM \
     policies WHERE part = ? AND kind = ? AND tenant = ? AND client = ?";
pub(crate) type PolicyKeyValues<'a> = (i16, i8, &'a str, &'a str);
pub(crate) type PolicyRow = (String, String, String, i64, CqlTimestamp);

pub(crate) const INSERT_POLICY_CQL: &str = "INSERT INTO policies (part, kind, tenant, client, \
     body, version, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS";
pub(crate) type InsertPolicyValues<'a> = (i16, i8, &'a str, &'a str, &'a str, i64, CqlTimestamp);

pub(crate) const UPDATE_POLICY_CQL: &str = "UPDATE policies SET body = ?, version = ?, \
     updated_at = ? WHERE part = ? AND kind = ? AND tenant = ? AND client = ? IF version = ?";
pub(crate) type UpdatePolicyValues<'a> =
    (&'a str, i64, CqlTimestamp, i16, i8, &'a str, &'a str, i64);

pub(crate) const DELETE_POLICY_CQL: &str =
    "DELETE FROM policies WHERE part = ? AND kind = ? AND tenant = ? AND client = ? IF EXISTS";

pub(crate) const LIST_POLICIES_CQL: &str = "SELECT tenant, client, body, version, updated_at \
     FROM policies WHERE part = ? AND kind = ? AND tenant > ? LIMIT ?";
pub(crate) type ListPoliciesValues<'a> = (i16, i8, &'a str, i32);

pub(crate) const LIST_OVERRIDES_CQL: &str = "SELECT tenant, client, body, version, updated_at \
     FROM policies WHERE part = ? AND kind = ? AND tenant = ? AND client > ? LIMIT ?";
pub(crate) type ListOverridesValues<'a> = (i16, i8, &'a str, &'a str, i32);

pub(crate) const LOAD_POLICIES_CQL: &str =
    "SELECT tenant, client, body, version, updated_at FROM policies WHERE part = ?";
pub(crate) type LoadPoliciesValues = (i16,);

pub(crate) const BUMP_GENERATION_CQL: &str =
    "UPDATE policy_generation SET generation = generation + ? WHERE id = ?";
pub(crate) type BumpGenerationValues<'a> = (Counter, &'a str);

pub(crate) const READ_GENERATION_CQL: &str =
    "SELECT generation FROM policy_generation WHERE id = ?";
pub(crate) type ReadGenerationValues<'a> = (&'a str,);
pub(crate) type GenerationRow = (Option<Counter>,);

/// Fleet membership (`store::lease`): a lease is a row of `members` with a TTL.
pub(crate) const CLAIM_SHARD_CQL: &str = "INSERT INTO members (shard, owner, renewed_at) \
     VALUES (?, ?, ?) IF NOT EXISTS USING TTL ?";
pub(crate) type ClaimShardValues<'a> = (i16, &'a str, CqlTimestamp, i32);

pub(crate) const RENEW_SHARD_CQL: &str = "UPDATE members USING TTL ? SET owner = ?, \
     renewed_at = ? WHERE shard = ? IF owner = ?";
pub(crate) type RenewShardValues<'a> = (i32, &'a str, CqlTimestamp, i16, &'a str);

pub(crate) const RELEASE_SHARD_CQL: &str = "DELETE FROM members WHERE shard = ? IF owner = ?";
pub(crate) type ReleaseShardValues<'a> = (i16, &'a str);

/// At most 256 rows, one per shard: a small scan.
pub(crate) const LIST_MEMBERS_CQL: &str = "SELECT shard, owner FROM members";
pub(crate) type MemberRow = (i16, Option<String>);

/// Idempotency keys (`store::idempotency`, `migrations/0005_idempotency.cql`).
pub(crate) const CLAIM_IDEMPOTENCY_CQL: &str = "INSERT INTO idempotency_keys (scope, key, \
     fingerprint) VALUES (?, ?, ?) IF NOT EXISTS USING TTL ?";
pub(crate) type ClaimIdempotencyValues<'a> = (&'a str, &'a str, &'a str, i32);

/// Sets the fingerprint again so that both cells live as long (a row whose fingerprint expired
/// before its response would block its key).
pub(crate) const FINISH_IDEMPOTENCY_CQL: &str = "UPDATE idempotency_keys USING TTL ? \
     SET fingerprint = ?, response = ? WHERE scope = ? AND key = ? IF fingerprint = ?";
pub(crate) type FinishIdempotencyValues<'a> = (i32, &'a str, &'a str, &'a str, &'a str, &'a str);

/// Only a claim without a response: a recorded one stays for its retries.
pub(crate) const ABANDON_IDEMPOTENCY_CQL: &str = "DELETE FROM idempotency_keys \
     WHERE scope = ? AND key = ? IF fingerprint = ? AND response = null";
pub(crate) type AbandonIdempotencyValues<'a> = (&'a str, &'a str, &'a str);

pub(crate) const GET_IDEMPOTENCY_CQL: &str =
    "SELECT fingerprint, response FROM idempotency_keys WHERE scope = ? AND key = ?";
pub(crate) type GetIdempotencyValues<'a> = (&'a str, &'a str);
pub(crate) type IdempotencyRow = (Option<String>, Option<String>);

/// Holds (`store::hold`, `migrations/0008_holds.cql`). Every write sets the row's TTL: a day
/// past the hold's expiry.
pub(crate) const PUT_HOLD_CQL: &str = "INSERT INTO holds (id, tenant, client, resource, \
     estimate, taken_ms, expires_ms, charges, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) \
     USING TTL ?";
pub(crate) type PutHoldValues<'a> = (
    &'a str,
    &'a str,
    &'a str,
    Option<&'a str>,
    i64,
    i64,
    i64,
    &'a str,
    &'a str,
    i32,
);

pub(crate) const PUT_HOLD_EXPIRY_CQL: &str =
    "INSERT INTO hold_expiry (minute, expires_ms, id) VALUES (?, ?, ?) USING TTL ?";
pub(crate) type PutHoldExpiryValues<'a> = (i64, i64, &'a str, i32);

pub(crate) const GET_HOLD_CQL: &str = "SELECT tenant, client, resource, estimate, taken_ms, \
     expires_ms, charges, state, cost, ended_ms FROM holds WHERE id = ?";
pub(crate) type GetHoldValues<'a> = (&'a str,);
pub(crate) type HoldRow = (
    String,
    String,
    Option<String>,
    i64,
    i64,
    i64,
    String,
    String,
    Option<i64>,
    Option<i64>,
);

/// One end wins: the others find the state changed.
pub(crate) const END_HOLD_CQL: &str = "UPDATE holds USING TTL ? SET state = ?, cost = ?, \
     ended_ms = ? WHERE id = ? IF state = 'open'";
pub(crate) type EndHoldValues<'a> = (i32, &'a str, Option<i64>, i64, &'a str);

pub(crate) const DELETE_HOLD_EXPIRY_CQL: &str =
    "DELETE FROM hold_expiry WHERE minute = ? AND expires_ms = ? AND id = ?";
pub(crate) type DeleteHoldExpiryValues<'a> = (i64, i64, &'a str);

pub(crate) const DUE_HOLDS_CQL: &str =
    "SELECT id FROM hold_expiry WHERE minute = ? AND expires_ms < ? LIMIT ?";
pub(crate) type DueHoldsValues = (i64, i64, i32);
pub(crate) type DueHoldRow = (String,);

/// `part` is always [`USED_PART`]: one partition lists every shard ever claimed.
pub(crate) const MARK_USED_CQL: &str = "INSERT INTO shards_used (part, shard) VALUES (?, ?)";
pub(crate) type MarkUsedValues = (i8, i16);

pub(crate) const LIST_USED_CQL: &str = "SELECT shard FROM shards_used WHERE part = ?";
pub(crate) type ListUsedValues = (i8,);
pub(crate) type UsedRow = (i16,);
pub(crate) const USED_PART: i8 = 0;

/// How far each live instance's writes reached the store (`migrations/0009_members_written.cql`),
/// in one partition ([`USED_PART`]), with the lease's TTL.
pub(crate) const PUT_WRITTEN_CQL: &str = "INSERT INTO members_written (part, shard, owner, \
     written_at) VALUES (?, ?, ?, ?) USING TTL ?";
pub(crate) type PutWrittenValues<'a> = (i8, i16, &'a str, CqlTimestamp, i32);
pub(crate) const LIST_WRITTEN_CQL: &str =
    "SELECT shard, owner, written_at FROM members_written WHERE part = ?";
pub(crate) type WrittenRow = (i16, Option<String>, Option<CqlTimestamp>);

/// Regions (`store::lease`, `migrations/0007_regions.cql`). A slot is claimed at SERIAL: the
/// one write every region's quorum must agree on, once per region.
pub(crate) const LIST_REGION_SLOTS_CQL: &str = "SELECT slot, region FROM region_slots";
pub(crate) type RegionSlotRow = (i16, Option<String>);

pub(crate) const CLAIM_REGION_SLOT_CQL: &str =
    "INSERT INTO region_slots (slot, region) VALUES (?, ?) IF NOT EXISTS";
pub(crate) type ClaimRegionSlotValues<'a> = (i16, &'a str);

/// A heartbeat lives a day: a region unheard that long is taken as gone.
pub(crate) const BEAT_REGION_CQL: &str =
    "INSERT INTO region_heartbeats (region, slot, at) VALUES (?, ?, ?) USING TTL 86400";
pub(crate) type BeatRegionValues<'a> = (&'a str, i16, CqlTimestamp);

pub(crate) const LIST_REGION_BEATS_CQL: &str = "SELECT region, slot, at FROM region_heartbeats";

pub(crate) const LOG_REGION_BEAT_CQL: &str =
    "INSERT INTO region_beats (region, minute, at) VALUES (?, ?, ?) USING TTL 86400";
pub(crate) type LogRegionBeatValues<'a> = (&'a str, i64, CqlTimestamp);

pub(crate) const READ_REGION_BEATS_CQL: &str =
    "SELECT at FROM region_beats WHERE region = ? AND minute = ? AND at >= ? AND at < ?";
pub(crate) type ReadRegionBeatsValues<'a> = (&'a str, i64, CqlTimestamp, CqlTimestamp);
pub(crate) type RegionBeatAtRow = (CqlTimestamp,);
pub(crate) type RegionBeatRow = (String, Option<i16>, Option<CqlTimestamp>);

/// Usage history (`store::history`, `migrations/0004_history_audit.cql`): one counter cell
/// of a point. `month` is `yyyymm` of `start`; `step` is `Step::as_str`.
pub(crate) const ADD_USAGE_POINT_CQL: &str = "UPDATE usage_history SET n = n + ? WHERE \
     tenant = ? AND subject = ? AND month = ? AND step = ? AND start = ? AND field = ?";
pub(crate) type AddUsagePointValues<'a> = (Counter, &'a str, &'a str, i32, &'a str, i64, &'a str);

pub(crate) const READ_USAGE_POINTS_CQL: &str = "SELECT start, field, n FROM usage_history \
     WHERE tenant = ? AND subject = ? AND month = ? AND step = ? AND start >= ? AND start < ?";
pub(crate) type ReadUsagePointsValues<'a> = (&'a str, &'a str, i32, &'a str, i64, i64);
pub(crate) type UsagePointRow = (i64, String, Option<Counter>);

pub(crate) const DELETE_USAGE_HISTORY_CQL: &str =
    "DELETE FROM usage_history WHERE tenant = ? AND subject = ? AND month = ?";
pub(crate) type UsageHistoryKeyValues<'a> = (&'a str, &'a str, i32);

/// A client's line in the day's index. A figure that is 0 is bound unset: the server then
/// leaves that counter alone instead of writing a cell.
pub(crate) const ADD_CLIENT_DAY_CQL: &str = "UPDATE usage_clients SET admitted = admitted + ?, \
     cost = cost + ?, denied = denied + ? WHERE tenant = ? AND day = ? AND client = ?";
pub(crate) type AddClientDayValues<'a> = (
    MaybeUnset<Counter>,
    MaybeUnset<Counter>,
    MaybeUnset<Counter>,
    &'a str,
    i64,
    &'a str,
);

pub(crate) const READ_CLIENT_DAY_CQL: &str = "SELECT client, admitted, cost, denied FROM \
     usage_clients WHERE tenant = ? AND day = ?";
pub(crate) type ClientDayValues<'a> = (&'a str, i64);
pub(crate) type ClientDayRow = (String, Option<Counter>, Option<Counter>, Option<Counter>);

/// The janitor's list of a day's clients: keys only (a counter read costs more).
pub(crate) const LIST_CLIENT_DAY_CQL: &str =
    "SELECT client FROM usage_clients WHERE tenant = ? AND day = ?";
pub(crate) type NameRow = (String,);

pub(crate) const DELETE_CLIENT_DAY_CQL: &str =
    "DELETE FROM usage_clients WHERE tenant = ? AND day = ?";

pub(crate) const NOTE_TENANT_MONTH_CQL: &str =
    "INSERT INTO usage_tenants (month, tenant) VALUES (?, ?)";
/// (month, tenant) of `usage_tenants`, or (month, scope) of `audit_months`.
pub(crate) type MonthNameValues<'a> = (i32, &'a str);

/// Every month with history: one partition key per month kept, a small scan.
pub(crate) const LIST_HISTORY_MONTHS_CQL: &str = "SELECT DISTINCT month FROM usage_tenants";
pub(crate) type MonthRow = (i32,);
pub(crate) type MonthValues = (i32,);

pub(crate) const LIST_MONTH_TENANTS_CQL: &str = "SELECT tenant FROM usage_tenants WHERE month = ?";

pub(crate) const FIND_TENANT_MONTH_CQL: &str =
    "SELECT tenant FROM usage_tenants WHERE month = ? AND tenant = ?";

pub(crate) const DELETE_TENANT_MONTH_CQL: &str =
    "DELETE FROM usage_tenants WHERE month = ? AND tenant = ?";

pub(crate) const DELETE_HISTORY_MONTH_CQL: &str = "DELETE FROM usage_tenants WHERE month = ?";

/// The audit log (`store::audit`): one copy of an entry, under its tenant or under `*`.
pub(crate) const INSERT_AUDIT_CQL: &str = "INSERT INTO audit_log (scope, month, at, id, actor, \
     role, action, tenant, client, version_before, version_after, body_before, body_after, \
     request_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
pub(crate) type InsertAuditValues<'a> = (
    &'a str,
    i32,
    CqlTimestamp,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    &'a str,
    MaybeUnset<&'a str>,
    MaybeUnset<i64>,
    MaybeUnset<i64>,
    MaybeUnset<&'a str>,
    MaybeUnset<&'a str>,
    &'a str,
);

/// A month of one scope, newest first, before a time (`at < ?`)...
pub(crate) const READ_AUDIT_CQL: &str = "SELECT at, id, actor, role, action, tenant, client, \
     version_before, version_after, body_before, body_after, request_id FROM audit_log WHERE \
     scope = ? AND month = ? AND at < ? LIMIT ?";
pub(crate) type ReadAuditValues<'a> = (&'a str, i32, CqlTimestamp, i32);
/// ...or strictly before a cursor. One multi-column slice: Cassandra refuses to mix it with a
/// single-column relation on `at`, so the lower bound (`from`) is applied by the caller.
pub(crate) const READ_AUDIT_BEFORE_CQL: &str = "SELECT at, id, actor, role, action, tenant, \
     client, version_before, version_after, body_before, body_after, request_id FROM audit_log \
     WHERE scope = ? AND month = ? AND (at, id) < (?, ?) LIMIT ?";
pub(crate) type ReadAuditBeforeValues<'a> = (&'a str, i32, CqlTimestamp, &'a str, i32);
pub(crate) type AuditRow = (
    CqlTimestamp,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<i64>,
    Option<i64>,
    Option<String>,
    Option<String>,
    String,
);

pub(crate) const DELETE_AUDIT_PARTITION_CQL: &str =
    "DELETE FROM audit_log WHERE scope = ? AND month = ?";
pub(crate) type AuditPartitionValues<'a> = (&'a str, i32);

pub(crate) const NOTE_AUDIT_MONTH_CQL: &str =
    "INSERT INTO audit_months (month, scope) VALUES (?, ?)";

pub(crate) const LIST_AUDIT_MONTHS_CQL: &str = "SELECT DISTINCT month FROM audit_months";

pub(crate) const LIST_MONTH_SCOPES_CQL: &str = "SELECT scope FROM audit_months WHERE month = ?";

pub(crate) const FIND_AUDIT_MONTH_CQL: &str =
    "SELECT scope FROM audit_months WHERE month = ? AND scope = ?";

pub(crate) const DELETE_AUDIT_SCOPE_MONTH_CQL: &str =
    "DELETE FROM audit_months WHERE month = ? AND scope = ?";

pub(crate) const DELETE_AUDIT_MONTH_CQL: &str = "DELETE FROM audit_months WHERE month = ?";

/// One entry of the table, for code that walks every statement.
#[cfg(test)]
pub(crate) struct Entry {
    /// The field of [`Statements`].
    pub name: &'static str,
    pub cql: &'static str,
    /// CQL types of the bound values, in marker order.
    pub binds: Vec<&'static str>,
    /// CQL types of the row read back; None for statements that read no rows.
    pub row: Option<Vec<&'static str>>,
}

/// Declares the table once: the `Statements` struct, its preparation, and (under test) the
/// catalog of every entry with its types.
///
/// `idempotent`: only statements that change nothing, or whose repetition is harmless, may be
/// retried or speculatively executed by the driver. Counter increments and LWTs stay
/// non-idempotent. `setup` adjusts one prepared statement (consistency, page size).
macro_rules! statements {
    ($(
        $(#[$doc:meta])*
        $field:ident: $cql:ident, idempotent: $idem:expr, binds: $binds:ty
        $(, row: $row:ty)? $(, setup: $setup:expr)? ;
    )*) => {
        /// Every statement the store runs, prepared once per session.
        pub(crate) struct Statements {
            $( $(#[$doc])* pub(crate) $field: PreparedStatement, )*
        }

        impl Statements {
            /// Prepares the whole table; fails on the first statement the server refuses.
            pub(crate) async fn prepare(session: &Session) -> StoreResult<Self> {
                Ok(Self {
                    $( $field: {
                        #[allow(unused_mut)]
                        let mut p = prepare(session, $cql, $idem).await?;
                        $( ($setup)(&mut p); )?
                        p
                    }, )*
                })
            }
        }

        /// Every entry of the table with the CQL types of what is bound and read.
        #[cfg(test)]
        pub(crate) fn catalog() -> Vec<Entry> {
            use crate::scylla::cql::schema_check::names;
            vec![$(
                Entry {
                    name: stringify!($field),
                    cql: $cql,
                    binds: names::<$binds>(),
                    row: {
                        #[allow(unused_mut, unused_assignments)]
                        let mut row = None;
                        $( row = Some(names::<$row>()); )?
                        row
                    },
                },
            )*]
        }
    };
}

statements! {
    increment: INCREMENT_CQL, idempotent: false, binds: IncrementValues<'static>;
    read_starts: READ_STARTS_CQL, idempotent: true, binds: ReadStartsValues<'static>,
        row: CounterRow;
    read_span: READ_SPAN_CQL, idempotent: true, binds: ReadSpanValues<'static>,
        row: CounterRow;
    read_clients: READ_CLIENTS_CQL, idempotent: true, binds: ReadClientsValues<'static>,
        row: ClientCounterRow;
    read_clients_span: READ_CLIENTS_SPAN_CQL, idempotent: true,
        binds: ReadClientsSpanValues<'static>, row: ClientCounterRow;
    read_client: READ_CLIENT_CQL, idempotent: true, binds: ClientValues<'static>,
        row: CounterRow, setup: in_janitor_pages;
    scan_clients: SCAN_CLIENTS_CQL, idempotent: true, binds: ScanValues, row: ClientRow;
    delete_starts: DELETE_STARTS_CQL, idempotent: true, binds: ReadSpanValues<'static>;
    claim_layout: CLAIM_LAYOUT_CQL, idempotent: false, binds: ClaimLayoutValues<'static>;
    read_layout: READ_LAYOUT_CQL, idempotent: true, binds: ReadLayoutValues<'static>,
        row: LayoutRow, setup: at_local_serial;
    legacy_read_buckets: LEGACY_READ_BUCKETS_CQL, idempotent: true,
        binds: ReadBucketsValues<'static>, row: BucketRow;
    legacy_any: LEGACY_ANY_CQL, idempotent: true, binds: (), row: PartitionRow;
    scan_partitions: SCAN_PARTITIONS_CQL, idempotent: true, binds: ScanValues,
        row: PartitionRow;
    delete_partition: DELETE_PARTITION_CQL, idempotent: true, binds: PartitionValues<'static>;
    get_policy: GET_POLICY_CQL, idempotent: true, binds: PolicyKeyValues<'static>,
        row: PolicyRow;
    /// `get_policy` at LOCAL_SERIAL: the read inside a compare-and-set loop must see the
    /// latest committed (or in-flight) transaction, or the loop spins on stale versions.
    get_policy_serial: GET_POLICY_CQL, idempotent: true, binds: PolicyKeyValues<'static>,
        row: PolicyRow, setup: at_local_serial;
    insert_policy: INSERT_POLICY_CQL, idempotent: false, binds: InsertPolicyValues<'static>;
    update_policy: UPDATE_POLICY_CQL, idempotent: false, binds: UpdatePolicyValues<'static>;
    delete_policy: DELETE_POLICY_CQL, idempotent: false, binds: PolicyKeyValues<'static>;
    list_policies: LIST_POLICIES_CQL, idempotent: true, binds: ListPoliciesValues<'static>,
        row: PolicyRow;
    list_overrides: LIST_OVERRIDES_CQL, idempotent: true, binds: ListOverridesValues<'static>,
        row: PolicyRow;
    load_policies: LOAD_POLICIES_CQL, idempotent: true, binds: LoadPoliciesValues,
        row: PolicyRow, setup: in_policy_pages;
    bump_generation: BUMP_GENERATION_CQL, idempotent: false, binds: BumpGenerationValues<'static>;
    read_generation: READ_GENERATION_CQL, idempotent: true, binds: ReadGenerationValues<'static>,
        row: GenerationRow;
    claim_shard: CLAIM_SHARD_CQL, idempotent: false, binds: ClaimShardValues<'static>;
    renew_shard: RENEW_SHARD_CQL, idempotent: true, binds: RenewShardValues<'static>;
    release_shard: RELEASE_SHARD_CQL, idempotent: false, binds: ReleaseShardValues<'static>;
    list_members: LIST_MEMBERS_CQL, idempotent: true, binds: (), row: MemberRow;
    claim_idempotency: CLAIM_IDEMPOTENCY_CQL, idempotent: false,
        binds: ClaimIdempotencyValues<'static>;
    finish_idempotency: FINISH_IDEMPOTENCY_CQL, idempotent: false,
        binds: FinishIdempotencyValues<'static>;
    abandon_idempotency: ABANDON_IDEMPOTENCY_CQL, idempotent: false,
        binds: AbandonIdempotencyValues<'static>;
    /// At LOCAL_SERIAL: after a claim that did not apply, sees the claim that won.
    get_idempotency: GET_IDEMPOTENCY_CQL, idempotent: true,
        binds: GetIdempotencyValues<'static>, row: IdempotencyRow, setup: at_local_serial;
    put_hold: PUT_HOLD_CQL, idempotent: true, binds: PutHoldValues<'static>;
    put_hold_expiry: PUT_HOLD_EXPIRY_CQL, idempotent: true,
        binds: PutHoldExpiryValues<'static>;
    /// At SERIAL: after an end that did not apply, sees the end that won, in whichever region
    /// it was made.
    get_hold: GET_HOLD_CQL, idempotent: true, binds: GetHoldValues<'static>, row: HoldRow,
        setup: read_at_serial;
    /// Paxos at SERIAL: a reservation is ended once across every region (`holds`).
    end_hold: END_HOLD_CQL, idempotent: false, binds: EndHoldValues<'static>,
        setup: at_serial;
    delete_hold_expiry: DELETE_HOLD_EXPIRY_CQL, idempotent: true,
        binds: DeleteHoldExpiryValues<'static>;
    due_holds: DUE_HOLDS_CQL, idempotent: true, binds: DueHoldsValues, row: DueHoldRow;
    mark_used: MARK_USED_CQL, idempotent: true, binds: MarkUsedValues;
    list_used: LIST_USED_CQL, idempotent: true, binds: ListUsedValues, row: UsedRow;
    put_written: PUT_WRITTEN_CQL, idempotent: true, binds: PutWrittenValues<'static>;
    list_written: LIST_WRITTEN_CQL, idempotent: true, binds: ListUsedValues, row: WrittenRow;
    list_region_slots: LIST_REGION_SLOTS_CQL, idempotent: true, binds: (), row: RegionSlotRow;
    claim_region_slot: CLAIM_REGION_SLOT_CQL, idempotent: false,
        binds: ClaimRegionSlotValues<'static>, setup: at_serial;
    beat_region: BEAT_REGION_CQL, idempotent: true, binds: BeatRegionValues<'static>;
    list_region_beats: LIST_REGION_BEATS_CQL, idempotent: true, binds: (), row: RegionBeatRow;
    log_region_beat: LOG_REGION_BEAT_CQL, idempotent: true, binds: LogRegionBeatValues<'static>;
    read_region_beats: READ_REGION_BEATS_CQL, idempotent: true,
        binds: ReadRegionBeatsValues<'static>, row: RegionBeatAtRow;
    add_usage_point: ADD_USAGE_POINT_CQL, idempotent: false,
        binds: AddUsagePointValues<'static>;
    read_usage_points: READ_USAGE_POINTS_CQL, idempotent: true,
        binds: ReadUsagePointsValues<'static>, row: UsagePointRow;
    delete_usage_history: DELETE_USAGE_HISTORY_CQL, idempotent: true,
        binds: UsageHistoryKeyValues<'static>;
    add_client_day: ADD_CLIENT_DAY_CQL, idempotent: false, binds: AddClientDayValues<'static>;
    read_client_day: READ_CLIENT_DAY_CQL, idempotent: true, binds: ClientDayValues<'static>,
        row: ClientDayRow;
    list_client_day: LIST_CLIENT_DAY_CQL, idempotent: true, binds: ClientDayValues<'static>,
        row: NameRow;
    delete_client_day: DELETE_CLIENT_DAY_CQL, idempotent: true,
        binds: ClientDayValues<'static>;
    note_tenant_month: NOTE_TENANT_MONTH_CQL, idempotent: true,
        binds: MonthNameValues<'static>;
    list_history_months: LIST_HISTORY_MONTHS_CQL, idempotent: true, binds: (), row: MonthRow;
    list_month_tenants: LIST_MONTH_TENANTS_CQL, idempotent: true, binds: MonthValues,
        row: NameRow;
    find_tenant_month: FIND_TENANT_MONTH_CQL, idempotent: true,
        binds: MonthNameValues<'static>, row: NameRow;
    delete_tenant_month: DELETE_TENANT_MONTH_CQL, idempotent: true,
        binds: MonthNameValues<'static>;
    delete_history_month: DELETE_HISTORY_MONTH_CQL, idempotent: true, binds: MonthValues;
    insert_audit: INSERT_AUDIT_CQL, idempotent: true, binds: InsertAuditValues<'static>;
    read_audit: READ_AUDIT_CQL, idempotent: true, binds: ReadAuditValues<'static>,
        row: AuditRow, setup: in_audit_pages;
    read_audit_before: READ_AUDIT_BEFORE_CQL, idempotent: true,
        binds: ReadAuditBeforeValues<'static>, row: AuditRow, setup: in_audit_pages;
    delete_audit_partition: DELETE_AUDIT_PARTITION_CQL, idempotent: true,
        binds: AuditPartitionValues<'static>;
    note_audit_month: NOTE_AUDIT_MONTH_CQL, idempotent: true, binds: MonthNameValues<'static>;
    list_audit_months: LIST_AUDIT_MONTHS_CQL, idempotent: true, binds: (), row: MonthRow;
    list_month_scopes: LIST_MONTH_SCOPES_CQL, idempotent: true, binds: MonthValues,
        row: NameRow;
    find_audit_month: FIND_AUDIT_MONTH_CQL, idempotent: true, binds: MonthNameValues<'static>,
        row: NameRow;
    delete_audit_scope_month: DELETE_AUDIT_SCOPE_MONTH_CQL, idempotent: true,
        binds: MonthNameValues<'static>;
    delete_audit_month: DELETE_AUDIT_MONTH_CQL, idempotent: true, binds: MonthValues;
}

fn at_local_serial(p: &mut PreparedStatement) {
    p.set_consistency(Consistency::LocalSerial);
}

/// Paxos among every region's replicas, not only this region's.
fn at_serial(p: &mut PreparedStatement) {
    p.set_serial_consistency(Some(scylla::statement::SerialConsistency::Serial));
}

/// A linearizable read among every region's replicas: sees what Paxos at SERIAL decided.
fn read_at_serial(p: &mut PreparedStatement) {
    p.set_consistency(Consistency::Serial);
}

fn in_janitor_pages(p: &mut PreparedStatement) {
    p.set_page_size(JANITOR_PAGE_SIZE);
}

fn in_policy_pages(p: &mut PreparedStatement) {
    p.set_page_size(POLICY_PAGE_SIZE);
}

fn in_audit_pages(p: &mut PreparedStatement) {
    p.set_page_size(AUDIT_PAGE_SIZE);
}

async fn prepare(session: &Session, cql: &str, idempotent: bool) -> StoreResult<PreparedStatement> {
    let mut p = session
        .prepare(cql)
        .await
        .map_err(|e| map_prepare(cql, e))?;
    p.set_is_idempotent(idempotent);
    Ok(p)
}

#[cfg(test)]
mod tests;
