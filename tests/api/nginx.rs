//! quotad behind a real nginx (Debian's `nginx-light`) running `examples/nginx/nginx.conf` in
//! front of a small upstream: what it lets through, what it answers, and that no header a
//! caller sends through it changes what is counted.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use serde_json::json;

use crate::helpers::*;
use crate::proxy::shop;

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
