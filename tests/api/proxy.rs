//! quotad behind real proxies: `/v1/forward-auth` spoken to directly, and a real nginx
//! (Debian's `nginx-light`) running `examples/nginx/nginx.conf` in front of a small upstream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;

use crate::helpers::*;

async fn shop(app: &TestApp) {
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

    // A cost, a denial that consumed nothing, a tenant without a quota, and bad headers.
    let costly = [
        ("X-Quota-Tenant", "shop"),
        ("X-Quota-Client", "k3"),
        ("X-Quota-Cost", "3"),
    ];
    assert_eq!(ask(&app, "POST", &costly).await.status(), 200);
    assert_eq!(ask(&app, "POST", &costly).await.status(), 429);
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
                ("X-Quota-Cost", "-1"),
            ],
            "x-quota-cost",
        ),
    ] {
        let r = ask(&app, "GET", &headers).await;
        assert_eq!(r.status(), 400, "{headers:?}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["field"], field, "{v}");
    }
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

/// nginx, from Debian's nginx-light: on PATH or in /usr/sbin. None when it is not installed
/// (then the test says so and passes, unless QUOTAD_TEST_REQUIRE_NGINX is set, as in .ci/run).
fn nginx() -> Option<std::path::PathBuf> {
    let candidates = ["/usr/sbin/nginx", "/usr/bin/nginx"];
    let found = candidates
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var_os("QUOTAD_TEST_REQUIRE_NGINX").is_none(),
            "nginx is required (apt-get install nginx-light)"
        );
        eprintln!("nginx is not installed: skipping (apt-get install nginx-light)");
    }
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Stops nginx when the test ends, however it ends.
struct Nginx(std::process::Child);

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM (fast shutdown) stops the workers too; SIGKILL would orphan them.
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn nginx_passes_three_requests_a_second_and_answers_the_fourth_429_with_retry_after() {
    let Some(nginx) = nginx() else { return };
    let app = spawn_with(|s| s.forward_auth.deny_status = 403).await;
    shop(&app).await;

    // The upstream: counts what reaches it.
    let reached = Arc::new(AtomicUsize::new(0));
    let counter = reached.clone();
    let upstream = actix_web::HttpServer::new(move || {
        let counter = counter.clone();
        actix_web::App::new().default_service(actix_web::web::to(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { actix_web::HttpResponse::Ok().body("hello from upstream") }
        }))
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let up_port = upstream.addrs()[0].port();
    let up = upstream.run();
    let up_handle = up.handle();
    tokio::spawn(up);

    // examples/nginx/nginx.conf as shipped, with this test's ports and private paths.
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/nginx/nginx.conf"
    ))
    .unwrap();
    let d = dir.path().display();
    let is_root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    let head = format!(
        "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n{}",
        if is_root { "user root;\n" } else { "" }
    );
    let paths = format!(
        "http {{\n    access_log off;\n    client_body_temp_path {d}/body;\n    \
         proxy_temp_path {d}/proxy;\n    fastcgi_temp_path {d}/fastcgi;\n    \
         uwsgi_temp_path {d}/uwsgi;\n    scgi_temp_path {d}/scgi;\n"
    );
    let conf = head
        + &example
            .replace("127.0.0.1:9000", &format!("127.0.0.1:{up_port}"))
            .replace("listen 8088;", &format!("listen 127.0.0.1:{port};"))
            .replace("http://127.0.0.1:8080/", &format!("{}/", app.base))
            .replacen("http {\n", &paths, 1);
    let conf_path = dir.path().join("nginx.conf");
    std::fs::write(&conf_path, &conf).unwrap();
    let check = std::process::Command::new(&nginx)
        .args(["-t", "-q", "-p"])
        .arg(dir.path())
        .arg("-c")
        .arg(&conf_path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "nginx -t: {}\n{conf}",
        String::from_utf8_lossy(&check.stderr)
    );
    let _nginx = Nginx(
        std::process::Command::new(&nginx)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while http
        .get(format!("{base}/health"))
        .header("X-Api-Key", "probe")
        .send()
        .await
        .is_err()
    {
        assert!(std::time::Instant::now() < deadline, "nginx did not start");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let before = reached.load(Ordering::SeqCst);

    // Four requests of one client within a second: three reach the upstream, the fourth is 429.
    let mut answers = Vec::new();
    for _ in 0..4 {
        let r = http
            .get(format!("{base}/products/42"))
            .header("X-Api-Key", "key-123")
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let retry = r
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_owned());
        let remaining = r
            .headers()
            .get("ratelimit-remaining")
            .map(|v| v.to_str().unwrap().to_owned());
        answers.push((status, retry, remaining, r.text().await.unwrap()));
    }
    let statuses: Vec<u16> = answers.iter().map(|a| a.0).collect();
    assert_eq!(statuses, [200, 200, 200, 429], "{answers:?}");
    assert_eq!(answers[0].3, "hello from upstream");
    assert_eq!(answers[2].2.as_deref(), Some("0"), "{answers:?}");
    let retry = answers[3].1.as_deref().map(|r| r.parse::<u64>().unwrap());
    assert!(matches!(retry, Some(1..=2)), "{answers:?}");
    assert_eq!(reached.load(Ordering::SeqCst) - before, 3, "{answers:?}");
    up_handle.stop(true).await;
}
