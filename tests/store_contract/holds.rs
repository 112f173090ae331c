//! Holds (reservations): what a store keeps of one, and that ending it is one step.

use std::sync::Arc;

use quotad::domain::HoldState;
use quotad::store::hold::{Charge, Ended, Hold};
use quotad::store::Store;

fn hold(id: &str, taken_ms: i64, expires_ms: i64) -> Hold {
    Hold {
        id: id.to_owned(),
        tenant: "acme".into(),
        client: "key-1".into(),
        resource: Some("POST /v1/chat".into()),
        estimate: 1_500_000,
        taken_ms,
        expires_ms,
        charges: vec![
            Charge {
                limit: "tokens".into(),
                grain: 6_000,
                subject: "key-1".into(),
                start: taken_ms - taken_ms % 6_000,
                amount: 1_500_000,
                in_flight: false,
            },
            Charge {
                limit: "slots".into(),
                grain: 60_000,
                subject: "*".into(),
                start: taken_ms - taken_ms % 60_000,
                amount: 1,
                in_flight: true,
            },
        ],
        state: HoldState::Open,
        cost: None,
        ended_ms: None,
    }
}

/// A hold id no other run of the suite uses.
fn id(n: u32) -> String {
    format!("{:024x}{n:08x}", std::process::id())
}

pub async fn holds_round_trip_and_end_once(store: &Arc<dyn Store>) {
    let now = chrono::Utc::now().timestamp_millis();
    let h = hold(&id(1), now, now + 60_000);
    store.put_hold(&h).await.unwrap();
    assert_eq!(store.get_hold(&h.id).await.unwrap(), Some(h.clone()));
    assert_eq!(store.get_hold(&id(2)).await.unwrap(), None);
    // Eight racing ends of one hold: exactly one wins, and every loser sees the winner's end.
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let (s, hid) = (store.clone(), h.id.clone());
        tasks.push(tokio::spawn(async move {
            let (state, cost) = if i % 2 == 0 {
                (HoldState::Settled, Some(1_000 + i))
            } else {
                (HoldState::Released, None)
            };
            s.end_hold(&hid, state, cost, now + 1_000).await.unwrap()
        }));
    }
    let mut won = Vec::new();
    let mut lost = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ended::Now(h) => won.push(h),
            Ended::Before(h) => lost.push(h),
            Ended::Unknown => panic!("the hold was lost"),
        }
    }
    assert_eq!(won.len(), 1, "one end wins: {won:?}");
    let w = &won[0];
    assert_ne!(w.state, HoldState::Open);
    assert_eq!(w.ended_ms, Some(now + 1_000));
    assert_eq!(
        (w.charges.clone(), w.estimate),
        (h.charges.clone(), h.estimate)
    );
    assert!(
        lost.iter().all(|l| l == w),
        "the losers see the winner's end"
    );
    assert_eq!(store.get_hold(&h.id).await.unwrap().as_ref(), Some(w));
    assert_eq!(
        store
            .end_hold(&id(3), HoldState::Released, None, now)
            .await
            .unwrap(),
        Ended::Unknown
    );
}

pub async fn expired_holds_are_listed_until_they_end(store: &Arc<dyn Store>) {
    let now = chrono::Utc::now().timestamp_millis();
    let gone = hold(&id(11), now - 120_000, now - 60_000);
    let late = hold(&id(12), now - 30_000, now - 1_000);
    let open = hold(&id(13), now, now + 600_000);
    let ended = hold(&id(14), now - 100_000, now - 50_000);
    for h in [&gone, &late, &open, &ended] {
        store.put_hold(h).await.unwrap();
    }
    let e = store
        .end_hold(&ended.id, HoldState::Settled, Some(7), now)
        .await;
    assert!(matches!(e.unwrap(), Ended::Now(_)));
    let due: Vec<String> = store
        .expired_holds(now, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.id)
        .filter(|i| [&gone.id, &late.id, &open.id, &ended.id].contains(&i))
        .collect();
    assert_eq!(
        due,
        [gone.id.clone(), late.id.clone()],
        "past their time and open, oldest first"
    );
    for h in [&gone, &late] {
        let e = store.end_hold(&h.id, HoldState::Expired, None, now).await;
        assert!(matches!(e.unwrap(), Ended::Now(_)));
    }
    let due = store.expired_holds(now, 100).await.unwrap();
    assert!(
        due.iter()
            .all(|h| ![&gone.id, &late.id, &ended.id].contains(&&h.id)),
        "{due:?}"
    );
    // Later, the open one is due too.
    let due = store.expired_holds(now + 600_001, 100).await.unwrap();
    assert!(due.iter().any(|h| h.id == open.id), "{due:?}");
}

