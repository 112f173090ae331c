//! Real answers of every kind, held against what the OpenAPI document says of them: a session
//! that puts, reads, checks, lists and deletes, in steps, each answer checked as it comes.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::conformance::Conformance;
use crate::helpers::*;
use crate::openapi::{documented, fetch_doc};

#[tokio::test]
async fn real_answers_match_the_document() {
    let app = spawn_app().await;
    let mut c = Conformance::new(fetch_doc(&app).await);
    quota_answers(&mut c, &app).await;
    check_answers(&mut c, &app).await;
    batch_and_usage_answers(&mut c, &app).await;
    deletes_and_ops_answers(&mut c, &app).await;
    history_and_audit_answers(&mut c, &app).await;
    forward_auth_answers(&mut c, &app).await;
    reservation_answers(&mut c, &app).await;

    // Every operation was exercised, and each answer kind the contract names at least once.
    let ops: BTreeSet<(String, String)> = c
        .seen
        .iter()
        .map(|(m, p, _)| (m.clone(), p.clone()))
        .collect();
    assert_eq!(ops, documented(&c.doc));
    let statuses: BTreeSet<u16> = c.seen.iter().map(|s| s.2).collect();
    for s in [200, 201, 204, 400, 401, 404, 409, 413, 429] {
        assert!(statuses.contains(&s), "no {s} seen: {statuses:?}");
    }
}

/// Puts, reads and lists tenants' policies and an override, well and badly.
async fn quota_answers(c: &mut Conformance, app: &TestApp) {
    let a = Some(ADMIN);
    let policy = json!({"limits": [
        {"id": "per-minute", "max": 2, "window": "1m"},
        {"id": "monthly", "max": 1000, "period": "month", "scope": "tenant"},
        {"id": "writes", "max": 1, "window": "10s", "resource": "PUT /p/*"},
        {"id": "bursts", "burst": 20, "rate": 5, "per": "1s", "resource": "GET /b/*"}]});
    let q = "/v1/quotas/{tenant}";
    let o = "/v1/quotas/{tenant}/clients/{client}";
    c.send(app, "put", q, "/v1/quotas/acme", Some(policy.clone()), a)
        .await;
    c.send(app, "put", q, "/v1/quotas/acme", Some(policy), a)
        .await;
    c.send(
        app,
        "put",
        q,
        "/v1/quotas/dry",
        Some(json!({"mode": "dry_run", "limits": [{"id": "one", "max": 1, "period": "day"}]})),
        a,
    )
    .await;
    c.send(
        app,
        "put",
        q,
        "/v1/quotas/bad",
        Some(json!({"limits": []})),
        a,
    )
    .await;
    c.send(
        app,
        "put",
        q,
        "/v1/quotas/bad",
        Some(json!({"limits": [{"id": "x", "max": 1, "windw": "1s"}]})),
        a,
    )
    .await;
    c.send(
        app,
        "put",
        q,
        "/v1/quotas/acme",
        Some(json!({"limits": []})),
        None,
    )
    .await;
    c.send(
        app,
        "put",
        q,
        "/v1/quotas/acme",
        Some(json!({"limits": []})),
        Some("wrong"),
    )
    .await;
    let r = app
        .http
        .put(app.url("/v1/quotas/acme"))
        .bearer_auth(ADMIN)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
    c.send(app, "get", q, "/v1/quotas/acme", None, a).await;
    c.send(app, "get", q, "/v1/quotas/nobody", None, a).await;
    c.send(app, "get", q, "/v1/quotas/a%20b", None, a).await;
    c.send(
        app,
        "put",
        o,
        "/v1/quotas/acme/clients/vip",
        Some(json!({"limits": [{"id": "per-minute", "max": 50, "window": "1m"}]})),
        a,
    )
    .await;
    c.send(app, "get", o, "/v1/quotas/acme/clients/vip", None, a)
        .await;
    c.send(app, "get", o, "/v1/quotas/acme/clients/nobody", None, a)
        .await;
    c.send(app, "get", "/v1/quotas", "/v1/quotas?limit=1", None, a)
        .await;
    c.send(app, "get", "/v1/quotas", "/v1/quotas", None, a)
        .await;
    c.send(app, "get", "/v1/quotas", "/v1/quotas?limit=0", None, a)
        .await;
    c.send(app, "get", "/v1/quotas", "/v1/quotas?bogus=1", None, a)
        .await;
    let l = "/v1/quotas/{tenant}/clients";
    let (st, v) = c
        .send(app, "get", l, "/v1/quotas/acme/clients?limit=1", None, a)
        .await;
    assert_eq!(
        (st, &v["overrides"][0]["client"]),
        (200, &json!("vip")),
        "{v}"
    );
    let (st, _) = c
        .send(
            app,
            "get",
            l,
            "/v1/quotas/acme/clients?after=a%20b",
            None,
            a,
        )
        .await;
    assert_eq!(st, 400);
    let (st, v) = c
        .send(app, "get", "/v1/quotas", "/v1/quotas?prefix=ac", None, a)
        .await;
    assert_eq!(st, 200, "{v}");
    assert!(
        v["quotas"]
            .as_array()
            .unwrap()
            .iter()
            .all(|q| q["tenant"].as_str().unwrap().starts_with("ac")),
        "{v}"
    );
}

