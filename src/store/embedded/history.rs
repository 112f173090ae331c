//! Usage history on the embedded store (the audit log is in `audit`).
//!
//! Tables (ids cannot contain \0; integers as in the counters, big-endian with the sign flipped):
//! - `usage`: tenant \0 subject \0 step(1) start(8) -> [`Counts`]; subject `*` is the tenant's
//!   totals, step `h` or `d`. A client has hour points only: its days are summed from them when
//!   read (at most 24 rows a day), so a sync round writes two rows per active client, not three.
//!   Day points of clients written by earlier releases are not read, and are deleted with their
//!   day.
//! - `usage_clients`: tenant \0 day(8) client -> [`Counts`] without `denied_by`: the index of
//!   the clients seen each day (`top`, and the janitor's list of what to delete).
//! - `usage_days`: day(8) tenant -> (): which tenants have history on a day, oldest first, so
//!   the janitor deletes a day at a time without a scan.
//!
//! [`Counts`] rows are binary (see [`encode_counts`]); rows written as JSON by earlier releases
//! are read as well, and rewritten as binary the next time they are added to.

use std::collections::HashMap;

use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::db::Db;
use super::{dec_i64, decode, enc_i64, err};
use crate::domain::TENANT_SUBJECT;
use crate::pace::Pacer;
use crate::store::history::{ClientTotal, Counts, Step, UsageDelta, UsagePoint, DAY_MS};
use crate::store::{StoreError, StoreResult};

const USAGE: TableDefinition<&[u8], &[u8]> = TableDefinition::new("usage");
const USAGE_CLIENTS: TableDefinition<&[u8], &[u8]> = TableDefinition::new("usage_clients");
const USAGE_DAYS: TableDefinition<&[u8], ()> = TableDefinition::new("usage_days");

pub(super) fn create_tables(tx: &WriteTransaction) -> StoreResult<()> {
    tx.open_table(USAGE).map_err(err)?;
    tx.open_table(USAGE_CLIENTS).map_err(err)?;
    tx.open_table(USAGE_DAYS).map_err(err)?;
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

/// The first byte of a binary [`Counts`] row. A JSON row (earlier releases) starts with `{`.
const COUNTS_V1: u8 = 1;

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn corrupt() -> StoreError {
    StoreError::Internal("corrupt row: bad binary counts".into())
}

fn take_varint(b: &mut &[u8]) -> StoreResult<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first().ok_or_else(corrupt)?;
        *b = rest;
        // The tenth byte holds the 64th bit only: more would not fit a u64.
        if shift == 63 && byte > 1 {
            return Err(corrupt());
        }
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(corrupt())
}

/// A [`Counts`] row: `COUNTS_V1`, then LEB128 varints: admitted, cost, denied, the number of
/// `denied_by` entries, and per entry its id's length, the id's bytes and its count. A client
/// with no denials takes 5-10 bytes against JSON's 50 or so, and neither side parses text.
fn encode_counts(c: &Counts, out: &mut Vec<u8>) {
    out.clear();
    out.push(COUNTS_V1);
    put_varint(out, c.admitted);
    put_varint(out, c.cost);
    put_varint(out, c.denied);
    put_varint(out, c.denied_by.len() as u64);
    for (id, n) in &c.denied_by {
        put_varint(out, id.len() as u64);
        out.extend_from_slice(id.as_bytes());
        put_varint(out, *n);
    }
}

fn decode_counts(bytes: &[u8]) -> StoreResult<Counts> {
    let Some((&tag, mut b)) = bytes.split_first() else {
        return Err(corrupt());
    };
    if tag == b'{' {
        return decode(bytes);
    }
    if tag != COUNTS_V1 {
        return Err(StoreError::Internal(format!(
            "corrupt row: unknown counts format {tag}"
        )));
    }
    let mut c = Counts {
        admitted: take_varint(&mut b)?,
        cost: take_varint(&mut b)?,
        denied: take_varint(&mut b)?,
        ..Counts::default()
    };
    for _ in 0..take_varint(&mut b)? {
        let len = usize::try_from(take_varint(&mut b)?).map_err(|_| corrupt())?;
        if len > b.len() {
            return Err(corrupt());
        }
        let (id, rest) = b.split_at(len);
        b = rest;
        let id = std::str::from_utf8(id).map_err(|_| corrupt())?;
        c.denied_by.insert(id.to_owned(), take_varint(&mut b)?);
    }
    if !b.is_empty() {
        return Err(corrupt());
    }
    Ok(c)
}

