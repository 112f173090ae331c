//! Sync writes of unknown outcome: held in doubt, settled by reading this instance's own cells
//! back, resent only where they did not land.

use super::*;

/// An increment sent and never answered may have landed or not: it is held in doubt, never
/// resent blindly; once a read of the instance's own cells (at `ALL`, a wait after the write and
/// again a wait after the replicas first answer) says what landed, only what did not is sent
/// again. A shutdown that could not settle a doubt says so.
#[tokio::test]
async fn increments_in_doubt_are_settled_by_reading_them_back() {
    use quotad::store::faulty::PartFault;
    let wait = Duration::from_millis(200);
    let r = rig_syncing(
        LimiterConfig::default(),
        SyncConfig {
            doubt_wait: wait,
            ..SyncConfig::default()
        },
    );
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let day = p.limits[0].kind.grain();
    for c in ["k1", "k2", "k3"] {
        let (t, c) = ids("acme", c);
        for _ in 0..4 {
            check(&r, &p, &t, &c, 1).await;
        }
    }
    // k2's increments land, k3's are lost; both are answered as unknown.
    r.faulty.fail_part("k2", Some(PartFault::Doubtful));
    r.faulty.fail_part("k3", Some(PartFault::Lost));
    let round = r.syncer.round().await.unwrap();
    assert_eq!(round.pending_after, 0, "hits in doubt are not pending");
    assert_eq!(metric(&r, "quotad_store_uncertain_hits_total"), 8.0);
    assert_eq!(metric(&r, "quotad_store_doubtful_hits"), 8.0);
    // Too early, and then the replicas do not answer: nothing is settled.
    assert_eq!(r.syncer.settle_doubts().await, 8);
    tokio::time::sleep(wait).await;
    assert_eq!(r.syncer.settle_doubts().await, 8, "the reads are refused");
    r.faulty.fail_part("k2", None);
    r.faulty.fail_part("k3", None);
    // New hits meanwhile land with an answer, and are not taken for the ones in doubt.
    for c in ["k2", "k3"] {
        let (t, c) = ids("acme", c);
        check(&r, &p, &t, &c, 1).await;
    }
    r.syncer.round().await.unwrap();
    assert_eq!(
        r.syncer.settle_doubts().await,
        8,
        "a failed read waits a `wait` before the next"
    );
    tokio::time::sleep(wait).await;
    assert_eq!(
        r.syncer.settle_doubts().await,
        8,
        "a first read only witnesses"
    );
    tokio::time::sleep(wait).await;
    assert_eq!(r.syncer.settle_doubts().await, 0);
    assert_eq!(stored(&r, "acme", "k1", "d", day).await, 4);
    assert_eq!(
        stored(&r, "acme", "k2", "d", day).await,
        5,
        "landed: not resent"
    );
    assert_eq!(
        stored(&r, "acme", "k3", "d", day).await,
        5,
        "lost: sent again"
    );
    let settled = "quotad_store_doubtful_hits_settled_total";
    assert_eq!(metric(&r, &format!("{settled}{{outcome=\"landed\"}}")), 4.0);
    assert_eq!(metric(&r, &format!("{settled}{{outcome=\"resent\"}}")), 4.0);
    let (_stop, stopped) = tokio::sync::watch::channel(true);
    assert_eq!(
        r.syncer.run(stopped).await,
        0,
        "every admitted hit is in the store"
    );
}

/// A doubt the drain cannot settle (the replicas never answer) is what a shutdown reports.
#[tokio::test]
async fn a_doubt_left_at_shutdown_is_reported() {
    use quotad::store::faulty::PartFault;
    let r = rig_syncing(
        LimiterConfig::default(),
        SyncConfig {
            doubt_wait: Duration::from_millis(50),
            drain_timeout: Duration::from_millis(500),
            ..SyncConfig::default()
        },
    );
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..3 {
        check(&r, &p, &t, &c, 1).await;
    }
    r.faulty.fail_part("k1", Some(PartFault::Lost));
    r.syncer.round().await.unwrap();
    let (_stop, stopped) = tokio::sync::watch::channel(true);
    assert_eq!(r.syncer.run(stopped).await, 3);
}

/// At exit with a replica down a read at `ALL` cannot succeed: the drain settles its doubts
/// at `LOCAL_QUORUM` instead, and what did not land is sent again rather than lost.
#[tokio::test]
async fn a_drain_with_a_replica_down_settles_its_doubts_from_the_live_replicas() {
    use quotad::store::faulty::PartFault;
    let r = rig_syncing(
        LimiterConfig::default(),
        SyncConfig {
            doubt_wait: Duration::from_millis(100),
            drain_timeout: Duration::from_secs(2),
            ..SyncConfig::default()
        },
    );
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let day = p.limits[0].kind.grain();
    for c in ["k1", "k2"] {
        let (t, c) = ids("acme", c);
        for _ in 0..3 {
            check(&r, &p, &t, &c, 1).await;
        }
    }
    r.faulty.fail_part("k1", Some(PartFault::Lost));
    r.faulty.fail_part("k2", Some(PartFault::Doubtful));
    r.syncer.round().await.unwrap();
    assert_eq!(metric(&r, "quotad_store_doubtful_hits"), 6.0);
    r.faulty.fail_part("k1", None);
    r.faulty.fail_part("k2", None);
    r.faulty.set_replica_down(true);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        r.syncer.settle_doubts().await,
        6,
        "no read at ALL while running"
    );
    let (store, now) = (r.store.clone(), r.clock.now_ms());
    let (_stop, stopped) = tokio::sync::watch::channel(true);
    assert_eq!(r.syncer.run(stopped).await, 0, "settled at exit");
    let k1 = stored_in(&store, now, "acme", "k1", "d", day).await;
    let k2 = stored_in(&store, now, "acme", "k2", "d", day).await;
    assert_eq!(
        (k1, k2),
        (3, 3),
        "k1's lost hits sent again, k2's landed ones not"
    );
}

