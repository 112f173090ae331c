//! The fleet task against a real embedded store (and a failing one).

use super::*;
use crate::store::embedded::EmbeddedStore;
use crate::store::faulty::{Fault, FaultyStore};
use crate::store::DynStore;

fn cfg(pin: Option<i16>) -> FleetConfig {
    FleetConfig {
        heartbeat: Duration::from_millis(100),
        lease_ttl: Duration::from_millis(1_000),
        region_heartbeat: Duration::from_millis(100),
        region_stale: Duration::from_millis(400),
        heal_grace: Duration::from_millis(500),
        pin,
        timeout: Duration::from_secs(2),
    }
}

fn embedded() -> (tempfile::TempDir, DynStore) {
    let dir = tempfile::tempdir().unwrap();
    let store: DynStore = Arc::new(EmbeddedStore::open(dir.path()).unwrap());
    (dir, store)
}

async fn join(store: &DynStore, pin: Option<i16>) -> (Fleet, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::new(false));
    let f = Fleet::join(store.clone(), cfg(pin), metrics.clone())
        .await
        .unwrap();
    (f, metrics)
}

fn metric(m: &Metrics, name: &str) -> f64 {
    m.render()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name}"))
}

#[tokio::test]
async fn instances_take_distinct_shards_and_n_follows_joins_and_leaves() {
    let (_dir, store) = embedded();
    let (mut a, ma) = join(&store, None).await;
    let (mut b, _) = join(&store, None).await;
    let (c, _) = join(&store, None).await;
    assert_eq!(
        [a.view.shard(), b.view.shard(), c.view.shard()],
        [Some(0), Some(1), Some(2)]
    );
    // c saw everyone when it joined; a learns of b and c at its next heartbeat.
    assert_eq!(c.view.members(), 3);
    a.heartbeat().await;
    b.heartbeat().await;
    assert_eq!(a.view.members(), 3);
    assert_eq!(metric(&ma, "quotad_fleet_members"), 3.0);
    assert_eq!(metric(&ma, "quotad_instance_info{shard=\"0\"}"), 1.0);
    // c stops cleanly: its lease goes at once.
    let (leave, rx) = watch::channel(false);
    let task = tokio::spawn(c.run(rx));
    leave.send(true).unwrap();
    task.await.unwrap();
    a.heartbeat().await;
    b.heartbeat().await;
    // N shrinks one lease's life after it was last seen larger (1 s here).
    assert_eq!((a.view.members(), b.view.members()), (3, 3));
    for _ in 0..11 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.heartbeat().await;
        b.heartbeat().await;
    }
    assert_eq!((a.view.members(), b.view.members()), (2, 2));
    // A newcomer takes the lowest free shard: c's.
    let (d, _) = join(&store, None).await;
    assert_eq!(d.view.shard(), Some(2));
}

#[tokio::test]
async fn a_pin_held_by_a_live_instance_stops_start_up() {
    let (_dir, store) = embedded();
    let (a, _) = join(&store, Some(5)).await;
    assert_eq!(a.view.shard(), Some(5));
    let err = Fleet::join(store.clone(), cfg(Some(5)), Arc::new(Metrics::new(false)))
        .await
        .err()
        .expect("the pin is taken");
    assert!(matches!(err, JoinError::PinTaken { shard: 5, .. }), "{err}");
    assert!(err.to_string().contains("store.shard 5"), "{err}");
}

#[tokio::test]
async fn an_instance_that_cannot_renew_stops_admitting_until_it_holds_a_lease_again() {
    let (_dir, inner) = embedded();
    let faulty = FaultyStore::new(inner);
    let store: DynStore = faulty.clone();
    let (mut a, m) = join(&store, None).await;
    assert!(a.view.holds_lease());
    faulty.set(Fault::Failing);
    a.heartbeat().await;
    // A failed renewal alone does not end a lease that still lives.
    assert!(a.view.holds_lease());
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    a.heartbeat().await;
    assert!(!a.view.holds_lease(), "the lease may have ended");
    assert_eq!(a.view.shard(), None);
    assert!(metric(&m, "quotad_lease_renewals_failed_total") >= 2.0);
    faulty.set(Fault::Healthy);
    a.heartbeat().await;
    assert!(a.view.holds_lease());
    assert_eq!(a.view.shard(), Some(0), "its old shard was free again");
}

