//! The layer in front of a real axum service, against a real quotad on a real port (the
//! embedded store, in a temporary directory).

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use quotad::config::{DurationMs, Secret, Settings};
use quotad::startup::Application;
use quotad_client::{Check, Client, QuotaLayer, Unreachable};

const ADMIN: &str = "client-test-admin";

/// A quotad on 127.0.0.1 with `acme` limited to 2 requests a second per client.
async fn quotad() -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Settings::default();
    s.server.bind = "127.0.0.1:0".into();
    s.server.workers = 1;
    s.store.path = dir.path().to_path_buf();
    s.auth.admin_token = Secret::new(ADMIN);
    s.sync.interval_ms = DurationMs(50);
    let app = Application::build(s).await.expect("quotad starts");
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    let r = reqwest::Client::new()
        .put(format!("{base}/v1/quotas/acme"))
        .bearer_auth(ADMIN)
        .json(&serde_json::json!({"limits": [{"id": "per-second", "max": 2, "window": "1s"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    (base, dir)
}

/// An axum app behind the layer: `/hello` checked as the client named by `X-Api-Key`,
/// `/health` never asked about.
async fn app(client: Client, unreachable: Unreachable) -> SocketAddr {
    let layer = QuotaLayer::new(client, unreachable, |req: &http::Request<Body>| {
        if req.uri().path() == "/health" {
            return None;
        }
        let key = req.headers().get("x-api-key")?.to_str().ok()?;
        Some(Check::new("acme", key).resource(format!("{} {}", req.method(), req.uri().path())))
    });
    let router = Router::new()
        .route("/hello", get(|| async { "hello" }))
        .route("/health", get(|| async { "ok" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_third_request_in_a_second_gets_429_with_quotads_headers() {
    let (base, _dir) = quotad().await;
    let addr = app(Client::new(&base), Unreachable::Deny).await;
    let http = reqwest::Client::new();
    let hello = || {
        http.get(format!("http://{addr}/hello"))
            .header("x-api-key", "k1")
            .send()
    };
    let first = hello().await.unwrap();
    assert_eq!(first.status(), 200);
    assert_eq!(first.headers()["ratelimit-limit"], "2");
    assert_eq!(first.headers()["ratelimit-remaining"], "1");
    assert_eq!(first.text().await.unwrap(), "hello");
    assert_eq!(hello().await.unwrap().status(), 200);
    let third = hello().await.unwrap();
    assert_eq!(third.status(), 429);
    // The same headers quotad gives: a peek (cost 0) now answers as the denial did.
    let peek = Client::new(&base)
        .check(&Check::new("acme", "k1").resource("GET /hello").cost(0))
        .await
        .unwrap();
    for name in [
        "ratelimit-limit",
        "ratelimit-remaining",
        "x-ratelimit-limit",
    ] {
        let from_quotad = peek.headers.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(third.headers()[name], from_quotad.1, "{name}");
    }
    let retry: u64 = third.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=2).contains(&retry), "{retry}");
    let body: serde_json::Value = third.json().await.unwrap();
    assert_eq!(body["allowed"], false);
    // Unasked routes go through whatever the count.
    let health = http
        .get(format!("http://{addr}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    // Another client has its own count.
    let other = http
        .get(format!("http://{addr}/hello"))
        .header("x-api-key", "k2")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
}

#[tokio::test]
async fn an_unreachable_quotad_fails_open_or_closed_as_configured() {
    // A port nobody listens on.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    let client = Client::new(&base).deadline(Duration::from_millis(200));
    let http = reqwest::Client::new();
    for (rule, want) in [(Unreachable::Allow, 200), (Unreachable::Deny, 503)] {
        let addr = app(client.clone(), rule).await;
        let r = http
            .get(format!("http://{addr}/hello"))
            .header("x-api-key", "k1")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), want, "{rule:?}");
        if want == 503 {
            assert_eq!(r.headers()["retry-after"], "1");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_checks_in_batches_and_reads_usage() {
    let (base, _dir) = quotad().await;
    let client = Client::new(&base);
    let results = client
        .batch(&[
            Check::new("acme", "b1"),
            Check::new("acme", "b1"),
            Check::new("acme", "b1"),
        ])
        .await
        .unwrap();
    let allowed: Vec<bool> = results.iter().map(|r| r["allowed"] == true).collect();
    assert_eq!(allowed, [true, true, false]);
    let usage = client
        .clone()
        .token(ADMIN)
        .usage("acme", "b1")
        .await
        .unwrap();
    assert_eq!(usage["limits"][0]["count"], 2);
    let refused = client.usage("acme", "b1").await.unwrap_err();
    assert!(matches!(refused, quotad_client::Error::Refused { status, .. } if status == 401));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reserves_settles_releases_and_reads_reservations() {
    use quotad_client::ReservationState;
    let (base, _dir) = quotad().await;
    let admin = Client::new(&base).token(ADMIN);
    let policy = serde_json::json!({"limits": [
        {"id": "per-minute", "max": 1000, "window": "1m"},
        {"id": "slots", "max": 2, "in_flight": "holds"}]});
    let r = reqwest::Client::new()
        .put(format!("{base}/v1/quotas/holds"))
        .bearer_auth(ADMIN)
        .json(&policy)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let client = Client::new(&base);
    let check = Check::new("holds", "k").cost(600);
    let taken = client
        .reserve(&check, Some(Duration::from_secs(120)))
        .await
        .unwrap();
    assert!(taken.allowed());
    // The binding limit is the one with the least left: one slot of two.
    assert_eq!(
        (&taken.body["limit_id"], &taken.body["remaining"]),
        (&"slots".into(), &1.into())
    );
    assert!(taken
        .headers
        .iter()
        .any(|(n, _)| n == "ratelimit-remaining"));
    let first = taken
        .reservation
        .clone()
        .expect("admitted with a reservation");
    assert_eq!((first.id.len(), first.estimate), (32, 600));
    let read = client.reservation(&first.id).await.unwrap();
    assert_eq!(read.state, ReservationState::Open);
    assert_eq!(
        (read.estimate, read.expires_at, read.cost),
        (600, first.expires_at.clone(), None)
    );

    // 600 held: 500 more does not fit; nothing is held for it.
    let denied = client
        .reserve(&check.clone().cost(500), None)
        .await
        .unwrap();
    assert_eq!(denied.status, 429);
    assert!(denied.reservation.is_none());

    // Settled above the estimate: charged past max, which the answer names.
    let ended = first.settle(&client, 1_200).await.unwrap();
    assert_eq!(ended.state, ReservationState::Settled);
    assert_eq!((ended.estimate, ended.cost), (600, Some(1_200)));
    assert_eq!(ended.over_limit, ["per-minute"]);
    let usage = admin.usage("holds", "k").await.unwrap();
    assert_eq!(usage["limits"][0]["limit_id"], "per-minute", "{usage}");
    assert_eq!(usage["limits"][0]["count"], 1_200, "{usage}");
    assert_eq!(usage["limits"][1]["count"], 0, "{usage}");
    // The same settle again answers the same; another end is refused with 409.
    assert_eq!(client.settle(&first.id, 1_200).await.unwrap(), ended);
    let conflict = first.release(&client).await.unwrap_err();
    assert!(
        matches!(&conflict, quotad_client::Error::Refused { status, .. } if *status == 409),
        "{conflict}"
    );

    // A release gives the estimate back (in another client, with a budget left).
    let other = Check::new("holds", "k2").cost(300);
    let held = client.reserve(&other, None).await.unwrap();
    let released = held.reservation.unwrap().release(&client).await.unwrap();
    assert_eq!(
        (released.state, released.cost),
        (ReservationState::Released, None)
    );
    let usage = admin.usage("holds", "k2").await.unwrap();
    assert_eq!(usage["limits"][0]["limit_id"], "per-minute", "{usage}");
    assert_eq!(usage["limits"][0]["count"], 0, "{usage}");
    // An id that is not one is quotad's 400, whatever it holds.
    let bad = client.release("../../quotas/holds").await.unwrap_err();
    assert!(
        matches!(&bad, quotad_client::Error::Refused { status, .. } if *status == 400),
        "{bad}"
    );
}
