//! Leases on write shards, idempotency keys, overrides and credits.

use super::*;

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

/// How far each instance's writes reached the store: the roster shows a member's last report
/// beside its lease, only the lease holder's, and nothing for a member that has not reported.
/// Needs a fresh store.
pub async fn reports_of_writes_show_with_their_lease(store: &dyn Store) {
    let ttl = Duration::from_secs(30);
    let (Claim::Held(a), Claim::Held(b)) = (
        store.claim("writer-a", None, None, ttl).await.unwrap(),
        store.claim("writer-b", None, None, ttl).await.unwrap(),
    ) else {
        panic!("two free shards");
    };
    let written = |r: quotad::store::lease::Roster| {
        r.members
            .into_iter()
            .map(|m| (m.shard, m.written_ms))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        written(store.roster().await.unwrap()),
        vec![(a, None), (b, None)]
    );
    store
        .report_written(a, "writer-a", 1_700_000_000_123, ttl)
        .await
        .unwrap();
    store
        .report_written(a, "writer-a", 1_700_000_000_456, ttl)
        .await
        .unwrap();
    // A report under another owner's name (one whose lease lapsed) is not b's.
    store
        .report_written(b, "writer-a", 1_700_000_000_999, ttl)
        .await
        .unwrap();
    assert_eq!(
        written(store.roster().await.unwrap()),
        vec![(a, Some(1_700_000_000_456)), (b, None)]
    );
    store
        .report_written(b, "writer-b", 1_700_000_000_777, ttl)
        .await
        .unwrap();
    assert_eq!(
        written(store.roster().await.unwrap()),
        vec![(a, Some(1_700_000_000_456)), (b, Some(1_700_000_000_777))]
    );
    // A lease given back takes its member, and its report, out of the roster.
    assert!(store.release(a, "writer-a").await.unwrap());
    assert_eq!(
        written(store.roster().await.unwrap()),
        vec![(b, Some(1_700_000_000_777))]
    );
}

/// Every shard held: a claim says so. (Embedded only: on a cluster it would leave 256 used
/// shards for every later read of the run to sum.)
pub(crate) async fn a_full_shard_space_refuses_one_more(store: &dyn Store) {
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
pub async fn idempotency_keys_claim_once(store: &Arc<dyn Store>) {
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
pub(crate) async fn join(store: &dyn Store, owner: &str) -> i16 {
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
