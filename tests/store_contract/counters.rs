//! Counters and policies: what any store must do with them.

use super::*;

// ---- checks any store must pass -------------------------------------------------------------

/// The clock a fleet cuts its buckets on: none where one process owns the store (the
/// embedded store), the store's own where a fleet shares it, which on one machine agrees with
/// the local clock within a second.
pub async fn the_clock_is_the_stores_own(store: &dyn Store) {
    let ms = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    let before = ms(SystemTime::now());
    let read = store.clock_ms().await.unwrap();
    let after = ms(SystemTime::now());
    if store.kind() == "embedded" {
        assert_eq!(read, None);
        return;
    }
    let read = read.expect("a shared store has a clock");
    assert!(
        (before - 1_000..=after + 1_000).contains(&read),
        "{before} <= {read} <= {after}, within a second"
    );
}

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
pub async fn racing_writers_count_exactly(store: &Arc<dyn Store>, one_step: bool) {
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

/// The janitor sweeps the whole store; each case has a store of its own, so no other case's
/// counters are swept with these.
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
