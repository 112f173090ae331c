//! Who may do what: every route with no token, a wrong token, each role, and another tenant's.

use quotad::config::{Role, TokenSettings};
use serde_json::json;

use crate::helpers::*;

fn token(role: Role, tenants: Option<&[&str]>, secret: &str) -> TokenSettings {
    TokenSettings {
        name: format!("{role:?}"),
        sha256: hex::encode(quotad::api::digest(secret)),
        role,
        tenants: tenants.map(|t| t.iter().map(|s| s.to_string()).collect()),
    }
}

const ACME_ADMIN: &str = "acme-admin-secret";
const ACME_CHECK: &str = "acme-check-secret";
const ANY_CHECK: &str = "any-check-secret";

async fn app() -> TestApp {
    let app = spawn_with(|s| {
        s.auth.tokens = vec![
            token(Role::TenantAdmin, Some(&["acme"]), ACME_ADMIN),
            token(Role::Check, Some(&["acme"]), ACME_CHECK),
            token(Role::Check, None, ANY_CHECK),
        ];
    })
    .await;
    for t in ["acme", "globex"] {
        let r = app
            .put_quota(
                t,
                json!({"limits": [{"id": "d", "max": 100, "period": "day"}]}),
            )
            .await;
        assert_eq!(r.status(), 201);
    }
    app
}

async fn send(app: &TestApp, method: reqwest::Method, path: &str, tok: Option<&str>) -> u16 {
    // `/v1/check#globex` means: check tenant globex.
    let (path, tenant) = path.split_once('#').unwrap_or((path, "acme"));
    let check = json!({"tenant": tenant, "client": "k"});
    let body = match path {
        "/v1/check" => check,
        "/v1/check/batch" => json!({ "checks": [check] }),
        _ => json!({"limits": [{"id": "d", "max": 100, "period": "day"}]}),
    };
    let mut req = app.http.request(method, app.url(path)).json(&body);
    if let Some(t) = tok {
        req = req.bearer_auth(t);
    }
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    if status >= 400 {
        let b: serde_json::Value = r.json().await.unwrap();
        assert!(b["error"]["code"].is_string(), "{path}: {b}");
        if status == 403 {
            // Never tells whether the other tenant exists.
            assert!(!b.to_string().contains("no quota"), "{b}");
        }
    }
    status
}

#[tokio::test]
async fn every_token_gets_exactly_the_access_of_its_role_and_tenants() {
    let app = app().await;
    use reqwest::Method as M;
    // (method, path, [no token, wrong, admin, acme tenant_admin, acme check, any check])
    let table: Vec<(M, &str, [u16; 6])> = vec![
        (M::GET, "/v1/quotas", [401, 401, 200, 200, 403, 403]),
        (M::GET, "/v1/quotas/acme", [401, 401, 200, 200, 403, 403]),
        (M::GET, "/v1/quotas/globex", [401, 401, 200, 403, 403, 403]),
        (M::GET, "/v1/quotas/nobody", [401, 401, 404, 403, 403, 403]),
        (M::PUT, "/v1/quotas/acme", [401, 401, 200, 200, 403, 403]),
        (M::PUT, "/v1/quotas/globex", [401, 401, 200, 403, 403, 403]),
        (
            M::PUT,
            "/v1/quotas/acme/clients/k",
            [401, 401, 201, 200, 403, 403],
        ),
        (
            M::GET,
            "/v1/quotas/acme/clients/k",
            [401, 401, 200, 200, 403, 403],
        ),
        (
            M::PUT,
            "/v1/quotas/globex/clients/k",
            [401, 401, 201, 403, 403, 403],
        ),
        (M::GET, "/v1/usage/acme/k", [401, 401, 200, 200, 403, 403]),
        (M::GET, "/v1/usage/globex/k", [401, 401, 200, 403, 403, 403]),
        (M::POST, "/v1/check#acme", [401, 401, 200, 200, 200, 200]),
        (M::POST, "/v1/check#globex", [401, 401, 200, 403, 403, 200]),
        (
            M::POST,
            "/v1/check/batch#acme",
            [401, 401, 200, 200, 200, 200],
        ),
        (
            M::DELETE,
            "/v1/quotas/globex/clients/k",
            [401, 401, 204, 403, 403, 403],
        ),
        (
            M::DELETE,
            "/v1/quotas/acme/clients/k",
            [401, 401, 204, 404, 403, 403],
        ),
    ];
    let tokens = [
        None,
        Some("wrong"),
        Some(ADMIN),
        Some(ACME_ADMIN),
        Some(ACME_CHECK),
        Some(ANY_CHECK),
    ];
    for (method, path, want) in table {
        for (tok, want) in tokens.iter().zip(want) {
            let got = send(&app, method.clone(), path, *tok).await;
            assert_eq!(got, want, "{method} {path} with {tok:?}");
        }
    }
}

#[tokio::test]
async fn a_tenant_admin_lists_only_its_tenants_and_a_batch_item_of_another_tenant_is_denied() {
    let app = app().await;
    let r = app
        .http
        .get(app.url("/v1/quotas?limit=1"))
        .bearer_auth(ACME_ADMIN)
        .send()
        .await
        .unwrap();
    let b: serde_json::Value = r.json().await.unwrap();
    let tenants: Vec<_> = b["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["tenant"].clone())
        .collect();
    assert_eq!(tenants, [json!("acme")]);
    assert!(b["next"].is_null());
    let r = app
        .http
        .post(app.url("/v1/check/batch"))
        .bearer_auth(ACME_CHECK)
        .json(&json!({"checks": [{"tenant": "acme", "client": "k"}, {"tenant": "globex", "client": "k"}]}))
        .send()
        .await
        .unwrap();
    let b: serde_json::Value = r.json().await.unwrap();
    assert_eq!(b["results"][0]["allowed"], true);
    assert_eq!(b["results"][1]["error"]["code"], "permission_denied");
}

#[test]
fn hash_token_prints_the_sha256_of_stdin() {
    use std::io::Write;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_quotad"))
        .arg("hash-token")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"s3cret\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        hex::encode(quotad::api::digest("s3cret"))
    );
}