/// Adds `c` to the counts at `key` and takes `returned` from their cost (not below 0): one
/// descent of the B-tree, the row read and replaced through the same mutable access. `buf` is
/// scratch for the encoded row.
fn add_at(
    table: &mut redb::Table<&[u8], &[u8]>,
    key: &[u8],
    c: &Counts,
    returned: u64,
    buf: &mut Vec<u8>,
) -> StoreResult<()> {
    let mut row = table.get_mut(key).map_err(err)?;
    match row.as_mut() {
        Some(row) => {
            let mut now = decode_counts(row.value())?;
            now.add(c);
            now.cost = now.cost.saturating_sub(returned);
            encode_counts(&now, buf);
            row.insert(buf.as_slice()).map_err(err)?;
        }
        None => {
            drop(row);
            let mut now = c.clone();
            now.cost = now.cost.saturating_sub(returned);
            encode_counts(&now, buf);
            table.insert(key, buf.as_slice()).map_err(err)?;
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
    let mut tenants: HashMap<(&str, i64), (Counts, u64)> = HashMap::new();
    let mut pace = Pacer::new();
    let mut buf = Vec::with_capacity(64);
    for d in deltas {
        pace.step();
        // As on the scylla store, a figure that is 0 is not written, and a delta of zeros
        // makes no point and no line in the index: points exist only where something was
        // added.
        let mut counts = d.counts.clone();
        counts.denied_by.retain(|_, n| *n != 0);
        let returned = d.cost_returned;
        if counts.is_empty() && counts.denied_by.is_empty() && returned == 0 {
            continue;
        }
        let day = Step::Day.floor(d.hour);
        let tenant = tenants.entry((&d.tenant, d.hour)).or_default();
        tenant.0.add(&counts);
        tenant.1 += returned;
        add_at(
            &mut usage,
            &point_key(&d.tenant, &d.client, Step::Hour, d.hour),
            &counts,
            returned,
            &mut buf,
        )?;
        let mut index = day_prefix(&d.tenant, day);
        index.extend_from_slice(d.client.as_bytes());
        let mut plain = counts;
        plain.denied_by.clear();
        add_at(&mut clients, &index, &plain, returned, &mut buf)?;
    }
    let mut tenant_days: HashMap<(&str, i64), (Counts, u64)> = HashMap::new();
    for ((tenant, hour), (counts, returned)) in &tenants {
        let day = Step::Day.floor(*hour);
        add_at(
            &mut usage,
            &point_key(tenant, TENANT_SUBJECT, Step::Hour, *hour),
            counts,
            *returned,
            &mut buf,
        )?;
        let sum = tenant_days.entry((tenant, day)).or_default();
        sum.0.add(counts);
        sum.1 += returned;
    }
    for ((tenant, day), (counts, returned)) in &tenant_days {
        add_at(
            &mut usage,
            &point_key(tenant, TENANT_SUBJECT, Step::Day, *day),
            counts,
            *returned,
            &mut buf,
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

/// Usage history and its indexes.
pub(super) struct History {
    db: Db,
}

impl History {
    pub(super) fn new(db: Db) -> Self {
        History { db }
    }

    pub(super) async fn add(&self, deltas: &[UsageDelta]) -> StoreResult<()> {
        if deltas.is_empty() {
            return Ok(());
        }
        let mut deltas = deltas.to_vec();
        self.db
            .blocking(move |db| {
                // In the order of the tables' keys: a round's rows come in the limiter's hash
                // order, and walking the b-trees in key order keeps their pages in the CPU's
                // caches (a write of 10^4 clients' rows took about a fifth less, docs/performance.md).
                deltas.sort_unstable_by(|a, b| {
                    (a.tenant.as_str(), a.client.as_str(), a.hour).cmp(&(
                        b.tenant.as_str(),
                        b.client.as_str(),
                        b.hour,
                    ))
                });
                // One delta per point: cost given back is taken from the point's cost after
                // the call's additions to it, whatever order they came in.
                deltas.dedup_by(|next, kept| {
                    let same = (&next.tenant, &next.client, next.hour)
                        == (&kept.tenant, &kept.client, kept.hour);
                    if same {
                        kept.counts.add(&next.counts);
                        kept.cost_returned += next.cost_returned;
                    }
                    same
                });
                let tx = db.begin_write().map_err(err)?;
                add_deltas(&tx, &deltas)?;
                tx.commit().map_err(err)
            })
            .await
    }

    pub(super) async fn points(
        &self,
        tenant: &str,
        client: Option<&str>,
        step: Step,
        from: i64,
        to: i64,
    ) -> StoreResult<Vec<UsagePoint>> {
        // A client's days are summed from its hours (see the module's doc).
        let summed = client.is_some() && step == Step::Day;
        let subject = client.unwrap_or(TENANT_SUBJECT);
        let (lo, hi) = if summed {
            // The hours of the days that start in from..to. Saturating: `to` may be i64::MAX.
            let first = Step::Day.floor(from.saturating_add(DAY_MS - 1));
            let end = Step::Day.floor(to.saturating_add(DAY_MS - 1));
            (
                point_key(tenant, subject, Step::Hour, first),
                point_key(tenant, subject, Step::Hour, end),
            )
        } else {
            (
                point_key(tenant, subject, step, from),
                point_key(tenant, subject, step, to),
            )
        };
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(err)?;
                let usage = tx.open_table(USAGE).map_err(err)?;
                let mut out: Vec<UsagePoint> = Vec::new();
                if from >= to {
                    return Ok(out);
                }
                for item in usage.range(lo.as_slice()..hi.as_slice()).map_err(err)? {
                    let (k, v) = item.map_err(err)?;
                    let key = k.value();
                    let start = dec_i64(&key[key.len() - 8..]);
                    let counts = decode_counts(v.value())?;
                    if !summed {
                        out.push(UsagePoint { start, counts });
                        continue;
                    }
                    let day = Step::Day.floor(start);
                    match out.last_mut() {
                        Some(p) if p.start == day => p.counts.add(&counts),
                        _ => out.push(UsagePoint { start: day, counts }),
                    }
                }
                Ok(out)
            })
            .await
    }

    pub(super) async fn clients_seen(
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
        self.db
            .blocking(move |db| {
                let tx = db.begin_read().map_err(err)?;
                let clients = tx.open_table(USAGE_CLIENTS).map_err(err)?;
                let mut sums: HashMap<String, Counts> = HashMap::new();
                if first >= end {
                    return Ok(Vec::new());
                }
                for item in clients.range(lo.as_slice()..hi.as_slice()).map_err(err)? {
                    let (k, v) = item.map_err(err)?;
                    let client = String::from_utf8_lossy(&k.value()[skip..]).into_owned();
                    let c = decode_counts(v.value())?;
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

    pub(super) async fn delete_before(&self, before: i64, budget: usize) -> StoreResult<u64> {
        self.db
            .blocking(move |db| {
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

#[cfg(test)]
mod tests;
