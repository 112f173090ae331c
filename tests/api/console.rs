//! The web console driven in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`) through WebDriver, as a user would: sign in, create a quota through the
//! form (a bad value first, shown beside its field), send checks, see the client's bar and chart
//! and a denial, find the change in the audit log; and a tenant admin kept out of another
//! tenant's pages. A screenshot of each page is saved in `QUOTAD_CONSOLE_SCREENSHOTS` (default
//! `target/console-screenshots`).
//!
//! The browser tests are `#[ignore]`d, so a plain `cargo test` lists them as not run; `.ci/run`
//! runs them with `cargo test --test api console -- --ignored`, and there, or anywhere, a missing
//! chromium or chromedriver fails them, naming what is missing.
//!
//! The WebDriver client is `fantoccini` without its default features rather than `thirtyfour`:
//! it speaks plain http to chromedriver through the hyper this build already has, with no TLS
//! stack, where `thirtyfour` brings more crates and turns on serde_json's `preserve_order` for
//! the whole test build, which would reorder the keys of the JSON the server under test writes.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use quotad::config::{Role, TokenSettings};
use serde_json::{json, Value};

use crate::helpers::*;

const GLOBEX_ADMIN: &str = "globex-admin-secret";

fn which(names: &[&str]) -> Option<PathBuf> {
    names.iter().find_map(|n| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(n))
                .find(|p| p.is_file())
        })
    })
}

/// Chromium and its driver; their absence fails the test, saying which is missing.
fn installed() -> (PathBuf, PathBuf) {
    const CHROMIUM: [&str; 3] = ["chromium", "chromium-browser", "google-chrome"];
    match (which(&CHROMIUM), which(&["chromedriver"])) {
        (Some(chromium), Some(chromedriver)) => (chromium, chromedriver),
        (chromium, chromedriver) => {
            let mut missing = Vec::new();
            if chromium.is_none() {
                missing.push(format!(
                    "chromium (none of {} on PATH)",
                    CHROMIUM.join(", ")
                ));
            }
            if chromedriver.is_none() {
                missing.push("chromedriver (not on PATH)".to_owned());
            }
            panic!(
                "this browser test needs {}: apt-get install chromium chromium-driver fonts-liberation",
                missing.join(" and ")
            )
        }
    }
}

