//! Bad bodies get a clear 4xx in the contract's shape: never a 5xx, a panic or a lost count.

use serde_json::{json, Value};

use crate::helpers::*;

#[tokio::test]
async fn malformed_check_bodies_are_400s_naming_the_field() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "d", "max": 1, "period": "day"}]}),
    )
    .await;
    let long = "a".repeat(129);
    let cases: Vec<(Value, Option<&str>)> = vec![
        (json!({"client": "k"}), Some("tenant")),
        (json!({"tenant": "acme"}), Some("client")),
        (json!({"tenant": "", "client": "k"}), Some("tenant")),
        (json!({"tenant": long, "client": "k"}), Some("tenant")),
        (json!({"tenant": "acme", "client": "k/1"}), Some("client")),
        (json!({"tenant": "acme", "client": "ké"}), Some("client")),
        (json!({"tenant": 7, "client": "k"}), Some("tenant")),
        (
            json!({"tenant": "acme", "client": "k", "cost": 1_000_000_001u64}),
            Some("cost"),
        ),
        (
            json!({"tenant": "acme", "client": "k", "cost": -1}),
            Some("cost"),
        ),
        (
            json!({"tenant": "acme", "client": "k", "cost": 1.5}),
            Some("cost"),
        ),
        (
            json!({"tenant": "acme", "client": "k", "cost": "1"}),
            Some("cost"),
        ),
        (
            json!({"tenant": "acme", "client": "k", "resource": ""}),
            Some("resource"),
        ),
        (
            json!({"tenant": "acme", "client": "k", "resource": "x".repeat(257)}),
            Some("resource"),
        ),
        (
            json!({"tenant": "acme", "client": "k", "resource": "tab\there"}),
            Some("resource"),
        ),
        (
            json!({"tenant": "acme", "client": "k", "cots": 1}),
            Some("cots"),
        ),
        (json!([1, 2]), None),
        (json!("acme"), None),
    ];
    for (body, field) in cases {
        let r = app.check(body.clone()).await;
        let b = assert_error(r, 400, "invalid_argument").await;
        if let Some(f) = field {
            assert_eq!(b["error"]["field"], f, "{body}");
        }
    }
    for raw in [
        &b"{"[..],
        b"",
        b"{\"tenant\": \"acme\",}",
        b"null",
        b"\xff\xfe",
        // One value, then more: not one JSON body.
        b"{\"tenant\": \"acme\", \"client\": \"k\"} {}",
        b"{\"tenant\": \"acme\", \"client\": \"k\"}x",
    ] {
        let r = post_raw(&app, "/v1/check", Some("application/json"), raw.to_vec()).await;
        assert_error(r, 400, "invalid_argument").await;
    }
    // Nothing above consumed the one unit of quota.
    assert_eq!(app.check_json("acme", "k").await.0, 200);
}

#[tokio::test]
async fn oversized_bodies_are_413_and_wrong_content_types_415() {
    let app = spawn_app().await;
    let big = format!(
        r#"{{"tenant": "acme", "client": "k", "resource": "{}"}}"#,
        "x".repeat(70_000)
    );
    let r = post_raw(
        &app,
        "/v1/check",
        Some("application/json"),
        big.clone().into_bytes(),
    )
    .await;
    assert_error(r, 413, "payload_too_large").await;
    let r = app
        .http
        .put(app.url("/v1/quotas/acme"))
        .bearer_auth(ADMIN)
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_error(r, 413, "payload_too_large").await;
    // Chunked, so no Content-Length warns in advance.
    let stream = futures::stream::iter((0..70).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1024])));
    let r = app
        .http
        .post(app.url("/v1/check"))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_error(r, 413, "payload_too_large").await;

    let body = br#"{"tenant": "acme", "client": "k"}"#.to_vec();
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let r = post_raw(&app, "/v1/check", ct, body.clone()).await;
        assert_error(r, 415, "unsupported_media_type").await;
    }
    let r = post_raw(
        &app,
        "/v1/check",
        Some("application/json; charset=utf-8"),
        body,
    )
    .await;
    assert_error(r, 404, "not_found").await; // parsed fine; acme simply has no quota
}

/// `7.0` is an integer to JSON Schema (and so to the API document): `cost` and `max` take it.
/// Fractions, negatives and out-of-range values are still refused with the same messages.
#[tokio::test]
async fn whole_number_floats_count_as_integers_and_fractions_are_still_refused() {
    let app = spawn_app().await;
    // serde_json writes an f64 with a fraction part (`3.0`), so the server really gets floats.
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "d", "max": 3.0, "period": "day"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["limits"][0]["max"], json!(3), "stored as the integer");
    assert!(body["limits"][0]["max"].is_u64(), "{body}");

    let r = app
        .check(json!({"tenant": "acme", "client": "k", "cost": 2.0}))
        .await;
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["remaining"], 1, "{b}");
    let r = app
        .http
        .post(app.url("/v1/check"))
        .header("content-type", "application/json")
        .body(r#"{"tenant": "acme", "client": "k", "cost": 1e0}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = app
        .http
        .post(app.url("/v1/check/batch"))
        .json(&json!({"checks": [{"tenant": "acme", "client": "k", "cost": 0.0}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["results"][0]["remaining"], 0, "{b}");

    for cost in [
        json!(7.5),
        json!(-1.0),
        json!(1_000_000_001.0),
        json!(1e300),
    ] {
        let r = app
            .check(json!({"tenant": "acme", "client": "k", "cost": cost}))
            .await;
        let b = assert_error(r, 400, "invalid_argument").await;
        assert_eq!(b["error"]["field"], "cost", "{cost}");
        assert_eq!(
            b["error"]["message"], "cost must be 0..=1000000000",
            "{cost}"
        );
    }
    for max in [json!(7.5), json!(-3.0), json!(0.0), json!(1.8e16)] {
        let r = app
            .put_quota(
                "other",
                json!({"limits": [{"id": "d", "max": max, "period": "day"}]}),
            )
            .await;
        let b = assert_error(r, 400, "invalid_argument").await;
        assert_eq!(b["error"]["field"], "limits[0].max", "{max}");
        assert_eq!(
            b["error"]["message"], "max must be an integer 1..=9007199254740992",
            "{max}"
        );
    }
    // The refused checks consumed nothing: acme's 3 are used up by the 2 + 1 above.
    assert_eq!(app.check_json("acme", "k").await.0, 429);
}

/// `server.request_timeout_ms` covers the whole request, its body too: 200 connections that
/// announce a body of 60,000 bytes and never send it do not delay `/healthz`, and each gets 408
/// once the deadline has passed, its connection closed.
#[tokio::test]
async fn bodies_that_never_arrive_get_408_at_the_deadline_and_delay_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let app = spawn_with(|s| s.server.request_timeout_ms = quotad::config::DurationMs(1_000)).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let head = "POST /v1/check HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\n\
                Content-Length: 60000\r\n\r\n{\"tenant\":";
    let started = std::time::Instant::now();
    let mut stuck = Vec::new();
    for _ in 0..200 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(head.as_bytes()).await.unwrap();
        stuck.push(s);
    }
    let t = std::time::Instant::now();
    let r = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        t.elapsed() < std::time::Duration::from_millis(500),
        "/healthz took {:?}",
        t.elapsed()
    );
    for mut s in stuck {
        let mut answer = Vec::new();
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            s.read_to_end(&mut answer),
        )
        .await
        .expect("the connection is closed after the answer")
        .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the last 408 came after {:?}",
        started.elapsed()
    );
}
