//! The janitor: deletes counter buckets no window can need any more.
//!
//! Counter tables take no TTL, so expiry sweeps partition keys in token order, a cursor kept in
//! memory per table:
//! - the client partitions (`client_counters`): each one's rows are read, and every run of
//!   buckets past its grain's retention ([`expired_runs`]) is deleted with one range delete;
//!   at most [`MAX_CLIENTS_PER_CALL`] partitions a call, so a call stays short;
//! - while it holds anything, the table of earlier releases (`counters`): whole partitions, once
//!   `epoch end + grain.retention_ms() <= now` ([`partition_expired`]); a lap that finds it
//!   empty ends the reads of it ([`super::legacy`]).
//!
//! The planners ([`plan_sweep`], [`expired_runs`]) are pure; [`Janitor`], the part of the store
//! that owns the two cursors, only pages through the ring and deletes.

use std::sync::{Arc, Mutex};

use futures::stream::{self, StreamExt, TryStreamExt};

use super::connection::Cql;
use super::errors::{internal, map_exec, Op};
use super::legacy::Legacy;
use super::partition::{expired_runs, partition_expired};
use super::statements::{
    ClientRow, ClientValues, CounterRow, PartitionRow, PartitionValues, ReadSpanValues, ScanValues,
};
use crate::domain::Grain;
use crate::store::StoreResult;

/// Most partition keys of the old table one `delete_expired` call examines, so a call stays
/// short even on a huge table with little to delete.
const MAX_SWEEP_PER_CALL: usize = 20_000;
/// Most client partitions one call reads: each is a query, and the sync task waits while the
/// janitor runs.
const MAX_CLIENTS_PER_CALL: usize = 1_000;

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

/// Where the sweeps of the two counter tables continue.
pub(super) struct Janitor {
    cql: Arc<Cql>,
    /// Whether the old table is still swept; told when a lap finds it empty.
    legacy: Arc<Legacy>,
    /// Token after which the next sweep of the old counter table continues. A std mutex: it is
    /// only read and written between awaits, never held across one.
    legacy_cursor: Mutex<i64>,
    /// Likewise, for the client partitions.
    client_cursor: Mutex<i64>,
}

impl Janitor {
    /// Sweeps that start at the beginning of the ring.
    pub(super) fn new(cql: Arc<Cql>, legacy: Arc<Legacy>) -> Self {
        Janitor {
            cql,
            legacy,
            legacy_cursor: Mutex::new(i64::MIN),
            client_cursor: Mutex::new(i64::MIN),
        }
    }

    /// Deletes expired buckets (see the module comment), about `budget` a call: rows of the
    /// client partitions (a run of them is one range delete), and partitions of the old table
    /// while it holds any. Less than `budget` means this call's part of the sweep found no
    /// more; calling until 0 twice in a row sweeps everything.
    pub(super) async fn delete_expired(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        let mut deleted = 0;
        if self.legacy.in_use() {
            deleted += self.sweep_legacy(now_ms, budget).await?;
        }
        let left = budget.saturating_sub(deleted as usize);
        Ok(deleted + self.sweep_clients(now_ms, left).await?)
    }

    /// Up to [`MAX_CLIENTS_PER_CALL`] client partitions from the cursor on, until `budget` rows
    /// went or the lap ended.
    async fn sweep_clients(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        let mut deleted = 0u64;
        let mut scanned = 0usize;
        let page_limit = budget.clamp(10, 500);
        while (deleted as usize) < budget && scanned < MAX_CLIENTS_PER_CALL {
            let cursor = *self.client_cursor.lock().unwrap_or_else(|p| p.into_inner());
            let page = self.scan_clients(cursor, page_limit).await?;
            scanned += page.len();
            let page = &page;
            let counts: Vec<u64> = stream::iter(0..page.len())
                .map(|i| self.expire_client(&page[i].0, now_ms))
                .buffer_unordered(self.cql.max_concurrency)
                .try_collect()
                .await?;
            deleted += counts.iter().sum::<u64>();
            let next = match page.last() {
                Some((_, t)) if page.len() >= page_limit => *t,
                _ => i64::MIN,
            };
            // Only now: a failed call looks at the same partitions again (deleting twice is
            // harmless).
            *self.client_cursor.lock().unwrap_or_else(|p| p.into_inner()) = next;
            if next == i64::MIN {
                break;
            }
        }
        Ok(deleted)
    }

