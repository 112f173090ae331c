//! The store contract: one suite of checks, run against every store, one test per case and
//! store, so each case passes or fails on its own.
//!
//! `every_store!` lists the cases once; `embedded.rs` and `scylla.rs` each turn every entry
//! into a test of their module, on a store of its own: `embedded::increments_add_up`,
//! `scylla::increments_add_up`, and so on. Each module adds the cases only its store has (the
//! embedded store's full shard space, the scylla store's migrations and its second instance).
//! To run one case, or one store's cases:
//!
//! ```text
//! cargo test --test store_contract embedded::increments_add_up
//! cargo test --test store_contract embedded::
//! ```
//!
//! - The embedded store: always, each case in its own temporary directory; beside them,
//!   reopen-the-directory checks prove counters, policies, usage history and the audit log
//!   survive a restart.
//! - The scylla store: needs a cluster, so its tests are `#[ignore]`d and a plain `cargo test`
//!   lists them as ignored. To run them against a cluster:
//!
//!   ```text
//!   docker compose up -d scylla        # or any Cassandra/ScyllaDB node
//!   QUOTAD_TEST_SCYLLA_NODES=127.0.0.1:9042 cargo test --test store_contract -- --ignored
//!   QUOTAD_TEST_SCYLLA_NODES=127.0.0.1:9042 cargo test --test store_contract \
//!       scylla::increments_add_up -- --ignored
//!   ```
//!
//!   `QUOTAD_TEST_SCYLLA_NODES` is a comma-separated list of `host:port`; run with `--ignored`
//!   but without it, those tests fail and say so. Everything else about reaching the cluster
//!   comes through quotad's own configuration: `QUOTAD__STORE__*` variables (credentials,
//!   `*_file` forms, `TLS_CA_FILE`, `TLS_CERT_FILE`, ...) apply to every session the suite
//!   opens, so a cluster that requires a password and TLS is tested as quotad reaches it.
//!   `strict_checks_hold_through_node_pauses` also pauses the node: beside a node on this
//!   machine, add `QUOTAD_TEST_SCYLLA_PID=<its process id>`; against a cluster elsewhere, add
//!   `--skip strict_checks_hold`. Each scylla test makes its own keyspace
//!   (`quotad_test_<tag>_<pid>_<n>_<time>`), migrates it with the real `quotad migrate` code,
//!   runs its check and drops the keyspace, also when the check fails.
//!
//! The checks are `async fn(&dyn Store)` (or `&Arc<dyn Store>` where they spawn tasks), one
//! file a part of the contract: `counters` (counters, policies, the janitor), `history` (usage
//! history, the audit log and their retention), `fleet` (leases, idempotency keys, overrides,
//! credits), `holds` (reservations), `regions`, `small` (small cached limits exact on fleets of two and three),
//! `stalls` (strict checks of two instances while the node is paused: it also needs
//! `QUOTAD_TEST_SCYLLA_PID`, the node's process id on this machine), `replicas` (increments
//! through a replica of three killed or paused mid-round: `QUOTAD_TEST_SCYLLA_VICTIM_PID` and
//! `QUOTAD_TEST_SCYLLA_RESTART`), `upgrade` and `tls`. This
//! file holds the helpers, the list of cases and the tests that are not one case on one store.

/// The cases every store must pass, listed once: `$case!(check, setup)` for each, where
/// `check` is the check's function here (and the test's name) and `setup` says what a store
/// of a fleet needs first: `Joined`, a shard lease (a scylla store writes nothing without one;
/// the embedded store needs none), or `Fresh`, nothing (the check claims leases itself).
macro_rules! every_store {
    ($case:ident) => {
        $case!(leases_hand_out_one_shard_per_instance, Fresh);
        $case!(reports_of_writes_show_with_their_lease, Fresh);
        $case!(increments_add_up, Joined);
        $case!(the_clock_is_the_stores_own, Joined);
        $case!(ranges_hold_only_their_buckets_in_order, Joined);
        $case!(many_keys_in_one_call, Joined);
        $case!(monthly_buckets_count, Joined);
        $case!(policies_round_trip_with_versions, Joined);
        $case!(policies_list_in_pages, Joined);
        $case!(history_adds_up_point_by_point, Joined);
        $case!(history_takes_back_cost_returned, Joined);
        $case!(audit_pages_newest_first, Joined);
        $case!(old_history_and_audit_are_deleted, Joined);
        $case!(totals_may_go_below_zero, Joined);
        $case!(overrides_list_by_tenant, Joined);
        $case!(idempotency_keys_claim_once, Joined);
        $case!(delete_expired_removes_only_expired_buckets, Joined);
        $case!(holds_round_trip_and_end_once, Joined);
        $case!(expired_holds_are_listed_until_they_end, Joined);
        $case!(holds_expire_in_batches_each_once, Joined);
    };
}