/// A chromedriver process, killed on drop.
struct Driver {
    child: Child,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One browser session over the W3C WebDriver protocol.
pub(crate) struct Browser {
    client: Client,
    shots: PathBuf,
    /// Declared after `client`, so dropped after it: the driver outlives the session.
    _driver: Driver,
}

impl Browser {
    /// Starts chromedriver and a session in a headless Chromium; fails the test if either is
    /// not installed.
    pub(crate) async fn start() -> Browser {
        let (chromium, chromedriver) = installed();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        // The browser in a zone other than UTC, as support staff's often are: charts must say
        // which zone their hours are in, and keep days in UTC.
        let child = Command::new(chromedriver)
            .env("TZ", "America/Los_Angeles")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Driver { child };
        let base = format!("http://127.0.0.1:{port}");
        // Asked until it answers: a session asked for before that would fail.
        let http = reqwest::Client::new();
        let started = Instant::now();
        while http.get(format!("{base}/status")).send().await.is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not answer"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let Value::Object(caps) = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.to_string_lossy(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-background-networking", "--disable-dev-shm-usage",
                         "--window-size=1280,1000"]
            }
        }) else {
            unreachable!("an object")
        };
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(caps)
            .connect(&base)
            .await
            .unwrap_or_else(|e| panic!("no WebDriver session: {e}"));
        let shots = std::env::var_os("QUOTAD_CONSOLE_SCREENSHOTS")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots")
            });
        std::fs::create_dir_all(&shots).unwrap();
        Browser {
            client,
            shots,
            _driver: driver,
        }
    }

    pub(crate) async fn go(&self, url: &str) {
        if let Err(e) = self.client.goto(url).await {
            panic!("navigating to {url}: {e}");
        }
    }

    pub(crate) async fn url(&self) -> String {
        self.client.current_url().await.unwrap().into()
    }

    pub(crate) async fn find(&self, css: &str) -> Option<Element> {
        match self.client.find(Locator::Css(css)).await {
            Ok(e) => Some(e),
            Err(e) if e.is_no_such_element() => None,
            Err(e) => panic!("finding {css}: {e}"),
        }
    }

    /// The element, once it is there (pages load their data asynchronously).
    pub(crate) async fn wait(&self, css: &str) -> Element {
        let started = Instant::now();
        loop {
            if let Some(e) = self.find(css).await {
                return e;
            }
            if started.elapsed() > Duration::from_secs(10) {
                let page = self
                    .script("return location.href + '\\n' + document.documentElement.outerHTML")
                    .await;
                panic!("no {css} on the page: {page}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the text of `css` contains `want`, and returns it.
    pub(crate) async fn wait_text(&self, css: &str, want: &str) -> String {
        let started = Instant::now();
        loop {
            let t = self.text(css).await;
            if t.contains(want) {
                return t;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{css} never said {want:?}; it says {t:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The text of `css`, or nothing while it is not there (or was replaced as it was read: the
    /// pages re-render as their data comes).
    pub(crate) async fn text(&self, css: &str) -> String {
        match self.find(css).await {
            None => String::new(),
            Some(e) => e.text().await.unwrap_or_default(),
        }
    }

    pub(crate) async fn click(&self, css: &str) {
        let e = self.wait(css).await;
        if let Err(e) = e.click().await {
            panic!("clicking {css}: {e}");
        }
    }

    pub(crate) async fn type_into(&self, css: &str, text: &str) {
        let e = self.wait(css).await;
        if let Err(e) = e.clear().await {
            panic!("clearing {css}: {e}");
        }
        if let Err(e) = e.send_keys(text).await {
            panic!("typing into {css}: {e}");
        }
    }

    pub(crate) async fn script(&self, js: &str) -> Value {
        self.client
            .execute(js, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("the script failed: {e}\n{js}"))
    }

    /// A script that answers by calling its last argument; the error is the caller's to tell.
    pub(crate) async fn script_async(&self, js: &str) -> Result<Value, CmdError> {
        self.client.execute_async(js, Vec::new()).await
    }

    pub(crate) async fn resize(&self, width: u32, height: u32) {
        self.client.set_window_size(width, height).await.unwrap();
    }

    pub(crate) async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        println!("screenshot: {}", path.display());
    }

    pub(crate) async fn quit(self) {
        self.client.close().await.unwrap();
    }
}

fn tenant_admin(secret: &str, tenants: &[&str]) -> TokenSettings {
    TokenSettings {
        name: secret.trim_end_matches("-secret").to_owned(),
        hash: String::new(),
        sha256: hex::encode(quotad::http::digest(secret)),
        role: Role::TenantAdmin,
        tenants: Some(tenants.iter().map(|s| s.to_string()).collect()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium and chromedriver: cargo test --test api console -- --ignored (as .ci/run does)"]
async fn the_console_in_a_real_chromium() {
    let app = spawn_with(|s| s.auth.tokens = vec![tenant_admin(GLOBEX_ADMIN, &["globex"])]).await;
    let r = app
        .put_quota(
            "globex",
            json!({"limits": [{"id": "daily", "max": 10, "period": "day"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let b = Browser::start().await;

    // Sign in; the token stays in sessionStorage, never in the URL.
    b.go(&app.url("/console/")).await;
    b.wait("#signin").await;
    b.screenshot("01-sign-in").await;
    b.type_into("#token", "wrong").await;
    b.click("#signin-submit").await;
    b.wait_text("#signin-error", "Unknown token").await;
    b.type_into("#token", ADMIN).await;
    b.click("#signin-submit").await;
    b.wait_text("#tenants", "globex").await;
    // The header says who is signed in; an admin may create tenants.
    b.wait_text("#who", "Signed in as admin_token (admin)")
        .await;
    b.wait("#create-form:not([hidden])").await;
    let url = b.url().await;
    assert!(!url.contains(ADMIN), "{url}");
    let stored = b
        .script("return sessionStorage.getItem('quotad.token')")
        .await;
    assert_eq!(stored, json!(ADMIN));
    b.screenshot("02-tenants").await;

    // Create acme through the form: a bad max first, refused beside its field.
    b.type_into("#new-tenant", "acme").await;
    b.click("#create-tenant").await;
    b.wait("#no-policy").await;
    b.type_into("[data-field='limits[0].id']", "per-minute")
        .await;
    b.type_into("[data-field='limits[0].max']", "0").await;
    b.type_into("[data-field='limits[0].window']", "1m").await;
    b.click("#save-policy").await;
    b.wait_text("#policy-status", "Not saved").await;
    b.wait(".field:has([data-field='limits[0].max'].invalid) .field-error")
        .await;
    let msg = b
        .text(".field:has([data-field='limits[0].max'].invalid) .field-error")
        .await;
    assert!(
        msg.starts_with("max must be an integer 1..="),
        "the error beside max: {msg:?}"
    );
    b.screenshot("03-policy-form-error").await;
    b.type_into("[data-field='limits[0].max']", "5").await;
    b.click("#save-policy").await;
    b.wait_text("#policy-status", "Saved: version 1").await;
    assert!(
        b.find("#no-policy").await.is_none(),
        "the header follows the save"
    );
    // Saved, the policy reads as a view, with an explicit Edit.
    let view = b.wait_text("#policy-view", "per-minute").await;
    assert!(view.contains("sliding window of 1m, at most 5"), "{view}");
    assert!(b.find("#policy-form[hidden]").await.is_some());
    b.wait("#edit-policy").await;
    b.screenshot("04-policy-saved").await;
    // The CSP's Trusted Types: the page cannot send a string to an HTML sink.
    let sink = b
        .script("try { document.createElement('div').innerHTML = '<b>x</b>'; return 'allowed'; } catch (e) { return 'refused'; }")
        .await;
    assert_eq!(sink, json!("refused"));
    let stored = app.get_json("/v1/quotas/acme").await;
    assert_eq!(
        stored["limits"][0],
        json!({"id": "per-minute", "max": 5, "window": "1m", "scope": "client"})
    );

    // A second limit, tenant-wide and on one resource only, filled by another client.
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [
                {"id": "per-minute", "max": 5, "window": "1m"},
                {"id": "exports", "max": 2, "window": "1h", "scope": "tenant", "resource": "POST /exports"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    for want in [200, 200, 429] {
        let r = app
            .check(json!({"tenant": "acme", "client": "k2", "resource": "POST /exports"}))
            .await;
        assert_eq!(r.status(), want);
    }
    // Checks: 5 admitted, the 6th denied.
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(app.check_json("acme", "k1").await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    // The usage history is written in the sync rounds.
    app.history_reaches("acme", "k1", 5, 1).await;
    app.history_reaches("acme", "k2", 2, 1).await;

    // The client's page: a full bar, and the chart's hour holding 5 admitted and 1 denied.
    b.go(&app.url("/console/#/tenants/acme/clients/k1")).await;
    let used = b
        .wait_text("#usage tr[data-limit='per-minute'] .count", "5 / 5")
        .await;
    assert_eq!(used, "5 / 5");
    let width = b
        .script("return document.querySelector(\"#usage tr[data-limit='per-minute'] .bar > div\").style.width")
        .await;
    assert_eq!(width, json!("100%"));
    // The resource-scoped, tenant-wide limit is on the client's page too, full, saying what
    // it counts.
    let exports = b
        .wait_text("#usage tr[data-limit='exports']", "2 / 2")
        .await;
    assert!(
        exports.contains("checks on POST /exports of all the tenant's clients"),
        "{exports}"
    );
    b.wait_text("#chart-hours .summary", "5 admitted, 1 denied")
        .await;
    b.wait("#chart-hours canvas").await;
    b.screenshot("05-client").await;
    // An override's limits may only count the client: the form does not offer `tenant`.
    let scopes = b
        .script("return [...document.querySelectorAll(\"#client-page select[name=scope] option\")].map(o => o.value).join(',')")
        .await;
    assert_eq!(scopes, json!("client"));

    // The tenant's page: k1 nearest to its limit, at 100%.
    b.go(&app.url("/console/#/tenants/acme")).await;
    b.wait_text("#nearest", "k1").await;
    b.wait_text("#nearest", "5 / 5").await;
    // k2 is nearest to the tenant-wide limit on exports, which its own checks filled.
    b.wait_text("#nearest", "k2 exports 2 / 2").await;
    let summary = b
        .wait_text("#tenant-charts .summary", "7 admitted, 2 denied")
        .await;
    // Refusals by limit, hours in the browser's zone, and days in UTC, each said so.
    assert!(
        summary.contains("1 by per-minute") && summary.contains("1 by exports"),
        "{summary}"
    );
    assert!(
        summary.contains("hours in America/Los_Angeles"),
        "{summary}"
    );
    let legend = b.text("#tenant-charts .legend").await;
    assert!(
        legend.contains("denied by per-minute") && legend.contains("denied by exports"),
        "{legend}"
    );
    b.script("document.getElementById('tenant-charts').scrollIntoView(); return 1")
        .await;
    b.screenshot("06-tenant-chart").await;
    b.script("const r = document.getElementById('chart-range'); r.value = '2'; r.dispatchEvent(new Event('change')); return 1")
        .await;
    let days = b.wait_text("#chart-days .summary", "UTC days").await;
    assert!(days.contains("7 admitted, 2 denied"), "{days}");
    b.screenshot("06-tenant-chart-days").await;
    b.screenshot("06-tenant").await;

    // The audit log holds the change, by the admin token's name.
    b.go(&app.url("/console/#/audit")).await;
    b.type_into("#audit-tenant", "acme").await;
    b.click("#audit-filter").await;
    let entries = b.wait_text("#audit-entries", "quota.put").await;
    assert!(
        entries.contains("acme") && entries.contains("admin_token"),
        "{entries}"
    );
    let title = b
        .script("return document.querySelector('#audit-entries time').title")
        .await;
    assert!(title.as_str().unwrap().starts_with("UTC "), "{title}");
    b.screenshot("07-audit").await;

    // Support resets k1 from its page: asked first, then done, and k1 is admitted again.
    b.go(&app.url("/console/#/tenants/acme/clients/k1")).await;
    b.wait_text("#usage tr[data-limit='per-minute'] .count", "5 / 5")
        .await;
    b.click("#reset-usage").await;
    b.click("#reset-usage-confirm").await;
    b.wait_text("#reset-usage-status", "Reset").await;
    b.wait_text("#usage tr[data-limit='per-minute'] .count", "0 / 5")
        .await;
    b.screenshot("08-client-reset").await;
    assert_eq!(app.check_json("acme", "k1").await.0, 200);
    // The page reads its figures again by itself (every 5 s while visible).
    b.wait_text("#usage tr[data-limit='per-minute'] .count", "1 / 5")
        .await;
    // The audit log holds the reset, with what it changed.
    b.go(&app.url("/console/#/audit?tenant=acme")).await;
    let entries = b.wait_text("#audit-entries", "usage.reset").await;
    assert!(entries.contains("per-minute: 5 → 0"), "{entries}");
    // And the policy change before it, as its diff.
    assert!(entries.contains("limits[1].max: – → 2"), "{entries}");
    b.screenshot("09-audit-reset").await;
    // Filtered by action through the form: the reset alone.
    b.script(
        "const a = document.getElementById('audit-action'); a.value = 'usage.reset'; return 1",
    )
    .await;
    b.click("#audit-filter").await;
    let only_reset = "const t = document.getElementById('audit-entries'); \
        return location.hash.includes('action=usage.reset') && !!t && \
        t.textContent.includes('usage.reset') && !t.textContent.includes('quota.put')";
    let started = Instant::now();
    while b.script(only_reset).await != json!(true) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the action filter: {}",
            b.text("#audit-entries").await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A tenant admin of globex: its tenant only; acme's pages say permission denied.
    b.click("#signout").await;
    b.wait("#signin").await;
    b.type_into("#token", GLOBEX_ADMIN).await;
    b.click("#signin-submit").await;
    let list = b.wait_text("#tenants", "globex").await;
    assert!(!list.contains("acme"), "{list}");
    // A tenant admin is told so, and is not offered a new tenant.
    b.wait_text("#who", "Signed in as globex-admin (tenant admin)")
        .await;
    assert!(b.find("#create-form[hidden]").await.is_some());
    b.go(&app.url("/console/#/tenants/acme")).await;
    b.wait_text("#error", "Permission denied").await;
    assert!(
        b.find("#policy-form").await.is_none(),
        "no policy form for another tenant"
    );
    b.go(&app.url("/console/#/tenants/acme/clients/k1")).await;
    b.wait_text("#error", "Permission denied").await;
    assert!(b.find("#usage").await.is_none());
    b.screenshot("10-tenant-admin-denied").await;
    b.go(&app.url("/console/#/audit")).await;
    b.wait("#audit-entries tr").await;
    let entries = b.text("#audit-entries").await;
    assert!(!entries.contains("acme"), "{entries}");

    // A deep link opened signed out lands on its page after sign-in.
    b.click("#signout").await;
    b.wait("#signin").await;
    b.go(&app.url("/console/#/tenants/acme/clients/k1")).await;
    b.wait("#signin").await;
    b.type_into("#token", ADMIN).await;
    b.click("#signin-submit").await;
    b.wait_text("#usage tr[data-limit='exports']", "2 / 2")
        .await;

    // What a client holds shows on its page; an in-flight limit is not offered for a grant.
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "per-minute", "max": 5, "window": "1m"},
                              {"id": "slots", "max": 3, "in_flight": "holds"}]}),
        )
        .await;
    assert_eq!(r.status(), 200);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let r = app
        .check(json!({"tenant": "acme", "client": "k3", "reserve": true}))
        .await;
    assert_eq!(r.status(), 200);
    b.go(&app.url("/console/#/tenants/acme/clients/k3")).await;
    let held = b.wait_text("#usage tr[data-limit='slots']", "1 / 3").await;
    assert!(
        held.contains("reservations held now") && held.contains("as they end"),
        "{held}"
    );
    let offered = b
        .script("return [...document.querySelectorAll('#grant-limit option')].map((o) => o.value).join(',')")
        .await;
    assert_eq!(offered, json!("per-minute"));
    b.quit().await;
}

#[tokio::test]
async fn console_files_carry_a_strict_content_security_policy() {
    let app = spawn_app().await;
    let r = app.http.get(app.url("/console")).send().await.unwrap();
    // reqwest follows the redirect to /console/.
    assert_eq!(r.status(), 200);
    assert_eq!(r.url().path(), "/console/");
    let csp = r.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    for part in [
        "default-src 'none'",
        "script-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(part), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline"), "{csp}");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    let page = r.text().await.unwrap();
    // No inline script: every <script> has a src.
    assert_eq!(
        page.matches("<script").count(),
        page.matches("<script src=").count(),
        "{page}"
    );
    for (path, ctype) in [
        ("/console/app.js", "text/javascript; charset=utf-8"),
        ("/console/policy.js", "text/javascript; charset=utf-8"),
        ("/console/support.js", "text/javascript; charset=utf-8"),
        (
            "/console/vendor/uPlot.iife.min.js",
            "text/javascript; charset=utf-8",
        ),
        ("/console/vendor/uPlot.LICENSE", "text/plain; charset=utf-8"),
    ] {
        let r = app.http.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], ctype, "{path}");
    }
    let r = app
        .http
        .get(app.url("/console/../Cargo.toml"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}