    /// The next `limit` client partitions after `cursor` in token order, with tokens.
    async fn scan_clients(&self, cursor: i64, limit: usize) -> StoreResult<Vec<(ClientRow, i64)>> {
        let values: ScanValues = (cursor, i32::try_from(limit).unwrap_or(i32::MAX));
        let rows: Vec<ClientRow> = self
            .cql
            .read_rows(&self.cql.st.scan_clients, values)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let key: ClientValues<'_> = (&row.0, &row.1);
            let token = self
                .cql
                .st
                .read_client
                .calculate_token(&key)
                .map_err(internal)?
                .map(|t| t.value())
                .ok_or_else(|| internal("no token for a client partition"))?;
            out.push((row, token));
        }
        Ok(out)
    }

    /// Deletes a client's expired runs of buckets; returns how many rows they held.
    async fn expire_client(&self, c: &ClientRow, now_ms: i64) -> StoreResult<u64> {
        let key: ClientValues<'_> = (&c.0, &c.1);
        let rows: Vec<CounterRow> = self.cql.read_all(&self.cql.st.read_client, key).await?;
        let keys: Vec<(i64, i64)> = rows.iter().map(|r| (r.0, r.2)).collect();
        let runs = expired_runs(&keys, now_ms);
        let doomed = keys
            .iter()
            .filter(|(s, _)| runs.iter().any(|(a, b)| (a..=b).contains(&s)))
            .count() as u64;
        let deletes: Vec<ReadSpanValues<'_>> =
            runs.iter().map(|&(a, b)| (&*c.0, &*c.1, a, b)).collect();
        self.cql
            .run_all(&self.cql.st.delete_starts, deletes)
            .await?;
        Ok(doomed)
    }

    /// Deletes whole expired partitions of the old table (see the module comment), at most `budget` per call;
    /// returns how many partitions went (a partition holds up to 64 buckets). Each call
    /// continues the sweep where the last stopped and ends at the end of a lap of the token
    /// ring, or after examining `MAX_SWEEP_PER_CALL` keys. So 0 means "nothing expired from
    /// where this call started to the end of the ring" (on a table under 20,000 partitions);
    /// calling until 0 twice in a row sweeps everything.
    async fn sweep_legacy(&self, now_ms: i64, budget: usize) -> StoreResult<u64> {
        let mut deleted = 0u64;
        let mut scanned = 0usize;
        let scan_limit = budget.saturating_mul(4).clamp(100, 5_000);
        while (deleted as usize) < budget && scanned < MAX_SWEEP_PER_CALL {
            let cursor = *self.legacy_cursor.lock().unwrap_or_else(|p| p.into_inner());
            let page = self.scan_partitions(cursor, scan_limit).await?;
            if cursor == i64::MIN && page.is_empty() {
                // A whole lap found nothing: the old table is empty for good (nothing
                // writes it).
                self.legacy.emptied();
                break;
            }
            scanned += page.len();
            let sweep = plan_sweep(&page, cursor, scan_limit, now_ms, budget - deleted as usize);
            self.delete_partitions(&sweep.doomed).await?;
            deleted += sweep.doomed.len() as u64;
            // Only now: if a delete failed, the next sweep looks at the same partitions again
            // (deleting twice is harmless).
            *self.legacy_cursor.lock().unwrap_or_else(|p| p.into_inner()) = sweep.next;
            if sweep.next == i64::MIN {
                // A lap is complete; the next call starts the next one.
                break;
            }
        }
        Ok(deleted)
    }

    /// The next `limit` counter partition keys after `cursor` in token order, with tokens.
    async fn scan_partitions(
        &self,
        cursor: i64,
        limit: usize,
    ) -> StoreResult<Vec<(PartitionRow, i64)>> {
        let values: ScanValues = (cursor, i32::try_from(limit).unwrap_or(i32::MAX));
        let rows: Vec<PartitionRow> = self
            .cql
            .read_rows(&self.cql.st.scan_partitions, values)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            // The driver computes the token exactly as the server does (Murmur3 over the
            // serialized key), so the cursor needs no token() in the SELECT.
            let key: PartitionValues<'_> = (&row.0, &row.1, &row.2, row.3, row.4, row.5);
            let token = self
                .cql
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
                self.cql
                    .session
                    .execute_unpaged(&self.cql.st.delete_partition, key)
                    .await
                    .map(|_| ())
                    .map_err(|e| map_exec(e, Op::Write))
            })
            .buffer_unordered(self.cql.max_concurrency)
            .collect()
            .await;
        outcomes.into_iter().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
