//! `GET /v1/openapi.json`: the document is served, lists exactly the routes the server has, and
//! real answers of every kind match what it says (a small JSON Schema check, enough for the
//! keywords the document uses; `scripts/fuzz-api.sh` does the thorough job with schemathesis).

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::helpers::*;

const METHODS: [&str; 5] = ["get", "put", "post", "delete", "patch"];

async fn fetch_doc(app: &TestApp) -> Value {
    let r = app
        .http
        .get(app.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    r.json().await.unwrap()
}

/// (method, path template) of every documented operation.
fn documented(doc: &Value) -> BTreeSet<(String, String)> {
    let mut ops = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for m in METHODS {
            if item.get(m).is_some() {
                ops.insert((m.to_owned(), path.clone()));
            }
        }
    }
    ops
}

/// (method, path template) of every route in `api::ROUTES`, the table `api::routes` registers:
/// a route added there without a `#[utoipa::path]` fails `every_route_is_documented`.
fn registered() -> BTreeSet<(String, String)> {
    quotad::api::ROUTES
        .iter()
        .map(|r| (r.method.as_str().to_lowercase(), r.path.to_owned()))
        .collect()
}

#[tokio::test]
async fn the_document_is_served_as_openapi_3() {
    let app = spawn_app().await;
    let doc = fetch_doc(&app).await;
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["title"], "quotad");
    assert!(doc["info"]["version"].as_str().is_some());
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    // Objects the server refuses unknown fields in say so.
    for name in ["Check", "CheckBatch", "Policy", "Limit"] {
        assert_eq!(
            doc["components"]["schemas"][name]["additionalProperties"], false,
            "{name}"
        );
    }
    // Admin routes need the bearer token; checks may go without one.
    assert_eq!(
        doc["paths"]["/v1/quotas"]["get"]["security"],
        json!([{"bearer": []}])
    );
    assert_eq!(
        doc["paths"]["/v1/check"]["post"]["security"],
        json!([{}, {"bearer": []}])
    );
}

#[tokio::test]
async fn every_route_is_documented() {
    let app = spawn_app().await;
    let doc = fetch_doc(&app).await;
    let registered = registered();
    assert!(registered.len() >= 14, "{registered:?}");
    assert_eq!(documented(&doc), registered);
}

/// Fills a path template with valid ids.
fn concrete(template: &str) -> String {
    template
        .replace("{tenant}", "acme")
        .replace("{client}", "k1")
}

#[tokio::test]
async fn the_server_has_exactly_the_documented_methods_of_each_path() {
    let app = spawn_app().await;
    let doc = fetch_doc(&app).await;
    let ops = documented(&doc);
    let paths: BTreeSet<&String> = ops.iter().map(|(_, p)| p).collect();
    for path in paths {
        for m in METHODS {
            let method = reqwest::Method::from_bytes(m.to_uppercase().as_bytes()).unwrap();
            let r = app
                .http
                .request(method, app.url(&concrete(path)))
                .bearer_auth(ADMIN)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let allow = allowed_methods(&r);
            let body: Value = r.json().await.unwrap_or(Value::Null);
            let is_documented = ops.contains(&(m.to_owned(), path.clone()));
            if is_documented {
                assert_ne!(status, 405, "{m} {path}: {body}");
                assert_ne!(body["error"]["message"], "no such route", "{m} {path}");
            } else {
                assert_eq!(status, 405, "{m} {path} is not documented: {body}");
                // The 405's Allow names exactly the path's documented methods.
                let want: BTreeSet<String> = ops
                    .iter()
                    .filter(|(_, p)| p == path)
                    .map(|(m, _)| m.to_uppercase())
                    .collect();
                assert_eq!(allow, Some(want), "{m} {path}");
            }
        }
    }
}

