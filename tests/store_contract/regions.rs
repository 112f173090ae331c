//! Regions: a slot per region, shards claimed in the region's range, heartbeats every region
//! reads, and reads that tell the region's part of a count.

use super::*;

/// Three instances, two regions: slots handed out once per region, each region's shards in its
/// own range, heartbeats read back, and each read's region part is its region's shards' sum.
pub async fn regions_split_the_shard_space_and_hear_each_other(
    eu: &dyn Store,
    us: &dyn Store,
    us2: &dyn Store,
) {
    let dc = eu.local_region().await.unwrap();
    assert!(dc.as_deref().is_some_and(|d| !d.is_empty()), "{dc:?}");
    assert_eq!(eu.join_region("test-eu").await.unwrap(), 0);
    assert_eq!(us.join_region("test-us").await.unwrap(), 1);
    // Another instance of a region finds the region's slot.
    assert_eq!(us2.join_region("test-us").await.unwrap(), 1);
    assert_eq!(eu.join_region("test-eu").await.unwrap(), 0);

    let ttl = Duration::from_secs(60);
    assert_eq!(
        eu.claim("eu-a", None, None, ttl).await.unwrap(),
        Claim::Held(0)
    );
    assert_eq!(
        us.claim("us-a", None, None, ttl).await.unwrap(),
        Claim::Held(MAX_SHARDS),
        "a region claims in its own range"
    );
    // A pin counts from the region's first shard.
    assert_eq!(
        us2.claim("us-b", Some(3), None, ttl).await.unwrap(),
        Claim::Held(MAX_SHARDS + 3)
    );
    let used = eu.roster().await.unwrap().used;
    assert_eq!(used, vec![0, MAX_SHARDS, MAX_SHARDS + 3]);
    eu.adopt(Some(0), &used);
    us.adopt(Some(MAX_SHARDS), &used);
    us2.adopt(Some(MAX_SHARDS + 3), &used);

    let now = Utc::now().timestamp_millis();
    eu.beat(now).await.unwrap();
    us.beat(now - 5_000).await.unwrap();
    let beats = us2.regions().await.unwrap();
    let got: Vec<(&str, i16, i64)> = beats
        .iter()
        .map(|b| (b.region.as_str(), b.slot, b.at_ms))
        .collect();
    assert_eq!(got, [("test-eu", 0, now), ("test-us", 1, now - 5_000)]);

    let k = key("regions", "k1", "l", Grain::Fixed(1_000));
    eu.increment(&[delta(&k, T0, 2)]).await.unwrap();
    us.increment(&[delta(&k, T0, 3)]).await.unwrap();
    us2.increment(&[delta(&k, T0, 4)]).await.unwrap();
    let mut parts = Vec::new();
    for s in [eu, us, us2] {
        let t = s.read(&[range(&k, T0, T0)]).await.unwrap()[0][0];
        parts.push((t.total, t.mine, t.region));
    }
    assert_eq!(parts, [(9, 2, 2), (9, 3, 7), (9, 4, 7)]);
}

/// The embedded store is one process in one region: nothing to join, nothing to hear.
pub async fn a_store_without_regions_is_one(store: &dyn Store) {
    assert_eq!(store.local_region().await.unwrap(), None);
    assert_eq!(store.join_region("anything").await.unwrap(), 0);
    store.beat(0).await.unwrap();
    assert!(store.regions().await.unwrap().is_empty());
}
