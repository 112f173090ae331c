//! Envoy's rate limit service used as Envoy AI Gateway uses it (`grpc.usage_after_the_fact`):
//! a call on the request with `hits_addend` 0, and one at the stream's end carrying the tokens
//! used.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::json;

use crate::grpc::{client, descriptor};
use crate::helpers::*;

async fn call(app: &TestApp, hits_addend: u32) -> RateLimitResponse {
    let mut c = client(app).await;
    c.should_rate_limit(RateLimitRequest {
        domain: "llm".into(),
        descriptors: vec![descriptor(&[("client", "u1"), ("model", "gpt")])],
        hits_addend,
    })
    .await
    .unwrap()
    .into_inner()
}

/// The count of the model's limit (a limit on a resource: read with `all=true`).
async fn used(app: &TestApp) -> u64 {
    let u = app.get_json("/v1/usage/llm/u1?all=true").await;
    u["limits"][0]["count"]
        .as_u64()
        .unwrap_or_else(|| panic!("{u}"))
}

#[tokio::test]
async fn the_request_after_the_one_that_crossed_the_budget_is_refused() {
    let app = spawn_with(|s| {
        s.server.grpc_bind = Some("127.0.0.1:0".into());
        s.grpc.usage_after_the_fact = true;
    })
    .await;
    let policy = json!({"limits": [
        {"id": "tokens", "max": 10000, "window": "1m", "resource": "model=gpt"}]});
    assert_eq!(app.put_quota("llm", policy).await.status(), 201);

    // The request's check takes nothing.
    let r = call(&app, 0).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    assert_eq!(r.statuses[0].limit_remaining, 10_000);
    assert_eq!(used(&app).await, 0);
    // Its stream's end: 6,000 tokens used, charged.
    assert_eq!(call(&app, 6_000).await.overall_code, Code::Ok as i32);
    assert_eq!(used(&app).await, 6_000);
    // The next request is admitted (4,000 left), and its 6,000 are charged all the same.
    assert_eq!(call(&app, 0).await.overall_code, Code::Ok as i32);
    let end = call(&app, 6_000).await;
    assert_eq!(
        end.overall_code,
        Code::OverLimit as i32,
        "past the budget: {end:?}"
    );
    assert_eq!(used(&app).await, 12_000);
    // The request after the one that crossed the budget is refused.
    let r = call(&app, 0).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(used(&app).await, 12_000);
    // The usage history has the tokens, as cost, and the checks: 3 asked, 1 refused.
    app.history_reaches("llm", "u1", 2, 1).await;
    let h = app.get_json("/v1/usage/llm/u1/history").await;
    assert_eq!(h["total"]["cost"], 12_000, "{h}");
}

#[tokio::test]
async fn without_the_setting_every_call_is_a_check_and_0_is_1() {
    let app = spawn_with(|s| s.server.grpc_bind = Some("127.0.0.1:0".into())).await;
    let policy = json!({"limits": [
        {"id": "tokens", "max": 10000, "window": "1m", "resource": "model=gpt"}]});
    assert_eq!(app.put_quota("llm", policy).await.status(), 201);
    assert_eq!(call(&app, 0).await.overall_code, Code::Ok as i32);
    assert_eq!(used(&app).await, 1);
    // A stream's end that does not fit is refused, and nothing is charged.
    let end = call(&app, 10_000).await;
    assert_eq!(end.overall_code, Code::OverLimit as i32);
    assert_eq!(used(&app).await, 1);
}