/// Checks admitted, denied, dry-run, without a quota and malformed.
async fn check_answers(c: &mut Conformance, app: &TestApp) {
    let check = "/v1/check";
    let body = json!({"tenant": "acme", "client": "k1", "resource": "PUT /p/1"});
    let (s1, _) = c
        .send(app, "post", check, check, Some(body.clone()), None)
        .await;
    assert_eq!(s1, 200);
    let (s2, v) = c
        .send(app, "post", check, check, Some(body.clone()), None)
        .await;
    assert_eq!((s2, v["limit_id"].as_str()), (429, Some("writes")), "{v}");
    let (_, v) = c
        .send(
            app,
            "post",
            check,
            check,
            Some(json!({"tenant": "acme", "client": "k2", "cost": 5})),
            None,
        )
        .await;
    assert_eq!(v["retry_after_ms"], Value::Null, "{v}");
    let (_, v) = c
        .send(
            app,
            "post",
            check,
            check,
            Some(json!({"tenant": "dry", "client": "k", "cost": 0})),
            None,
        )
        .await;
    assert_eq!(v["allowed"], true);
    c.send(
        app,
        "post",
        check,
        check,
        Some(json!({"tenant": "dry", "client": "k"})),
        None,
    )
    .await;
    let (_, v) = c
        .send(
            app,
            "post",
            check,
            check,
            Some(json!({"tenant": "dry", "client": "k"})),
            None,
        )
        .await;
    assert_eq!(v["dry_run_denied"], true, "{v}");
    c.send(
        app,
        "post",
        check,
        check,
        Some(json!({"tenant": "nobody", "client": "k"})),
        None,
    )
    .await;
    c.send(
        app,
        "post",
        check,
        check,
        Some(json!({"tenant": "acme", "client": "k", "cots": 1})),
        None,
    )
    .await;
    let big = json!({"tenant": "acme", "client": "k", "resource": "x".repeat(70_000)});
    c.send(app, "post", check, check, Some(big), None).await;
}

