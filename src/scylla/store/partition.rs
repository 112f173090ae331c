//! Partition arithmetic: which partition a bucket or a policy lives in.
//!
//! A counter partition is `(tenant, subject, limit_id, grain, epoch, shard)`; the epoch is a
//! coarse time bucket: [`FIXED_EPOCH_BUCKETS`] buckets of a fixed grain, or one calendar year
//! of monthly buckets. So a partition holds at most 64 rows, a window's buckets lie in at most
//! two partitions per shard, and a partition can be deleted whole once its last bucket is past
//! the grain's retention ([`partition_expired`]). Policies are spread over [`POLICY_PARTS`]
//! partitions by a stable hash of the tenant. Usage history and the audit log are partitioned
//! by UTC calendar month ([`month_of`]). Pure functions: no driver, no I/O.

use std::collections::BTreeMap;

use chrono::{DateTime, Datelike, TimeZone, Utc};

use crate::domain::Grain;
use crate::store::{CounterKey, Delta, StoreError, StoreResult};

/// Buckets of a fixed grain per partition. More than a window's estimate reads
/// ([`crate::domain::MAX_BUCKETS_READ`]), so a window spans at most two partitions per shard; small, so partitions stay tiny and expire soon after
/// their last bucket.
pub(crate) const FIXED_EPOCH_BUCKETS: i64 = 64;
/// Policies are spread over this many partitions. Part of the stored data: changing it needs a
/// data migration.
pub(crate) const POLICY_PARTS: i16 = 16;
/// Most partitions one range may span; a wider range is a caller bug, not a workload.
const MAX_EPOCHS_PER_RANGE: i64 = 64;

/// The epoch (coarse time bucket of the partition key) holding the bucket that starts at
/// `start_ms`.
pub(crate) fn epoch_of(grain: Grain, start_ms: i64) -> StoreResult<i64> {
    match grain {
        Grain::Fixed(g) => Ok(start_ms.div_euclid(epoch_span(g)?)),
        Grain::Month => Ok(i64::from(
            DateTime::<Utc>::from_timestamp_millis(start_ms)
                .ok_or_else(|| {
                    StoreError::Internal(format!("bucket start {start_ms} out of range"))
                })?
                .year(),
        )),
    }
}

fn epoch_span(g: i64) -> StoreResult<i64> {
    if g <= 0 {
        return Err(StoreError::Internal(format!("grain {g} is not positive")));
    }
    g.checked_mul(FIXED_EPOCH_BUCKETS)
        .ok_or_else(|| StoreError::Internal(format!("grain {g} too large")))
}

/// Where an epoch ends (exclusive, Unix ms); None when out of the representable range.
pub(crate) fn epoch_end(grain: Grain, epoch: i64) -> Option<i64> {
    match grain {
        Grain::Fixed(g) => epoch.checked_add(1)?.checked_mul(epoch_span(g).ok()?),
        Grain::Month => {
            let year = i32::try_from(epoch.checked_add(1)?).ok()?;
            Utc.with_ymd_and_hms(year, 1, 1, 0, 0, 0)
                .single()
                .map(|d| d.timestamp_millis())
        }
    }
}

/// Whether no window can need any bucket of the partition at `now_ms`: its last bucket ends
/// by `epoch_end`, and a bucket is needed for `retention_ms` after its start.
pub(crate) fn partition_expired(grain: Grain, epoch: i64, now_ms: i64) -> bool {
    epoch_end(grain, epoch)
        .and_then(|end| end.checked_add(grain.retention_ms()))
        .is_some_and(|horizon| horizon <= now_ms)
}

/// The epochs a range `[from, to]` of bucket starts touches.
pub(crate) fn epochs_of_range(
    grain: Grain,
    from: i64,
    to: i64,
) -> StoreResult<std::ops::RangeInclusive<i64>> {
    let (a, b) = (epoch_of(grain, from)?, epoch_of(grain, to)?);
    if b.saturating_sub(a) >= MAX_EPOCHS_PER_RANGE {
        return Err(StoreError::Internal(format!(
            "a read range of {} ms on grain {:?} spans more than {MAX_EPOCHS_PER_RANGE} partitions",
            to.saturating_sub(from),
            grain
        )));
    }
    Ok(a..=b)
}