#[tokio::test]
async fn a_paused_instance_whose_shard_was_taken_claims_another() {
    let (_dir, store) = embedded();
    let (mut a, _) = join(&store, None).await;
    // a pauses past its lease; b starts meanwhile and takes the free shard 0.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let (b, _) = join(&store, None).await;
    assert_eq!(b.view.shard(), Some(0));
    a.heartbeat().await;
    assert_eq!(a.view.shard(), Some(1), "a must not write b's shard");
    assert!(a.view.holds_lease());
    assert_eq!(a.view.members(), 2);
}

/// A lease that lapses (its renewals stalled) and is claimed again soon after does not shrink
/// N for the others meanwhile: the lapsed instance still serves, from its own share. A lease of
/// 3 s, so that each step has most of a second to spare on a loaded machine.
#[tokio::test]
async fn a_lease_that_lapses_for_less_than_its_life_leaves_n_as_it_was() {
    let (_dir, inner) = embedded();
    let faulty = FaultyStore::new(inner.clone());
    let through_faulty: DynStore = faulty.clone();
    let long = || FleetConfig {
        lease_ttl: Duration::from_secs(3),
        ..cfg(None)
    };
    let join_long = |store: DynStore| async move {
        let metrics = Arc::new(Metrics::new(false));
        Fleet::join(store, long(), metrics).await.unwrap()
    };
    let mut a = join_long(through_faulty).await;
    let mut b = join_long(inner.clone()).await;
    a.heartbeat().await;
    assert_eq!((a.view.members(), b.view.members()), (2, 2));
    // a's renewals fail from here: its lease lives until about 3 s from its last renewal.
    faulty.set(Fault::Failing);
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    b.heartbeat().await;
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    // a's lease has lapsed in the store: b's roster shows b alone.
    b.heartbeat().await;
    assert_eq!(b.view.members(), 2, "a lapse shorter than a lease's life");
    // Missed by b's reads for a lease's life: gone.
    tokio::time::sleep(Duration::from_millis(3_200)).await;
    b.heartbeat().await;
    assert_eq!(b.view.members(), 1, "gone for a lease's life: gone");
    faulty.set(Fault::Healthy);
    a.heartbeat().await;
    b.heartbeat().await;
    assert_eq!((a.view.members(), b.view.members()), (2, 2));
}

/// A store of regions whose heartbeat reads stop answering once told to (a replica paused),
/// over a real embedded store for the leases.
struct SilentRegions(DynStore, std::sync::atomic::AtomicBool);

#[async_trait::async_trait]
impl LeaseStore for SilentRegions {
    async fn claim(
        &self,
        owner: &str,
        pin: Option<i16>,
        prefer: Option<i16>,
        ttl: Duration,
    ) -> crate::store::StoreResult<Claim> {
        self.0.claim(owner, pin, prefer, ttl).await
    }
    async fn renew(
        &self,
        shard: i16,
        owner: &str,
        ttl: Duration,
    ) -> crate::store::StoreResult<bool> {
        self.0.renew(shard, owner, ttl).await
    }
    async fn release(&self, shard: i16, owner: &str) -> crate::store::StoreResult<bool> {
        self.0.release(shard, owner).await
    }
    async fn report_written(
        &self,
        shard: i16,
        owner: &str,
        written_ms: i64,
        ttl: Duration,
    ) -> crate::store::StoreResult<()> {
        self.0.report_written(shard, owner, written_ms, ttl).await
    }
    async fn roster(&self) -> crate::store::StoreResult<Roster> {
        self.0.roster().await
    }
    fn adopt(&self, write: Option<i16>, read: &[i16]) {
        self.0.adopt(write, read)
    }
    async fn local_region(&self) -> crate::store::StoreResult<Option<String>> {
        Ok(Some("dc1".into()))
    }
    async fn regions(&self) -> crate::store::StoreResult<Vec<crate::store::lease::RegionBeat>> {
        if self.1.load(std::sync::atomic::Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
        Ok(Vec::new())
    }
}

/// A region round whose reads hang up to the store's timeout (2 s here, twice a lease's life)
/// does not hold up the lease's renewals: the lease lives in the store all along.
#[tokio::test]
async fn a_region_round_that_hangs_does_not_let_the_lease_lapse() {
    let (_dir, inner) = embedded();
    let silent = Arc::new(SilentRegions(inner.clone(), false.into()));
    let store: Arc<dyn LeaseStore> = silent.clone();
    let metrics = Arc::new(Metrics::new(false));
    let fleet = Fleet::join(store, cfg(None), metrics).await.unwrap();
    silent.1.store(true, std::sync::atomic::Ordering::Relaxed);
    let owner = fleet.owner.clone();
    let (leave, rx) = watch::channel(false);
    let task = tokio::spawn(fleet.run(rx));
    for _ in 0..30 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let roster = inner.roster().await.unwrap();
        assert!(
            roster.members.iter().any(|m| m.owner == owner),
            "the lease lapsed: {roster:?}"
        );
    }
    leave.send(true).unwrap();
    task.await.unwrap();
}

