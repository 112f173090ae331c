//! `POST /v1/check` and `/v1/check/batch` as the contract says.

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn admitted_checks_carry_ratelimit_headers_and_a_denial_says_when_to_retry() {
    let app = spawn_app().await;
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "per-minute", "max": 2, "period": "minute"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let r = app.check(json!({"tenant": "acme", "client": "k1"})).await;
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["ratelimit-limit"], "2");
    assert_eq!(h["ratelimit-remaining"], "1");
    assert_eq!(h["x-ratelimit-limit"], "2");
    assert_eq!(h["x-ratelimit-remaining"], "1");
    assert_eq!(h["ratelimit-reset"], h["x-ratelimit-reset"]);
    assert!(h.get("retry-after").is_none());
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["allowed"], true);
    assert_eq!(body["limit_id"], "per-minute");
    assert_eq!(body["limit"], 2);
    assert_eq!(body["remaining"], 1);
    assert_eq!(body["retry_after_ms"], 0);
    let reset_ms = body["reset_after_ms"].as_i64().unwrap();
    assert!(reset_ms > 0 && reset_ms <= 60_000);
    let reset_s: i64 = h["ratelimit-reset"].to_str().unwrap().parse().unwrap();
    assert_eq!(reset_s, (reset_ms + 999) / 1000, "seconds rounded up");

    app.check(json!({"tenant": "acme", "client": "k1"})).await;
    let r = app.check(json!({"tenant": "acme", "client": "k1"})).await;
    assert_eq!(r.status(), 429);
    let retry: i64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry >= 1);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["allowed"], false);
    assert_eq!(body["remaining"], 0);
    let retry_ms = body["retry_after_ms"].as_i64().unwrap();
    assert!(retry_ms > 0);
    assert_eq!(retry, ((retry_ms + 999) / 1000).max(1));
}

#[tokio::test]
async fn two_hundred_concurrent_http_checks_against_max_100_admit_exactly_100() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "h", "max": 100, "period": "hour"}]}),
    )
    .await;
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let (http, url) = (app.http.clone(), app.url("/v1/check"));
        tasks.push(tokio::spawn(async move {
            http.post(url)
                .json(&json!({"tenant": "acme", "client": "k1"}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }));
    }
    let mut codes = std::collections::HashMap::new();
    for t in tasks {
        *codes.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    assert_eq!(codes.get(&200), Some(&100), "{codes:?}");
    assert_eq!(codes.get(&429), Some(&100), "{codes:?}");
}

#[tokio::test]
async fn a_cost_above_max_is_429_with_null_retry_and_no_retry_after_header() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "m", "max": 5, "window": "1m"}]}),
    )
    .await;
    let r = app
        .check(json!({"tenant": "acme", "client": "k1", "cost": 6}))
        .await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_none());
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["retry_after_ms"].is_null());
    // Cost 0 peeks and consumes nothing.
    let r = app
        .check(json!({"tenant": "acme", "client": "k1", "cost": 0}))
        .await;
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["remaining"], 5);
    let u = app.usage("acme", "k1").await;
    assert_eq!(u["limits"][0]["count"], 0);
}

#[tokio::test]
async fn a_check_no_limit_applies_to_is_admitted_with_nulls_and_no_headers() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "writes", "max": 1, "window": "10s", "resource": "PUT /products/*"}]}),
    )
    .await;
    let r = app
        .check(json!({"tenant": "acme", "client": "k1", "resource": "GET /products/1"}))
        .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("ratelimit-limit").is_none());
    let body: serde_json::Value = r.json().await.unwrap();
    for k in ["limit_id", "limit", "remaining", "reset_after_ms"] {
        assert!(body[k].is_null(), "{k}: {body}");
    }
    // The prefix matches, once; then it denies.
    for (want, status) in [(true, 200), (false, 429)] {
        let r = app
            .check(json!({"tenant": "acme", "client": "k1", "resource": "PUT /products/42"}))
            .await;
        assert_eq!(r.status(), status);
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["allowed"], want);
    }
}

#[tokio::test]
async fn tenant_scoped_limits_are_shared_and_client_limits_are_not() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [
            {"id": "per-client", "max": 2, "period": "hour"},
            {"id": "all", "max": 3, "period": "hour", "scope": "tenant"}]}),
    )
    .await;
    assert_eq!(app.check_json("acme", "a").await.0, 200);
    assert_eq!(app.check_json("acme", "a").await.0, 200);
    let (s, b) = app.check_json("acme", "a").await;
    assert_eq!((s, b["limit_id"].as_str()), (429, Some("per-client")));
    assert_eq!(app.check_json("acme", "b").await.0, 200);
    let (s, b) = app.check_json("acme", "c").await;
    assert_eq!((s, b["limit_id"].as_str()), (429, Some("all")));
}

#[tokio::test]
async fn dry_run_always_answers_200_and_flags_what_enforcement_would_deny() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "m", "max": 1, "period": "hour"}], "mode": "dry_run"}),
    )
    .await;
    let (s, b) = app.check_json("acme", "k1").await;
    assert_eq!(s, 200);
    assert!(b.get("dry_run_denied").is_none());
    let r = app.check(json!({"tenant": "acme", "client": "k1"})).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("retry-after").is_none());
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["allowed"], true);
    assert_eq!(b["dry_run_denied"], true);
}

