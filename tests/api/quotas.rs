//! The admin API: `/v1/quotas`, overrides, `/v1/usage`.

use serde_json::json;

use crate::helpers::*;

#[tokio::test]
async fn put_creates_then_replaces_with_a_new_version_and_get_and_delete_follow() {
    let app = spawn_app().await;
    let policy = json!({"limits": [{"id": "per-second", "max": 10, "window": "1s"}]});
    let r = app.put_quota("acme", policy).await;
    assert_eq!(r.status(), 201);
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["tenant"], "acme");
    assert_eq!(b["version"], 1);
    assert_eq!(b["mode"], "enforce");
    assert_eq!(b["consistency"], "cached");
    assert_eq!(b["on_store_failure"], "local");
    assert_eq!(b["limits"][0]["scope"], "client");
    assert!(chrono::DateTime::parse_from_rfc3339(b["updated_at"].as_str().unwrap()).is_ok());

    // The same policy again (in another spelling) changes nothing: no version, no audit entry.
    let same =
        json!({"limits": [{"window": "1s", "max": 10, "id": "per-second", "scope": "client"}]});
    let r = app.put_quota("acme", same).await;
    assert_eq!(r.status(), 200);
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["version"], 1);
    let audit = app.get_json("/v1/audit?tenant=acme").await;
    assert_eq!(audit["entries"].as_array().unwrap().len(), 1, "{audit}");

    let changed = json!({"limits": [{"id": "per-second", "max": 20, "window": "1s"}]});
    let r = app.put_quota("acme", changed).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap()["version"], 2);

    let r = app.admin_get("/v1/quotas/acme").await;
    assert_eq!(r.status(), 200);
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["version"], 2);
    assert_eq!(b["limits"][0]["window"], "1s");
    assert_eq!(b["limits"][0]["max"], 20);

    let del = |path: &str| app.http.delete(app.url(path)).bearer_auth(ADMIN).send();
    assert_eq!(del("/v1/quotas/acme").await.unwrap().status(), 204);
    assert_error(del("/v1/quotas/acme").await.unwrap(), 404, "not_found").await;
    assert_error(app.admin_get("/v1/quotas/acme").await, 404, "not_found").await;
    let r = app.check(json!({"tenant": "acme", "client": "k"})).await;
    assert_error(r, 404, "not_found").await;
}

