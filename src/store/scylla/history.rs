//! Usage history on the scylla store. (Being written: see the branch `scylla-history`.)

use async_trait::async_trait;

use super::ScyllaStore;
use crate::store::history::{ClientTotal, HistoryStore, Step, UsageDelta, UsagePoint};
use crate::store::{StoreError, StoreResult};

fn not_yet() -> StoreError {
    StoreError::Internal("usage history is not available on the scylla store yet".into())
}

#[async_trait]
impl HistoryStore for ScyllaStore {
    async fn add_usage(&self, _deltas: &[UsageDelta]) -> StoreResult<()> {
        Err(not_yet())
    }
    async fn usage_points(
        &self,
        _tenant: &str,
        _client: Option<&str>,
        _step: Step,
        _from: i64,
        _to: i64,
    ) -> StoreResult<Vec<UsagePoint>> {
        Err(not_yet())
    }
    async fn clients_seen(
        &self,
        _tenant: &str,
        _from: i64,
        _to: i64,
    ) -> StoreResult<Vec<ClientTotal>> {
        Err(not_yet())
    }
    async fn delete_history_before(&self, _before: i64, _budget: usize) -> StoreResult<u64> {
        Err(not_yet())
    }
}
