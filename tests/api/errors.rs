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

/// `name: value\r\n` of each field: what `server.max_header_bytes` counts.
fn field_bytes(fields: &[(String, String)]) -> usize {
    fields.iter().map(|(n, v)| n.len() + v.len() + 4).sum()
}

/// Sends `GET path` with exactly these header fields (plus `Host` and `Connection: close`) on a
/// fresh connection, byte for byte as given; returns the status, the header fields (lower-case
/// names) and the body of the answer.
async fn raw_get(
    app: &TestApp,
    path: &str,
    fields: &[(String, String)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    use std::io::{Read, Write};
    let addr = app.base.strip_prefix("http://").unwrap().to_owned();
    let mut head = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
    for (n, v) in fields {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap();
        let end = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an answer head");
        let text = String::from_utf8(answer[..end].to_vec()).unwrap();
        let mut lines = text.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap();
        let headers = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        (status.parse().unwrap(), headers, answer[end + 4..].to_vec())
    })
    .await
    .unwrap()
}

/// Header fields that, with `raw_get`'s own `Host` and `Connection`, take exactly `total` bytes.
fn padded_to(total: usize) -> Vec<(String, String)> {
    let own = field_bytes(&[
        ("host".into(), "x".into()),
        ("connection".into(), "close".into()),
    ]);
    let pad = total - own - field_bytes(&[("x-pad".into(), String::new())]);
    vec![("x-pad".into(), "p".repeat(pad))]
}

fn assert_431_body(body: &[u8], limit: usize) {
    let b: Value = serde_json::from_slice(body).expect("a JSON error body");
    assert_eq!(b["error"]["code"], "request_header_fields_too_large", "{b}");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(message.contains(&limit.to_string()), "{b}");
}

#[tokio::test]
async fn header_fields_over_max_header_bytes_get_431_and_exactly_at_it_pass() {
    let app = spawn_with(|s| s.server.max_header_bytes = 4096).await;

    let (status, _, _) = raw_get(&app, "/healthz", &padded_to(4096)).await;
    assert_eq!(status, 200, "exactly at the limit");
    let (status, headers, body) = raw_get(&app, "/healthz", &padded_to(4097)).await;
    assert_eq!(status, 431, "one byte over");
    assert!(
        headers
            .iter()
            .any(|(n, v)| n == "content-type" && v.starts_with("application/json")),
        "{headers:?}"
    );
    assert_431_body(&body, 4096);

    // The sum counts, not the largest field: 50 fields of 90 bytes each are 4500.
    let many: Vec<(String, String)> = (0..50)
        .map(|i| (format!("x-f{i:02}"), "v".repeat(81)))
        .collect();
    assert_eq!(field_bytes(&many), 4500);
    let (status, _, body) = raw_get(&app, "/healthz", &many).await;
    assert_eq!(status, 431);
    assert_431_body(&body, 4096);

    // Before routing and auth: an admin route without a token, an unknown path.
    for path in ["/v1/quotas", "/v1/nothing"] {
        let (status, _, body) = raw_get(&app, path, &padded_to(5000)).await;
        assert_eq!(status, 431, "{path}");
        assert_431_body(&body, 4096);
    }
}

#[tokio::test]
async fn the_default_header_limit_is_16_kib() {
    let app = spawn_app().await;
    let get = |pad: usize| {
        app.http
            .get(app.url("/healthz"))
            .header("x-pad", "p".repeat(pad))
            .send()
    };
    assert_eq!(get(15 * 1024).await.unwrap().status(), 200);
    let r = get(16 * 1024).await.unwrap();
    assert_error(r, 431, "request_header_fields_too_large").await;
}

/// What actix-http enforces by itself, before quotad sees the request (documented in the README
/// and at `server.max_header_bytes`): past 96 header fields a bare 431 with no body. A limit as
/// high as the configuration allows is reachable: a 120 KiB header block passes.
#[tokio::test]
async fn actix_limits_stand_behind_max_header_bytes() {
    let app =
        spawn_with(|s| s.server.max_header_bytes = quotad::config::HEADER_BYTES_CEILING).await;
    let (status, _, _) = raw_get(&app, "/healthz", &padded_to(120 * 1024)).await;
    assert_eq!(status, 200);

    let fields = |n: usize| -> Vec<(String, String)> {
        (0..n).map(|i| (format!("x-{i}"), "v".into())).collect()
    };
    // 94 of ours and raw_get's 2 are 96: still parsed.
    let (status, _, _) = raw_get(&app, "/healthz", &fields(94)).await;
    assert_eq!(status, 200);
    let (status, _, body) = raw_get(&app, "/healthz", &fields(95)).await;
    assert_eq!(status, 431);
    assert!(body.is_empty(), "{}", String::from_utf8_lossy(&body));
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

    for cost in [json!(7.5), json!(-1.0), json!(1_000_001.0), json!(1e300)] {
        let r = app
            .check(json!({"tenant": "acme", "client": "k", "cost": cost}))
            .await;
        let b = assert_error(r, 400, "invalid_argument").await;
        assert_eq!(b["error"]["field"], "cost", "{cost}");
        assert_eq!(b["error"]["message"], "cost must be 0..=1000000", "{cost}");
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
