//! Who may do what: every route with no token, a wrong token, each role, and another tenant's.

use quotad::config::{Role, TokenSettings};
use serde_json::json;

use crate::helpers::*;

fn token(role: Role, tenants: Option<&[&str]>, secret: &str) -> TokenSettings {
    TokenSettings {
        name: secret.trim_end_matches("-secret").to_owned(),
        // Salted hashes, as `quotad hash-token` prints them: every route below goes through
        // their verification and its cache.
        hash: quotad::config::tokens::hash(secret),
        sha256: String::new(),
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
        (
            M::GET,
            "/v1/usage/acme/k/history",
            [401, 401, 200, 200, 403, 403],
        ),
        (
            M::GET,
            "/v1/usage/globex/k/history",
            [401, 401, 200, 403, 403, 403],
        ),
        (
            M::GET,
            "/v1/usage/acme/history",
            [401, 401, 200, 200, 403, 403],
        ),
        (
            M::GET,
            "/v1/usage/globex/history",
            [401, 401, 200, 403, 403, 403],
        ),
        (M::GET, "/v1/usage/acme/top", [401, 401, 200, 200, 403, 403]),
        (
            M::GET,
            "/v1/usage/globex/top",
            [401, 401, 200, 403, 403, 403],
        ),
        (M::GET, "/v1/audit", [401, 401, 200, 200, 403, 403]),
        (M::GET, "/v1/whoami", [401, 401, 200, 200, 403, 403]),
        (
            M::GET,
            "/v1/audit?tenant=acme",
            [401, 401, 200, 200, 403, 403],
        ),
        (
            M::GET,
            "/v1/audit?tenant=globex",
            [401, 401, 200, 403, 403, 403],
        ),
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
async fn whoami_names_the_token_its_role_and_its_tenants() {
    let app = app().await;
    let who = |token: &'static str| {
        let app = &app;
        async move {
            let r = app
                .http
                .get(app.url("/v1/whoami"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            r.json::<serde_json::Value>().await.unwrap()
        }
    };
    assert_eq!(
        who(ADMIN).await,
        json!({"name": "admin_token", "role": "admin", "tenants": null})
    );
    let acme = who(ACME_ADMIN).await;
    assert_eq!(acme["role"], "tenant_admin");
    assert_eq!(acme["tenants"], json!(["acme"]));
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

#[tokio::test]
async fn the_audit_log_names_who_changed_each_quota_and_shows_a_tenant_admin_only_its_own() {
    let app = app().await; // the admin token put acme, then globex
    let new_acme = json!({"limits": [{"id": "d", "max": 250, "period": "day"}]});
    let r = app
        .http
        .put(app.url("/v1/quotas/acme"))
        .bearer_auth(ACME_ADMIN)
        .header("x-request-id", "req-42")
        .json(&new_acme)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "req-42");
    let r = app
        .http
        .delete(app.url("/v1/quotas/globex"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    // A request without an id gets one made, errors included.
    let made = r.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(made.len(), 32, "{made}");
    let r = app.http.get(app.url("/v1/audit")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("x-request-id"));

    let who = |e: &serde_json::Value| {
        format!(
            "{} {} {} {}",
            e["actor"].as_str().unwrap(),
            e["role"].as_str().unwrap(),
            e["action"].as_str().unwrap(),
            e["tenant"].as_str().unwrap()
        )
    };
    let all = app.get_json("/v1/audit").await;
    let entries = all["entries"].as_array().unwrap();
    let said: Vec<String> = entries.iter().map(who).collect();
    assert_eq!(
        said,
        [
            "admin_token admin quota.delete globex",
            "acme-admin tenant_admin quota.put acme",
            "admin_token admin quota.put globex",
            "admin_token admin quota.put acme",
        ]
    );
    let change = &entries[1];
    assert_eq!(change["request_id"], "req-42");
    assert_eq!(
        (
            change["version_before"].as_u64(),
            change["version_after"].as_u64()
        ),
        (Some(1), Some(2))
    );
    assert_eq!(change["body_before"]["limits"][0]["max"], 100);
    assert_eq!(change["body_after"]["limits"][0]["max"], 250);
    assert!(change["client"].is_null());
    assert_eq!(entries[0]["request_id"], made.as_str());
    assert!(entries[0]["body_after"].is_null() && entries[3]["body_before"].is_null());

    // Paging one at a time walks the same entries.
    let mut paged = Vec::new();
    let mut next = String::new();
    loop {
        let v = app.get_json(&format!("/v1/audit?limit=1{next}")).await;
        paged.extend(v["entries"].as_array().unwrap().iter().map(who));
        match v["next"].as_str() {
            Some(n) => next = format!("&after={n}"),
            None => break,
        }
    }
    assert_eq!(paged, said);

    // The tenant admin sees acme's changes only, whoever made them.
    let mine = app
        .http
        .get(app.url("/v1/audit"))
        .bearer_auth(ACME_ADMIN)
        .send()
        .await
        .unwrap();
    let mine: serde_json::Value = mine.json().await.unwrap();
    let mine: Vec<String> = mine["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(who)
        .collect();
    assert_eq!(mine, [said[1].clone(), said[3].clone()]);
}

#[tokio::test]
async fn quotad_audit_prints_the_log_from_the_store_without_a_token() {
    let app = app().await;
    let r = app
        .http
        .delete(app.url("/v1/quotas/acme"))
        .bearer_auth(ACME_ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let (_, dir) = app.stop().await;
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_quotad"))
            .arg("audit")
            .args(args)
            .env("QUOTAD__STORE__PATH", dir.path())
            .env("QUOTAD__LOG__LEVEL", "warn")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let e: serde_json::Value = serde_json::from_str(l).unwrap();
                format!("{} {} {}", e["actor"], e["action"], e["tenant"])
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        run(&["--tenant", "acme"]),
        [
            r#""acme-admin" "quota.delete" "acme""#,
            r#""admin_token" "quota.put" "acme""#
        ]
    );
    assert_eq!(run(&["--limit", "0"]).len(), 3);
    assert_eq!(run(&["--limit", "1"]).len(), 1);
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_quotad"))
        .args(["audit", "--from", "yesterday"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--from"));
}

#[test]
fn hash_token_prints_a_salted_hash_and_refuses_a_weak_token() {
    use std::io::Write;
    let run = |input: &[u8]| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_quotad"))
            .arg("hash-token")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let token = "5f0c2a9e8b7d6c5f4a3b2c1d0e9f8a7b";
    let (a, b) = (run(format!("{token}\n").as_bytes()), run(token.as_bytes()));
    assert!(a.status.success() && b.status.success());
    let (a, b) = (
        String::from_utf8(a.stdout).unwrap(),
        String::from_utf8(b.stdout).unwrap(),
    );
    assert_ne!(
        a.trim(),
        b.trim(),
        "the same token twice must hash differently"
    );
    for h in [a.trim(), b.trim()] {
        let h = quotad::config::tokens::TokenHash::parse(h).unwrap();
        assert!(h.verify(token), "the newline is not part of the token");
        assert!(!h.verify("5f0c2a9e8b7d6c5f4a3b2c1d0e9f8a7c"));
    }
    let weak = run(b"s3cret\n");
    assert_eq!(weak.status.code(), Some(2));
    assert!(weak.stdout.is_empty());
    assert!(String::from_utf8_lossy(&weak.stderr).contains("128 bits"));
}

#[tokio::test]
async fn the_audit_log_filters_by_action_client_and_actor() {
    let app = app().await;
    let limits = json!({"limits": [{"id": "daily", "max": 5, "period": "day"}]});
    for c in ["k1", "k2"] {
        let path = format!("/v1/quotas/acme/clients/{c}");
        let r = app
            .http
            .put(app.url(&path))
            .bearer_auth(ACME_ADMIN)
            .json(&limits)
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success());
    }
    let r = app
        .http
        .post(app.url("/v1/usage/acme/k1/reset"))
        .bearer_auth(ADMIN)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let actions = |v: &serde_json::Value| -> Vec<String> {
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| format!("{} {} {}", e["action"], e["client"], e["actor"]))
            .collect()
    };
    let v = app.get_json("/v1/audit?tenant=acme&client=k1").await;
    assert_eq!(
        actions(&v),
        [
            "\"usage.reset\" \"k1\" \"admin_token\"",
            "\"override.put\" \"k1\" \"acme-admin\""
        ]
    );
    let v = app.get_json("/v1/audit?action=usage.reset").await;
    assert_eq!(actions(&v).len(), 1, "{v}");
    let v = app.get_json("/v1/audit?actor=acme-admin&limit=1").await;
    assert_eq!(actions(&v), ["\"override.put\" \"k2\" \"acme-admin\""]);
    // A full page says where to go on; the next holds the other one.
    let next = v["next"].as_str().unwrap().to_owned();
    let v = app
        .get_json(&format!("/v1/audit?actor=acme-admin&limit=1&after={next}"))
        .await;
    assert_eq!(actions(&v), ["\"override.put\" \"k1\" \"acme-admin\""]);
    for bad in ["action=Quota.Put", "client=bad%20id", "actor="] {
        let r = app.admin_get(&format!("/v1/audit?{bad}")).await;
        assert_error(r, 400, "invalid_argument").await;
    }
}

/// A wrong token whose SHA-256 starts as a salted entry's salt does (found in about 65,536
/// tries, as an attacker would) costs one argon2 run the first time and none after, on
/// `/v1/check` and forward-auth alike; the right token costs one run in all.
#[tokio::test]
async fn a_wrong_token_costs_at_most_one_argon2_run_however_often_it_is_sent() {
    let app = app().await;
    let salt = quotad::auth::digest(ANY_CHECK);
    let wrong = (0u64..)
        .map(|i| format!("attacker-{i}"))
        .find(|t| quotad::auth::digest(t)[..2] == salt[..2])
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            send(&app, reqwest::Method::POST, "/v1/check", Some(ANY_CHECK)).await,
            200
        );
    }
    for _ in 0..10 {
        assert_eq!(
            send(&app, reqwest::Method::POST, "/v1/check", Some(&wrong)).await,
            401
        );
        let r = app
            .http
            .get(app.url("/v1/forward-auth"))
            .header("X-Quota-Tenant", "acme")
            .header("X-Quota-Client", "k")
            .header("X-Quota-Token", &wrong)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401);
    }
    assert_eq!(hash_runs(&app).await, (1.0, 1.0));
}

/// `quotad_token_hash_runs_total`: (verified, refused).
async fn hash_runs(app: &TestApp) -> (f64, f64) {
    let runs = |o: &str| format!("quotad_token_hash_runs_total{{outcome=\"{o}\"}}");
    (
        app.metric(&runs("verified")).await,
        app.metric(&runs("refused")).await,
    )
}