mod audit;
mod counters;
mod embedded;
mod fleet;
mod history;
mod holds;
mod regions;
mod replicas;
mod scylla;
mod small;
mod stalls;
mod tls;
mod upgrade;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ::scylla::client::session_builder::SessionBuilder;
use chrono::{DateTime, TimeZone, Utc};
use futures::FutureExt;
use quotad::domain::{ClientId, Grain, TenantId};
use quotad::scylla::migrate;
use quotad::scylla::store::{ScyllaOptions, ScyllaStore};
use quotad::store::audit::{AuditCursor, AuditEntry, AuditQuery, AuditStore};
use quotad::store::history::{
    ClientTotal, Counts, HistoryStore, Step, UsageDelta, UsagePoint, DAY_MS, HOUR_MS,
};
use quotad::store::idempotency::{Begun, Remembered};
use quotad::store::lease::{Claim, MAX_SHARDS};
use quotad::store::{
    BucketTotal, CounterKey, CounterRange, CounterStore, Delta, PolicyKey, PolicyStore, Store,
    StoreError,
};

use audit::*;
use counters::*;
use fleet::*;
use history::*;
use holds::*;
use regions::*;

const ENV: &str = "QUOTAD_TEST_SCYLLA_NODES";

/// The test keyspaces' replication: `QUOTAD_TEST_SCYLLA_REPLICATION` (a CQL map, e.g.
/// `{'class': 'NetworkTopologyStrategy', 'dc1': 1, 'dc2': 1}` on a cluster of two data
/// centres), else the store's default.
fn replication() -> String {
    std::env::var("QUOTAD_TEST_SCYLLA_REPLICATION")
        .unwrap_or_else(|_| ScyllaOptions::default().replication)
}

/// The cluster's contact points. Only the ignored tests call this, so a run that asked for
/// them (`--ignored`) without naming a cluster fails plainly instead of passing untested.
fn nodes() -> Vec<String> {
    let v = std::env::var(ENV).unwrap_or_default();
    let nodes: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    assert!(
        !nodes.is_empty(),
        "{ENV} is not set: name a Cassandra/ScyllaDB cluster (host:port,...) to run this test"
    );
    nodes
}

/// The options every scylla test starts from: quotad's configuration as a deployment gives it
/// (`QUOTAD__STORE__*` variables, files included), through quotad's own code.
fn base_options() -> ScyllaOptions {
    let settings = quotad::config::Settings::load(None).expect("the QUOTAD__* configuration");
    quotad::startup::scylla_options(&settings).expect("the store options")
}

/// A session on `nodes` with the credentials and TLS of [`base_options`].
fn session_on(nodes: &[String]) -> SessionBuilder {
    ScyllaOptions {
        nodes: nodes.to_vec(),
        ..base_options()
    }
    .session_builder()
}

/// A keyspace name no other test uses: tests of one run differ by their number, runs by their
/// process id and start time.
fn unique_keyspace(tag: &str) -> String {
    static MADE: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "quotad_test_{tag}_{}_{}_{}",
        std::process::id(),
        MADE.fetch_add(1, Ordering::Relaxed),
        nanos % 1_000_000_000
    )
}

fn key(tenant: &str, subject: &str, limit: &str, grain: Grain) -> CounterKey {
    CounterKey {
        tenant: tenant.into(),
        subject: subject.into(),
        limit: limit.into(),
        grain,
    }
}

fn delta(k: &CounterKey, start: i64, delta: i64) -> Delta {
    Delta {
        key: k.clone(),
        start,
        delta,
    }
}

fn range(k: &CounterKey, from: i64, to: i64) -> CounterRange {
    CounterRange {
        key: k.clone(),
        from,
        to,
    }
}

