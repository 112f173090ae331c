//! The store contract: one suite of checks, run against every store.
//!
//! - The embedded store: always, in a temporary directory, plus reopen-the-directory checks
//!   that prove counters, policies, usage history and the audit log survive a restart.
//! - The scylla store: needs a cluster, so its tests are `#[ignore]`d and a plain `cargo test`
//!   lists them as ignored. To run them against a cluster:
//!
//!   ```text
//!   docker compose up -d scylla        # or any Cassandra/ScyllaDB node
//!   QUOTAD_TEST_SCYLLA_NODES=127.0.0.1:9042 cargo test --test store_contract -- --ignored
//!   ```
//!
//!   `QUOTAD_TEST_SCYLLA_NODES` is a comma-separated list of `host:port`; run with `--ignored`
//!   but without it, those tests fail and say so. Each run makes its own keyspace
//!   (`quotad_test_<tag>_<pid>_<time>`), migrates it with the real `quotad migrate` code, runs
//!   the checks and drops the keyspace, also when a check fails.
//!
//! The checks are `async fn(&dyn Store)` (or `Arc<dyn Store>` where they spawn tasks); only
//! `two_instances_share_counts` needs two scylla stores (the embedded store holds one
//! process).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, TimeZone, Utc};
use futures::FutureExt;
use quotad::domain::{ClientId, Grain, TenantId};
use quotad::migrate;
use quotad::store::audit::{AuditCursor, AuditEntry, AuditQuery, AuditStore};
use quotad::store::history::{
    ClientTotal, Counts, HistoryStore, Step, UsageDelta, UsagePoint, DAY_MS, HOUR_MS,
};
use quotad::store::idempotency::{Begun, Remembered};
use quotad::store::lease::{Claim, MAX_SHARDS};
use quotad::store::scylla::{ScyllaOptions, ScyllaStore};
use quotad::store::{
    BucketTotal, CounterKey, CounterRange, CounterStore, Delta, PolicyKey, PolicyStore, Store,
    StoreError,
};
use scylla::client::session_builder::SessionBuilder;

const ENV: &str = "QUOTAD_TEST_SCYLLA_NODES";

/// The cluster's contact points. Only the ignored tests call this, so a run that asked for
/// them (`--ignored`) without naming a cluster fails plainly instead of passing untested.
fn nodes() -> Vec<String> {
    let v = std::env::var(ENV).unwrap_or_default();
    let nodes: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    assert!(
        !nodes.is_empty(),
        "{ENV} is not set: name a Cassandra/ScyllaDB cluster (host:port,...) to run this test"
    );
    nodes
}

fn unique_keyspace(tag: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "quotad_test_{tag}_{}_{}",
        std::process::id(),
        nanos % 1_000_000_000
    )
}

fn key(tenant: &str, subject: &str, limit: &str, grain: Grain) -> CounterKey {
    CounterKey {
        tenant: tenant.into(),
        subject: subject.into(),
        limit: limit.into(),
        grain,
    }
}

fn delta(k: &CounterKey, start: i64, delta: i64) -> Delta {
    Delta {
        key: k.clone(),
        start,
        delta,
    }
}

fn range(k: &CounterKey, from: i64, to: i64) -> CounterRange {
    CounterRange {
        key: k.clone(),
        from,
        to,
    }
}

fn totals(buckets: &[BucketTotal]) -> Vec<(i64, i64)> {
    buckets.iter().map(|b| (b.start, b.total)).collect()
}

fn tenant_key(t: &str) -> PolicyKey {
    PolicyKey {
        tenant: TenantId::parse(t).unwrap(),
        client: None,
    }
}

fn client_key(t: &str, c: &str) -> PolicyKey {
    PolicyKey {
        tenant: TenantId::parse(t).unwrap(),
        client: Some(ClientId::parse(c).unwrap()),
    }
}

/// A moment well inside 2023, so bucket arithmetic is easy to follow.
const T0: i64 = 1_700_000_000_000;

// ---- checks any store must pass -------------------------------------------------------------

pub async fn increments_add_up(store: &dyn Store) {
    let k = key("inc", "k1", "per-second", Grain::Fixed(1_000));
    store
        .increment(&[delta(&k, T0, 2), delta(&k, T0, 3), delta(&k, T0 + 1_000, 1)])
        .await
        .unwrap();
    store.increment(&[delta(&k, T0, 4)]).await.unwrap();
    let got = store.read(&[range(&k, T0, T0 + 1_000)]).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(T0, 9), (T0 + 1_000, 1)]);
    // One writer: all of it is this instance's.
    assert!(got[0].iter().all(|b| b.mine == b.total), "{got:?}");
    // A compensation (strict mode's denied increment) takes hits back.
    store.increment(&[delta(&k, T0, -4)]).await.unwrap();
    let got = store.read(&[range(&k, T0, T0)]).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(T0, 5)]);
    // Counters of other subjects, limits and grains are separate.
    let other = [
        key("inc", "k2", "per-second", Grain::Fixed(1_000)),
        key("inc", "k1", "other", Grain::Fixed(1_000)),
        key("inc", "k1", "per-second", Grain::Fixed(2_000)),
        key("inc2", "k1", "per-second", Grain::Fixed(1_000)),
    ];
    let ranges: Vec<_> = other.iter().map(|k| range(k, T0, T0 + 10_000)).collect();
    let got = store.read(&ranges).await.unwrap();
    assert!(got.iter().all(|r| r.is_empty()), "{got:?}");
}

pub async fn ranges_hold_only_their_buckets_in_order(store: &dyn Store) {
    let g = 60_000;
    let k = key("ranges", "*", "per-hour", Grain::Fixed(g));
    // As many buckets as a counter keeps at once (a store may drop a bucket once a newer one of
    // its counter has outlived its retention), placed to cross a partition (epoch, 64 buckets)
    // boundary on the scylla store.
    let n = Grain::Fixed(g).retention_ms() / g;
    let epoch = 64 * g;
    let base = T0 - T0 % epoch + epoch - n / 2 * g;
    let deltas: Vec<_> = (0..n).map(|i| delta(&k, base + i * g, i + 1)).collect();
    store.increment(&deltas).await.unwrap();
    let got = store
        .read(&[
            range(&k, base + 10 * g, base + 12 * g),
            range(&k, base - 100 * g, base - g),
            range(&k, base, base + (n - 1) * g),
            range(&k, base + 5 * g, base + 4 * g),
        ])
        .await
        .unwrap();
    assert_eq!(got.len(), 4, "one answer per range");
    assert_eq!(
        totals(&got[0]),
        vec![
            (base + 10 * g, 11),
            (base + 11 * g, 12),
            (base + 12 * g, 13)
        ]
    );
    assert!(got[1].is_empty());
    assert_eq!(got[2].len(), n as usize);
    assert!(got[2].windows(2).all(|w| w[0].start < w[1].start));
    assert_eq!(
        got[2].iter().map(|b| b.total).sum::<i64>(),
        (1..=n).sum::<i64>()
    );
    assert!(got[3].is_empty(), "an empty range reads nothing");
    // Bounds are inclusive, and a range between buckets is empty.
    let got = store
        .read(&[
            range(&k, base + 1, base + g - 1),
            range(&k, base + g, base + g),
        ])
        .await
        .unwrap();
    assert!(got[0].is_empty());
    assert_eq!(totals(&got[1]), vec![(base + g, 2)]);
}