/// The policy partition of a tenant: FNV-1a (stable across versions and platforms, unlike
/// std's hasher) modulo [`POLICY_PARTS`].
pub(crate) fn policy_part(tenant: &str) -> i16 {
    let mut h: u32 = 0x811c_9dc5;
    for b in tenant.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    (h % POLICY_PARTS as u32) as i16
}

/// The first instant a history or audit partition may hold (the epoch: nothing older is
/// written), and the last (the end of year 9999): ranges are clamped to these, so a caller's
/// `0` or `i64::MAX` bound reads what exists instead of failing.
pub(crate) const FIRST_MS: i64 = 0;
pub(crate) const LAST_MS: i64 = 253_402_300_799_999;

/// The UTC calendar month holding `ms`, as `yyyymm` (202611 for November 2026): the month part
/// of the partition key of usage history and the audit log. `ms` is clamped to
/// [`FIRST_MS`]..=[`LAST_MS`].
pub(crate) fn month_of(ms: i64) -> i32 {
    let t = DateTime::<Utc>::from_timestamp_millis(ms.clamp(FIRST_MS, LAST_MS))
        .expect("clamped into chrono's range");
    t.year() * 100 + t.month() as i32
}

/// Where a `yyyymm` month starts (Unix ms); None for a malformed month.
pub(crate) fn month_start(month: i32) -> Option<i64> {
    let (y, m) = (month.div_euclid(100), month.rem_euclid(100));
    if !(1..=12).contains(&m) {
        return None;
    }
    Utc.with_ymd_and_hms(y, m as u32, 1, 0, 0, 0)
        .single()
        .map(|d| d.timestamp_millis())
}

/// The month after a `yyyymm` month.
pub(crate) fn next_month(month: i32) -> i32 {
    if month % 100 >= 12 {
        (month / 100 + 1) * 100 + 1
    } else {
        month + 1
    }
}

/// Where a `yyyymm` month ends (exclusive, Unix ms): the start of the next.
pub(crate) fn month_end(month: i32) -> Option<i64> {
    month_start(next_month(month))
}

/// How many months `first..=last` holds (0 when `last < first`).
pub(crate) fn months_spanned(first: i32, last: i32) -> i64 {
    let index = |m: i32| i64::from(m / 100) * 12 + i64::from(m % 100) - 1;
    (index(last) - index(first) + 1).max(0)
}

/// The months `first..=last`, oldest first. Callers bound the span first
/// ([`months_spanned`]): a range of years is read through an index of months instead.
pub(crate) fn months_between(first: i32, last: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let mut m = first;
    while m <= last {
        out.push(m);
        m = next_month(m);
    }
    out
}

/// Most bucket starts one range names in a read (`bucket_start IN ?`); a wider range is read
/// as a span of starts instead. More than a window's estimate reads
/// ([`crate::domain::MAX_BUCKETS_READ`]).
pub(crate) const MAX_STARTS_PER_RANGE: usize = 64;
/// Most values in one `IN` list: ScyllaDB refuses more than 100 clustering-key restrictions in
/// one query by default.
pub(crate) const MAX_IN_VALUES: usize = 100;

/// The bucket starts of `grain` in `[from, to]`, oldest first; None when there are more than
/// [`MAX_STARTS_PER_RANGE`] (or the arithmetic leaves the representable range).
pub(crate) fn starts_in(grain: Grain, from: i64, to: i64) -> Option<Vec<i64>> {
    let mut out = Vec::new();
    let mut s = grain.bucket_start(from);
    if s < from {
        s = grain.bucket_end(s);
    }
    while s <= to {
        if out.len() == MAX_STARTS_PER_RANGE {
            return None;
        }
        out.push(s);
        let next = grain.bucket_end(s);
        if next <= s {
            return None;
        }
        s = next;
    }
    Some(out)
}

/// One client's increments of a round: the rows of one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClientWrite<'a> {
    pub(crate) tenant: &'a str,
    pub(crate) subject: &'a str,
    /// (bucket start, limit id, grain code, summed delta), in clustering order, zero sums
    /// dropped.
    pub(crate) rows: Vec<(i64, &'a str, i64, i64)>,
}