fn totals(buckets: &[BucketTotal]) -> Vec<(i64, i64)> {
    buckets.iter().map(|b| (b.start, b.total)).collect()
}

fn tenant_key(t: &str) -> PolicyKey {
    PolicyKey {
        tenant: TenantId::parse(t).unwrap(),
        client: None,
    }
}

fn client_key(t: &str, c: &str) -> PolicyKey {
    PolicyKey {
        tenant: TenantId::parse(t).unwrap(),
        client: Some(ClientId::parse(c).unwrap()),
    }
}

/// A moment well inside 2023, so bucket arithmetic is easy to follow.
const T0: i64 = 1_700_000_000_000;

/// The store as a case takes it: `&dyn Store`, or `&Arc<dyn Store>` where it spawns tasks.
/// (A `&Arc<dyn Store>` given for a `&dyn Store` does not compile: the compiler tries to make
/// the `Arc` itself the store rather than look through it.)
trait CaseStore<'a> {
    fn of(store: &'a Arc<dyn Store>) -> Self;
}

impl<'a> CaseStore<'a> for &'a dyn Store {
    fn of(store: &'a Arc<dyn Store>) -> Self {
        &**store
    }
}

impl<'a> CaseStore<'a> for &'a Arc<dyn Store> {
    fn of(store: &'a Arc<dyn Store>) -> Self {
        store
    }
}

// ---- scylla-specific -------------------------------------------------------------------------

/// Without a lease nothing is written: the hits stay with the caller.
async fn an_increment_without_a_lease_is_refused(store: &dyn Store) {
    let k = key("no-lease", "k1", "l", Grain::Fixed(1_000));
    match store.increment(&[delta(&k, T0, 1)]).await {
        Err(StoreError::Unavailable(m)) => assert!(m.contains("lease"), "{m}"),
        other => panic!("an increment without a lease: {other:?}"),
    }
}

async fn two_instances_share_counts(a: &dyn Store, b: &dyn Store) {
    let k = key("shared", "k1", "l", Grain::Fixed(1_000));
    a.increment(&[delta(&k, T0, 3)]).await.unwrap();
    b.increment(&[delta(&k, T0, 4)]).await.unwrap();
    let ra = a.read(&[range(&k, T0, T0)]).await.unwrap();
    let rb = b.read(&[range(&k, T0, T0)]).await.unwrap();
    assert_eq!(
        ra[0],
        vec![BucketTotal {
            start: T0,
            total: 7,
            mine: 3,
            region: 7
        }]
    );
    assert_eq!(
        rb[0],
        vec![BucketTotal {
            start: T0,
            total: 7,
            mine: 4,
            region: 7
        }]
    );
}

/// A change made through one instance is seen by the other.
async fn a_change_through_one_instance_is_seen_by_the_other(a: &dyn Store, b: &dyn Store) {
    let g = b.policies_generation().await.unwrap();
    a.put_policy(&tenant_key("seen-by-b"), "{}", Utc::now())
        .await
        .unwrap();
    assert_ne!(b.policies_generation().await.unwrap(), g);
    assert!(b
        .get_policy(&tenant_key("seen-by-b"))
        .await
        .unwrap()
        .is_some());
}

/// The cluster's contact points, a keyspace name no other run uses, and the options of a
/// store on it (not created yet).
fn fresh_keyspace(tag: &str) -> (Vec<String>, String, ScyllaOptions) {
    let nodes = nodes();
    let ks = unique_keyspace(tag);
    let opts = ScyllaOptions {
        nodes: nodes.clone(),
        keyspace: ks.clone(),
        replication: replication(),
        ..base_options()
    };
    (nodes, ks, opts)
}

/// Runs `check` on a keyspace of the cluster no other run uses, not created yet, and drops the
/// keyspace after it, also when the check fails.
async fn in_fresh_keyspace<F, Fut>(tag: &str, check: F)
where
    F: FnOnce(Vec<String>, ScyllaOptions) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (nodes, ks, opts) = fresh_keyspace(tag);
    let result = std::panic::AssertUnwindSafe(check(nodes.clone(), opts))
        .catch_unwind()
        .await;
    drop_keyspace(&nodes, &ks).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// Runs `check` on a fresh keyspace of the cluster, migrated, and drops the keyspace after it,
