//! The audit log on the scylla store (`migrations/0004_history_audit.cql`): `audit_log` holds
//! each entry under (its tenant, month) and under (`*`, month), rows newest first by (at, id);
//! `audit_months` lists the scopes each month holds.
//!
//! An append writes the month's two index rows (one partition, one batch), then the two
//! copies, as idempotent inserts in parallel. Not one logged batch: an entry may carry two
//! policy bodies of up to 64 KiB, written twice, and Cassandra refuses a batch over several
//! partitions above `batch_size_fail_threshold` (50 KiB by default). The price: an append
//! that fails half-way may leave the entry in one of the two logs until it is appended again,
//! which is safe (same key, same values).
//!
//! Retention deletes whole (scope, month) partitions of months that ended at or before
//! `before`, found through `audit_months`, never by a scan.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use scylla::statement::batch::{Batch, BatchType};
use scylla::value::{CqlTimestamp, MaybeUnset};

use super::connection::Cql;
use super::errors::{internal, map_exec, Op};
use super::partition::{month_of, FIRST_MS};
use super::statements::{
    AuditPartitionValues, AuditRow, InsertAuditValues, MonthNameValues, MonthValues, NameRow,
    ReadAuditBeforeValues, ReadAuditValues,
};
use crate::store::audit::{AuditEntry, AuditQuery};
use crate::store::StoreResult;

/// The scope of the log of every tenant (tenant ids never hold `*`).
const ALL: &str = "*";

fn entry_from_row(
    (
        at,
        id,
        actor,
        role,
        action,
        tenant,
        client,
        before,
        after,
        body_before,
        body_after,
        request_id,
    ): AuditRow,
) -> StoreResult<AuditEntry> {
    let version = |v: Option<i64>| {
        v.map(|v| u64::try_from(v).map_err(|_| internal(format!("negative version {v}"))))
            .transpose()
    };
    Ok(AuditEntry {
        at: DateTime::<Utc>::from_timestamp_millis(at.0)
            .ok_or_else(|| internal(format!("audit time {} out of range", at.0)))?,
        id,
        actor,
        role,
        action,
        tenant,
        client,
        version_before: version(before)?,
        version_after: version(after)?,
        body_before,
        body_after,
        request_id,
    })
}

fn version_value(v: Option<u64>) -> StoreResult<MaybeUnset<i64>> {
    v.map(|v| i64::try_from(v).map_err(|_| internal(format!("version {v} too large"))))
        .transpose()
        .map(MaybeUnset::from_option)
}

/// The audit log and its month index.
pub(super) struct Audit {
    cql: Arc<Cql>,
}

impl Audit {
    pub(super) fn new(cql: Arc<Cql>) -> Self {
        Audit { cql }
    }