/// Resolves `{"$ref": "#/components/..."}`.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let pointer = r.strip_prefix('#').expect("local $ref");
            resolve(doc, doc.pointer(pointer).unwrap_or_else(|| panic!("{r}")))
        }
        None => schema,
    }
}

fn type_ok(t: &str, v: &Value) -> bool {
    match t {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "string" => v.is_string(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        other => panic!("unknown type {other}"),
    }
}

/// Validates `v` against `schema`; returns what does not match, with where.
fn check(doc: &Value, schema: &Value, v: &Value, at: &str, errors: &mut Vec<String>) {
    let s = resolve(doc, schema);
    let mut fail = |m: String| errors.push(format!("{at}: {m} (value {v})"));
    if let Some(t) = s.get("type") {
        let ok = match t {
            Value::String(t) => type_ok(t, v),
            Value::Array(ts) => ts.iter().any(|t| type_ok(t.as_str().unwrap(), v)),
            _ => panic!("bad type {t}"),
        };
        if !ok {
            fail(format!("not of type {t}"));
            return;
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            fail(format!("not one of {e:?}"));
        }
    }
    if let Some(n) = v.as_f64() {
        if s.get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n < m)
        {
            fail("below minimum".into());
        }
        if s.get("maximum")
            .and_then(Value::as_f64)
            .is_some_and(|m| n > m)
        {
            fail("above maximum".into());
        }
    }
    if let Some(alts) = s.get("oneOf").and_then(Value::as_array) {
        let matching = alts
            .iter()
            .filter(|a| {
                let mut e = Vec::new();
                check(doc, a, v, at, &mut e);
                e.is_empty()
            })
            .count();
        if matching != 1 {
            fail(format!("matches {matching} of oneOf, not 1"));
        }
    }
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for a in all {
            check(doc, a, v, at, errors);
        }
    }
    if let Value::Object(obj) = v {
        let props = s.get("properties").and_then(Value::as_object);
        for r in s
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let r = r.as_str().unwrap();
            if !obj.contains_key(r) {
                errors.push(format!("{at}: required {r} missing in {v}"));
            }
        }
        for (k, x) in obj {
            match props.and_then(|p| p.get(k)) {
                Some(ps) => check(doc, ps, x, &format!("{at}.{k}"), errors),
                None if s.get("additionalProperties") == Some(&Value::Bool(false)) => {
                    errors.push(format!("{at}: {k} is not in the document"))
                }
                None => {}
            }
        }
    }
    if let (Value::Array(items), Some(is)) = (v, s.get("items")) {
        if s.get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| (items.len() as u64) < m)
        {
            errors.push(format!("{at}: fewer than minItems"));
        }
        if s.get("maxItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| (items.len() as u64) > m)
        {
            errors.push(format!("{at}: more than maxItems"));
        }
        for (i, x) in items.iter().enumerate() {
            check(doc, is, x, &format!("{at}[{i}]"), errors);
        }
    }
}

/// Sends a request and holds its answer against the document: the status is documented for the
/// operation, the content type is the documented one, the body matches the schema and the
/// documented headers that came have the documented type.
struct Conformance {
    doc: Value,
    /// (method, path template, status) seen, to prove the test covered what it meant to.
    seen: BTreeSet<(String, String, u16)>,
}

