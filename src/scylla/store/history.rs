//! Usage history on the scylla store (`migrations/0004_history_audit.cql`).
//!
//! - `usage_history`: a counter cell per (point, field), partitioned by (tenant, subject,
//!   month); a field is `admitted`, `cost`, `denied` or `denied_by:<limit id>`.
//! - `usage_clients`: the clients seen each (tenant, day), with the day's totals.
//! - `usage_tenants`: the tenants with history in each month.
//!
//! An `add_usage` call is summed per cell first ([`plan_usage`]), so the tenant's `*`
//! partition takes one increment per field and hour however many clients a round saw, and a
//! field that stayed 0 is never written. It then writes in three steps, each only once the one
//! before succeeded: the months' tenant rows (idempotent), the days' client lines, the points.
//! So every `usage_history` partition is listed by a client line and every client line by a
//! tenant row: retention, which finds partitions only through those indexes, never misses one.
//! Counter writes are never retried (see [`super::connection`]): once any counter write may have
//! landed, a failure is `Uncertain`.
//!
//! Retention ([`History::delete_before`]) deletes whole partitions of months that
//! ended at or before `before`. A deleted counter cannot reliably be incremented again; that
//! never matters here, because nothing writes history for an hour that far past retention.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::stream::{self, StreamExt, TryStreamExt};
use scylla::value::{Counter, MaybeUnset};

use super::connection::Cql;
use super::errors::{combine_write_outcomes, internal};
use super::partition::{month_end, month_of, month_start, FIRST_MS, LAST_MS};
use super::statements::{
    AddClientDayValues, AddUsagePointValues, ClientDayRow, ClientDayValues, MonthNameValues,
    MonthValues, NameRow, ReadUsagePointsValues, UsageHistoryKeyValues, UsagePointRow,
};
use crate::domain::TENANT_SUBJECT;
use crate::store::history::{ClientTotal, Counts, Step, UsageDelta, UsagePoint, DAY_MS};
use crate::store::{StoreError, StoreResult};

const ADMITTED: &str = "admitted";
const COST: &str = "cost";
const DENIED: &str = "denied";
/// `denied_by:<limit id>`; everything after the prefix is the id (which may hold ':').
const DENIED_BY: &str = "denied_by:";

/// Most counter updates in one batch. Each batch is one partition (a single mutation, which
/// Cassandra neither warns about nor refuses for size), so this only keeps requests small.
const MAX_BATCH: usize = 100;

