//! The contract on the embedded store: every case of `every_store!` and the embedded-only
//! ones, each a test of its own on a store in a temporary directory of its own.

use std::sync::Arc;

use quotad::store::embedded::EmbeddedStore;
use quotad::store::Store;
use tempfile::TempDir;

/// A store in `dir`, as quotad opens it. The directory must outlive the store.
fn open(dir: &TempDir) -> Arc<dyn Store> {
    let store: Arc<dyn Store> = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    assert_eq!(store.kind(), "embedded");
    store
}

/// A test named after the case. The embedded store needs no lease, so `Joined` and `Fresh`
/// cases start alike.
macro_rules! embedded_case {
    ($case:ident, $setup:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let dir = tempfile::tempdir().unwrap();
            let store = open(&dir);
            store.ping().await.unwrap();
            super::$case(super::CaseStore::of(&store)).await;
        }
    };
}

every_store!(embedded_case);

// On a cluster it would leave 256 used shards for every later read of the keyspace to sum.
embedded_case!(a_full_shard_space_refuses_one_more, Fresh);
embedded_case!(a_store_without_regions_is_one, Fresh);