    pub(super) async fn append(&self, entry: &AuditEntry) -> StoreResult<()> {
        let at = entry.at.timestamp_millis();
        let month = month_of(at);
        // The index first, so every partition written is listed. Both rows are in the
        // partition `month`: one batch, applied at once.
        let mut batch = Batch::new(BatchType::Unlogged);
        batch.append_statement(self.cql.st.note_audit_month.clone());
        batch.append_statement(self.cql.st.note_audit_month.clone());
        batch.set_is_idempotent(true);
        let index: (MonthNameValues<'_>, MonthNameValues<'_>) =
            ((month, entry.tenant.as_str()), (month, ALL));
        self.cql
            .session
            .batch(&batch, index)
            .await
            .map_err(|e| map_exec(e, Op::Write))?;
        let copy = |scope| -> StoreResult<InsertAuditValues<'_>> {
            Ok((
                scope,
                month,
                CqlTimestamp(at),
                entry.id.as_str(),
                entry.actor.as_str(),
                entry.role.as_str(),
                entry.action.as_str(),
                entry.tenant.as_str(),
                MaybeUnset::from_option(entry.client.as_deref()),
                version_value(entry.version_before)?,
                version_value(entry.version_after)?,
                MaybeUnset::from_option(entry.body_before.as_deref()),
                MaybeUnset::from_option(entry.body_after.as_deref()),
                entry.request_id.as_str(),
            ))
        };
        let (mine, all) = (copy(entry.tenant.as_str())?, copy(ALL)?);
        self.cql
            .run_all(&self.cql.st.insert_audit, vec![mine, all])
            .await
    }

    /// Month partitions newest first, from the month of the newest entry the page may hold down
    /// to the month of `from`; each read is bounded above (`at < to`, or strictly before the
    /// cursor) and by the entries still wanted, and stops at the first entry older than `from`.
    pub(super) async fn page(&self, q: &AuditQuery) -> StoreResult<Vec<AuditEntry>> {
        if q.limit == 0 {
            return Ok(Vec::new());
        }
        let scope = q.tenant.as_deref().unwrap_or(ALL);
        // A cursor at or after `to` bounds nothing `to` does not.
        let cursor = q.before.as_ref().filter(|c| c.at_ms < q.to);
        let newest = cursor.map_or(q.to.saturating_sub(1), |c| c.at_ms);
        let from = q.from.max(FIRST_MS);
        if from > newest {
            return Ok(Vec::new());
        }
        let months = self
            .cql
            .months_to_read(
                month_of(from),
                month_of(newest),
                &self.cql.st.list_audit_months,
                &self.cql.st.find_audit_month,
                scope,
            )
            .await?;
        let mut out = Vec::with_capacity(q.limit.min(1_000));
        for month in months.into_iter().rev() {
            let want = i32::try_from(q.limit - out.len()).unwrap_or(i32::MAX);
            let rows: Vec<AuditRow> = match cursor {
                Some(c) => {
                    let v: ReadAuditBeforeValues<'_> =
                        (scope, month, CqlTimestamp(c.at_ms), c.id.as_str(), want);
                    self.cql.read_all(&self.cql.st.read_audit_before, v).await?
                }
                None => {
                    let v: ReadAuditValues<'_> = (scope, month, CqlTimestamp(q.to), want);
                    self.cql.read_all(&self.cql.st.read_audit, v).await?
                }
            };
            for row in rows {
                if row.0 .0 < q.from {
                    // Newest first: everything after this is older still.
                    return Ok(out);
                }
                out.push(entry_from_row(row)?);
            }
            if out.len() >= q.limit {
                break;
            }
        }
        out.truncate(q.limit);
        Ok(out)
    }

    /// Months that ended at or before `before`, oldest first: each (scope, month) partition,
    /// then its index row, then the month's index partition. Counts partitions of
    /// `audit_log` deleted (two per month a tenant had changes in: its own and a share of `*`).
    pub(super) async fn delete_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        let mut removed = 0usize;
        if budget == 0 {
            return Ok(0);
        }
        let months = self
            .cql
            .months_ended_by(&self.cql.st.list_audit_months, before)
            .await?;
        for month in months {
            let values: MonthValues = (month,);
            let scopes: Vec<NameRow> = self
                .cql
                .read_all(&self.cql.st.list_month_scopes, values)
                .await?;
            let doomed = &scopes[..scopes.len().min(budget - removed)];
            let parts: Vec<AuditPartitionValues<'_>> =
                doomed.iter().map(|(s,)| (s.as_str(), month)).collect();
            self.cql
                .run_all(&self.cql.st.delete_audit_partition, parts)
                .await?;
            let rows: Vec<MonthNameValues<'_>> =
                doomed.iter().map(|(s,)| (month, s.as_str())).collect();
            self.cql
                .run_all(&self.cql.st.delete_audit_scope_month, rows)
                .await?;
            removed += doomed.len();
            if doomed.len() < scopes.len() {
                return Ok(removed as u64);
            }
            self.cql
                .run_all(&self.cql.st.delete_audit_month, vec![values])
                .await?;
        }
        Ok(removed as u64)
    }
}
