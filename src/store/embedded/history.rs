//! Usage history and the audit log on the embedded store.
//!
//! Tables (ids cannot contain \0; integers as in the counters, big-endian with the sign flipped):
//! - `usage`: tenant \0 subject \0 step(1) start(8) -> JSON [`Counts`]; subject `*` is the
//!   tenant's totals, step `h` or `d`.
//! - `usage_clients`: tenant \0 day(8) client -> JSON [`Counts`] without `denied_by`: the
//!   index of the clients seen each day (`top`, and the janitor's list of what to delete).
//! - `usage_days`: day(8) tenant -> (): which tenants have history on a day, oldest first, so
//!   the janitor deletes a day at a time without a scan.
//! - `audit`: scope \0 at(8) id -> JSON [`AuditEntry`], where scope is the entry's tenant, or
//!   `*` for the log of all tenants: each entry is written under both.

use std::collections::HashMap;

use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::{dec_i64, enc_i64, err, EmbeddedStore};
use crate::domain::TENANT_SUBJECT;
use crate::pace::Pacer;
use crate::store::audit::{AuditEntry, AuditQuery, AuditStore};
use crate::store::history::{
    ClientTotal, Counts, HistoryStore, Step, UsageDelta, UsagePoint, DAY_MS,
};
use crate::store::{StoreError, StoreResult};

const USAGE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("usage");
const USAGE_CLIENTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("usage_clients");
const USAGE_DAYS: TableDefinition<&[u8], ()> = TableDefinition::new("usage_days");
const AUDIT: TableDefinition<&[u8], &[u8]> = TableDefinition::new("audit");
/// The scope of the log of every tenant.
const ALL: &str = "*";

pub(super) fn create_tables(tx: &WriteTransaction) -> StoreResult<()> {
    tx.open_table(USAGE).map_err(err)?;
    tx.open_table(USAGE_CLIENTS).map_err(err)?;
    tx.open_table(USAGE_DAYS).map_err(err)?;
    tx.open_table(AUDIT).map_err(err)?;
    Ok(())
}

fn step_code(step: Step) -> u8 {
    match step {
        Step::Hour => b'h',
        Step::Day => b'd',
    }
}

/// tenant \0 subject \0 step: the part of a point's key shared by a history's points.
fn series(tenant: &str, subject: &str, step: Step) -> Vec<u8> {
    let mut v = Vec::with_capacity(tenant.len() + subject.len() + 11);
    v.extend_from_slice(tenant.as_bytes());
    v.push(0);
    v.extend_from_slice(subject.as_bytes());
    v.push(0);
    v.push(step_code(step));
    v
}

fn point_key(tenant: &str, subject: &str, step: Step, start: i64) -> Vec<u8> {
    let mut v = series(tenant, subject, step);
    v.extend_from_slice(&enc_i64(start));
    v
}

/// tenant \0 day: the prefix of a day's index of clients.
fn day_prefix(tenant: &str, day: i64) -> Vec<u8> {
    let mut v = Vec::with_capacity(tenant.len() + 9);
    v.extend_from_slice(tenant.as_bytes());
    v.push(0);
    v.extend_from_slice(&enc_i64(day));
    v
}

fn day_row(day: i64, tenant: &str) -> Vec<u8> {
    let mut v = enc_i64(day).to_vec();
    v.extend_from_slice(tenant.as_bytes());
    v
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Internal(format!("corrupt row: {e}")))
}

fn encode<T: serde::Serialize>(v: &T) -> StoreResult<Vec<u8>> {
    serde_json::to_vec(v).map_err(|e| StoreError::Internal(e.to_string()))
}

/// Adds `c` to the JSON counts at `key`: one descent of the B-tree, the row read and replaced
/// through the same mutable access.
fn add_at(table: &mut redb::Table<&[u8], &[u8]>, key: &[u8], c: &Counts) -> StoreResult<()> {
    let mut row = table.get_mut(key).map_err(err)?;
    match row.as_mut() {
        Some(row) => {
            let mut now: Counts = decode(row.value())?;
            now.add(c);
            row.insert(encode(&now)?.as_slice()).map_err(err)?;
        }
        None => {
            drop(row);
            table.insert(key, encode(c)?.as_slice()).map_err(err)?;
        }
    }
    Ok(())
}