#[tokio::test]
async fn a_tenant_without_a_quota_is_404_unless_a_default_is_configured() {
    let app = spawn_app().await;
    let r = app.check(json!({"tenant": "nobody", "client": "k1"})).await;
    assert_error(r, 404, "not_found").await;

    let app = spawn_with(|s| {
        s.quotas.default = Some(
            serde_json::from_value(json!({"limits": [{"id": "d", "max": 1, "period": "day"}]}))
                .unwrap(),
        )
    })
    .await;
    assert_eq!(app.check_json("nobody", "k1").await.0, 200);
    assert_eq!(app.check_json("nobody", "k1").await.0, 429);
}

#[tokio::test]
async fn client_overrides_replace_same_id_limits_and_add_others() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "h", "max": 1, "period": "hour"}]}),
    )
    .await;
    let r = app
        .http
        .put(app.url("/v1/quotas/acme/clients/vip"))
        .bearer_auth(ADMIN)
        .json(&json!({"limits": [
            {"id": "h", "max": 3, "period": "hour"},
            {"id": "m", "max": 2, "period": "minute"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(app.check_json("acme", "plain").await.0, 200);
    assert_eq!(app.check_json("acme", "plain").await.0, 429);
    assert_eq!(app.check_json("acme", "vip").await.0, 200);
    assert_eq!(app.check_json("acme", "vip").await.0, 200);
    let (s, b) = app.check_json("acme", "vip").await;
    assert_eq!(
        (s, b["limit_id"].as_str()),
        (429, Some("m")),
        "the added limit binds"
    );
    let u = app.usage("acme", "vip").await;
    assert_eq!(u["limits"].as_array().unwrap().len(), 2);
    // An override's scope must be client.
    let r = app
        .http
        .put(app.url("/v1/quotas/acme/clients/vip"))
        .bearer_auth(ADMIN)
        .json(&json!({"limits": [{"id": "t", "max": 3, "period": "hour", "scope": "tenant"}]}))
        .send()
        .await
        .unwrap();
    let b = assert_error(r, 400, "invalid_argument").await;
    assert_eq!(b["error"]["field"], "limits[0].scope");
}

#[tokio::test]
async fn a_batch_answers_in_order_each_as_if_sent_alone() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "h", "max": 2, "period": "hour"}]}),
    )
    .await;
    let checks: Vec<_> = (0..3)
        .map(|_| json!({"tenant": "acme", "client": "k1"}))
        .chain([
            json!({"tenant": "ghost", "client": "k1"}),
            json!({"tenant": "acme", "client": "k2", "cost": 2}),
        ])
        .collect();
    let r = app
        .http
        .post(app.url("/v1/check/batch"))
        .json(&json!({ "checks": checks }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let b: serde_json::Value = r.json().await.unwrap();
    let res = b["results"].as_array().unwrap();
    assert_eq!(res.len(), 5);
    let allowed: Vec<_> = res.iter().map(|x| x["allowed"].clone()).collect();
    assert_eq!(allowed[..3], [json!(true), json!(true), json!(false)]);
    assert_eq!(res[3]["error"]["code"], "not_found");
    assert_eq!(res[4]["allowed"], true);
    assert_eq!(res[4]["remaining"], 0);

    for n in [0usize, 1001] {
        let checks: Vec<_> = (0..n)
            .map(|_| json!({"tenant": "acme", "client": "k"}))
            .collect();
        let r = app
            .http
            .post(app.url("/v1/check/batch"))
            .json(&json!({ "checks": checks }))
            .send()
            .await
            .unwrap();
        let b = assert_error(r, 400, "invalid_argument").await;
        assert_eq!(b["error"]["field"], "checks");
    }
    let r = app
        .http
        .post(app.url("/v1/check/batch"))
        .json(&json!({"checks": [{"tenant": "acme", "client": "k"}, {"tenant": "acme", "client": "k", "cost": -1}]}))
        .send()
        .await
        .unwrap();
    let b = assert_error(r, 400, "invalid_argument").await;
    assert_eq!(b["error"]["field"], "checks[1].cost");
}

#[tokio::test]
async fn a_configured_check_token_is_required_for_checks() {
    let app = spawn_with(|s| s.auth.check_token = quotad::config::Secret::new("chk")).await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "h", "max": 5, "period": "hour"}]}),
    )
    .await;
    let body = json!({"tenant": "acme", "client": "k1"});
    let r = app.check(body.clone()).await;
    assert_error(r, 401, "unauthenticated").await;
    let r = app
        .http
        .post(app.url("/v1/check"))
        .bearer_auth("wrong")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_error(r, 401, "unauthenticated").await;
    let r = app
        .http
        .post(app.url("/v1/check"))
        .bearer_auth("chk")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // The check token is not an admin token.
    let r = app
        .http
        .get(app.url("/v1/quotas/acme"))
        .bearer_auth("chk")
        .send()
        .await
        .unwrap();
    assert_error(r, 403, "permission_denied").await;
}