/// A batch with a failed item, an empty batch, and usage reads.
async fn batch_and_usage_answers(c: &mut Conformance, app: &TestApp) {
    let a = Some(ADMIN);
    let u = "/v1/usage/{tenant}/{client}";
    let batch = "/v1/check/batch";
    let (_, v) = c
        .send(
            app,
            "post",
            batch,
            batch,
            Some(json!({"checks": [
            {"tenant": "acme", "client": "k3"},
            {"tenant": "nobody", "client": "k3"},
            {"tenant": "acme", "client": "k3", "resource": "GET /"}]})),
            None,
        )
        .await;
    assert_eq!(v["results"][1]["error"]["code"], "not_found", "{v}");
    c.send(app, "post", batch, batch, Some(json!({"checks": []})), None)
        .await;

    c.send(app, "get", u, "/v1/usage/acme/k1", None, a).await;
    c.send(
        app,
        "get",
        u,
        "/v1/usage/acme/k1?resource=PUT%20/p/1",
        None,
        a,
    )
    .await;
    c.send(app, "get", u, "/v1/usage/nobody/k1", None, a).await;
    let reset = "/v1/usage/{tenant}/{client}/reset";
    let (s, v) = c
        .send(
            app,
            "post",
            reset,
            "/v1/usage/acme/k1/reset",
            Some(json!({"limit_id": "per-minute"})),
            a,
        )
        .await;
    assert_eq!(s, 200, "{v}");
    let (s, _) = c
        .send(app, "post", reset, "/v1/usage/nobody/k1/reset", None, a)
        .await;
    assert_eq!(s, 404);
    let grant = "/v1/usage/{tenant}/{client}/grant";
    let body = json!({"limit_id": "per-minute", "amount": 3});
    let key = [("Idempotency-Key", "answers-grant-1")];
    let (s, first) = c
        .send_with(
            app,
            "post",
            grant,
            "/v1/usage/acme/k1/grant",
            Some(body.clone()),
            a,
            &key,
        )
        .await;
    assert_eq!((s, &first["granted"]), (200, &json!(3)), "{first}");
    let (s, again) = c
        .send_with(
            app,
            "post",
            grant,
            "/v1/usage/acme/k1/grant",
            Some(body),
            a,
            &key,
        )
        .await;
    assert_eq!(
        (s, &again),
        (200, &first),
        "a replay answers as the first did"
    );
    let (s, v) = c
        .send_with(
            app,
            "post",
            grant,
            "/v1/usage/acme/k1/grant",
            Some(json!({"limit_id": "per-minute", "amount": 4})),
            a,
            &key,
        )
        .await;
    assert_eq!(
        (s, &v["error"]["field"]),
        (400, &json!("Idempotency-Key")),
        "{v}"
    );
    let (s, v) = c
        .send(
            app,
            "post",
            grant,
            "/v1/usage/acme/k1/grant",
            Some(json!({"limit_id": "monthly", "amount": 1})),
            a,
        )
        .await;
    assert_eq!((s, &v["error"]["field"]), (400, &json!("limit_id")), "{v}");

    // The clients nearest to a limit (once the sync round has written the day's history).
    eventually("k3 nearest to its limit", || async {
        let v = app.get_json("/v1/usage/acme/nearest?limit=5").await;
        (v["clients"][0]["client"] == "k3")
            .then_some(())
            .ok_or_else(|| v.to_string())
    })
    .await;
    let n = "/v1/usage/{tenant}/nearest";
    let (s, v) = c
        .send(app, "get", n, "/v1/usage/acme/nearest?limit=5", None, a)
        .await;
    assert_eq!(s, 200, "{v}");
    // k3 used its per-minute limit up; k1's was reset and credited.
    assert_eq!(
        (&v["clients"][0]["client"], &v["clients"][0]["used"]),
        (&json!("k3"), &json!(1.0)),
        "{v}"
    );
    let (s, _) = c
        .send(app, "get", n, "/v1/usage/acme/nearest?limit=0", None, a)
        .await;
    assert_eq!(s, 400);
}

/// Deletes (the second one of each a 404), and the ops routes.
async fn deletes_and_ops_answers(c: &mut Conformance, app: &TestApp) {
    let a = Some(ADMIN);
    let q = "/v1/quotas/{tenant}";
    let o = "/v1/quotas/{tenant}/clients/{client}";
    c.send(app, "delete", o, "/v1/quotas/acme/clients/vip", None, a)
        .await;
    c.send(app, "delete", o, "/v1/quotas/acme/clients/vip", None, a)
        .await;
    c.send(app, "delete", q, "/v1/quotas/dry", None, a).await;
    c.send(app, "delete", q, "/v1/quotas/dry", None, a).await;

    c.send(app, "get", "/healthz", "/healthz", None, None).await;
    c.send(app, "get", "/readyz", "/readyz", None, None).await;
    c.send(app, "get", "/metrics", "/metrics", None, None).await;
    c.send(
        app,
        "get",
        "/v1/openapi.json",
        "/v1/openapi.json",
        None,
        None,
    )
    .await;
}