impl Conformance {
    async fn send(
        &mut self,
        app: &TestApp,
        method: &str,
        template: &str,
        path: &str,
        body: Option<Value>,
        token: Option<&str>,
    ) -> (u16, Value) {
        let m = reqwest::Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let mut req = app.http.request(m, app.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = &body {
            req = req.json(b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let headers = r.headers().clone();
        let text = r.text().await.unwrap();
        let op = &self.doc["paths"][template][method];
        assert!(op.is_object(), "{method} {template} is not documented");
        let answer = &op["responses"][status.to_string()];
        assert!(
            answer.is_object(),
            "{method} {path}: status {status} is not documented ({text})"
        );
        let ct = headers
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let documented_ct: Vec<&String> = answer["content"]
            .as_object()
            .map(|c| c.keys().collect())
            .unwrap_or_default();
        let value = match (&ct, documented_ct.first()) {
            (None, None) => Value::Null,
            (Some(ct), Some(doc_ct)) => {
                assert!(
                    ct.starts_with(doc_ct.as_str()),
                    "{method} {path} {status}: content-type {ct}, documented {doc_ct}"
                );
                if doc_ct.as_str() == "application/json" {
                    let v: Value = serde_json::from_str(&text).unwrap();
                    let mut errors = Vec::new();
                    check(
                        &self.doc,
                        &answer["content"][doc_ct.as_str()]["schema"],
                        &v,
                        "$",
                        &mut errors,
                    );
                    assert!(errors.is_empty(), "{method} {path} {status}: {errors:#?}");
                    v
                } else {
                    Value::String(text)
                }
            }
            (ct, doc_ct) => {
                panic!("{method} {path} {status}: content-type {ct:?}, documented {doc_ct:?}")
            }
        };
        for (name, h) in answer["headers"].as_object().into_iter().flatten() {
            if let Some(got) = headers.get(name.as_str()) {
                let got = got.to_str().unwrap();
                if h["schema"]["type"] == "integer" {
                    assert!(got.parse::<u64>().is_ok(), "{name}: {got}");
                }
            }
        }
        self.seen
            .insert((method.to_owned(), template.to_owned(), status));
        (status, value)
    }
}

#[tokio::test]
async fn real_answers_match_the_document() {
    let app = spawn_app().await;
    let mut c = Conformance {
        doc: fetch_doc(&app).await,
        seen: BTreeSet::new(),
    };
    let a = Some(ADMIN);
    let policy = json!({"limits": [
        {"id": "per-minute", "max": 2, "window": "1m"},
        {"id": "monthly", "max": 1000, "period": "month", "scope": "tenant"},
        {"id": "writes", "max": 1, "window": "10s", "resource": "PUT /p/*"}]});
    let q = "/v1/quotas/{tenant}";
    let o = "/v1/quotas/{tenant}/clients/{client}";
    let u = "/v1/usage/{tenant}/{client}";

    c.send(&app, "put", q, "/v1/quotas/acme", Some(policy.clone()), a)
        .await;
    c.send(&app, "put", q, "/v1/quotas/acme", Some(policy), a)
        .await;
    c.send(
        &app,
        "put",
        q,
        "/v1/quotas/dry",
        Some(json!({"mode": "dry_run", "limits": [{"id": "one", "max": 1, "period": "day"}]})),
        a,
    )
    .await;
    c.send(
        &app,
        "put",
        q,
        "/v1/quotas/bad",
        Some(json!({"limits": []})),
        a,
    )
    .await;
    c.send(
        &app,
        "put",
        q,
        "/v1/quotas/bad",
        Some(json!({"limits": [{"id": "x", "max": 1, "windw": "1s"}]})),
        a,
    )
    .await;
    c.send(
        &app,
        "put",
        q,
        "/v1/quotas/acme",
        Some(json!({"limits": []})),
        None,
    )
    .await;
    c.send(
        &app,
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
    c.send(&app, "get", q, "/v1/quotas/acme", None, a).await;
    c.send(&app, "get", q, "/v1/quotas/nobody", None, a).await;
    c.send(&app, "get", q, "/v1/quotas/a%20b", None, a).await;
    c.send(
        &app,
        "put",
        o,
        "/v1/quotas/acme/clients/vip",
        Some(json!({"limits": [{"id": "per-minute", "max": 50, "window": "1m"}]})),
        a,
    )
    .await;
    c.send(&app, "get", o, "/v1/quotas/acme/clients/vip", None, a)
        .await;
    c.send(&app, "get", o, "/v1/quotas/acme/clients/nobody", None, a)
        .await;
    c.send(&app, "get", "/v1/quotas", "/v1/quotas?limit=1", None, a)
        .await;
    c.send(&app, "get", "/v1/quotas", "/v1/quotas", None, a)
        .await;
    c.send(&app, "get", "/v1/quotas", "/v1/quotas?limit=0", None, a)
        .await;
    c.send(&app, "get", "/v1/quotas", "/v1/quotas?bogus=1", None, a)
        .await;

    let check = "/v1/check";
    let body = json!({"tenant": "acme", "client": "k1", "resource": "PUT /p/1"});
    let (s1, _) = c
        .send(&app, "post", check, check, Some(body.clone()), None)
        .await;
    assert_eq!(s1, 200);
    let (s2, v) = c
        .send(&app, "post", check, check, Some(body.clone()), None)
        .await;
    assert_eq!((s2, v["limit_id"].as_str()), (429, Some("writes")), "{v}");
    let (_, v) = c
        .send(
            &app,
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
            &app,
            "post",
            check,
            check,
            Some(json!({"tenant": "dry", "client": "k", "cost": 0})),
            None,
        )
        .await;
    assert_eq!(v["allowed"], true);
    c.send(
        &app,
        "post",
        check,
        check,
        Some(json!({"tenant": "dry", "client": "k"})),
        None,
    )
    .await;
    let (_, v) = c
        .send(
            &app,
            "post",
            check,
            check,
            Some(json!({"tenant": "dry", "client": "k"})),
            None,
        )
        .await;
    assert_eq!(v["dry_run_denied"], true, "{v}");
    c.send(
        &app,
        "post",
        check,
        check,
        Some(json!({"tenant": "nobody", "client": "k"})),
        None,
    )
    .await;
    c.send(
        &app,
        "post",
        check,
        check,
        Some(json!({"tenant": "acme", "client": "k", "cots": 1})),
        None,
    )
    .await;
    let big = json!({"tenant": "acme", "client": "k", "resource": "x".repeat(70_000)});
    c.send(&app, "post", check, check, Some(big), None).await;

    let batch = "/v1/check/batch";
    let (_, v) = c
        .send(
            &app,
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
    c.send(
        &app,
        "post",
        batch,
        batch,
        Some(json!({"checks": []})),
        None,
    )
    .await;

    c.send(&app, "get", u, "/v1/usage/acme/k1", None, a).await;
    c.send(
        &app,
        "get",
        u,
        "/v1/usage/acme/k1?resource=PUT%20/p/1",
        None,
        a,
    )
    .await;
    c.send(&app, "get", u, "/v1/usage/nobody/k1", None, a).await;

    c.send(&app, "delete", o, "/v1/quotas/acme/clients/vip", None, a)
        .await;
    c.send(&app, "delete", o, "/v1/quotas/acme/clients/vip", None, a)
        .await;
    c.send(&app, "delete", q, "/v1/quotas/dry", None, a).await;
    c.send(&app, "delete", q, "/v1/quotas/dry", None, a).await;

    c.send(&app, "get", "/healthz", "/healthz", None, None)
        .await;
    c.send(&app, "get", "/readyz", "/readyz", None, None).await;
    c.send(&app, "get", "/metrics", "/metrics", None, None)
        .await;
    c.send(
        &app,
        "get",
        "/v1/openapi.json",
        "/v1/openapi.json",
        None,
        None,
    )
    .await;

    // Every operation was exercised, and each answer kind the contract names at least once.
    let ops: BTreeSet<(String, String)> = c
        .seen
        .iter()
        .map(|(m, p, _)| (m.clone(), p.clone()))
        .collect();
    assert_eq!(ops, documented(&c.doc));
    let statuses: BTreeSet<u16> = c.seen.iter().map(|s| s.2).collect();
    for s in [200, 201, 204, 400, 401, 404, 413, 429] {
        assert!(statuses.contains(&s), "no {s} seen: {statuses:?}");
    }
}