fn add_deltas(tx: &WriteTransaction, deltas: &[UsageDelta]) -> StoreResult<()> {
    let mut usage = tx.open_table(USAGE).map_err(err)?;
    let mut clients = tx.open_table(USAGE_CLIENTS).map_err(err)?;
    let mut days = tx.open_table(USAGE_DAYS).map_err(err)?;
    // A tenant's own points sum its clients': added up here and written once per round, not
    // once per client (a round carries a delta for every client active in it).
    let mut tenants: HashMap<(&str, i64), Counts> = HashMap::new();
    let mut pace = Pacer::new();
    for d in deltas {
        pace.step();
        // As on the scylla store, a figure that is 0 is not written, and a delta of zeros
        // makes no point and no line in the index: points exist only where something was
        // added.
        let mut counts = d.counts.clone();
        counts.denied_by.retain(|_, n| *n != 0);
        if counts.is_empty() && counts.denied_by.is_empty() {
            continue;
        }
        let day = Step::Day.floor(d.hour);
        tenants.entry((&d.tenant, d.hour)).or_default().add(&counts);
        add_at(
            &mut usage,
            &point_key(&d.tenant, &d.client, Step::Hour, d.hour),
            &counts,
        )?;
        add_at(
            &mut usage,
            &point_key(&d.tenant, &d.client, Step::Day, day),
            &counts,
        )?;
        let mut index = day_prefix(&d.tenant, day);
        index.extend_from_slice(d.client.as_bytes());
        let mut plain = counts;
        plain.denied_by.clear();
        add_at(&mut clients, &index, &plain)?;
    }
    let mut tenant_days: HashMap<(&str, i64), Counts> = HashMap::new();
    for ((tenant, hour), counts) in &tenants {
        let day = Step::Day.floor(*hour);
        add_at(
            &mut usage,
            &point_key(tenant, TENANT_SUBJECT, Step::Hour, *hour),
            counts,
        )?;
        tenant_days.entry((tenant, day)).or_default().add(counts);
    }
    for ((tenant, day), counts) in &tenant_days {
        add_at(
            &mut usage,
            &point_key(tenant, TENANT_SUBJECT, Step::Day, *day),
            counts,
        )?;
        days.insert(day_row(*day, tenant).as_slice(), ())
            .map_err(err)?;
    }
    Ok(())
}

/// Deletes one tenant's history of one day: its clients' and its own points, and the index.
fn delete_day(tx: &WriteTransaction, tenant: &str, day: i64) -> StoreResult<u64> {
    let mut usage = tx.open_table(USAGE).map_err(err)?;
    let mut clients = tx.open_table(USAGE_CLIENTS).map_err(err)?;
    let prefix = day_prefix(tenant, day);
    let next = day_prefix(tenant, day + DAY_MS);
    let mut subjects = vec![TENANT_SUBJECT.to_owned()];
    for item in clients
        .range(prefix.as_slice()..next.as_slice())
        .map_err(err)?
    {
        let (k, _) = item.map_err(err)?;
        let client = &k.value()[prefix.len()..];
        subjects.push(String::from_utf8_lossy(client).into_owned());
    }
    let mut removed = 0;
    for subject in &subjects {
        let lo = point_key(tenant, subject, Step::Hour, day);
        let hi = point_key(tenant, subject, Step::Hour, day + DAY_MS);
        removed += usage
            .extract_from_if(lo.as_slice()..hi.as_slice(), |_, _| true)
            .map_err(err)?
            .count() as u64;
        if usage
            .remove(point_key(tenant, subject, Step::Day, day).as_slice())
            .map_err(err)?
            .is_some()
        {
            removed += 1;
        }
    }
    removed += clients
        .extract_from_if(prefix.as_slice()..next.as_slice(), |_, _| true)
        .map_err(err)?
        .count() as u64;
    Ok(removed)
}

#[async_trait]
impl HistoryStore for EmbeddedStore {
    async fn add_usage(&self, deltas: &[UsageDelta]) -> StoreResult<()> {
        if deltas.is_empty() {
            return Ok(());
        }
        let deltas = deltas.to_vec();
        self.blocking(move |db| {
            let tx = db.begin_write().map_err(err)?;
            add_deltas(&tx, &deltas)?;
            tx.commit().map_err(err)
        })
        .await
    }