/// also when the check fails.
async fn in_migrated_keyspace<F, Fut>(tag: &str, check: F)
where
    F: FnOnce(Vec<String>, ScyllaOptions) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    in_fresh_keyspace(tag, |nodes, opts| async move {
        migrate::run(&opts, false, &mut Vec::new()).await.unwrap();
        check(nodes, opts).await;
    })
    .await;
}

async fn drop_keyspace(nodes: &[String], ks: &str) {
    // `ks` comes from unique_keyspace(): a plain identifier.
    match session_on(nodes).build().await {
        Ok(s) => {
            if let Err(e) = s
                .query_unpaged(format!("DROP KEYSPACE IF EXISTS {ks}"), ())
                .await
            {
                eprintln!("could not drop keyspace {ks}: {e}");
            }
        }
        Err(e) => eprintln!("could not drop keyspace {ks}: {e}"),
    }
}

async fn keyspace_exists(nodes: &[String], ks: &str) -> bool {
    let s = session_on(nodes).build().await.unwrap();
    let rows = s
        .query_unpaged(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
            (ks,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    rows.rows_num() > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster: set QUOTAD_TEST_SCYLLA_NODES=host:port and run with --ignored"]
async fn an_upgrade_keeps_the_counts_of_the_old_layout() {
    in_migrated_keyspace("u", |nodes, opts| async move {
        upgrade::counts_of_the_old_layout_survive_the_upgrade(&nodes, &opts).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB node on this machine: set QUOTAD_TEST_SCYLLA_NODES=host:port and QUOTAD_TEST_SCYLLA_PID=<its process id>, run with --ignored"]
async fn strict_checks_hold_through_node_pauses() {
    in_migrated_keyspace("s", |_, opts| async move {
        stalls::strict_checks_hold_through_node_pauses(&opts).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster of three replicas on this machine: set QUOTAD_TEST_SCYLLA_NODES, QUOTAD_TEST_SCYLLA_REPLICATION (three replicas), QUOTAD_TEST_SCYLLA_VICTIM_PID (a node's process id) and QUOTAD_TEST_SCYLLA_RESTART (a command that starts it again), run with --ignored"]
async fn increments_outlive_a_replica_killed_mid_round() {
    in_migrated_keyspace("k", |_, opts| async move {
        replicas::increments_outlive_a_replica_lost_mid_round(&opts, replicas::Loss::Kill).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster of three replicas on this machine: set QUOTAD_TEST_SCYLLA_NODES, QUOTAD_TEST_SCYLLA_REPLICATION (three replicas) and QUOTAD_TEST_SCYLLA_VICTIM_PID (a node's process id), run with --ignored"]
async fn increments_outlive_a_replica_paused_mid_round() {
    in_migrated_keyspace("p", |_, opts| async move {
        replicas::increments_outlive_a_replica_lost_mid_round(&opts, replicas::Loss::Pause).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster: set QUOTAD_TEST_SCYLLA_NODES=host:port and run with --ignored"]
async fn small_limits_are_exact_on_fleets_of_two_and_three() {
    in_migrated_keyspace("l", |_, opts| async move {
        small::small_limits_are_exact_on_a_fleet(&opts).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster: set QUOTAD_TEST_SCYLLA_NODES=host:port and run with --ignored"]
async fn migrate_dry_run_writes_nothing_and_an_unmigrated_keyspace_is_refused() {
    let nodes = nodes();
    let ks = unique_keyspace("d");
    let opts = ScyllaOptions {
        nodes: nodes.clone(),
        keyspace: ks.clone(),
        replication: replication(),
        ..base_options()
    };
    let mut out = Vec::new();
    let report = migrate::run(&opts, true, &mut out).await.unwrap();
    let log = String::from_utf8_lossy(&out).to_string();
    assert!(report.dry_run && report.keyspace_created, "{log}");
    assert!(log.contains("would create keyspace"), "{log}");
    assert!(log.contains("0001_counters.cql"), "{log}");
    assert!(
        !keyspace_exists(&nodes, &ks).await,
        "a dry run created the keyspace"
    );
    match ScyllaStore::connect(opts).await {
        Err(StoreError::Internal(m)) => assert!(m.contains("quotad migrate"), "{m}"),
        other => panic!("connecting to a missing keyspace: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster that requires TLS and a password, reached through QUOTAD__STORE__TLS_CA_FILE and QUOTAD__STORE__PASSWORD_FILE: run with --ignored"]
async fn a_cluster_with_tls_and_a_password_names_each_refusal() {
    tls::each_refusal_says_why().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster: set QUOTAD_TEST_SCYLLA_NODES=host:port and run with --ignored"]
async fn scylla_regions_split_the_shard_space() {
    in_migrated_keyspace("r", |_, opts| async move {
        let eu = ScyllaStore::connect(opts.clone()).await.unwrap();
        let us = ScyllaStore::connect(opts.clone()).await.unwrap();
        let us2 = ScyllaStore::connect(opts).await.unwrap();
        regions_split_the_shard_space_and_hear_each_other(&eu, &us, &us2).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster of two data centres: set QUOTAD_TEST_SCYLLA_NODES to a node of each, QUOTAD_TEST_SCYLLA_DCS to their data centres (dc1,dc2) and QUOTAD_TEST_SCYLLA_REPLICATION to a map over both; run with --ignored"]
async fn scylla_a_reservation_ends_once_across_regions() {
    let dcs: Vec<String> = std::env::var("QUOTAD_TEST_SCYLLA_DCS")
        .unwrap_or_default()
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(
        dcs.len(),
        2,
        "QUOTAD_TEST_SCYLLA_DCS names two data centres"
    );
    in_migrated_keyspace("x", |nodes, opts| async move {
        assert_eq!(nodes.len(), 2, "{ENV} names a node of each data centre");
        let mut stores: Vec<Arc<dyn Store>> = Vec::new();
        for (node, dc) in nodes.iter().zip(dcs) {
            let o = ScyllaOptions {
                nodes: vec![node.clone()],
                local_dc: Some(dc),
                ..opts.clone()
            };
            stores.push(Arc::new(ScyllaStore::connect(o).await.unwrap()));
        }
        holds::holds_end_once_across_regions(&stores).await;
    })
    .await;
}

// ---- embedded --------------------------------------------------------------------------------

#[tokio::test]
async fn embedded_counters_and_policies_survive_reopening_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let k = key("reopen", "k1", "l", Grain::Fixed(1_000));
    {
        let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
        store.increment(&[delta(&k, T0, 5)]).await.unwrap();
        store
            .put_policy(&tenant_key("reopen"), "{\"limits\": []}", Utc::now())
            .await
            .unwrap();
    }
    let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
    let got = store.read(&[range(&k, T0, T0)]).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(T0, 5)]);
    let p = store
        .get_policy(&tenant_key("reopen"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.version, 1);
    assert!(store.policies_generation().await.unwrap() > 0);
}

#[tokio::test]
async fn embedded_history_and_audit_survive_reopening_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let hour = ms("2023-11-14T10:00:00Z");
    let entry = audit_entry(hour + 5, "e1", "reopen", 2);
    {
        let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
        store
            .add_usage(&[usage("reopen", "k1", hour, counts(3, 6, 1, &[("l", 1)]))])
            .await
            .unwrap();
        store.append_audit(&entry).await.unwrap();
    }
    let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(
        store
            .usage_points("reopen", None, Step::Hour, hour, hour + HOUR_MS)
            .await
            .unwrap(),
        vec![UsagePoint {
            start: hour,
            counts: counts(3, 6, 1, &[("l", 1)])
        }]
    );
    assert_eq!(
        store
            .clients_seen("reopen", Step::Day.floor(hour), hour + DAY_MS)
            .await
            .unwrap()
            .len(),
        1
    );
    let page = store
        .audit_page(&AuditQuery {
            tenant: Some("reopen".into()),
            from: 0,
            to: i64::MAX,
            before: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(page, vec![entry]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_strict_increment_and_read_is_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
    let k = key("strict", "k1", "l", Grain::Fixed(1_000));
    let got = store
        .increment_and_read(&[delta(&k, T0, 2)], &[range(&k, T0, T0)])
        .await
        .unwrap();
    assert_eq!(totals(&got[0]), vec![(T0, 2)]);
    let store: Arc<dyn Store> = Arc::new(store);
    racing_writers_count_exactly(&store, true).await;
}
