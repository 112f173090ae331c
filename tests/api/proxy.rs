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

/// The upstream of the nginx tests: answers every request, and counts what reaches it.
struct Upstream {
    port: u16,
    reached: Arc<AtomicUsize>,
    handle: actix_web::dev::ServerHandle,
}

impl Upstream {
    fn start() -> Upstream {
        let reached = Arc::new(AtomicUsize::new(0));
        let counter = reached.clone();
        let server = actix_web::HttpServer::new(move || {
            let counter = counter.clone();
            actix_web::App::new().default_service(actix_web::web::to(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                async { actix_web::HttpResponse::Ok().body("hello from upstream") }
            }))
        })
        .workers(1)
        .bind("127.0.0.1:0")
        .unwrap();
        let port = server.addrs()[0].port();
        let run = server.run();
        let handle = run.handle();
        tokio::spawn(run);
        Upstream {
            port,
            reached,
            handle,
        }
    }

    fn reached(&self) -> usize {
        self.reached.load(Ordering::SeqCst)
    }
}

/// `examples/nginx/nginx.conf` as shipped, with this test's ports and private paths, running in
/// front of `up` and asking `app`; stopped when dropped.
struct NginxExample {
    base: String,
    _nginx: Nginx,
    _dir: tempfile::TempDir,
}

impl NginxExample {
    async fn start(nginx: &std::path::Path, app: &TestApp, up: &Upstream) -> NginxExample {
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
                .replace("127.0.0.1:9000", &format!("127.0.0.1:{}", up.port))
                .replace("listen 8088;", &format!("listen 127.0.0.1:{port};"))
                .replace("http://127.0.0.1:8080/", &format!("{}/", app.base))
                .replacen("http {\n", &paths, 1);
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, &conf).unwrap();
        let check = std::process::Command::new(nginx)
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
        let nginx = Nginx(
            std::process::Command::new(nginx)
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
        NginxExample {
            base,
            _nginx: nginx,
            _dir: dir,
        }
    }
}

#[tokio::test]
async fn nginx_passes_three_requests_a_second_and_answers_the_fourth_429_with_retry_after() {
    let Some(nginx) = nginx() else { return };
    let app = spawn_with(|s| s.forward_auth.deny_status = 403).await;
    shop(&app).await;
    let up = Upstream::start();
    let proxy = NginxExample::start(&nginx, &app, &up).await;
    let base = &proxy.base;
    let http = reqwest::Client::new();
    let before = up.reached();

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
    assert_eq!(up.reached() - before, 3, "{answers:?}");
    up.handle.stop(true).await;
}

/// What a caller may add to its own request, hoping quotad reads it: a cost of its choosing,
/// another tenant or client, and another method and path in both proxies' spellings.
const SPOOFS: &[&[(&str, &str)]] = &[
    &[],
    &[("X-Quota-Cost", "0")],
    &[("X-Quota-Cost", "100")],
    &[("X-Quota-Tenant", "elsewhere")],
    &[("X-Quota-Client", "someone-else")],
    &[
        ("X-Original-Method", "GET"),
        ("X-Original-URI", "/elsewhere"),
    ],
    &[
        ("X-Forwarded-Method", "GET"),
        ("X-Forwarded-Uri", "/elsewhere"),
    ],
    &[
        ("X-Original-URI", "/elsewhere"),
        ("X-Forwarded-Method", "get"),
    ],
    &[
        ("X-Quota-Cost", "0"),
        ("X-Quota-Tenant", "elsewhere"),
        ("X-Quota-Client", "someone-else"),
        ("X-Original-Method", "GET"),
        ("X-Original-URI", "/elsewhere"),
        ("X-Forwarded-Method", "GET"),
        ("X-Forwarded-Uri", "/elsewhere"),
    ],
];

/// Through the shipped nginx example, with quotad's defaults and with the cost header turned
/// on (the example must clear the caller's even then): a limit of 3 a minute on `POST /login`
/// lets three requests of a client through and refuses the fourth whatever headers the caller
/// adds, and the tenant's budget counts one for each request admitted. (Fails where the example
/// passes a caller's headers to quotad and quotad reads its cost from them.)
#[tokio::test]
async fn through_nginx_no_header_a_caller_sends_changes_what_is_counted() {
    let Some(nginx) = nginx() else { return };
    for cost_on in [false, true] {
        let app = spawn_with(|s| {
            s.forward_auth.deny_status = 403;
            if cost_on {
                s.forward_auth.cost_header = Some("X-Quota-Cost".into());
            }
        })
        .await;
        let r = app
            .put_quota(
                "shop",
                json!({"limits": [
                    {"id": "login", "max": 3, "window": "1m", "resource": "POST /login"},
                    {"id": "budget", "max": 1000, "window": "1m", "scope": "tenant"}]}),
            )
            .await;
        assert_eq!(r.status(), 201);
        let up = Upstream::start();
        let proxy = NginxExample::start(&nginx, &app, &up).await;
        let http = reqwest::Client::new();
        let before = up.reached();
        // nginx's start-up probe is counted there too.
        let budget_before = login_count(&app, "key-0", "budget").await;
        for (i, spoof) in SPOOFS.iter().enumerate() {
            let key = format!("key-{i}");
            let mut statuses = Vec::new();
            for _ in 0..4 {
                let mut req = http
                    .post(format!("{}/login", proxy.base))
                    .header("X-Api-Key", &key)
                    .body("user=attacker");
                for (k, v) in spoof.iter() {
                    req = req.header(*k, *v);
                }
                statuses.push(req.send().await.unwrap().status().as_u16());
            }
            assert_eq!(
                statuses,
                [200, 200, 200, 429],
                "cost header on: {cost_on}, caller sent {spoof:?}"
            );
            // The limit counted this client's key, as the example keys it, and nothing else.
            assert_eq!(login_count(&app, &key, "login").await, 3, "{spoof:?}");
        }
        let admitted = 3 * SPOOFS.len() as u64;
        assert_eq!(up.reached() - before, admitted as usize);
        assert_eq!(
            login_count(&app, "key-0", "budget").await - budget_before,
            admitted,
            "cost header on: {cost_on}"
        );
        up.handle.stop(true).await;
    }
}

/// What limit `id` of tenant `shop` counts for client `key` on `POST /login`.
async fn login_count(app: &TestApp, key: &str, id: &str) -> u64 {
    let u = app
        .get_json(&format!("/v1/usage/shop/{key}?resource=POST%20%2Flogin"))
        .await;
    let limit = u["limits"]
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["limit_id"] == id));
    limit
        .and_then(|l| l["count"].as_u64())
        .unwrap_or_else(|| panic!("no {id} count in {u}"))
}