pub async fn many_keys_in_one_call(store: &dyn Store) {
    let keys: Vec<_> = (0..300)
        .map(|i| key("many", &format!("client-{i}"), "l", Grain::Fixed(1_000)))
        .collect();
    let deltas: Vec<_> = keys
        .iter()
        .enumerate()
        .flat_map(|(i, k)| [delta(k, T0, i as i64 + 1), delta(k, T0 + 1_000, 1)])
        .collect();
    store.increment(&deltas).await.unwrap();
    let ranges: Vec<_> = keys.iter().map(|k| range(k, T0, T0 + 1_000)).collect();
    let got = store.read(&ranges).await.unwrap();
    for (i, r) in got.iter().enumerate() {
        assert_eq!(
            totals(r),
            vec![(T0, i as i64 + 1), (T0 + 1_000, 1)],
            "key {i}"
        );
    }
}

pub async fn monthly_buckets_count(store: &dyn Store) {
    let k = key("monthly", "k1", "monthly", Grain::Month);
    let t = |y, m| {
        Utc.with_ymd_and_hms(y, m, 1, 0, 0, 0)
            .unwrap()
            .timestamp_millis()
    };
    store
        .increment(&[
            delta(&k, t(2023, 12), 5),
            delta(&k, t(2024, 1), 7),
            delta(&k, t(2024, 1), 1),
        ])
        .await
        .unwrap();
    let got = store
        .read(&[range(&k, t(2023, 12), t(2024, 1))])
        .await
        .unwrap();
    assert_eq!(totals(&got[0]), vec![(t(2023, 12), 5), (t(2024, 1), 8)]);
}

