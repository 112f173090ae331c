//! Envoy's rate limit service (gRPC), spoken to by a client generated from Envoy's own protobuf
//! definitions (envoy-types), against a running quotad.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use serde_json::json;
use tonic::transport::Channel;

use crate::helpers::*;

pub(crate) fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

pub(crate) async fn client(app: &TestApp) -> RateLimitServiceClient<Channel> {
    let port = app.grpc_port.expect("grpc_bind is set");
    RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap()
}

async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    c.should_rate_limit(RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    })
    .await
    .unwrap()
    .into_inner()
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

async fn app() -> TestApp {
    let app = spawn_with(|s| s.server.grpc_bind = Some("127.0.0.1:0".into())).await;
    let r = app
        .put_quota(
            "shop",
            json!({"limits": [
                {"id": "per-second", "max": 3, "window": "1s", "resource": "path=/api"},
                {"id": "search", "max": 5, "window": "1m", "resource": "path=/search*"},
                {"id": "uploads", "max": 1, "period": "hour", "resource": "method=POST/path=/upload"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    app
}

#[tokio::test]
async fn ok_then_over_limit_with_the_current_limit_remaining_and_headers() {
    let app = app().await;
    let mut c = client(&app).await;
    let d = || vec![descriptor(&[("client", "k1"), ("path", "/api")])];
    let mut remaining = Vec::new();
    for _ in 0..3 {
        let r = ask(&mut c, "shop", d()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        let s = &r.statuses[0];
        let limit = s.current_limit.as_ref().unwrap();
        assert_eq!(
            (limit.requests_per_unit, limit.unit, limit.name.as_str()),
            (3, Unit::Second as i32, "per-second")
        );
        remaining.push(s.limit_remaining);
        assert_eq!(
            header(&r, "RateLimit-Remaining"),
            Some(s.limit_remaining.to_string().as_str())
        );
        assert_eq!(header(&r, "Retry-After"), None);
    }
    assert_eq!(remaining, [2, 1, 0]);
    let r = ask(&mut c, "shop", d()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert_eq!(r.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    let reset = r.statuses[0].duration_until_reset.unwrap();
    assert!(
        reset.seconds <= 1 && (reset.seconds > 0 || reset.nanos > 0),
        "{reset:?}"
    );
    let retry: u64 = header(&r, "Retry-After").unwrap().parse().unwrap();
    assert!((1..=2).contains(&retry), "{r:?}");
    assert_eq!(header(&r, "RateLimit-Limit"), Some("3"));

    // A calendar period maps to its unit; an unknown tenant and an unmatched descriptor are OK.
    let r = ask(
        &mut c,
        "shop",
        vec![descriptor(&[
            ("client", "k1"),
            ("method", "POST"),
            ("path", "/upload"),
        ])],
    )
    .await;
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (1, Unit::Hour as i32)
    );
    let r = ask(&mut c, "nobody", d()).await;
    assert_eq!((r.overall_code, r.statuses.len()), (Code::Ok as i32, 1));
    // A value no resource may hold (raw UTF-8) is encoded, not refused (a refusal would let a
    // fail-open Envoy through).
    let r = ask(
        &mut c,
        "shop",
        vec![descriptor(&[("client", "k1"), ("path", "/é")])],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    let r = ask(
        &mut c,
        "shop",
        vec![descriptor(&[("client", "k1"), ("path", "/other")])],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());

    // A bad domain is refused, not guessed.
    let e = c
        .should_rate_limit(RateLimitRequest {
            domain: "a b".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    // So is a cost above a check's most (as a 400 is on HTTP).
    let e = c
        .should_rate_limit(RateLimitRequest {
            domain: "shop".into(),
            descriptors: d(),
            hits_addend: 1_000_000_001,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    app.stop().await;
}

/// A descriptor value that is a path is compared as forward-auth compares paths: no spelling
/// (doubled slashes, capitals, escapes of plain letters, dot segments) walks past a limit on it.
#[tokio::test]
async fn every_spelling_of_a_path_meets_the_limit_on_it() {
    let app = app().await;
    let mut c = client(&app).await;
    for path in [
        "//search/x",
        "/SEARCH/x",
        "/%73earch/x",
        "/./search",
        "/a/../search?q=1",
    ] {
        let r = ask(
            &mut c,
            "shop",
            vec![descriptor(&[("client", "k9"), ("path", path)])],
        )
        .await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{path}: {r:?}");
        let limit = r.statuses[0].current_limit.as_ref();
        assert_eq!(limit.map(|l| l.name.as_str()), Some("search"), "{path}");
    }
    let r = ask(
        &mut c,
        "shop",
        vec![descriptor(&[("client", "k9"), ("path", "/Search/y/")])],
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "the 6th: {r:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_request_denied_by_one_descriptor_consumes_nothing_from_the_other() {
    let app = app().await;
    let mut c = client(&app).await;
    let upload = descriptor(&[("client", "k2"), ("method", "POST"), ("path", "/upload")]);
    let search = descriptor(&[("client", "k2"), ("path", "/search")]);
    // Use up the upload limit (1 an hour).
    let r = ask(&mut c, "shop", vec![upload.clone()]).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    // Both descriptors: the upload one is over, so nothing is taken from search.
    for _ in 0..3 {
        let r = ask(&mut c, "shop", vec![search.clone(), upload.clone()]).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
        assert_eq!(r.statuses[0].code, Code::Ok as i32);
        assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
        assert_eq!(r.statuses[0].limit_remaining, 5, "{r:?}");
    }
    let usage = app
        .get_json("/v1/usage/shop/k2?resource=path=/search")
        .await;
    let search_count = usage["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit_id"] == "search")
        .map(|l| l["count"].as_u64().unwrap());
    assert_eq!(search_count, Some(0), "{usage}");
    // Search alone still has its whole allowance.
    let r = ask(&mut c, "shop", vec![search]).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 4)
    );
    app.stop().await;
}

#[tokio::test]
async fn a_check_token_is_read_from_the_authorization_metadata() {
    let app = spawn_with(|s| {
        s.server.grpc_bind = Some("127.0.0.1:0".into());
        s.auth.check_token = quotad::config::Secret::new("envoy-secret");
    })
    .await;
    let mut c = client(&app).await;
    let req = || RateLimitRequest {
        domain: "shop".into(),
        descriptors: vec![descriptor(&[("client", "k")])],
        hits_addend: 1,
    };
    let e = c.should_rate_limit(req()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut with = tonic::Request::new(req());
    with.metadata_mut()
        .insert("authorization", "Bearer envoy-secret".parse().unwrap());
    let r = c.should_rate_limit(with).await.unwrap().into_inner();
    assert_eq!(r.overall_code, Code::Ok as i32);
    app.stop().await;
}

#[tokio::test]
async fn while_the_store_fails_each_request_is_one_failure_decision_for_all_its_descriptors() {
    use quotad::store::faulty::{Fault, FaultyStore};
    let dir = tempfile::tempdir().unwrap();
    let inner: quotad::store::DynStore =
        std::sync::Arc::new(quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap());
    let faulty = FaultyStore::new(inner);
    let app = spawn_on_store(faulty.clone(), |s| {
        s.server.grpc_bind = Some("127.0.0.1:0".into())
    })
    .await;
    let r = app
        .put_quota(
            "shop",
            json!({"on_store_failure": "deny", "limits": [
                {"id": "api", "max": 3, "window": "1s", "resource": "path=/api"},
                {"id": "search", "max": 5, "window": "1m", "resource": "path=/search"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let mut c = client(&app).await;
    faulty.set(Fault::Failing);
    let series = "quotad_store_failure_decisions_total{consistency=\"cached\",rule=\"deny\"}";
    let before = app.metric(series).await;
    // A client never seen: its counters must be read from the failing store.
    let r = ask(
        &mut c,
        "shop",
        vec![
            descriptor(&[("client", "new"), ("path", "/api")]),
            descriptor(&[("client", "new"), ("path", "/search")]),
        ],
    )
    .await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert!(
        r.statuses.iter().all(|s| s.code == Code::OverLimit as i32),
        "{r:?}"
    );
    assert!(
        r.statuses.iter().all(|s| s.current_limit.is_some()),
        "{r:?}"
    );
    assert_eq!(app.metric(series).await - before, 1.0);
    faulty.set(Fault::Healthy);
    app.stop().await;
}

/// A request of 160,000 descriptors for a tenant that does not exist, with no token (3.5 MB,
/// under tonic's default 4 MiB), grouped client by client with a linear search, once took 31 s
/// of a worker. It is refused at once for its size, one of 300 small descriptors for their
/// number, and a small call made meanwhile keeps its latency.
#[tokio::test]
async fn a_request_past_the_bounds_is_refused_at_once_and_small_calls_keep_going() {
    let app = app().await;
    let many = |n: usize| -> Vec<RateLimitDescriptor> {
        (0..n)
            .map(|i| descriptor(&[("client", &format!("c{i}")), ("path", "/x")]))
            .collect()
    };
    let huge = RateLimitRequest {
        domain: "nobody".into(),
        descriptors: many(160_000),
        hits_addend: 0,
    };
    let mut big = client(&app).await;
    let started = std::time::Instant::now();
    let call = tokio::spawn(async move { big.should_rate_limit(huge).await });
    // A small call while the large one is under way.
    let mut c = client(&app).await;
    let small_started = std::time::Instant::now();
    let r = ask(
        &mut c,
        "shop",
        vec![descriptor(&[("client", "k9"), ("path", "/api")])],
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    assert!(small_started.elapsed() < std::time::Duration::from_secs(1));
    let err = call
        .await
        .unwrap()
        .expect_err("160,000 descriptors refused");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(1),
        "refused after {:?}",
        started.elapsed()
    );
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");
    assert!(
        err.message().contains("message length too large"),
        "{err:?}"
    );
    let err = c
        .should_rate_limit(RateLimitRequest {
            domain: "shop".into(),
            descriptors: many(300),
            hits_addend: 0,
        })
        .await
        .expect_err("300 descriptors refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("at most 256"), "{err:?}");
    // Within the bounds, 256 descriptors of 256 clients are answered.
    let r = ask(&mut c, "shop", many(256)).await;
    assert_eq!(r.statuses.len(), 256);
}