/// Groups increments by client partition, summing duplicates; an increment that sums to zero
/// is not sent at all.
pub(crate) fn group_by_client(deltas: &[Delta]) -> StoreResult<Vec<ClientWrite<'_>>> {
    type Rows<'a> = BTreeMap<(i64, &'a str, i64), i64>;
    let mut by_client: BTreeMap<(&str, &str), Rows<'_>> = BTreeMap::new();
    for d in deltas {
        let k: &CounterKey = &d.key;
        let sum = by_client
            .entry((&*k.tenant, &*k.subject))
            .or_default()
            .entry((d.start, &*k.limit, k.grain.code()))
            .or_insert(0);
        *sum = sum
            .checked_add(d.delta)
            .ok_or_else(|| StoreError::Internal("increment overflows i64".into()))?;
    }
    Ok(by_client
        .into_iter()
        .map(|((tenant, subject), rows)| ClientWrite {
            tenant,
            subject,
            rows: rows
                .into_iter()
                .filter(|&(_, d)| d != 0)
                .map(|((start, limit, grain), d)| (start, limit, grain, d))
                .collect(),
        })
        .filter(|c| !c.rows.is_empty())
        .collect())
}

/// The runs of a client's rows (in clustering order: by bucket start) that no window can need
/// at `now_ms`, as inclusive ranges of bucket starts. A start is expired when every row at it
/// is (`start + grain.retention_ms() <= now_ms`; a grain code this version does not know never
/// is), so a range never covers a row still needed, even one of another grain at the same
/// start.
pub(crate) fn expired_runs(rows: &[(i64, i64)], now_ms: i64) -> Vec<(i64, i64)> {
    let mut runs: Vec<(i64, i64)> = Vec::new();
    let mut open: Option<(i64, i64)> = None;
    for same in rows.chunk_by(|a, b| a.0 == b.0) {
        let start = same[0].0;
        let expired = same.iter().all(|&(s, code)| {
            Grain::from_code(code)
                .and_then(|g| s.checked_add(g.retention_ms()))
                .is_some_and(|horizon| horizon <= now_ms)
        });
        open = match (open, expired) {
            (Some((a, _)), true) => Some((a, start)),
            (None, true) => Some((start, start)),
            (Some(run), false) => {
                runs.push(run);
                None
            }
            (None, false) => None,
        };
    }
    runs.extend(open);
    runs
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fixed_epochs_hold_64_buckets_and_a_window_spans_at_most_two() {
        for g in [100, 1_000, 60_000, 3_600_000, 86_400_000] {
            let grain = Grain::Fixed(g);
            assert_eq!(epoch_of(grain, 0).unwrap(), 0);
            assert_eq!(epoch_of(grain, 64 * g - 1).unwrap(), 0);
            assert_eq!(epoch_of(grain, 64 * g).unwrap(), 1);
            assert_eq!(epoch_of(grain, -1).unwrap(), -1);
            assert_eq!(epoch_end(grain, 0), Some(64 * g));
            // The most buckets an estimate reads: the window's, the straddling one, the one before.
            let t = 63 * g;
            let r =
                epochs_of_range(grain, t - (crate::domain::MAX_BUCKETS_READ - 1) * g, t).unwrap();
            assert!(r.end() - r.start() <= 1);
        }
        assert!(epoch_of(Grain::Fixed(0), 5).is_err());
        assert!(epochs_of_range(Grain::Fixed(1_000), 0, 1_000 * 64 * 100).is_err());
    }

    #[test]
    fn monthly_buckets_are_grouped_by_year() {
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis();
        assert_eq!(
            epoch_of(Grain::Month, t("2024-02-01T00:00:00Z")).unwrap(),
            2024
        );
        assert_eq!(
            epoch_of(Grain::Month, t("2024-12-01T00:00:00Z")).unwrap(),
            2024
        );
        assert_eq!(
            epoch_end(Grain::Month, 2024),
            Some(t("2025-01-01T00:00:00Z"))
        );
        let dec = t("2024-12-01T00:00:00Z");
        let needed_until = dec + Grain::Month.retention_ms();
        assert!(!partition_expired(Grain::Month, 2024, needed_until - 1));
        assert!(partition_expired(
            Grain::Month,
            2024,
            t("2025-01-01T00:00:00Z") + Grain::Month.retention_ms()
        ));
    }

    #[test]
    fn a_partition_expires_only_after_its_last_bucket_did() {
        let g = Grain::Fixed(1_000);
        let last_start = 64_000 - 1_000;
        assert!(!partition_expired(g, 0, last_start + g.retention_ms() - 1));
        assert!(!partition_expired(g, 0, 64_000 + g.retention_ms() - 1));
        assert!(partition_expired(g, 0, 64_000 + g.retention_ms()));
        // Out-of-range arithmetic never expires anything.
        assert!(!partition_expired(g, i64::MAX / 2, i64::MAX));
        assert!(!partition_expired(Grain::Month, i64::MAX, i64::MAX));
    }

    proptest! {
        #[test]
        fn no_needed_bucket_is_ever_in_an_expired_partition(
            start in -4_000_000_000_000i64..4_000_000_000_000,
            gi in 0usize..6,
            age in 0i64..10_000_000_000,
        ) {
            let grain = [Grain::Fixed(100), Grain::Fixed(1_000), Grain::Fixed(60_000),
                Grain::Fixed(3_600_000), Grain::Fixed(86_400_000), Grain::Month][gi];
            let start = grain.bucket_start(start);
            let epoch = epoch_of(grain, start).unwrap();
            let now = start + age;
            if partition_expired(grain, epoch, now) {
                prop_assert!(now >= start + grain.retention_ms());
            }
            // And the bucket is inside its epoch.
            prop_assert!(start < epoch_end(grain, epoch).unwrap());
            prop_assert!(epoch == i64::MIN || start >= epoch_end(grain, epoch - 1).unwrap());
        }
    }

    fn key(tenant: &str, subject: &str, limit: &str, grain: Grain) -> CounterKey {
        CounterKey {
            tenant: tenant.into(),
            subject: subject.into(),
            limit: limit.into(),
            grain,
        }
    }

    #[test]
    fn increments_are_grouped_per_client_and_summed() {
        let a = key("acme", "k1", "l1", Grain::Fixed(1_000));
        let b = key("acme", "k1", "l2", Grain::Month);
        let c = key("acme", "k2", "l1", Grain::Fixed(1_000));
        let d = |k: &CounterKey, start, delta| Delta {
            key: k.clone(),
            start,
            delta,
        };
        let deltas = [
            d(&a, 2_000, 1),
            d(&a, 1_000, 2),
            d(&a, 1_000, 3),
            d(&b, 0, 4),
            d(&c, 1_000, 1),
            d(&c, 2_000, 4),
            d(&c, 2_000, -4), // sums to nothing: not sent
        ];
        let got = group_by_client(&deltas).unwrap();
        let month = Grain::Month.code();
        assert_eq!(
            got,
            vec![
                ClientWrite {
                    tenant: "acme",
                    subject: "k1",
                    rows: vec![
                        (0, "l2", month, 4),
                        (1_000, "l1", 1_000, 5),
                        (2_000, "l1", 1_000, 1)
                    ],
                },
                ClientWrite {
                    tenant: "acme",
                    subject: "k2",
                    rows: vec![(1_000, "l1", 1_000, 1)],
                },
            ]
        );
        let zero = [d(&a, 0, 1), d(&a, 0, -1)];
        assert!(group_by_client(&zero).unwrap().is_empty());
        let over = [d(&a, 0, i64::MAX), d(&a, 0, 1)];
        assert!(group_by_client(&over).is_err());
    }

    #[test]
    fn a_range_names_its_bucket_starts() {
        let g = Grain::Fixed(1_000);
        assert_eq!(starts_in(g, 1_000, 3_000), Some(vec![1_000, 2_000, 3_000]));
        assert_eq!(starts_in(g, 1_001, 3_999), Some(vec![2_000, 3_000]));
        assert_eq!(starts_in(g, 5_000, 4_000), Some(vec![]));
        assert_eq!(starts_in(g, 0, 63_000).map(|v| v.len()), Some(64));
        assert_eq!(starts_in(g, 0, 64_000), None, "too many: read as a span");
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis();
        assert_eq!(
            starts_in(
                Grain::Month,
                t("2026-10-15T00:00:00Z"),
                t("2026-12-01T00:00:00Z")
            ),
            Some(vec![t("2026-11-01T00:00:00Z"), t("2026-12-01T00:00:00Z")])
        );
        // Every window's estimate fits in one list.
        assert!(crate::domain::MAX_BUCKETS_READ as usize <= MAX_STARTS_PER_RANGE);
    }

    #[test]
    fn expired_runs_never_cover_a_needed_row() {
        let s = Grain::Fixed(1_000);
        let r = s.retention_ms();
        let m = Grain::Month.code();
        let now = 100_000 + r;
        // 1..=3 s expired; at 100 s a needed row of the same grain; at 50 s a monthly row
        // (needed far longer) shares its start with an expired one.
        let rows = [
            (1_000, 1_000),
            (2_000, 1_000),
            (3_000, 1_000),
            (50_000, 1_000),
            (50_000, m),
            (60_000, 1_000),
            (100_000, 1_000),
            (100_001, 1_000),
        ];
        assert_eq!(
            expired_runs(&rows, now),
            vec![(1_000, 3_000), (60_000, 100_000)]
        );
        // Unknown grain codes are never expired; a run at the end is closed.
        assert_eq!(expired_runs(&[(1, 0), (2, 1_000)], i64::MAX), vec![(2, 2)]);
        assert!(expired_runs(&[], now).is_empty());
    }

    #[test]
    fn months_are_utc_calendar_months() {
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis();
        assert_eq!(month_of(t("2026-11-30T23:59:59.999Z")), 202611);
        assert_eq!(month_of(t("2026-12-01T00:00:00Z")), 202612);
        assert_eq!(
            month_of(t("2026-12-31T23:00:00-02:00")),
            202701,
            "UTC, not local"
        );
        assert_eq!(month_of(0), 197001);
        assert_eq!(month_of(i64::MIN), 197001, "clamped");
        assert_eq!(month_of(i64::MAX), 999912, "clamped");
        assert_eq!(month_start(202612), Some(t("2026-12-01T00:00:00Z")));
        assert_eq!(month_end(202612), Some(t("2027-01-01T00:00:00Z")));
        assert_eq!(month_end(202402), Some(t("2024-03-01T00:00:00Z")));
        assert_eq!(month_start(202613), None);
        assert_eq!(month_start(202600), None);
        assert_eq!(next_month(202612), 202701);
        assert_eq!(next_month(202601), 202602);
        assert_eq!(
            months_between(202611, 202702),
            [202611, 202612, 202701, 202702]
        );
        assert_eq!(months_spanned(202611, 202702), 4);
        assert_eq!(months_spanned(202611, 202611), 1);
        assert_eq!(months_spanned(202612, 202611), 0);
        assert!(months_between(202612, 202611).is_empty());
        assert_eq!(months_spanned(197001, 999912), (9999 - 1970 + 1) * 12);
        // Every instant lies in its month.
        for ms in [0, t("2024-02-29T12:00:00Z"), LAST_MS] {
            let m = month_of(ms);
            assert!(month_start(m).unwrap() <= ms);
            assert!(month_end(m).is_none_or(|end| ms < end));
        }
    }

    #[test]
    fn policy_parts_are_stable_and_in_range() {
        // Pinned: these values are part of the stored data.
        assert_eq!(policy_part(""), (0x811c_9dc5u32 % 16) as i16);
        assert_eq!(policy_part("a"), (0xe40c_292cu32 % 16) as i16);
        let mut seen = [false; POLICY_PARTS as usize];
        for i in 0..1000 {
            let p = policy_part(&format!("tenant-{i}"));
            assert!((0..POLICY_PARTS).contains(&p));
            seen[p as usize] = true;
        }
        assert!(seen.iter().all(|s| *s), "tenants spread over every part");
    }
}