pub async fn policies_round_trip_with_versions(store: &dyn Store) {
    let k = tenant_key("pol-acme");
    let now = Utc.timestamp_millis_opt(T0).unwrap();
    let g0 = store.policies_generation().await.unwrap();
    assert_eq!(store.get_policy(&k).await.unwrap(), None);

    let r1 = store
        .put_policy(&k, r#"{"limits":[1]}"#, now)
        .await
        .unwrap();
    assert_eq!((r1.version, r1.body.as_str()), (1, r#"{"limits":[1]}"#));
    assert_eq!(r1.updated_at, now);
    let g1 = store.policies_generation().await.unwrap();
    assert_ne!(g1, g0, "a create changes the generation");

    let later = Utc.timestamp_millis_opt(T0 + 5_000).unwrap();
    let r2 = store
        .put_policy(&k, r#"{"limits":[2]}"#, later)
        .await
        .unwrap();
    assert_eq!(r2.version, 2);
    let got = store.get_policy(&k).await.unwrap().unwrap();
    assert_eq!(got, r2);
    let g2 = store.policies_generation().await.unwrap();
    assert_ne!(g2, g1, "a replace changes the generation");
    store.get_policy(&k).await.unwrap();
    assert_eq!(
        store.policies_generation().await.unwrap(),
        g2,
        "reads change nothing"
    );

    // A client override lives beside the tenant's policy and survives its deletion.
    let o = client_key("pol-acme", "key-1");
    let ro = store.put_policy(&o, r#"{"over":1}"#, now).await.unwrap();
    assert_eq!(ro.version, 1);
    assert!(store.delete_policy(&k).await.unwrap());
    let g3 = store.policies_generation().await.unwrap();
    assert_ne!(g3, g2, "a delete changes the generation");
    assert!(
        !store.delete_policy(&k).await.unwrap(),
        "second delete finds nothing"
    );
    assert_eq!(store.policies_generation().await.unwrap(), g3);
    assert_eq!(store.get_policy(&k).await.unwrap(), None);
    assert_eq!(store.get_policy(&o).await.unwrap(), Some(ro));
    // Re-created after a delete: a new policy, version 1.
    let again = store.put_policy(&k, "{}", now).await.unwrap();
    assert_eq!(again.version, 1);
    let all = store.load_policies().await.unwrap();
    assert!(all.iter().any(|r| r.key == k));
    assert!(all.iter().any(|r| r.key == o));
}

pub async fn policies_list_in_pages(store: &dyn Store) {
    let now = Utc.timestamp_millis_opt(T0).unwrap();
    let mut mine: Vec<String> = (0..25).map(|i| format!("list-{i:02}")).collect();
    for t in &mine {
        store.put_policy(&tenant_key(t), "{}", now).await.unwrap();
    }
    // Overrides are never listed.
    store
        .put_policy(&client_key("list-03", "c"), "{}", now)
        .await
        .unwrap();
    let mut seen = Vec::new();
    let mut after: Option<TenantId> = None;
    loop {
        let page = store.list_policies(after.as_ref(), 10).await.unwrap();
        assert!(page.len() <= 10);
        assert!(page.iter().all(|r| r.key.client.is_none()));
        if page.is_empty() {
            break;
        }
        after = Some(page.last().unwrap().key.tenant.clone());
        seen.extend(page.into_iter().map(|r| r.key.tenant.to_string()));
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(seen, sorted, "pages are in tenant order without repeats");
    seen.retain(|t| t.starts_with("list-"));
    mine.sort();
    assert_eq!(seen, mine);
    assert!(store.list_policies(None, 0).await.unwrap().is_empty());
}

/// Many tasks at once increment one bucket and read it back. Totals must be exact (no lost
/// update), every read must see the reader's own increments, and the last reads must see
/// everyone's. With `one_step` (a store whose `increment_and_read` is one step, as the
/// embedded store's is), no two calls may see the same total: each saw exactly the
/// increments before its own, so the totals seen are exactly 1..=N.
pub async fn racing_writers_count_exactly(store: Arc<dyn Store>, one_step: bool) {
    const TASKS: usize = 16;
    const ROUNDS: usize = 25;
    const N: i64 = (TASKS * ROUNDS) as i64;
    let inc = key("race", "increment", "l", Grain::Fixed(1_000));
    let both = key("race", "increment-and-read", "l", Grain::Fixed(1_000));

    // Plain increments raced with reads of the same bucket.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (store, k) = (store.clone(), inc.clone());
        tasks.spawn(async move {
            for round in 1..=ROUNDS as i64 {
                store.increment(&[delta(&k, T0, 1)]).await.unwrap();
                let got = store.read(&[range(&k, T0, T0)]).await.unwrap();
                let total = got[0][0].total;
                assert!(
                    (round..=N).contains(&total),
                    "read {total} after {round} own"
                );
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    let got = store.read(&[range(&inc, T0, T0)]).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(T0, N)], "no increment is lost");

    // increment_and_read raced with itself.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let (store, k) = (store.clone(), both.clone());
        tasks.spawn(async move {
            let mut seen = Vec::with_capacity(ROUNDS);
            for _ in 0..ROUNDS {
                let got = store
                    .increment_and_read(&[delta(&k, T0, 1)], &[range(&k, T0, T0)])
                    .await
                    .unwrap();
                seen.push(got[0][0].total);
            }
            seen
        });
    }
    let mut all = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let seen = done.unwrap();
        // Each call sees its own increment and every earlier one of its task.
        assert!(seen[0] >= 1, "{seen:?}");
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        all.extend(seen);
    }
    all.sort_unstable();
    assert!(all.iter().all(|t| (1..=N).contains(t)), "{all:?}");
    assert_eq!(all.last(), Some(&N), "the last call sees every increment");
    if one_step {
        let repeats: Vec<i64> = all
            .windows(2)
            .filter(|w| w[0] == w[1])
            .map(|w| w[0])
            .collect();
        assert!(
            repeats.is_empty() && all.len() == N as usize,
            "each call must see exactly the increments before its own; totals seen twice: \
             {repeats:?}"
        );
    }
    let got = store.read(&[range(&both, T0, T0)]).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(T0, N)]);
}

/// Runs last: the janitor sweeps everything the other checks wrote.
pub async fn delete_expired_removes_only_expired_buckets(store: &dyn Store) {
    let grain = Grain::Fixed(1_000);
    let k = key("expiry", "k1", "per-10s", grain);
    let old = T0 - T0 % 1_000;
    let young = old + 500 * 1_000;
    store
        .increment(&[delta(&k, old, 3), delta(&k, young, 4)])
        .await
        .unwrap();
    // `old` is long past retention; `young` is still needed.
    let now = young + 1_000;
    assert!(now < young + grain.retention_ms());
    let mut rounds = 0;
    while store.delete_expired(now, 2).await.unwrap() > 0 {
        rounds += 1;
        assert!(rounds < 10_000, "delete_expired never reaches 0");
    }
    // A sweep may end at the end of its cursor's lap: one more pass must find nothing left.
    while store.delete_expired(now, 2).await.unwrap() > 0 {}
    let got = store
        .read(&[range(&k, old, old), range(&k, young, young)])
        .await
        .unwrap();
    assert!(got[0].is_empty(), "the expired bucket is gone: {got:?}");
    assert_eq!(totals(&got[1]), vec![(young, 4)]);
    assert_eq!(store.delete_expired(now, 0).await.unwrap(), 0);
}

// ---- usage history and the audit log ----------------------------------------------------------

/// A small deterministic generator (splitmix64): the same traffic on every run and every store.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }
}

fn ms(rfc3339: &str) -> i64 {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .timestamp_millis()
}

fn usage(tenant: &str, client: &str, hour: i64, counts: Counts) -> UsageDelta {
    UsageDelta {
        tenant: tenant.into(),
        client: client.into(),
        hour,
        counts,
    }
}

fn counts(admitted: u64, cost: u64, denied: u64, denied_by: &[(&str, u64)]) -> Counts {
    Counts {
        admitted,
        cost,
        denied,
        denied_by: denied_by.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
    }
}

/// What a store must hold after some `add_usage` calls, kept exactly.
#[derive(Default)]
struct UsageModel {
    /// (tenant, subject (`*`: the tenant's totals), step, start) -> figures.
    points: BTreeMap<(String, String, Step, i64), Counts>,
    /// (tenant, day, client) -> [admitted, cost, denied].
    lines: BTreeMap<(String, i64, String), [u64; 3]>,
}

impl UsageModel {
    fn add(&mut self, d: &UsageDelta) {
        // A figure of 0 adds nothing, and a delta of zeros makes no point at all.
        let mut c = d.counts.clone();
        c.denied_by.retain(|_, n| *n != 0);
        if c.is_empty() && c.denied_by.is_empty() {
            return;
        }
        let day = Step::Day.floor(d.hour);
        for subject in [d.client.as_str(), "*"] {
            for (step, start) in [(Step::Hour, d.hour), (Step::Day, day)] {
                self.points
                    .entry((d.tenant.clone(), subject.to_owned(), step, start))
                    .or_default()
                    .add(&c);
            }
        }
        let line = self
            .lines
            .entry((d.tenant.clone(), day, d.client.clone()))
            .or_default();
        line[0] += c.admitted;
        line[1] += c.cost;
        line[2] += c.denied;
    }

    fn points(
        &self,
        tenant: &str,
        client: Option<&str>,
        step: Step,
        from: i64,
        to: i64,
    ) -> Vec<UsagePoint> {
        let subject = client.unwrap_or("*");
        self.points
            .iter()
            .filter(|((t, s, st, start), _)| {
                t == tenant && s == subject && *st == step && (from..to).contains(start)
            })
            .map(|((_, _, _, start), c)| UsagePoint {
                start: *start,
                counts: c.clone(),
            })
            .collect()
    }

    /// By client, as [`sorted_clients`] puts a store's answer.
    fn clients_seen(&self, tenant: &str, from: i64, to: i64) -> Vec<ClientTotal> {
        let mut sums: BTreeMap<&str, [u64; 3]> = BTreeMap::new();
        for ((t, day, client), v) in &self.lines {
            if t == tenant && (from..to).contains(day) {
                let s = sums.entry(client).or_default();
                for i in 0..3 {
                    s[i] += v[i];
                }
            }
        }
        sums.into_iter()
            .map(|(client, [admitted, cost, denied])| ClientTotal {
                client: client.to_owned(),
                admitted,
                cost,
                denied,
            })
            .collect()
    }
}

fn sorted_clients(mut v: Vec<ClientTotal>) -> Vec<ClientTotal> {
    v.sort_by(|a, b| a.client.cmp(&b.client));
    v
}

/// A simulated day of traffic, sent as sync rounds would send it, then compared with an exact
/// model point by point: every client's hours and days, the tenants' totals, the clients seen.
/// 27 hours from 2023-11-30T00:00Z: crosses a day and a month (a partition on the scylla store).
pub async fn history_adds_up_point_by_point(store: &dyn Store) {
    const TENANTS: [&str; 2] = ["hist-a", "hist-b"];
    // Any id character may appear, ':' included (the scylla store's field separator).
    const CLIENTS: [&str; 5] = ["c1", "c2", "c3", "app:7@eu", "k.v~x_1"];
    const LIMITS: [&str; 4] = ["per-minute", "per-day", "burst:1", "org.q~2"];
    const QUIET: &str = "c-quiet";
    let start = ms("2023-11-30T00:00:00Z");
    let hours = 27;
    let end = start + hours * HOUR_MS;
    let mut rng = Rng(2023);
    let mut model = UsageModel::default();
    // A round every 10 minutes, as a sync task's; each sends what its clients did since the
    // last, so one (tenant, client, hour) is spread over many calls.
    for round in 0..hours * 6 {
        let hour = start + (round / 6) * HOUR_MS;
        let mut call = Vec::new();
        for _ in 0..1 + rng.below(8) {
            // Now and then a hit of the previous hour arrives late.
            let h = if hour > start && rng.below(10) == 0 {
                hour - HOUR_MS
            } else {
                hour
            };
            let admitted = rng.below(40);
            let denied = if rng.below(3) == 0 {
                1 + rng.below(5)
            } else {
                0
            };
            let admitted = if admitted + denied == 0 { 1 } else { admitted };
            let mut by: BTreeMap<String, u64> = BTreeMap::new();
            for _ in 0..denied {
                *by.entry(rng.pick(&LIMITS).to_owned()).or_default() += 1;
            }
            let c = Counts {
                admitted,
                cost: admitted * (1 + rng.below(3)),
                denied,
                denied_by: by,
            };
            call.push(usage(rng.pick(&TENANTS), rng.pick(&CLIENTS), h, c));
        }
        // The same key twice in one call adds up too.
        if rng.below(5) == 0 {
            let mut again = call[0].clone();
            again.counts = counts(2, 3, 1, &[("per-day", 1)]);
            call.push(again);
        }
        // A client answered nothing: a delta of zeros makes no point and no line.
        if round % 17 == 0 {
            call.push(usage(
                TENANTS[0],
                QUIET,
                hour,
                counts(0, 0, 0, &[("per-minute", 0)]),
            ));
        }
        for d in &call {
            model.add(d);
        }
        store.add_usage(&call).await.unwrap();
    }
    store.add_usage(&[]).await.unwrap();

    let day0 = Step::Day.floor(start);
    for tenant in TENANTS.into_iter().chain(["hist-none"]) {
        let subjects = CLIENTS.iter().chain(&[QUIET]).map(|c| Some(*c));
        for client in subjects.chain([None]) {
            for (step, from, to) in [
                (Step::Hour, start, end),
                (Step::Day, day0 - DAY_MS, end + DAY_MS),
                (Step::Hour, start - DAY_MS, start + 2 * DAY_MS),
            ] {
                let got = store
                    .usage_points(tenant, client, step, from, to)
                    .await
                    .unwrap();
                let want = model.points(tenant, client, step, from, to);
                assert_eq!(got, want, "{tenant} {client:?} {step:?} [{from}, {to})");
                if tenant != "hist-none" && client != Some(QUIET) {
                    assert!(
                        !want.is_empty(),
                        "{tenant} {client:?}: the traffic reached it"
                    );
                }
            }
        }
        assert!(store
            .usage_points(tenant, Some(QUIET), Step::Day, 0, i64::MAX)
            .await
            .unwrap()
            .is_empty());
        for (from, to) in [
            (day0, day0 + DAY_MS),
            (day0, day0 + 2 * DAY_MS),
            (day0 + 1, end + DAY_MS), // days that *start* in the range: only the second
            (day0 + DAY_MS, day0 + DAY_MS + 1),
            (day0, day0),
            (0, i64::MAX),
        ] {
            let got = sorted_clients(store.clients_seen(tenant, from, to).await.unwrap());
            assert_eq!(
                got,
                model.clients_seen(tenant, from, to),
                "{tenant} [{from}, {to})"
            );
        }
    }

    // [from, to) holds its `from` and never its `to`.
    let h = start + 5 * HOUR_MS;
    let one = model.points(TENANTS[0], None, Step::Hour, h, h + 1);
    assert_eq!(one.len(), 1);
    assert_eq!(
        store
            .usage_points(TENANTS[0], None, Step::Hour, h, h + 1)
            .await
            .unwrap(),
        one
    );
    let before_h = store
        .usage_points(TENANTS[0], None, Step::Hour, start, h)
        .await
        .unwrap();
    assert_eq!(before_h.len(), 5);
    assert!(before_h.iter().all(|p| p.start < h));
    assert!(store
        .usage_points(TENANTS[0], None, Step::Hour, h, h)
        .await
        .unwrap()
        .is_empty());
    assert!(store
        .usage_points(TENANTS[0], None, Step::Day, day0 + 1, day0 + DAY_MS)
        .await
        .unwrap()
        .is_empty());
    // The totals add up over the clients.
    let all: u64 = model
        .points(TENANTS[1], None, Step::Day, day0, end)
        .iter()
        .map(|p| p.counts.admitted)
        .sum();
    let by_client: u64 = model
        .clients_seen(TENANTS[1], day0, end)
        .iter()
        .map(|c| c.admitted)
        .sum();
    assert_eq!(all, by_client);
}

fn audit_entry(at: i64, id: &str, tenant: &str, n: u64) -> AuditEntry {
    AuditEntry {
        at: Utc.timestamp_millis_opt(at).unwrap(),
        id: id.into(),
        actor: format!("token-{}", n % 3),
        role: if n % 2 == 0 { "admin" } else { "tenant_admin" }.into(),
        action: ["quota.put", "quota.delete", "override.put"][(n % 3) as usize].into(),
        tenant: tenant.into(),
        client: (n % 3 == 2).then(|| format!("client-{n}")),
        version_before: (n % 4 != 0).then_some(n),
        version_after: (n % 3 != 1).then_some(n + 1),
        body_before: (n % 4 != 0).then(|| format!("{{\"limits\":[{n}],\"note\":\"it's\"}}")),
        body_after: (n % 3 != 1).then(|| "x".repeat(n as usize * 7)),
        request_id: format!("req-{n}"),
    }
}

/// Every page of a query, following the cursors; checks page sizes on the way: every page
/// but the last is full.
async fn all_pages(
    store: &dyn Store,
    tenant: Option<&str>,
    from: i64,
    to: i64,
    limit: usize,
) -> Vec<AuditEntry> {
    let mut out: Vec<AuditEntry> = Vec::new();
    let mut before: Option<AuditCursor> = None;
    let mut sizes = Vec::new();
    loop {
        let page = store
            .audit_page(&AuditQuery {
                tenant: tenant.map(str::to_owned),
                from,
                to,
                before: before.clone(),
                limit,
            })
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(sizes.len() < 10_000, "paging never ends");
        sizes.push(page.len());
        before = Some(page.last().unwrap().cursor());
        out.extend(page);
    }
    if let Some((_, full)) = sizes.split_last() {
        assert!(
            full.iter().all(|n| *n == limit),
            "short page before the end: {sizes:?}"
        );
    }
    out
}

/// Entries of two tenants over five days across a month end, several in one millisecond,
/// paged through one tenant and through all, against the expected order: `at` then `id`,
/// both descending, within `[from, to)`, without repeats or gaps across pages.
pub async fn audit_pages_newest_first(store: &dyn Store) {
    let start = ms("2023-10-29T00:00:00Z");
    let mut rng = Rng(77);
    let mut all = Vec::new();
    let mut t = start;
    for i in 0..40u64 {
        t += 1 + rng.below(3 * HOUR_MS as u64) as i64;
        // Up to three entries in the same millisecond, ids out of insertion order.
        for (j, tag) in ["k", "b", "x"]
            .iter()
            .enumerate()
            .take(1 + rng.below(3) as usize)
        {
            let tenant = if rng.below(2) == 0 { "aud-a" } else { "aud-b" };
            all.push(audit_entry(
                t,
                &format!("{tag}{i:03}"),
                tenant,
                i * 3 + j as u64,
            ));
        }
    }
    let end = t + 1;
    for e in &all {
        store.append_audit(e).await.unwrap();
    }
    let mut newest_first = all.clone();
    newest_first.sort_by_key(|e| std::cmp::Reverse(e.cursor()));
    let expect = |tenant: Option<&str>, from: i64, to: i64| -> Vec<AuditEntry> {
        newest_first
            .iter()
            .filter(|e| tenant.is_none_or(|t| e.tenant == t))
            .filter(|e| (from..to).contains(&e.at.timestamp_millis()))
            .cloned()
            .collect()
    };
    for (tenant, limit) in [
        (Some("aud-a"), 7),
        (Some("aud-b"), 1),
        (None, 5),
        (None, 1_000),
    ] {
        let got = all_pages(store, tenant, start, end, limit).await;
        assert_eq!(got, expect(tenant, start, end), "{tenant:?} by {limit}");
    }
    assert!(all_pages(store, Some("aud-none"), start, end, 10)
        .await
        .is_empty());
    // Bounds on entries that share a millisecond: `from` takes all of its millisecond, `to`
    // none of its.
    let shared: Vec<i64> = all
        .windows(2)
        .filter(|w| w[0].at == w[1].at)
        .map(|w| w[0].at.timestamp_millis())
        .collect();
    assert!(shared.len() >= 2, "the generator makes shared milliseconds");
    let (from, to) = (shared[0], *shared.last().unwrap());
    for (tenant, limit) in [(None, 4), (Some("aud-a"), 2)] {
        let got = all_pages(store, tenant, from, to, limit).await;
        assert_eq!(got, expect(tenant, from, to), "{tenant:?} [{from}, {to})");
        assert!(got.iter().all(|e| e.at.timestamp_millis() != to));
    }
    assert!(all_pages(store, None, to, to, 3).await.is_empty());
    // A cursor at or after `to` bounds nothing more; a cursor before `from` leaves nothing.
    let first = |before: Option<AuditCursor>, limit| AuditQuery {
        tenant: None,
        from: start,
        to: end,
        before,
        limit,
    };
    let later = AuditCursor {
        at_ms: end + 5,
        id: "z".into(),
    };
    assert_eq!(
        store.audit_page(&first(Some(later), 3)).await.unwrap(),
        expect(None, start, end)[..3]
    );
    let earlier = AuditCursor {
        at_ms: start,
        id: "a".into(),
    };
    assert!(store
        .audit_page(&first(Some(earlier), 3))
        .await
        .unwrap()
        .is_empty());
    assert!(store.audit_page(&first(None, 0)).await.unwrap().is_empty());
    // Appending an entry again changes nothing.
    store.append_audit(&all[0]).await.unwrap();
    assert_eq!(
        all_pages(store, None, start, end, 50).await,
        expect(None, start, end)
    );
}

/// History and audit entries in an old month and a recent one: deleting what ended before a
/// moment between them removes the old (whole days on the embedded store, whole months on the
/// scylla store: the old month ended well before `before`) and keeps the recent.
pub async fn old_history_and_audit_are_deleted(store: &dyn Store) {
    let old = ms("2021-03-10T05:00:00Z");
    let recent = ms("2021-06-10T05:00:00Z");
    let before = ms("2021-05-01T00:00:00Z");
    let c = |n| counts(n, 2 * n, 1, &[("per-day", 1)]);
    store
        .add_usage(&[
            usage("ret-a", "c1", old, c(3)),
            usage("ret-a", "c2", old, c(4)),
            usage("ret-a", "c1", old + HOUR_MS, c(5)),
            usage("ret-a", "c3", old + 2 * DAY_MS, c(1)),
            usage("ret-b", "c1", old, c(6)),
            usage("ret-a", "c1", recent, c(7)),
        ])
        .await
        .unwrap();
    let old_audit = [
        audit_entry(old, "o1", "ret-a", 1),
        audit_entry(old + 1, "o2", "ret-b", 2),
    ];
    let recent_audit = audit_entry(recent, "r1", "ret-a", 3);
    for e in old_audit.iter().chain([&recent_audit]) {
        store.append_audit(e).await.unwrap();
    }

    // A small budget: the janitor gets there over several calls.
    let mut removed = store.delete_history_before(before, 2).await.unwrap();
    assert!(removed > 0, "something old to delete");
    let mut calls = 1;
    loop {
        let n = store.delete_history_before(before, 2).await.unwrap();
        if n == 0 {
            break;
        }
        removed += n;
        calls += 1;
        assert!(calls < 1_000, "delete_history_before never reaches 0");
    }
    assert!(removed >= 3, "{removed}");
    let year = (ms("2021-01-01T00:00:00Z"), ms("2022-01-01T00:00:00Z"));
    for tenant in ["ret-a", "ret-b"] {
        for client in [Some("c1"), Some("c2"), Some("c3"), None] {
            for step in [Step::Hour, Step::Day] {
                let got = store
                    .usage_points(tenant, client, step, year.0, before)
                    .await
                    .unwrap();
                assert!(got.is_empty(), "{tenant} {client:?} {step:?}: {got:?}");
            }
        }
        let seen = store.clients_seen(tenant, year.0, before).await.unwrap();
        assert!(seen.is_empty(), "{tenant}: {seen:?}");
    }
    let kept = store
        .usage_points("ret-a", Some("c1"), Step::Hour, year.0, year.1)
        .await
        .unwrap();
    assert_eq!(
        kept,
        vec![UsagePoint {
            start: recent,
            counts: c(7)
        }]
    );
    let day = Step::Day.floor(recent);
    let kept = store
        .usage_points("ret-a", None, Step::Day, year.0, year.1)
        .await
        .unwrap();
    assert_eq!(
        kept,
        vec![UsagePoint {
            start: day,
            counts: c(7)
        }]
    );
    assert_eq!(
        store.clients_seen("ret-a", year.0, year.1).await.unwrap(),
        vec![ClientTotal {
            client: "c1".into(),
            admitted: 7,
            cost: 14,
            denied: 1
        }]
    );

    let mut removed = store.delete_audit_before(before, 1).await.unwrap();
    assert!(removed > 0, "old entries to delete");
    loop {
        let n = store.delete_audit_before(before, 1).await.unwrap();
        if n == 0 {
            break;
        }
        removed += n;
        assert!(removed < 1_000, "delete_audit_before never reaches 0");
    }
    let page = |tenant: Option<&str>| AuditQuery {
        tenant: tenant.map(str::to_owned),
        from: year.0,
        to: year.1,
        before: None,
        limit: 10,
    };
    assert_eq!(
        store.audit_page(&page(None)).await.unwrap(),
        vec![recent_audit.clone()]
    );
    assert_eq!(
        store.audit_page(&page(Some("ret-a"))).await.unwrap(),
        vec![recent_audit]
    );
    assert!(store
        .audit_page(&page(Some("ret-b")))
        .await
        .unwrap()
        .is_empty());
    // Nothing is left to delete, and nothing after `before` ever is.
    assert_eq!(store.delete_history_before(before, 100).await.unwrap(), 0);
    assert_eq!(store.delete_audit_before(before, 100).await.unwrap(), 0);
    assert_eq!(store.delete_history_before(0, 100).await.unwrap(), 0);
}

/// Leases on write shards: distinct shards for distinct owners, lowest free first, a pin held
/// by another is refused, only the owner renews or releases, an unrenewed lease ends, every
/// claimed shard stays in `used`, and a full shard space says so. Needs a fresh store.
pub async fn leases_hand_out_one_shard_per_instance(store: &dyn Store) {
    let ttl = Duration::from_secs(2);
    let held = |c: Claim| match c {
        Claim::Held(s) => s,
        other => panic!("expected a held shard, got {other:?}"),
    };
    let a = held(store.claim("owner-a", None, None, ttl).await.unwrap());
    let b = held(store.claim("owner-b", None, None, ttl).await.unwrap());
    assert_eq!((a, b), (0, 1), "lowest free shards first");
    assert_eq!(
        store.claim("owner-c", Some(a), None, ttl).await.unwrap(),
        Claim::Taken {
            shard: a,
            owner: "owner-a".into()
        }
    );
    assert!(store.renew(a, "owner-a", ttl).await.unwrap());
    assert!(
        !store.renew(a, "owner-b", ttl).await.unwrap(),
        "not b's lease"
    );
    let members = |r: quotad::store::lease::Roster| {
        r.members
            .into_iter()
            .map(|m| (m.shard, m.owner))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        members(store.roster().await.unwrap()),
        vec![(0, "owner-a".to_owned()), (1, "owner-b".to_owned())]
    );
    // b leaves: its shard is free again, and still summed by reads.
    assert!(!store.release(b, "owner-a").await.unwrap(), "not a's lease");
    assert!(store.release(b, "owner-b").await.unwrap());
    let r = store.roster().await.unwrap();
    assert_eq!(r.used, vec![0, 1]);
    assert_eq!(members(r), vec![(0, "owner-a".to_owned())]);
    assert_eq!(
        store.claim("owner-c", None, None, ttl).await.unwrap(),
        Claim::Held(1)
    );
    assert_eq!(
        store.claim("owner-d", None, Some(7), ttl).await.unwrap(),
        Claim::Held(7),
        "a free preferred shard is taken"
    );
    // Nobody renews: every lease ends, and an ended lease cannot be renewed.
    tokio::time::sleep(ttl + Duration::from_millis(1_500)).await;
    let r = store.roster().await.unwrap();
    assert!(r.members.is_empty(), "{:?}", r.members);
    assert_eq!(r.used, vec![0, 1, 7]);
    assert!(!store.renew(a, "owner-a", ttl).await.unwrap());
}

/// Every shard held: a claim says so. (Embedded only: on a cluster it would leave 256 used
/// shards for every later read of the run to sum.)
async fn a_full_shard_space_refuses_one_more(store: &dyn Store) {
    // Long enough that the first lease outlives the 256 claims on a loaded machine (with 500 ms,
    // a busy CI machine saw shard 0 expire and be claimed again before the last claim).
    let ttl = Duration::from_secs(3);
    for s in 0..MAX_SHARDS {
        let owner = format!("filler-{s}");
        assert_eq!(
            store.claim(&owner, None, None, ttl).await.unwrap(),
            Claim::Held(s)
        );
    }
    assert_eq!(
        store.claim("one-too-many", None, None, ttl).await.unwrap(),
        Claim::Full
    );
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    assert_eq!(
        store.claim("one-too-many", None, None, ttl).await.unwrap(),
        Claim::Held(0),
        "ended leases free their shards"
    );
}

/// Idempotency keys: one claim wins, the others see it with its fingerprint and, once
/// recorded, the response; a freed key can be claimed again; keys are per scope; rows expire.
pub async fn idempotency_keys_claim_once(store: Arc<dyn Store>) {
    let ttl = Duration::from_secs(60);
    let tag = format!("k-{}", std::process::id());
    // Eight racing claims of one key: exactly one goes ahead.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (s, key) = (store.clone(), tag.clone());
        tasks.push(tokio::spawn(async move {
            s.begin_idempotent("acme", &key, &format!("fp{i}"), ttl)
                .await
                .unwrap()
        }));
    }
    let mut claimed = 0;
    let mut seen = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Begun::Claimed => claimed += 1,
            Begun::Seen(r) => seen.push(r),
        }
    }
    assert_eq!(claimed, 1, "one claim wins");
    let winner = seen[0].fingerprint.clone();
    assert!(seen
        .iter()
        .all(|r| r.fingerprint == winner && r.response.is_none()));
    // Another fingerprint cannot record or free it.
    store
        .finish_idempotent("acme", &tag, "intruder", "{}", ttl)
        .await
        .unwrap();
    store
        .abandon_idempotent("acme", &tag, "intruder")
        .await
        .unwrap();
    store
        .finish_idempotent("acme", &tag, &winner, r#"{"ok":1}"#, ttl)
        .await
        .unwrap();
    assert_eq!(
        store
            .begin_idempotent("acme", &tag, "again", ttl)
            .await
            .unwrap(),
        Begun::Seen(Remembered {
            fingerprint: winner.clone(),
            response: Some(r#"{"ok":1}"#.into())
        })
    );
    // A recorded key is not freed; another scope has its own keys.
    store
        .abandon_idempotent("acme", &tag, &winner)
        .await
        .unwrap();
    assert!(matches!(
        store
            .begin_idempotent("acme", &tag, "x", ttl)
            .await
            .unwrap(),
        Begun::Seen(_)
    ));
    assert_eq!(
        store
            .begin_idempotent("globex", &tag, "x", ttl)
            .await
            .unwrap(),
        Begun::Claimed
    );
    // A claim freed before its response can be taken by a retry.
    let freed = format!("{tag}-freed");
    assert_eq!(
        store
            .begin_idempotent("acme", &freed, "a", ttl)
            .await
            .unwrap(),
        Begun::Claimed
    );
    store.abandon_idempotent("acme", &freed, "a").await.unwrap();
    assert_eq!(
        store
            .begin_idempotent("acme", &freed, "b", ttl)
            .await
            .unwrap(),
        Begun::Claimed
    );
    // Keys live for their TTL only.
    let short = format!("{tag}-short");
    let brief = Duration::from_secs(1);
    assert_eq!(
        store
            .begin_idempotent("acme", &short, "a", brief)
            .await
            .unwrap(),
        Begun::Claimed
    );
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    assert_eq!(
        store
            .begin_idempotent("acme", &short, "b", brief)
            .await
            .unwrap(),
        Begun::Claimed,
        "an expired key is free"
    );
}

/// A tenant's overrides list by client, a page at a time, and no other tenant's.
pub async fn overrides_list_by_tenant(store: &dyn Store) {
    let now = Utc::now();
    for c in ["c3", "c1", "c2"] {
        store
            .put_policy(&client_key("ovl", c), "{}", now)
            .await
            .unwrap();
    }
    store
        .put_policy(&client_key("ovl-other", "c0"), "{}", now)
        .await
        .unwrap();
    store
        .put_policy(&tenant_key("ovl"), "{}", now)
        .await
        .unwrap();
    let t = TenantId::parse("ovl").unwrap();
    let names = |v: Vec<quotad::store::PolicyRecord>| -> Vec<String> {
        v.iter()
            .map(|r| r.key.client.as_ref().unwrap().to_string())
            .collect()
    };
    let first = store.list_overrides(&t, None, 2).await.unwrap();
    assert_eq!(names(first), ["c1", "c2"]);
    let after = ClientId::parse("c2").unwrap();
    let rest = store.list_overrides(&t, Some(&after), 2).await.unwrap();
    assert_eq!(names(rest), ["c3"]);
    let none = TenantId::parse("ovl-none").unwrap();
    assert!(store
        .list_overrides(&none, None, 10)
        .await
        .unwrap()
        .is_empty());
}

/// A grant's credit: a bucket's total goes below zero and reads back so.
pub async fn totals_may_go_below_zero(store: &dyn Store) {
    let k = key("credit", "k1", "l", Grain::Fixed(1_000));
    store.increment(&[delta(&k, T0, 3)]).await.unwrap();
    store.increment(&[delta(&k, T0, -10)]).await.unwrap();
    let r = store.read(&[range(&k, T0, T0)]).await.unwrap();
    assert_eq!(totals(&r[0]), vec![(T0, -7)]);
}

/// Claims a shard for `owner` and makes it the store's write shard, as the fleet task does.
async fn join(store: &dyn Store, owner: &str) -> i16 {
    let Claim::Held(shard) = store
        .claim(owner, None, None, Duration::from_secs(60))
        .await
        .unwrap()
    else {
        panic!("no shard for {owner}")
    };
    let roster = store.roster().await.unwrap();
    store.adopt(Some(shard), &roster.used);
    shard
}

// ---- scylla-specific -------------------------------------------------------------------------

async fn two_instances_share_counts(a: &dyn Store, b: &dyn Store) {
    let k = key("shared", "k1", "l", Grain::Fixed(1_000));
    a.increment(&[delta(&k, T0, 3)]).await.unwrap();
    b.increment(&[delta(&k, T0, 4)]).await.unwrap();
    let ra = a.read(&[range(&k, T0, T0)]).await.unwrap();
    let rb = b.read(&[range(&k, T0, T0)]).await.unwrap();
    assert_eq!(
        ra[0],
        vec![BucketTotal {
            start: T0,
            total: 7,
            mine: 3
        }]
    );
    assert_eq!(
        rb[0],
        vec![BucketTotal {
            start: T0,
            total: 7,
            mine: 4
        }]
    );
}

async fn drop_keyspace(nodes: &[String], ks: &str) {
    // `ks` comes from unique_keyspace(): a plain identifier.
    match SessionBuilder::new().known_nodes(nodes).build().await {
        Ok(s) => {
            if let Err(e) = s
                .query_unpaged(format!("DROP KEYSPACE IF EXISTS {ks}"), ())
                .await
            {
                eprintln!("could not drop keyspace {ks}: {e}");
            }
        }
        Err(e) => eprintln!("could not drop keyspace {ks}: {e}"),
    }
}

async fn keyspace_exists(nodes: &[String], ks: &str) -> bool {
    let s = SessionBuilder::new()
        .known_nodes(nodes)
        .build()
        .await
        .unwrap();
    let rows = s
        .query_unpaged(
            "SELECT keyspace_name FROM system_schema.keyspaces WHERE keyspace_name = ?",
            (ks,),
        )
        .await
        .unwrap()
        .into_rows_result()
        .unwrap();
    rows.rows_num() > 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster: set QUOTAD_TEST_SCYLLA_NODES=host:port and run with --ignored"]
async fn scylla_store_passes_the_contract() {
    let nodes = nodes();
    let ks = unique_keyspace("c");
    let opts = ScyllaOptions {
        nodes: nodes.clone(),
        keyspace: ks.clone(),
        ..ScyllaOptions::default()
    };
    let run = async {
        let mut out = Vec::new();
        let report = migrate::run(&opts, false, &mut out).await.unwrap();
        let log = String::from_utf8_lossy(&out).to_string();
        assert!(report.keyspace_created, "{log}");
        let all: Vec<u32> = migrate::migrations()
            .unwrap()
            .iter()
            .map(|m| m.version)
            .collect();
        assert_eq!(report.applied, all, "{log}");
        // Idempotent: a second run applies nothing, and neither does a dry run.
        let again = migrate::run(&opts, false, &mut Vec::new()).await.unwrap();
        assert!(again.applied.is_empty() && !again.keyspace_created);
        assert_eq!(again.already_applied, all);
        let dry = migrate::run(&opts, true, &mut Vec::new()).await.unwrap();
        assert!(dry.applied.is_empty());

        let a: Arc<dyn Store> = Arc::new(ScyllaStore::connect(opts.clone()).await.unwrap());
        let b = ScyllaStore::connect(opts.clone()).await.unwrap();
        assert_eq!(a.kind(), "scylla");
        a.ping().await.unwrap();
        leases_hand_out_one_shard_per_instance(&*a).await;
        // Without a lease nothing is written: the hits stay with the caller.
        let k = key("no-lease", "k1", "l", Grain::Fixed(1_000));
        match a.increment(&[delta(&k, T0, 1)]).await {
            Err(StoreError::Unavailable(m)) => assert!(m.contains("lease"), "{m}"),
            other => panic!("an increment without a lease: {other:?}"),
        }
        let sa = join(&*a, "instance-a").await;
        let sb = join(&b, "instance-b").await;
        assert_ne!(sa, sb);
        // a joined before b: it learns of b's shard at its next heartbeat, as here.
        a.adopt(Some(sa), &a.roster().await.unwrap().used);

        increments_add_up(&*a).await;
        ranges_hold_only_their_buckets_in_order(&*a).await;
        many_keys_in_one_call(&*a).await;
        monthly_buckets_count(&*a).await;
        policies_round_trip_with_versions(&*a).await;
        policies_list_in_pages(&*a).await;
        history_adds_up_point_by_point(&*a).await;
        audit_pages_newest_first(&*a).await;
        old_history_and_audit_are_deleted(&*a).await;
        racing_writers_count_exactly(a.clone(), false).await;
        totals_may_go_below_zero(&*a).await;
        overrides_list_by_tenant(&*a).await;
        idempotency_keys_claim_once(a.clone()).await;
        two_instances_share_counts(&*a, &b).await;
        // A change made through one instance is seen by the other.
        let g = b.policies_generation().await.unwrap();
        a.put_policy(&tenant_key("seen-by-b"), "{}", Utc::now())
            .await
            .unwrap();
        assert_ne!(b.policies_generation().await.unwrap(), g);
        assert!(b
            .get_policy(&tenant_key("seen-by-b"))
            .await
            .unwrap()
            .is_some());
        delete_expired_removes_only_expired_buckets(&*a).await;
    };
    let result = std::panic::AssertUnwindSafe(run).catch_unwind().await;
    drop_keyspace(&nodes, &ks).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a Cassandra/ScyllaDB cluster: set QUOTAD_TEST_SCYLLA_NODES=host:port and run with --ignored"]
async fn migrate_dry_run_writes_nothing_and_an_unmigrated_keyspace_is_refused() {
    let nodes = nodes();
    let ks = unique_keyspace("d");
    let opts = ScyllaOptions {
        nodes: nodes.clone(),
        keyspace: ks.clone(),
        ..ScyllaOptions::default()
    };
    let mut out = Vec::new();
    let report = migrate::run(&opts, true, &mut out).await.unwrap();
    let log = String::from_utf8_lossy(&out).to_string();
    assert!(report.dry_run && report.keyspace_created, "{log}");
    assert!(log.contains("would create keyspace"), "{log}");
    assert!(log.contains("0001_counters.cql"), "{log}");
    assert!(
        !keyspace_exists(&nodes, &ks).await,
        "a dry run created the keyspace"
    );
    match ScyllaStore::connect(opts).await {
        Err(StoreError::Internal(m)) => assert!(m.contains("quotad migrate"), "{m}"),
        other => panic!("connecting to a missing keyspace: {other:?}"),
    }
}

// ---- embedded --------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_store_passes_the_contract() {
    let dir = tempfile::tempdir().unwrap();
    let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(store.kind(), "embedded");
    store.ping().await.unwrap();
    leases_hand_out_one_shard_per_instance(&store).await;
    a_full_shard_space_refuses_one_more(&store).await;
    increments_add_up(&store).await;
    ranges_hold_only_their_buckets_in_order(&store).await;
    many_keys_in_one_call(&store).await;
    monthly_buckets_count(&store).await;
    policies_round_trip_with_versions(&store).await;
    policies_list_in_pages(&store).await;
    history_adds_up_point_by_point(&store).await;
    audit_pages_newest_first(&store).await;
    old_history_and_audit_are_deleted(&store).await;
    delete_expired_removes_only_expired_buckets(&store).await;
    totals_may_go_below_zero(&store).await;
    overrides_list_by_tenant(&store).await;
    let store: Arc<dyn Store> = Arc::new(store);
    idempotency_keys_claim_once(store).await;
}

#[tokio::test]
async fn embedded_counters_and_policies_survive_reopening_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let k = key("reopen", "k1", "l", Grain::Fixed(1_000));
    {
        let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
        store.increment(&[delta(&k, T0, 5)]).await.unwrap();
        store
            .put_policy(&tenant_key("reopen"), "{\"limits\": []}", Utc::now())
            .await
            .unwrap();
    }
    let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
    let got = store.read(&[range(&k, T0, T0)]).await.unwrap();
    assert_eq!(totals(&got[0]), vec![(T0, 5)]);
    let p = store
        .get_policy(&tenant_key("reopen"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(p.version, 1);
    assert!(store.policies_generation().await.unwrap() > 0);
}

#[tokio::test]
async fn embedded_history_and_audit_survive_reopening_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let hour = ms("2023-11-14T10:00:00Z");
    let entry = audit_entry(hour + 5, "e1", "reopen", 2);
    {
        let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
        store
            .add_usage(&[usage("reopen", "k1", hour, counts(3, 6, 1, &[("l", 1)]))])
            .await
            .unwrap();
        store.append_audit(&entry).await.unwrap();
    }
    let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
    assert_eq!(
        store
            .usage_points("reopen", None, Step::Hour, hour, hour + HOUR_MS)
            .await
            .unwrap(),
        vec![UsagePoint {
            start: hour,
            counts: counts(3, 6, 1, &[("l", 1)])
        }]
    );
    assert_eq!(
        store
            .clients_seen("reopen", Step::Day.floor(hour), hour + DAY_MS)
            .await
            .unwrap()
            .len(),
        1
    );
    let page = store
        .audit_page(&AuditQuery {
            tenant: Some("reopen".into()),
            from: 0,
            to: i64::MAX,
            before: None,
            limit: 10,
        })
        .await
        .unwrap();
    assert_eq!(page, vec![entry]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn embedded_strict_increment_and_read_is_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let store = quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap();
    let k = key("strict", "k1", "l", Grain::Fixed(1_000));
    let got = store
        .increment_and_read(&[delta(&k, T0, 2)], &[range(&k, T0, T0)])
        .await
        .unwrap();
    assert_eq!(totals(&got[0]), vec![(T0, 2)]);
    racing_writers_count_exactly(Arc::new(store), true).await;
}
