//! Arbitrary input at every body-taking route: a 4xx or a decision, never a 5xx or a panic.

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::helpers::*;

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
