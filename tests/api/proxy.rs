//! `/v1/forward-auth` spoken to directly, as a proxy speaks to it: statuses and headers, the
//! cost and resource it reads and from where, every spelling of a limited path. quotad behind
//! the real nginx example is `nginx`.

use serde_json::json;

use crate::helpers::*;

pub(crate) async fn shop(app: &TestApp) {
    let r = app
        .put_quota(
            "shop",
            json!({"limits": [
                {"id": "per-second", "max": 3, "window": "1s"},
                {"id": "writes", "max": 1, "window": "1m", "resource": "POST /orders*"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
}

async fn ask(app: &TestApp, method: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut req = app.http.request(m, app.url("/v1/forward-auth"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn forward_auth_answers_with_a_status_and_headers_and_no_body() {
    let app = spawn_app().await;
    shop(&app).await;
    let who = [("X-Quota-Tenant", "shop"), ("X-Quota-Client", "k1")];
    let mut got = Vec::new();
    for _ in 0..4 {
        let r = ask(&app, "GET", &who).await;
        let status = r.status().as_u16();
        let remaining = r.headers()["ratelimit-remaining"]
            .to_str()
            .unwrap()
            .to_owned();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(r.bytes().await.unwrap().len(), 0);
        got.push((status, remaining, retry));
    }
    // Retry-After: whole seconds, rounded up, until the oldest hit leaves the 1 s window
    // (which the window's buckets may stretch by one bucket width): 1 or 2.
    let retry = got[3].2.as_deref().map(|r| r.parse::<u64>().unwrap());
    assert!(matches!(retry, Some(1..=2)), "{got:?}");
    let shape: Vec<(u16, &str, bool)> = got
        .iter()
        .map(|(s, rem, retry)| (*s, rem.as_str(), retry.is_some()))
        .collect();
    assert_eq!(
        shape,
        [
            (200, "2", false),
            (200, "1", false),
            (200, "0", false),
            (429, "0", true)
        ]
    );

    // The resource is the original request's method and path, the query left out: the write
    // limit (1 a minute) meets POST /orders only.
    let post = |uri: &'static str| {
        [
            ("X-Quota-Tenant", "shop"),
            ("X-Quota-Client", "k2"),
            ("X-Forwarded-Method", "POST"),
            ("X-Forwarded-Uri", uri),
        ]
    };
    assert_eq!(ask(&app, "GET", &post("/orders?id=1")).await.status(), 200);
    let r = ask(&app, "GET", &post("/orders/2")).await;
    assert_eq!(r.status(), 429);
    assert!(
        r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 1
    );
    assert_eq!(ask(&app, "GET", &post("/cart")).await.status(), 200);
    // A path with raw UTF-8 is still that path (percent-encoded), not "/": the write limit
    // of client k4 applies to it as to any POST /orders.
    let mut raw = reqwest::header::HeaderMap::new();
    for (k, v) in [
        ("x-quota-tenant", "shop"),
        ("x-quota-client", "k4"),
        ("x-forwarded-method", "POST"),
    ] {
        raw.insert(k, v.parse().unwrap());
    }
    raw.insert(
        "x-forwarded-uri",
        reqwest::header::HeaderValue::from_bytes("/orders/é".as_bytes()).unwrap(),
    );
    let send = || {
        app.http
            .get(app.url("/v1/forward-auth"))
            .headers(raw.clone())
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 200);
    assert_eq!(send().await.unwrap().status(), 429);

    // A cost header is not read unless the operator named one (`costs_are_read_only_...`):
    // a cost of 3 still costs 1, and a bad one is no error.
    let costly = |cost: &'static str| {
        [
            ("X-Quota-Tenant", "shop"),
            ("X-Quota-Client", "k3"),
            ("X-Quota-Cost", cost),
        ]
    };
    let r = ask(&app, "POST", &costly("3")).await;
    assert_eq!(r.headers()["ratelimit-remaining"], "2");
    assert_eq!(ask(&app, "POST", &costly("-1")).await.status(), 200);

    // A tenant without a quota, and bad headers.
    let r = ask(
        &app,
        "GET",
        &[("X-Quota-Tenant", "nobody"), ("X-Quota-Client", "k")],
    )
    .await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("ratelimit-limit").is_none());
    for (headers, field) in [
        (vec![("X-Quota-Client", "k")], "x-quota-tenant"),
        (vec![("X-Quota-Tenant", "shop")], "x-quota-client"),
        (
            vec![("X-Quota-Tenant", "a b"), ("X-Quota-Client", "k")],
            "x-quota-tenant",
        ),
        (
            vec![
                ("X-Quota-Tenant", "shop"),
                ("X-Quota-Client", "k"),
                ("X-Original-URI", "/orders"),
            ],
            "x-original-method",
        ),
        (
            vec![
                ("X-Quota-Tenant", "shop"),
                ("X-Quota-Client", "k"),
                ("X-Forwarded-Method", "POST"),
            ],
            "x-forwarded-uri",
        ),
        (
            vec![
                ("X-Quota-Tenant", "shop"),
                ("X-Quota-Client", "k"),
                ("X-Original-Method", "PO ST"),
                ("X-Original-URI", "/orders"),
            ],
            "x-original-method",
        ),
    ] {
        let r = ask(&app, "GET", &headers).await;
        assert_eq!(r.status(), 400, "{headers:?}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["field"], field, "{v}");
    }
}

/// With `forward_auth.cost_header` set, the cost is read from it, checked, and a denial
/// consumes nothing.
#[tokio::test]
async fn costs_are_read_only_from_a_cost_header_the_operator_named() {
    let app = spawn_with(|s| s.forward_auth.cost_header = Some("X-Cost".into())).await;
    shop(&app).await;
    let costly = |cost: &'static str| {
        [
            ("X-Quota-Tenant", "shop"),
            ("X-Quota-Client", "k3"),
            ("X-Cost", cost),
            ("X-Quota-Cost", "0"),
        ]
    };
    assert_eq!(ask(&app, "POST", &costly("3")).await.status(), 200);
    assert_eq!(ask(&app, "POST", &costly("3")).await.status(), 429);
    let r = ask(&app, "POST", &costly("-1")).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["field"], "x-cost", "{v}");
}

/// The method and URI come from one source, the first `forward_auth.resource_from` names
/// that is present, never one header from each; the method's case is folded.
#[tokio::test]
async fn the_resource_comes_from_one_pair_of_headers_in_the_configured_order() {
    let app = spawn_app().await;
    login_limit(&app).await;
    let at = |client: &'static str, extra: &[(&'static str, &'static str)]| {
        let mut h = vec![("X-Quota-Tenant", "site"), ("X-Quota-Client", client)];
        h.extend_from_slice(extra);
        h
    };
    // `post` is POST: the second meets the limit of 1.
    let lower = at(
        "a",
        &[("X-Original-Method", "post"), ("X-Original-URI", "/login")],
    );
    assert_eq!(ask(&app, "GET", &lower).await.status(), 200);
    assert_eq!(ask(&app, "GET", &lower).await.status(), 429);
    // The original pair is read first, whole: a forwarded URI does not replace its path.
    let both = at(
        "b",
        &[
            ("X-Original-Method", "POST"),
            ("X-Original-URI", "/login"),
            ("X-Forwarded-Method", "GET"),
            ("X-Forwarded-Uri", "/elsewhere"),
        ],
    );
    assert_eq!(ask(&app, "GET", &both).await.status(), 200);
    assert_eq!(ask(&app, "GET", &both).await.status(), 429);

    // Told to read Traefik's pair only, a caller's X-Original-* are not looked at.
    let traefik = spawn_with(|s| s.forward_auth.resource_from = vec!["forwarded".into()]).await;
    login_limit(&traefik).await;
    let spoofed = at(
        "c",
        &[
            ("X-Forwarded-Method", "POST"),
            ("X-Forwarded-Uri", "/login"),
            ("X-Original-Method", "GET"),
            ("X-Original-URI", "/elsewhere"),
        ],
    );
    assert_eq!(ask(&traefik, "GET", &spoofed).await.status(), 200);
    assert_eq!(ask(&traefik, "GET", &spoofed).await.status(), 429);
}

/// Tenant `site`: a limit of 1 an hour on `POST /login`.
async fn login_limit(app: &TestApp) {
    let r = app
        .put_quota(
            "site",
            json!({"limits": [{"id": "login", "max": 1, "window": "1h", "resource": "POST /login"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
}

/// A limit of 1 an hour on `POST /login`: the first request passes, and every other spelling
/// of the same path meets the same limit.
#[tokio::test]
async fn every_spelling_of_a_limited_path_meets_its_limit() {
    let app = spawn_app().await;
    login_limit(&app).await;
    let at = |uri: &'static str| {
        [
            ("X-Quota-Tenant", "site"),
            ("X-Quota-Client", "attacker"),
            ("X-Original-Method", "POST"),
            ("X-Original-URI", uri),
        ]
    };
    assert_eq!(ask(&app, "GET", &at("/login")).await.status(), 200);
    for uri in [
        "/login",
        "/%6Cogin",
        "//login",
        "/./login",
        "/login/",
        "/login;x",
        "/a/../login",
        "/login?next=/",
        "/LOGIN",
        "/Login/",
    ] {
        let r = ask(&app, "GET", &at(uri)).await;
        assert_eq!(r.status(), 429, "{uri}");
        assert_eq!(r.headers()["ratelimit-limit"], "1", "{uri}");
    }
}

/// The same through `POST /v1/check`, for a service that passes its request's path as the
/// resource: each spelling meets the limit, and the answer says which limit bound it.
#[tokio::test]
async fn every_spelling_of_a_limited_path_meets_its_limit_in_a_check() {
    let app = spawn_app().await;
    login_limit(&app).await;
    let check = |resource: &str| {
        app.check(json!({"tenant": "site", "client": "attacker", "resource": resource}))
    };
    assert_eq!(check("POST /login").await.status(), 200);
    for path in [
        "/login",
        "/%6Cogin",
        "//login",
        "/./login",
        "/login/",
        "/login;x",
        "/a/../login",
        "/LOGIN",
        "/Login/",
    ] {
        let r = check(&format!("POST {path}")).await;
        assert_eq!(r.status(), 429, "{path}");
        assert_eq!(r.headers()["ratelimit-limit"], "1", "{path}");
    }
    // Another path, and a resource that is not a request, meet no limit.
    assert_eq!(check("POST /logout").await.status(), 200);
    assert_eq!(check("login").await.status(), 200);
}

#[tokio::test]
async fn with_a_check_token_forward_auth_reads_it_from_its_own_header() {
    let app = spawn_with(|s| {
        s.auth.check_token = quotad::config::Secret::new("proxy-secret");
        s.forward_auth.deny_status = 403;
    })
    .await;
    shop(&app).await;
    let who = [("X-Quota-Tenant", "shop"), ("X-Quota-Client", "k")];
    assert_eq!(ask(&app, "GET", &who).await.status(), 401);
    let with = |t: &'static str| {
        [
            who[0],
            who[1],
            ("X-Quota-Token", t),
            ("Authorization", "Bearer end-user"),
        ]
    };
    assert_eq!(ask(&app, "GET", &with("wrong")).await.status(), 401);
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(
            ask(&app, "GET", &with("proxy-secret"))
                .await
                .status()
                .as_u16(),
        );
    }
    assert_eq!(got, [200, 200, 200, 403]);
}
