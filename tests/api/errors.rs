//! Bad input gets a clear 4xx in the contract's shape: never a 5xx, a panic or a lost count.

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::helpers::*;

async fn post_raw(app: &TestApp, path: &str, ct: Option<&str>, body: Vec<u8>) -> reqwest::Response {
    let mut req = app.http.post(app.url(path)).body(body);
    if let Some(ct) = ct {
        req = req.header("content-type", ct);
    }
    req.send().await.unwrap()
}

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
            json!({"tenant": "acme", "client": "k", "cost": 1_000_001}),
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

#[tokio::test]
async fn unknown_routes_and_wrong_methods_answer_in_the_error_shape() {
    let app = spawn_app().await;
    let r = app.http.get(app.url("/v1/nothing")).send().await.unwrap();
    assert_eq!(allowed_methods(&r), None, "a 404 has no Allow");
    assert_error(r, 404, "not_found").await;
    let r = app.http.get(app.url("/v1/check")).send().await.unwrap();
    assert_error(r, 405, "method_not_allowed").await;
    let r = app.http.delete(app.url("/healthz")).send().await.unwrap();
    assert_error(r, 405, "method_not_allowed").await;
}

/// RFC 9110 §15.5.6: a 405 carries `Allow` with the methods the path does support, for every
/// method it does not (including ones no route anywhere uses), with or without credentials.
#[tokio::test]
async fn a_405_names_the_methods_of_its_path_in_allow() {
    let app = spawn_app().await;
    let routes: [(&str, &[&str]); 8] = [
        ("/v1/check", &["POST"]),
        ("/v1/check/batch", &["POST"]),
        ("/v1/quotas", &["GET"]),
        ("/v1/quotas/acme", &["GET", "PUT", "DELETE"]),
        ("/v1/quotas/acme/clients/k1", &["GET", "PUT", "DELETE"]),
        ("/v1/usage/acme/k1", &["GET"]),
        ("/healthz", &["GET"]),
        ("/v1/openapi.json", &["GET"]),
    ];
    let every = [
        "GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "TRACE", "HEAD", "QUERY",
    ];
    for (path, methods) in routes {
        let want: std::collections::BTreeSet<String> =
            methods.iter().map(|m| m.to_string()).collect();
        for m in every.iter().filter(|m| !methods.contains(m)) {
            for token in [None, Some(ADMIN)] {
                let method = reqwest::Method::from_bytes(m.as_bytes()).unwrap();
                let mut req = app.http.request(method, app.url(path));
                if let Some(t) = token {
                    req = req.bearer_auth(t);
                }
                let r = req.send().await.unwrap();
                assert_eq!(r.status(), 405, "{m} {path}");
                assert_eq!(allowed_methods(&r).as_ref(), Some(&want), "{m} {path}");
                if *m != "HEAD" {
                    assert_error(r, 405, "method_not_allowed").await;
                }
            }
        }
        // An allowed method is not a 405 and carries no Allow.
        let method = reqwest::Method::from_bytes(methods[0].as_bytes()).unwrap();
        let r = app
            .http
            .request(method, app.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap();
        assert_ne!(r.status(), 405, "{} {path}", methods[0]);
        assert_eq!(allowed_methods(&r), None, "{} {path}", methods[0]);
    }
}

fn random_json(rng: &mut rand::rngs::StdRng, depth: u32) -> Value {
    match rng.random_range(0..if depth > 2 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.random::<bool>()),
        2 => json!(rng.random_range(-10_000_000i64..10_000_000)),
        3 => json!(rng.random::<f64>() * 1e7),
        4 => {
            let n = rng.random_range(0..300);
            let alphabet = b"acme-k1 /*\t\"\\\x01\xc3\xa9";
            let s: Vec<u8> = (0..n)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            json!(String::from_utf8_lossy(&s))
        }
        5 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_json(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "tenant", "client", "resource", "cost", "checks", "limits", "x",
            ];
            let mut m = serde_json::Map::new();
            for _ in 0..rng.random_range(0..5) {
                m.insert(
                    keys[rng.random_range(0..keys.len())].into(),
                    random_json(rng, depth + 1),
                );
            }
            Value::Object(m)
        }
    }
}

/// Arbitrary JSON (and arbitrary bytes) at every body-taking route: 4xx or a decision, never 5xx.
#[tokio::test]
async fn arbitrary_input_never_gets_a_5xx() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "d", "max": 1000, "period": "day"}]}),
    )
    .await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    for i in 0..600 {
        let mut body = random_json(&mut rng, 0);
        if i % 3 == 0 {
            // Mostly-valid checks with one field mangled reach deeper.
            let mut ok = json!({"tenant": "acme", "client": "k1", "cost": 1});
            let k = ["tenant", "client", "cost", "resource"][i % 4];
            ok[k] = body;
            body = ok;
        }
        for (method, path) in [
            (reqwest::Method::POST, "/v1/check"),
            (reqwest::Method::POST, "/v1/check/batch"),
            (reqwest::Method::PUT, "/v1/quotas/fuzz"),
        ] {
            let r = app
                .http
                .request(method, app.url(path))
                .bearer_auth(ADMIN)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert!(r.status().as_u16() < 500, "{path} {body}: {}", r.status());
        }
        let bytes: Vec<u8> = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
        let r = post_raw(&app, "/v1/check", Some("application/json"), bytes).await;
        assert_eq!(r.status(), 400);
    }
}