pub async fn holds_expire_in_batches_each_once(store: &Arc<dyn Store>) {
    let now = chrono::Utc::now().timestamp_millis();
    let due: Vec<Hold> = (0..40)
        .map(|n| hold(&id(200 + n), now - 20_000, now - 1_000 - i64::from(n)))
        .collect();
    for h in &due {
        store.put_hold(h).await.unwrap();
    }
    let settled = &due[3].id;
    let e = store
        .end_hold(settled, HoldState::Settled, Some(9), now)
        .await;
    assert!(matches!(e.unwrap(), Ended::Now(_)));
    let mut ids: Vec<String> = due.iter().map(|h| h.id.clone()).collect();
    ids.push(id(299)); // never taken
    let ended = store.expire_holds(&ids, now).await.unwrap();
    let mut got: Vec<&str> = ended.iter().map(|h| h.id.as_str()).collect();
    got.sort_unstable();
    let mut want: Vec<&str> = ids[..40]
        .iter()
        .map(String::as_str)
        .filter(|i| i != settled)
        .collect();
    want.sort_unstable();
    assert_eq!(
        got, want,
        "every open one, the settled one and the unknown one left out"
    );
    assert!(ended
        .iter()
        .all(|h| h.state == HoldState::Expired && h.ended_ms == Some(now)));
    // Each is expired once: a second batch ends none, and none is due any more.
    assert!(store.expire_holds(&ids, now + 1).await.unwrap().is_empty());
    let left = store.expired_holds(now + 1, 10_000).await.unwrap();
    assert!(left.iter().all(|h| !ids.contains(&h.id)), "{left:?}");
    let g = store.get_hold(settled).await.unwrap().unwrap();
    assert_eq!((g.state, g.cost), (HoldState::Settled, Some(9)));
}

/// Stores of two regions (data centres) end the same holds at once, one end in each: for each
/// hold exactly one end wins fleet-wide, and every store then reads that end. An end that
/// fails (Paxos contention between the regions can time one out) is tried again, as a caller
/// given a 503 does. Ends at LOCAL_SERIAL would each win in their own region.
pub async fn holds_end_once_across_regions(stores: &[Arc<dyn Store>]) {
    let now = chrono::Utc::now().timestamp_millis();
    for n in 0..20u32 {
        let h = hold(&id(100 + n), now, now + 60_000);
        let home = &stores[n as usize % stores.len()];
        home.put_hold(&h).await.unwrap();
        // Each region reads it before the race, as a settle does first.
        for s in stores {
            let seen = s.get_hold(&h.id).await.unwrap();
            assert_eq!(seen.map(|x| x.state), Some(HoldState::Open));
        }
        let mut tasks = Vec::new();
        for (i, s) in stores.iter().enumerate() {
            let (s, hid) = (s.clone(), h.id.clone());
            tasks.push(tokio::spawn(async move {
                let cost = Some(i as u64);
                for _ in 0..10 {
                    match s
                        .end_hold(&hid, HoldState::Settled, cost, now + 1_000)
                        .await
                    {
                        Ok(e) => return e,
                        Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
                    }
                }
                panic!("no end of {hid} went through in ten tries");
            }));
        }
        let mut won = Vec::new();
        for t in tasks {
            if let Ended::Now(h) = t.await.unwrap() {
                won.push(h);
            }
        }
        assert_eq!(
            won.len(),
            1,
            "hold {n}: one end wins across regions: {won:?}"
        );
        for s in stores {
            let got = s.get_hold(&h.id).await.unwrap();
            assert_eq!(
                got.as_ref(),
                Some(&won[0]),
                "hold {n} as each region reads it"
            );
        }
    }
}