#[tokio::test]
async fn the_list_pages_by_tenant() {
    let app = spawn_app().await;
    for t in ["t1", "t2", "t3", "t4", "t5"] {
        app.put_quota(
            t,
            json!({"limits": [{"id": "d", "max": 1, "period": "day"}]}),
        )
        .await;
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/quotas?limit=2&after={a}"),
            None => "/v1/quotas?limit=2".to_string(),
        };
        let b: serde_json::Value = app.admin_get(&path).await.json().await.unwrap();
        for q in b["quotas"].as_array().unwrap() {
            seen.push(q["tenant"].as_str().unwrap().to_string());
        }
        match b["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, ["t1", "t2", "t3", "t4", "t5"]);
    for bad in [
        "/v1/quotas?limit=0",
        "/v1/quotas?limit=1001",
        "/v1/quotas?limit=x",
        "/v1/quotas?after=a%20b",
        "/v1/quotas?colour=red",
    ] {
        assert_error(app.admin_get(bad).await, 400, "invalid_argument").await;
    }
}

#[tokio::test]
async fn the_admin_api_needs_the_admin_token() {
    let app = spawn_app().await;
    for (method, path) in [
        (reqwest::Method::GET, "/v1/quotas"),
        (reqwest::Method::GET, "/v1/quotas/acme"),
        (reqwest::Method::PUT, "/v1/quotas/acme"),
        (reqwest::Method::DELETE, "/v1/quotas/acme"),
        (reqwest::Method::GET, "/v1/quotas/acme/clients/k"),
        (reqwest::Method::PUT, "/v1/quotas/acme/clients/k"),
        (reqwest::Method::DELETE, "/v1/quotas/acme/clients/k"),
        (reqwest::Method::GET, "/v1/usage/acme/k"),
    ] {
        let r = app
            .http
            .request(method.clone(), app.url(path))
            .json(&json!({"limits": [{"id": "d", "max": 1, "period": "day"}]}))
            .send()
            .await
            .unwrap();
        assert!(r.headers().contains_key("www-authenticate"));
        assert_error(r, 401, "unauthenticated").await;
        let r = app
            .http
            .request(method, app.url(path))
            .bearer_auth("not-the-token")
            .send()
            .await
            .unwrap();
        assert_error(r, 401, "unauthenticated").await;
    }
}

/// The admin token a start-up logged (`admin_token=<hex>`), and how many times it logged one.
fn logged_admin_token(log: &str) -> (String, usize) {
    let mut found = log.match_indices("admin_token=");
    let (i, _) = found
        .next()
        .unwrap_or_else(|| panic!("no admin token logged:\n{log}"));
    let token: String = log[i + "admin_token=".len()..]
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (token, 1 + found.count())
}

#[tokio::test]
async fn without_a_configured_admin_token_a_random_one_guards_the_admin_api() {
    let unset = |s: &mut quotad::config::Settings| s.auth.admin_token = Default::default();
    let (app, log) = spawn_logged(unset).await;
    let (token, times) = logged_admin_token(&log);
    assert_eq!(times, 1, "logged once:\n{log}");
    assert_eq!(token.len(), 64, "256 random bits in hex: {token}");
    let get = |tok: Option<&str>| {
        let mut r = app.http.get(app.url("/v1/quotas"));
        if let Some(t) = tok {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    assert_error(get(None).await.unwrap(), 401, "unauthenticated").await;
    assert_error(get(Some("")).await.unwrap(), 401, "unauthenticated").await;
    assert_error(get(Some(ADMIN)).await.unwrap(), 401, "unauthenticated").await;
    // The logged token is the one that works.
    assert_eq!(get(Some(&token)).await.unwrap().status(), 200);

    // Another start makes another token: the first one does not open the second server.
    let (other, log) = spawn_logged(unset).await;
    let (second, _) = logged_admin_token(&log);
    assert_ne!(second, token, "two starts, two tokens");
    let with = |tok: &str| {
        other
            .http
            .get(other.url("/v1/quotas"))
            .bearer_auth(tok.to_owned())
            .send()
    };
    assert_error(with(&token).await.unwrap(), 401, "unauthenticated").await;
    assert_eq!(with(&second).await.unwrap().status(), 200);
}

#[tokio::test]
async fn usage_reports_each_applicable_limit_and_consumes_nothing() {
    let app = spawn_app().await;
    app.put_quota(
        "acme",
        json!({"limits": [
            {"id": "hourly", "max": 5, "period": "hour"},
            {"id": "writes", "max": 9, "window": "1m", "resource": "PUT /x*"}]}),
    )
    .await;
    for _ in 0..5 {
        app.check(json!({"tenant": "acme", "client": "k1"})).await;
    }
    for _ in 0..3 {
        let u = app.usage("acme", "k1").await;
        assert_eq!(u["tenant"], "acme");
        assert_eq!(u["client"], "k1");
        let l = &u["limits"][0];
        assert_eq!(l["limit_id"], "hourly");
        assert_eq!(
            (
                l["count"].clone(),
                l["limit"].clone(),
                l["remaining"].clone()
            ),
            (json!(5), json!(5), json!(0))
        );
        assert!(l["reset_after_ms"].as_i64().unwrap() > 0);
        assert_eq!(
            u["limits"].as_array().unwrap().len(),
            1,
            "writes does not apply without resource"
        );
    }
    let r = app.admin_get("/v1/usage/acme/k1?resource=PUT%20/x/1").await;
    let u: serde_json::Value = r.json().await.unwrap();
    assert_eq!(u["limits"].as_array().unwrap().len(), 2);
    // Every limit, whatever its resource, with what it counts: a console's view of a client.
    for _ in 0..2 {
        let r = app
            .check(json!({"tenant": "acme", "client": "k1", "resource": "PUT /x/2"}))
            .await;
        assert_eq!(r.status(), 429, "hourly is full");
    }
    let all = app.get_json("/v1/usage/acme/k1?all=true").await;
    let limits = all["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{all}");
    assert_eq!(limits[0]["resource"], serde_json::Value::Null);
    assert_eq!(limits[0]["scope"], "client");
    assert_eq!(limits[1]["limit_id"], "writes");
    assert_eq!(limits[1]["resource"], "PUT /x*");
    assert_eq!(limits[1]["count"], 0, "denied checks count nothing");
    for bad in ["all=yes", "all=true&resource=PUT%20/x/1"] {
        let r = app.admin_get(&format!("/v1/usage/acme/k1?{bad}")).await;
        assert_error(r, 400, "invalid_argument").await;
    }
    assert_error(app.admin_get("/v1/usage/nobody/k1").await, 404, "not_found").await;
    assert_error(
        app.admin_get("/v1/usage/acme/bad%20id").await,
        400,
        "invalid_argument",
    )
    .await;
}

#[tokio::test]
async fn invalid_policies_are_400s_that_name_the_field() {
    let app = spawn_app().await;
    for (policy, field) in [
        (json!({"limits": []}), "limits"),
        (json!({}), "limits"),
        (
            json!({"limits": [{"id": "a", "max": 0, "window": "1s"}]}),
            "limits[0].max",
        ),
        (
            json!({"limits": [{"id": "a", "max": "10", "window": "1s"}]}),
            "limits[0].max",
        ),
        (
            json!({"limits": [{"id": "a", "max": 10, "window": "0.5s"}]}),
            "limits[0].window",
        ),
        (json!({"limits": [{"id": "a", "max": 10}]}), "limits[0]"),
        (
            json!({"limits": [{"id": "a", "max": 10, "period": "fortnight"}]}),
            "limits[0].period",
        ),
        (
            json!({"limits": [{"id": "", "max": 10, "period": "day"}]}),
            "limits[0].id",
        ),
        (
            json!({"limits": [{"id": "a", "max": 10, "period": "day", "resource": ""}]}),
            "limits[0].resource",
        ),
        (
            json!({"limits": [{"id": "a", "max": 10, "period": "day", "windw": "1s"}]}),
            "limits[0].windw",
        ),
        (
            json!({"limits": [{"id": "a", "max": 10, "period": "day"}], "mode": "loud"}),
            "mode",
        ),
    ] {
        let r = app.put_quota("acme", policy.clone()).await;
        let b = assert_error(r, 400, "invalid_argument").await;
        assert_eq!(b["error"]["field"], field, "{policy}");
    }
    let r = app
        .put_quota(
            "bad%20tenant",
            json!({"limits": [{"id": "a", "max": 1, "period": "day"}]}),
        )
        .await;
    let b = assert_error(r, 400, "invalid_argument").await;
    assert_eq!(b["error"]["field"], "tenant");
}

#[tokio::test]
async fn a_change_through_one_instance_is_enforced_by_another_within_refresh_ms() {
    let dir = tempfile::tempdir().unwrap();
    let store: quotad::store::DynStore =
        std::sync::Arc::new(quotad::store::embedded::EmbeddedStore::open(dir.path()).unwrap());
    let a = spawn_on_store(store.clone(), |_| {}).await;
    let b = spawn_on_store(store, |_| {}).await;
    a.put_quota(
        "acme",
        json!({"limits": [{"id": "d", "max": 100, "period": "day"}]}),
    )
    .await;
    // refresh_ms is 100 in tests: a few intervals, or more on a busy machine.
    b.admitted_eventually("acme", "k", "instance b never saw the policy")
        .await;
    a.put_quota(
        "acme",
        json!({"limits": [{"id": "d", "max": 1, "period": "day"}]}),
    )
    .await;
    // Once b has polled the policy (and read a's hit back), the lowered max is enforced on
    // counts already consumed; a check b admitted before that only adds to them.
    eventually("the lowered max enforced on b", || async {
        let (s, body) = b.check_json("acme", "k").await;
        (s == 429 && body["limit"] == json!(1))
            .then_some(())
            .ok_or(format!("{s} {body}"))
    })
    .await;
}
