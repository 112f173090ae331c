//! `GET /v1/openapi.json`: the document is served and lists exactly the routes the server has
//! (`api::ROUTES`) with exactly their methods. Real answers against it: `answers.rs`.

use std::collections::BTreeSet;

use serde_json::{json, Value};

use crate::helpers::*;

const METHODS: [&str; 7] = ["get", "head", "post", "put", "patch", "delete", "options"];

pub async fn fetch_doc(app: &TestApp) -> Value {
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
pub fn documented(doc: &Value) -> BTreeSet<(String, String)> {
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
    quotad::http::ROUTES
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