    async fn usage_points(
        &self,
        tenant: &str,
        client: Option<&str>,
        step: Step,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<UsagePoint>> {
        let subject = client.unwrap_or(TENANT_SUBJECT);
        let lo = point_key(tenant, subject, step, from);
        let hi = point_key(tenant, subject, step, to);
        self.blocking(move |db| {
            let tx = db.begin_read().map_err(err)?;
            let usage = tx.open_table(USAGE).map_err(err)?;
            let mut out = Vec::new();
            if from >= to {
                return Ok(out);
            }
            for item in usage.range(lo.as_slice()..hi.as_slice()).map_err(err)? {
                let (k, v) = item.map_err(err)?;
                let key = k.value();
                out.push(UsagePoint {
                    start: dec_i64(&key[key.len() - 8..]),
                    counts: decode(v.value())?,
                });
            }
            Ok(out)
        })
        .await
    }

    async fn clients_seen(
        &self,
        tenant: &str,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<ClientTotal>> {
        // Saturating: `to` may be i64::MAX ("up to now and beyond").
        let (first, end) = (Step::Day.floor(from.saturating_add(DAY_MS - 1)), to);
        let lo = day_prefix(tenant, first);
        let hi = day_prefix(tenant, Step::Day.floor(end.saturating_add(DAY_MS - 1)));
        let skip = lo.len();
        self.blocking(move |db| {
            let tx = db.begin_read().map_err(err)?;
            let clients = tx.open_table(USAGE_CLIENTS).map_err(err)?;
            let mut sums: HashMap<String, Counts> = HashMap::new();
            if first >= end {
                return Ok(Vec::new());
            }
            for item in clients.range(lo.as_slice()..hi.as_slice()).map_err(err)? {
                let (k, v) = item.map_err(err)?;
                let client = String::from_utf8_lossy(&k.value()[skip..]).into_owned();
                let c: Counts = decode(v.value())?;
                sums.entry(client).or_default().add(&c);
            }
            Ok(sums
                .into_iter()
                .map(|(client, c)| ClientTotal {
                    client,
                    admitted: c.admitted,
                    cost: c.cost,
                    denied: c.denied,
                })
                .collect())
        })
        .await
    }

    async fn delete_history_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        self.blocking(move |db| {
            let tx = db.begin_write().map_err(err)?;
            let due: Vec<(i64, String)> = {
                let days = tx.open_table(USAGE_DAYS).map_err(err)?;
                let mut due = Vec::new();
                for item in days.iter().map_err(err)? {
                    let (k, _) = item.map_err(err)?;
                    let key = k.value();
                    let day = dec_i64(&key[..8]);
                    if day + DAY_MS > before || due.len() >= budget.max(1) {
                        break;
                    }
                    due.push((day, String::from_utf8_lossy(&key[8..]).into_owned()));
                }
                due
            };
            let mut removed = 0;
            for (day, tenant) in &due {
                removed += delete_day(&tx, tenant, *day)?;
                tx.open_table(USAGE_DAYS)
                    .map_err(err)?
                    .remove(day_row(*day, tenant).as_slice())
                    .map_err(err)?;
                if removed as usize >= budget {
                    break;
                }
            }
            tx.commit().map_err(err)?;
            Ok(removed)
        })
        .await
    }
}

/// scope \0 at(8) id.
fn audit_key(scope: &str, at_ms: i64, id: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(scope.len() + id.len() + 9);
    v.extend_from_slice(scope.as_bytes());
    v.push(0);
    v.extend_from_slice(&enc_i64(at_ms));
    v.extend_from_slice(id.as_bytes());
    v
}

#[async_trait]
impl AuditStore for EmbeddedStore {
    async fn append_audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        let entry = entry.clone();
        self.blocking(move |db| {
            let bytes = encode(&entry)?;
            let at = entry.at.timestamp_millis();
            let tx = db.begin_write().map_err(err)?;
            {
                let mut audit = tx.open_table(AUDIT).map_err(err)?;
                for scope in [entry.tenant.as_str(), ALL] {
                    audit
                        .insert(audit_key(scope, at, &entry.id).as_slice(), bytes.as_slice())
                        .map_err(err)?;
                }
            }
            tx.commit().map_err(err)
        })
        .await
    }

    async fn audit_page(&self, q: &AuditQuery) -> StoreResult<Vec<AuditEntry>> {
        let q = q.clone();
        self.blocking(move |db| {
            let scope = q.tenant.as_deref().unwrap_or(ALL);
            let lo = audit_key(scope, q.from, "");
            let mut hi = audit_key(scope, q.to, "");
            if let Some(c) = &q.before {
                hi = hi.min(audit_key(scope, c.at_ms, &c.id));
            }
            let tx = db.begin_read().map_err(err)?;
            let audit = tx.open_table(AUDIT).map_err(err)?;
            let mut out = Vec::new();
            if lo >= hi {
                return Ok(out);
            }
            for item in audit
                .range(lo.as_slice()..hi.as_slice())
                .map_err(err)?
                .rev()
                .take(q.limit)
            {
                let (_, v) = item.map_err(err)?;
                out.push(decode(v.value())?);
            }
            Ok(out)
        })
        .await
    }

    async fn delete_audit_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        self.blocking(move |db| {
            let tx = db.begin_write().map_err(err)?;
            let mut removed = 0;
            {
                let mut audit = tx.open_table(AUDIT).map_err(err)?;
                let lo = audit_key(ALL, i64::MIN, "");
                let hi = audit_key(ALL, before, "");
                let old: Vec<AuditEntry> = audit
                    .range(lo.as_slice()..hi.as_slice())
                    .map_err(err)?
                    .take(budget)
                    .map(|item| item.map_err(err).and_then(|(_, v)| decode(v.value())))
                    .collect::<StoreResult<_>>()?;
                for e in old {
                    let at = e.at.timestamp_millis();
                    for scope in [e.tenant.as_str(), ALL] {
                        audit
                            .remove(audit_key(scope, at, &e.id).as_slice())
                            .map_err(err)?;
                    }
                    removed += 1;
                }
            }
            tx.commit().map_err(err)?;
            Ok(removed)
        })
        .await
    }
}