/// A `usage_history` partition: (tenant, subject, month).
type PointsKey = (String, String, i32);
/// A cell of it: (step, start, field).
type Cell = (&'static str, i64, String);

/// What one `add_usage` call writes, summed per cell and grouped by partition.
#[derive(Debug, Default, PartialEq, Eq)]
struct UsagePlan {
    /// Rows of `usage_tenants`: (month, tenant), each once.
    tenant_months: BTreeSet<(i32, String)>,
    /// Partitions of `usage_clients`, (tenant, day): client -> [admitted, cost, denied].
    client_days: BTreeMap<(String, i64), BTreeMap<String, [i64; 3]>>,
    /// Partitions of `usage_history`: the increment of each cell, never 0.
    points: BTreeMap<PointsKey, BTreeMap<Cell, i64>>,
}

fn to_i64(v: u64) -> StoreResult<i64> {
    i64::try_from(v).map_err(|_| StoreError::Internal(format!("usage figure {v} too large")))
}

fn add_to(sum: &mut i64, n: i64) -> StoreResult<()> {
    *sum = sum
        .checked_add(n)
        .ok_or_else(|| StoreError::Internal("usage increment overflows i64".into()))?;
    Ok(())
}

/// The figures of a delta as a line of the index adds them: admitted, cost (net of what
/// it gives back, so it may be below 0), denied.
fn line_of(d: &UsageDelta) -> StoreResult<[i64; 3]> {
    Ok([
        to_i64(d.counts.admitted)?,
        d.net_cost(),
        to_i64(d.counts.denied)?,
    ])
}

/// The non-zero fields of `d` as (field, value).
fn fields(d: &UsageDelta) -> StoreResult<Vec<(String, i64)>> {
    let c = &d.counts;
    let mut out = Vec::with_capacity(3 + c.denied_by.len());
    for (name, v) in [ADMITTED, COST, DENIED].into_iter().zip(line_of(d)?) {
        if v != 0 {
            out.push((name.to_owned(), v));
        }
    }
    for (limit, &v) in &c.denied_by {
        if v != 0 {
            out.push((format!("{DENIED_BY}{limit}"), to_i64(v)?));
        }
    }
    Ok(out)
}

/// Sums the deltas per cell (see the module comment). A delta whose figures are all 0 adds
/// nothing, and so creates no point and no client line.
fn plan_usage(deltas: &[UsageDelta]) -> StoreResult<UsagePlan> {
    let mut plan = UsagePlan::default();
    for d in deltas {
        let fields = fields(d)?;
        if fields.is_empty() {
            continue;
        }
        let day = Step::Day.floor(d.hour);
        // A day lies in the month of its hours: one partition holds both.
        let month = month_of(d.hour);
        plan.tenant_months.insert((month, d.tenant.clone()));
        let line = plan
            .client_days
            .entry((d.tenant.clone(), day))
            .or_default()
            .entry(d.client.clone())
            .or_default();
        for (i, v) in line_of(d)?.into_iter().enumerate() {
            add_to(&mut line[i], v)?;
        }
        for subject in [d.client.as_str(), TENANT_SUBJECT] {
            let part = plan
                .points
                .entry((d.tenant.clone(), subject.to_owned(), month))
                .or_default();
            for (step, start) in [(Step::Hour, d.hour), (Step::Day, day)] {
                for (field, v) in &fields {
                    let cell = part
                        .entry((step.as_str(), start, field.clone()))
                        .or_insert(0);
                    add_to(cell, *v)?;
                }
            }
        }
    }
    Ok(plan)
}

/// A client line's figure: 0 is bound unset, so the server writes no cell for it. A line whose
/// figures are all 0 (only denials by limit, without `denied`: not what the limiter sends)
/// still writes `admitted + 0`, so the client is listed and its points found by retention.
fn line_values<'a>(
    tenant: &'a str,
    day: i64,
    client: &'a str,
    v: [i64; 3],
) -> AddClientDayValues<'a> {
    let set = |n: i64| {
        if n == 0 {
            MaybeUnset::Unset
        } else {
            MaybeUnset::Set(Counter(n))
        }
    };
    let admitted = if v == [0; 3] {
        MaybeUnset::Set(Counter(0))
    } else {
        set(v[0])
    };
    (admitted, set(v[1]), set(v[2]), tenant, day, client)
}

/// Adds a counter cell's value to the figures of a point. Unknown fields (a later version's)
/// are left out.
fn add_field(c: &mut Counts, field: &str, n: u64) {
    match field {
        ADMITTED => c.admitted += n,
        COST => c.cost += n,
        DENIED => c.denied += n,
        f => {
            if let Some(limit) = f.strip_prefix(DENIED_BY) {
                if n != 0 {
                    *c.denied_by.entry(limit.to_owned()).or_default() += n;
                }
            }
        }
    }
}

/// A counter cell's figure. Below 0 only where cost given back by a settle landed and the
/// estimate it netted against did not (an increment with an unknown outcome): read as 0.
fn counter_value(c: Option<Counter>) -> u64 {
    c.map_or(0, |Counter(n)| n.max(0) as u64)
}

/// The UTC days that start in `[from, to)`.
fn days_in(from: i64, to: i64) -> impl Iterator<Item = i64> {
    // The first day start at or after `from`.
    let first = from + (DAY_MS - from.rem_euclid(DAY_MS)) % DAY_MS;
    (0..)
        .map(move |i| first + i * DAY_MS)
        .take_while(move |d| *d < to)
}

/// Usage history and its indexes.
pub(super) struct History {
    cql: Arc<Cql>,
}

impl History {
    pub(super) fn new(cql: Arc<Cql>) -> Self {
        History { cql }
    }

