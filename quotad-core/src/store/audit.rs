//! The audit log: every change an admin made, appended and never edited.
//!
//! Each entry is kept twice: under its tenant (for a tenant admin's view) and in the log of all
//! tenants (for an admin's), so both are read newest first without a scan. Entries are ordered
//! by (`at`, `id`); a page ends with the cursor of its last entry, and the next page starts
//! strictly before it.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::StoreResult;

/// One change, as the log keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When the change was made (millisecond precision).
    pub at: DateTime<Utc>,
    /// Unique among entries of the same millisecond; orders them.
    pub id: String,
    /// The configured name of the token that made the change (never the token).
    pub actor: String,
    /// Its role: `admin` or `tenant_admin`.
    pub role: String,
    /// What was done, e.g. `quota.put`, `override.delete`.
    pub action: String,
    pub tenant: String,
    /// The client, for a client override.
    pub client: Option<String>,
    pub version_before: Option<u64>,
    pub version_after: Option<u64>,
    /// The policy document before and after (JSON), None where there was none.
    pub body_before: Option<String>,
    pub body_after: Option<String>,
    /// The request's `X-Request-Id`.
    pub request_id: String,
}

impl AuditEntry {
    pub fn cursor(&self) -> AuditCursor {
        AuditCursor {
            at_ms: self.at.timestamp_millis(),
            id: self.id.clone(),
        }
    }
}

/// A position in the log: entries strictly before it come next.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditCursor {
    pub at_ms: i64,
    pub id: String,
}

/// A page to read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditQuery {
    /// One tenant's entries, or every tenant's.
    pub tenant: Option<String>,
    /// Entries with `from <= at < to` (ms).
    pub from: i64,
    pub to: i64,
    /// Only entries strictly before this one.
    pub before: Option<AuditCursor>,
    pub limit: usize,
}

/// The audit log in the store.
#[async_trait]
pub trait AuditStore: Send + Sync + 'static {
    /// Appends an entry (under its tenant and in the log of all).
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()>;

    /// Entries newest first, as the query says.
    async fn audit_page(&self, q: &AuditQuery) -> StoreResult<Vec<AuditEntry>>;

    /// Deletes entries older than `before` (ms): whole months on the scylla store. At most
    /// about `budget` deletions; returns how many were made.
    async fn delete_audit_before(&self, before: i64, budget: usize) -> StoreResult<u64>;
}
