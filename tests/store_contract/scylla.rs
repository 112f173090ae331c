//! The contract on the scylla store: every case of `every_store!` and the scylla-only ones,
//! each a test of its own on a keyspace of its own, migrated and dropped after the test, also
//! when it fails. All need a cluster, so all are `#[ignore]`d (see main.rs).

use std::future::Future;
use std::sync::Arc;

use quotad::scylla::migrate;
use quotad::scylla::store::{ScyllaOptions, ScyllaStore};
use quotad::store::Store;

use super::{in_fresh_keyspace, in_migrated_keyspace, join};

/// A store on the keyspace of `opts`, as quotad connects to it.
async fn connect(opts: ScyllaOptions) -> Arc<dyn Store> {
    let store: Arc<dyn Store> = Arc::new(ScyllaStore::connect(opts).await.unwrap());
    assert_eq!(store.kind(), "scylla");
    store.ping().await.unwrap();
    store
}

/// Runs `check` on a store of a fresh migrated keyspace; with `joined`, once the store holds a
/// shard lease, as an instance of a fleet does.
async fn on_a_store<F, Fut>(joined: bool, check: F)
where
    F: FnOnce(Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()>,
{
    in_migrated_keyspace("c", |_, opts| async move {
        let store = connect(opts).await;
        if joined {
            join(&*store, "instance-a").await;
        }
        check(store).await;
    })
    .await;
}

/// Runs `check` on two instances of one fresh migrated keyspace, each holding its own shard
/// lease and each knowing of the other's shard.
async fn on_two_stores<F, Fut>(check: F)
where
    F: FnOnce(Arc<dyn Store>, Arc<dyn Store>) -> Fut,
    Fut: Future<Output = ()>,
{
    in_migrated_keyspace("c", |_, opts| async move {
        let a = connect(opts.clone()).await;
        let b = connect(opts).await;
        let sa = join(&*a, "instance-a").await;
        let sb = join(&*b, "instance-b").await;
        assert_ne!(sa, sb);
        // a joined before b: it learns of b's shard at its next heartbeat, as here.
        a.adopt(Some(sa), &a.roster().await.unwrap().used);
        check(a, b).await;
    })
    .await;
}

/// A test named after the case, on the setup it asks for; a `Joined` case may take more
/// arguments after the store.
macro_rules! scylla_case {
    ($case:ident, Fresh) => {
        scylla_case!(@test $case, on_a_store(false, |s| async move {
            super::$case(super::CaseStore::of(&s)).await
        }));
    };
    ($case:ident, Joined $(, $arg:expr)*) => {
        scylla_case!(@test $case, on_a_store(true, |s| async move {
            super::$case(super::CaseStore::of(&s) $(, $arg)*).await
        }));
    };
    ($case:ident, TwoJoined) => {
        scylla_case!(@test $case, on_two_stores(|a, b| async move {
            super::$case(&*a, &*b).await
        }));
    };
    (@test $case:ident, $run:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        #[ignore = "needs a Cassandra/ScyllaDB cluster: set QUOTAD_TEST_SCYLLA_NODES=host:port and run with --ignored"]
        async fn $case() {
            $run.await;
        }
    };
}

every_store!(scylla_case);

scylla_case!(an_increment_without_a_lease_is_refused, Fresh);
// Not one step on a cluster: two calls may see one total. The embedded store's one-step race is
// `embedded_strict_increment_and_read_is_one_step`.
scylla_case!(racing_writers_count_exactly, Joined, false);
scylla_case!(two_instances_share_counts, TwoJoined);
scylla_case!(
    a_change_through_one_instance_is_seen_by_the_other,
    TwoJoined
);

/// `quotad migrate` on a new keyspace creates it and applies every file, in order; a second
/// run applies nothing, and neither does a dry run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster: set QUOTAD_TEST_SCYLLA_NODES=host:port and run with --ignored"]
async fn migrate_applies_every_file_once() {
    in_fresh_keyspace("m", |_, opts| async move {
        let mut out = Vec::new();
        let report = migrate::run(&opts, false, &mut out).await.unwrap();
        let log = String::from_utf8_lossy(&out).to_string();
        assert!(report.keyspace_created, "{log}");
        let all: Vec<u32> = migrate::migrations()
            .unwrap()
            .iter()
            .map(|m| m.version)
            .collect();
        assert_eq!(report.applied, all, "{log}");
        let again = migrate::run(&opts, false, &mut Vec::new()).await.unwrap();
        assert!(again.applied.is_empty() && !again.keyspace_created);
        assert_eq!(again.already_applied, all);
        let dry = migrate::run(&opts, true, &mut Vec::new()).await.unwrap();
        assert!(dry.applied.is_empty());
    })
    .await;
}