    /// Runs counter updates, a batch per partition chunk, in parallel; the outcome as one
    /// error (`Uncertain` once any may have landed).
    async fn write_counters<V>(
        &self,
        st: &scylla::statement::prepared::PreparedStatement,
        parts: &[Vec<V>],
    ) -> StoreResult<()>
    where
        V: scylla::serialize::row::SerializeRow + Sync,
    {
        let chunks: Vec<&[V]> = parts.iter().flat_map(|p| p.chunks(MAX_BATCH)).collect();
        // By index, as `increment` does: a closure taking a borrowed chunk trips the `Send`
        // check of the async trait ("FnOnce is not general enough").
        let outcomes: Vec<StoreResult<()>> = stream::iter(0..chunks.len())
            .map(|i| self.cql.counter_batch(st, chunks[i]))
            .buffer_unordered(self.cql.max_concurrency)
            .collect()
            .await;
        combine_write_outcomes(outcomes)
    }

    /// The months of `[from, to)` that may hold `tenant`'s history.
    async fn history_months(&self, tenant: &str, from: i64, to: i64) -> StoreResult<Vec<i32>> {
        let (from, to) = (from.max(FIRST_MS), to.min(LAST_MS));
        if from >= to {
            return Ok(Vec::new());
        }
        self.cql
            .months_to_read(
                month_of(from),
                month_of(to - 1),
                &self.cql.st.list_history_months,
                &self.cql.st.find_tenant_month,
                tenant,
            )
            .await
    }

    /// Deletes one tenant's history of one month, a day at a time (see
    /// [`History::delete_before`]); stops once `removed` reaches `budget`.
    /// Returns whether the month is done.
    async fn delete_tenant_month(
        &self,
        month: i32,
        tenant: &str,
        budget: usize,
        removed: &mut u64,
    ) -> StoreResult<bool> {
        let (Some(start), Some(end)) = (month_start(month), month_end(month)) else {
            return Err(internal(format!(
                "malformed month {month} in usage_tenants"
            )));
        };
        let mut gone: HashSet<String> = HashSet::new();
        for day in days_in(start, end) {
            if *removed as usize >= budget {
                return Ok(false);
            }
            let key: ClientDayValues<'_> = (tenant, day);
            let clients: Vec<NameRow> =
                self.cql.read_all(&self.cql.st.list_client_day, key).await?;
            if clients.is_empty() {
                continue;
            }
            // The points first, then the line that lists them: a call cut off here is
            // repeated by the next, which finds the same lines (deleting twice is harmless).
            let doomed: Vec<UsageHistoryKeyValues<'_>> = clients
                .iter()
                .filter(|(c,)| gone.insert(c.clone()))
                .map(|(c,)| (tenant, c.as_str(), month))
                .collect();
            *removed += doomed.len() as u64;
            self.cql
                .run_all(&self.cql.st.delete_usage_history, doomed)
                .await?;
            self.cql
                .run_all(&self.cql.st.delete_client_day, vec![key])
                .await?;
            *removed += 1;
        }
        let totals: UsageHistoryKeyValues<'_> = (tenant, TENANT_SUBJECT, month);
        self.cql
            .run_all(&self.cql.st.delete_usage_history, vec![totals])
            .await?;
        let row: MonthNameValues<'_> = (month, tenant);
        self.cql
            .run_all(&self.cql.st.delete_tenant_month, vec![row])
            .await?;
        *removed += 2;
        Ok(true)
    }

    pub(super) async fn add(&self, deltas: &[UsageDelta]) -> StoreResult<()> {
        let plan = plan_usage(deltas)?;
        if plan.points.is_empty() {
            return Ok(());
        }
        // 1. The month index. Idempotent, and no counter is touched yet: on failure nothing
        //    was counted, so the whole call may be retried.
        let rows: Vec<MonthNameValues<'_>> = plan
            .tenant_months
            .iter()
            .map(|(m, t)| (*m, t.as_str()))
            .collect();
        self.cql
            .run_all(&self.cql.st.note_tenant_month, rows)
            .await
            .map_err(|e| match e {
                StoreError::Internal(m) => StoreError::Internal(m),
                e => StoreError::Unavailable(format!("nothing counted: {e}")),
            })?;
        // 2. The days' client lines.
        let lines: Vec<Vec<AddClientDayValues<'_>>> = plan
            .client_days
            .iter()
            .map(|((tenant, day), clients)| {
                clients
                    .iter()
                    .map(|(client, v)| line_values(tenant, *day, client, *v))
                    .collect()
            })
            .collect();
        self.write_counters(&self.cql.st.add_client_day, &lines)
            .await?;
        // 3. The points. Some lines landed already: any failure now is uncertain.
        let points: Vec<Vec<AddUsagePointValues<'_>>> = plan
            .points
            .iter()
            .map(|((tenant, subject, month), cells)| {
                cells
                    .iter()
                    .map(|((step, start, field), n)| {
                        (
                            Counter(*n),
                            tenant.as_str(),
                            subject.as_str(),
                            *month,
                            *step,
                            *start,
                            field.as_str(),
                        )
                    })
                    .collect()
            })
            .collect();
        self.write_counters(&self.cql.st.add_usage_point, &points)
            .await
            .map_err(|e| match e {
                StoreError::Uncertain(m) => StoreError::Uncertain(m),
                e => StoreError::Uncertain(format!(
                    "the clients' day lines were counted, their points failed: {e}"
                )),
            })
    }