/// An instance's own hits that a read back does not show (its write was lost, or not applied
/// yet) stay counted: it knows what it admitted, and a read of its own cell lower than that
/// does not hand the room back.
#[tokio::test]
async fn own_hits_a_read_back_does_not_show_stay_counted() {
    use quotad::store::faulty::PartFault;
    // One of two instances: it reads its counters back every round.
    let fleet = Arc::new(quotad::limiter::Membership::alone());
    fleet.set_members(2);
    let cfg = LimiterConfig {
        fleet,
        ..LimiterConfig::default()
    };
    let r = rig_syncing(cfg, SyncConfig::default());
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let (t, c) = ids("acme", "k1");
    for _ in 0..6 {
        assert!(check(&r, &p, &t, &c, 1).await.allowed);
    }
    r.faulty.fail_part("k1", Some(PartFault::Lost));
    r.syncer.round().await.unwrap();
    assert_eq!(
        metric(&r, "quotad_store_doubtful_hits"),
        6.0,
        "the 6 in doubt"
    );
    r.faulty.fail_part("k1", None);
    assert!(check(&r, &p, &t, &c, 1).await.allowed);
    r.syncer.round().await.unwrap();
    let day = p.limits[0].kind.grain();
    assert_eq!(
        stored(&r, "acme", "k1", "d", day).await,
        1,
        "the 6 lost, 1 written"
    );
    // Its share of the headroom the store shows, half of (1000 - 1), less this check and
    // the 6 in doubt: the store alone would leave it 498.
    let d = check(&r, &p, &t, &c, 1).await;
    let remaining = d.binding.map(|b| b.remaining);
    assert_eq!(remaining, Some(499 - 1 - 6), "the 6 in doubt still count");
}

/// What the fleet task reports to the others: before when every hit this instance admitted
/// was written with an answer. A round with a write in doubt holds it back; in a fleet that
/// writes lazily, only rounds in a row for as long as a counter may wait move it, and then to
/// that long before the last of them.
#[tokio::test]
async fn only_rounds_whose_writes_were_all_answered_move_the_report_of_what_is_written() {
    use quotad::store::faulty::PartFault;
    let fleet = Arc::new(Membership::alone());
    let cfg = |max_sync_delay_ms| LimiterConfig {
        fleet: fleet.clone(),
        sync_interval_ms: 250,
        max_sync_delay_ms,
        ..LimiterConfig::default()
    };
    let r = rig_syncing(cfg(250), SyncConfig::default());
    let p = policy(serde_json::json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}));
    let (t, k1) = ids("acme", "k1");
    assert_eq!(fleet.written_ms(), None, "no round yet");
    check(&r, &p, &t, &k1, 1).await;
    r.syncer.round().await.unwrap();
    assert_eq!(fleet.written_ms(), Some(T0));
    // A round whose write is in doubt: the report stays.
    r.clock.advance(1_000);
    check(&r, &p, &t, &k1, 1).await;
    r.faulty.fail_part("k1", Some(PartFault::Doubtful));
    r.syncer.write().await.unwrap();
    assert_eq!(fleet.written_ms(), Some(T0));
    // Answered again: every hit before this round's tick is written.
    r.faulty.fail_part("k1", None);
    r.clock.advance(250);
    r.syncer.write().await.unwrap();
    assert_eq!(fleet.written_ms(), Some(T0 + 1_250));

    // Lazily (a counter waits up to 2 s): a round's answered writes say nothing of the
    // counters it did not take until rounds have been answered for that long.
    let fleet = Arc::new(Membership::alone());
    let r = rig_syncing(
        LimiterConfig {
            fleet: fleet.clone(),
            ..cfg(2_000)
        },
        SyncConfig::default(),
    );
    check(&r, &p, &t, &k1, 1).await;
    r.syncer.write().await.unwrap();
    assert_eq!(fleet.written_ms(), None, "answered since only now");
    for _ in 0..7 {
        r.clock.advance(250);
        r.syncer.write().await.unwrap();
    }
    assert_eq!(
        fleet.written_ms(),
        Some(T0),
        "7 rounds of 250 ms: 1,750 ms of delay covered"
    );
    r.clock.advance(250);
    r.syncer.write().await.unwrap();
    assert_eq!(fleet.written_ms(), Some(T0 + 250));
    // A round refused whole starts the count again.
    r.faulty.set(quotad::store::faulty::Fault::Failing);
    check(&r, &p, &t, &k1, 1).await;
    r.clock.advance(250);
    assert!(r.syncer.round().await.is_err());
    r.faulty.set(quotad::store::faulty::Fault::Healthy);
    r.clock.advance(250);
    r.syncer.write().await.unwrap();
    assert_eq!(fleet.written_ms(), Some(T0 + 250));
}
