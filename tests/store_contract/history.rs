//! Usage history and the audit log: what any store must keep, page and delete.

use super::*;

// ---- usage history and the audit log ----------------------------------------------------------

/// A small deterministic generator (splitmix64): the same traffic on every run and every store.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(crate) fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.below(from.len() as u64) as usize]
    }
}

pub(crate) fn ms(rfc3339: &str) -> i64 {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .timestamp_millis()
}

pub(crate) fn usage(tenant: &str, client: &str, hour: i64, counts: Counts) -> UsageDelta {
    UsageDelta {
        tenant: tenant.into(),
        client: client.into(),
        hour,
        counts,
        cost_returned: 0,
    }
}

pub(crate) fn counts(admitted: u64, cost: u64, denied: u64, denied_by: &[(&str, u64)]) -> Counts {
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

/// Cost given back (reservations settled below their estimate, or released) comes off the
/// client's hour and day, the tenant's, and the client's line in the day's index; in the same
/// call as other clients' figures, or in a later one.
pub async fn history_takes_back_cost_returned(store: &dyn Store) {
    let (tenant, h) = ("hist-r", ms("2023-12-04T10:00:00Z"));
    let day = Step::Day.floor(h);
    let back = |client: &str, n: u64| UsageDelta {
        cost_returned: n,
        ..usage(tenant, client, h, counts(0, 0, 0, &[]))
    };
    store
        .add_usage(&[
            usage(tenant, "a", h, counts(2, 300, 0, &[])),
            usage(tenant, "b", h, counts(1, 100, 1, &[("per-minute", 1)])),
        ])
        .await
        .unwrap();
    // a settled 300 at 120; b's 100 was released, in the call that adds c's checks; d's 50
    // settled at 10 in the call that adds its check, before it.
    store
        .add_usage(&[
            back("a", 180),
            back("d", 40),
            back("b", 100),
            usage(tenant, "c", h, counts(1, 7, 0, &[])),
            usage(tenant, "d", h, counts(1, 50, 0, &[])),
        ])
        .await
        .unwrap();
    for (client, want) in [
        ("a", counts(2, 120, 0, &[])),
        ("b", counts(1, 0, 1, &[("per-minute", 1)])),
        ("d", counts(1, 10, 0, &[])),
    ] {
        for (step, start) in [(Step::Hour, h), (Step::Day, day)] {
            let got = store
                .usage_points(tenant, Some(client), step, start, start + 1)
                .await
                .unwrap();
            let want = vec![UsagePoint {
                start,
                counts: want.clone(),
            }];
            assert_eq!(got, want, "{client} at {step:?}");
        }
    }
    for step in [Step::Hour, Step::Day] {
        let got = store
            .usage_points(tenant, None, step, day, day + DAY_MS)
            .await
            .unwrap();
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            (got[0].counts.admitted, got[0].counts.cost),
            (5, 137),
            "the tenant at {step:?}"
        );
    }
    let seen = sorted_clients(store.clients_seen(tenant, day, day + 1).await.unwrap());
    let costs: Vec<(&str, u64)> = seen.iter().map(|c| (c.client.as_str(), c.cost)).collect();
    assert_eq!(costs, [("a", 120), ("b", 0), ("c", 7), ("d", 10)]);
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