#[test]
fn the_fleet_shrinks_only_after_reads_show_fewer_for_a_lease_life() {
    let hold = Duration::from_secs(5);
    let t0 = Instant::now();
    let at = |s: u64| t0 + Duration::from_secs(s);
    let mut m = Members::new();
    assert_eq!(m.observe(2, at(0), hold), 2);
    // Roster reads fail for 8 s (a paused node), then one shows the other's lease lapsed:
    // N stays, the other may still serve on hits this one has not read.
    assert_eq!(m.observe(1, at(8), hold), 2);
    assert_eq!(m.observe(1, at(12), hold), 2);
    // It claims again: the wait starts over.
    assert_eq!(m.observe(2, at(13), hold), 2);
    assert_eq!(m.observe(1, at(14), hold), 2);
    // Gone for good: N shrinks a lease's life after the first read that missed it.
    assert_eq!(m.observe(1, at(19), hold), 2);
    assert_eq!(m.observe(1, at(20), hold), 1);
    // A newcomer counts at once.
    assert_eq!(m.observe(3, at(21), hold), 3);
}

#[tokio::test]
async fn each_instance_learns_how_far_the_others_writes_reached_and_keeps_a_lapsed_ones() {
    let (_dir, store) = embedded();
    let (mut a, ma) = join(&store, None).await;
    let (mut b, _) = join(&store, None).await;
    // Nothing reported yet: nothing to wait for.
    a.heartbeat().await;
    assert_eq!(a.view.others_written(), None);
    // b's rounds wrote everything up to 5_000; a learns it at its next roster read.
    b.view.note_written(5_000);
    b.heartbeat().await;
    a.heartbeat().await;
    assert_eq!(a.view.others_written(), Some((5_000, 100)));
    assert_eq!(
        metric(&ma, "quotad_fleet_writes_stalled"),
        0.0,
        "it just moved"
    );
    // A report never moves back.
    b.view.note_written(4_000);
    b.heartbeat().await;
    a.heartbeat().await;
    assert_eq!(a.view.others_written(), Some((5_000, 100)));
    // b stalls (no renewal, no report): its lease lapses a lease's life (1 s) after its last
    // renewal, and its last report stays a lease's life after the roster last showed it.
    let stalled = Instant::now();
    while stalled.elapsed() < Duration::from_millis(1_500) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.heartbeat().await;
    }
    assert!(
        a.live.iter().all(|m| m.owner != b.owner),
        "b's lease lapsed"
    );
    assert_eq!(a.view.others_written(), Some((5_000, 100)));
    assert_eq!(metric(&ma, "quotad_fleet_writes_stalled"), 1.0);
    while stalled.elapsed() < Duration::from_millis(2_300) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.heartbeat().await;
    }
    assert_eq!(a.view.others_written(), None);
    assert_eq!(metric(&ma, "quotad_fleet_writes_stalled"), 0.0);
    // Its own report is not among the others'.
    a.view.note_written(9_000);
    a.heartbeat().await;
    assert_eq!(a.view.others_written(), None);
}

#[tokio::test]
async fn a_roster_read_that_fails_keeps_the_last_reports() {
    let (_dir, inner) = embedded();
    let faulty = FaultyStore::new(inner.clone());
    let store: DynStore = faulty.clone();
    let (mut a, _) = join(&store, None).await;
    let (mut b, _) = join(&inner, None).await;
    b.view.note_written(7_000);
    b.heartbeat().await;
    a.heartbeat().await;
    assert_eq!(a.view.others_written(), Some((7_000, 100)));
    // a's store calls fail: it cannot see b's newer report, and keeps the old one.
    faulty.set(Fault::Failing);
    b.view.note_written(8_000);
    b.heartbeat().await;
    a.heartbeat().await;
    assert_eq!(a.view.others_written(), Some((7_000, 100)));
    faulty.set(Fault::Healthy);
    a.heartbeat().await;
    assert_eq!(a.view.others_written(), Some((8_000, 100)));
}