    pub(super) async fn points(
        &self,
        tenant: &str,
        client: Option<&str>,
        step: Step,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<UsagePoint>> {
        let subject = client.unwrap_or(TENANT_SUBJECT);
        let months = self.history_months(tenant, from, to).await?;
        let parts: Vec<Vec<UsagePointRow>> = stream::iter(months.into_iter().map(|month| {
            let values: ReadUsagePointsValues<'_> =
                (tenant, subject, month, step.as_str(), from, to);
            self.cql.read_all(&self.cql.st.read_usage_points, values)
        }))
        .buffered(self.cql.max_concurrency)
        .try_collect()
        .await?;
        let mut points: BTreeMap<i64, Counts> = BTreeMap::new();
        for (start, field, n) in parts.into_iter().flatten() {
            add_field(points.entry(start).or_default(), &field, counter_value(n));
        }
        Ok(points
            .into_iter()
            .map(|(start, counts)| UsagePoint { start, counts })
            .collect())
    }

    pub(super) async fn clients_seen(
        &self,
        tenant: &str,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<ClientTotal>> {
        let (from, to) = (from.max(FIRST_MS), to.min(LAST_MS));
        let mut days: Vec<i64> = Vec::new();
        for month in self.history_months(tenant, from, to).await? {
            if let (Some(start), Some(end)) = (month_start(month), month_end(month)) {
                days.extend(days_in(from.max(start), to.min(end)));
            }
        }
        let parts: Vec<Vec<ClientDayRow>> = stream::iter(days.into_iter().map(|day| {
            let values: ClientDayValues<'_> = (tenant, day);
            self.cql.read_all(&self.cql.st.read_client_day, values)
        }))
        .buffer_unordered(self.cql.max_concurrency)
        .try_collect()
        .await?;
        let mut sums: HashMap<String, [u64; 3]> = HashMap::new();
        for (client, admitted, cost, denied) in parts.into_iter().flatten() {
            let s = sums.entry(client).or_default();
            s[0] += counter_value(admitted);
            s[1] += counter_value(cost);
            s[2] += counter_value(denied);
        }
        Ok(sums
            .into_iter()
            .map(|(client, [admitted, cost, denied])| ClientTotal {
                client,
                admitted,
                cost,
                denied,
            })
            .collect())
    }

    /// Whole months that ended at or before `before`, oldest first; in each, tenant by tenant
    /// and day by day: the history partitions of the clients a day lists, then the day's list;
    /// then the tenant's `*` partition and its row of the month; then the month's partition of
    /// `usage_tenants`. Each step deletes what lists it only after what it lists, so a call cut
    /// off (by an error or the budget) leaves everything still findable by the next. Counts
    /// partitions deleted (a day's clients may take it past `budget`).
    pub(super) async fn delete_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        let mut removed = 0u64;
        if budget == 0 {
            return Ok(0);
        }
        let months = self
            .cql
            .months_ended_by(&self.cql.st.list_history_months, before)
            .await?;
        for month in months {
            let values: MonthValues = (month,);
            let tenants: Vec<NameRow> = self
                .cql
                .read_all(&self.cql.st.list_month_tenants, values)
                .await?;
            for (tenant,) in &tenants {
                if removed as usize >= budget
                    || !self
                        .delete_tenant_month(month, tenant, budget, &mut removed)
                        .await?
                {
                    return Ok(removed);
                }
            }
            self.cql
                .run_all(&self.cql.st.delete_history_month, vec![values])
                .await?;
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests;