/// Usage history, top clients and the audit log, well and badly asked.
async fn history_and_audit_answers(c: &mut Conformance, app: &TestApp) {
    let a = Some(ADMIN);
    let ch = "/v1/usage/{tenant}/{client}/history";
    let th = "/v1/usage/{tenant}/history";
    let top = "/v1/usage/{tenant}/top";
    let (_, v) = c
        .send(app, "get", ch, "/v1/usage/acme/k1/history", None, a)
        .await;
    assert_eq!(v["points"].as_array().map(Vec::len), Some(24), "{v}");
    let (s, v) = c
        .send(
            app,
            "get",
            ch,
            "/v1/usage/acme/k1/history?step=week",
            None,
            a,
        )
        .await;
    assert_eq!(
        (s, v["error"]["field"].as_str()),
        (400, Some("step")),
        "{v}"
    );
    let (_, v) = c
        .send(app, "get", th, "/v1/usage/acme/history?step=day", None, a)
        .await;
    assert_eq!(v["points"].as_array().map(Vec::len), Some(30), "{v}");
    let (s, _) = c
        .send(
            app,
            "get",
            th,
            "/v1/usage/acme/history?from=yesterday",
            None,
            a,
        )
        .await;
    assert_eq!(s, 400);
    c.send(app, "get", top, "/v1/usage/acme/top", None, a).await;
    let (s, _) = c
        .send(app, "get", top, "/v1/usage/acme/top?limit=0", None, a)
        .await;
    assert_eq!(s, 400);
    let (_, v) = c.send(app, "get", "/v1/audit", "/v1/audit", None, a).await;
    assert!(!v["entries"].as_array().unwrap().is_empty(), "{v}");
    let (s, v) = c
        .send(app, "get", "/v1/audit", "/v1/audit?after=nope", None, a)
        .await;
    assert_eq!(
        (s, v["error"]["field"].as_str()),
        (400, Some("after")),
        "{v}"
    );
    c.send(
        app,
        "get",
        "/v1/audit",
        "/v1/audit?tenant=acme&limit=1",
        None,
        a,
    )
    .await;
    let (_, v) = c
        .send(
            app,
            "get",
            "/v1/audit",
            "/v1/audit?action=quota.put&actor=admin_token",
            None,
            a,
        )
        .await;
    assert!(!v["entries"].as_array().unwrap().is_empty(), "{v}");
    let (_, v) = c
        .send(app, "get", "/v1/whoami", "/v1/whoami", None, a)
        .await;
    assert_eq!(v["role"], "admin");
}

/// The forward-auth check under every method a proxy may forward, admitted and denied.
async fn forward_auth_answers(c: &mut Conformance, app: &TestApp) {
    let fa = "/v1/forward-auth";
    let client = [("x-quota-tenant", "acme"), ("x-quota-client", "fa")];
    let mut seen = Vec::new();
    for m in ["get", "head", "post", "put", "patch", "delete", "options"] {
        let (s, _) = c.send_with(app, m, fa, fa, None, None, &client).await;
        seen.push(s);
    }
    // acme allows 2 a minute per client: two admitted, then denials.
    assert_eq!(seen, [200, 200, 429, 429, 429, 429, 429]);
    let (s, v) = c
        .send_with(app, "get", fa, fa, None, None, &client[..1])
        .await;
    assert_eq!(
        (s, v["error"]["field"].as_str()),
        (400, Some("x-quota-client")),
        "{v}"
    );
}

/// A reservation taken, read, settled, released; and the refusals of each.
async fn reservation_answers(c: &mut Conformance, app: &TestApp) {
    let check = "/v1/check";
    let taking =
        json!({"tenant": "acme", "client": "r1", "cost": 2, "reserve": true, "hold": "1m"});
    let (s, v) = c
        .send(app, "post", check, check, Some(taking.clone()), None)
        .await;
    assert_eq!(s, 200, "{v}");
    let id = v["reservation"]["id"].as_str().unwrap().to_owned();
    let (s, v) = c.send(app, "post", check, check, Some(taking), None).await;
    assert_eq!((s, v.get("reservation")), (429, None), "{v}");
    let one = "/v1/reservations/{id}";
    let settle = "/v1/reservations/{id}/settle";
    let release = "/v1/reservations/{id}/release";
    let path = |t: &str| t.replace("{id}", &id);
    let (s, v) = c.send(app, "get", one, &path(one), None, None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("open")));
    let bad = Some(json!({"cost": -1}));
    assert_eq!(
        c.send(app, "post", settle, &path(settle), bad, None)
            .await
            .0,
        400
    );
    let (s, v) = c
        .send(
            app,
            "post",
            settle,
            &path(settle),
            Some(json!({"cost": 3})),
            None,
        )
        .await;
    assert_eq!(
        (s, v["over_limit"].as_array().map(Vec::len)),
        (200, Some(1)),
        "{v}"
    );
    assert_eq!(
        c.send(app, "post", release, &path(release), None, None)
            .await
            .0,
        409
    );
    let unknown = "/v1/reservations/0123456789abcdef0123456789abcdef";
    assert_eq!(c.send(app, "get", one, unknown, None, None).await.0, 404);
    assert_eq!(
        c.send(app, "get", one, "/v1/reservations/x", None, None)
            .await
            .0,
        400
    );
    let (_, v) = c
        .send(
            app,
            "post",
            check,
            check,
            Some(json!({"tenant": "acme", "client": "r2", "reserve": true})),
            None,
        )
        .await;
    let released = format!(
        "/v1/reservations/{}/release",
        v["reservation"]["id"].as_str().unwrap()
    );
    let (s, v) = c.send(app, "post", release, &released, None, None).await;
    assert_eq!((s, v["state"].as_str()), (200, Some("released")));
}
