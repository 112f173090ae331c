//! The audit log on the scylla store. (Being written: see the branch `scylla-history`.)

use async_trait::async_trait;

use super::ScyllaStore;
use crate::store::audit::{AuditEntry, AuditQuery, AuditStore};
use crate::store::{StoreError, StoreResult};

fn not_yet() -> StoreError {
    StoreError::Internal("the audit log is not available on the scylla store yet".into())
}

#[async_trait]
impl AuditStore for ScyllaStore {
    async fn append_audit(&self, _entry: &AuditEntry) -> StoreResult<()> {
        Err(not_yet())
    }
    async fn audit_page(&self, _q: &AuditQuery) -> StoreResult<Vec<AuditEntry>> {
        Err(not_yet())
    }
    async fn delete_audit_before(&self, _before: i64, _budget: usize) -> StoreResult<u64> {
        Err(not_yet())
    }
}
