//! `spawn_app`: a real quotad on port 0 with an embedded store in a temp directory.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quotad::clock::{Clock, SystemClock};
use quotad::config::{DurationMs, Secret, Settings};
use quotad::startup::Application;
use quotad::store::DynStore;
use serde_json::{json, Value};

/// A token as strong as the configuration asks (128 bits: 32 hex digits).
pub const ADMIN: &str = "6a1f0c9d2e8b7a4f3c5d6e7f8091a2b3";

/// How long [`eventually`] waits: many times what the tests' background tasks take on an idle
/// machine (sync rounds and history writes every 50 ms, policy polls every 100 ms), for a busy
/// 2-core machine where a round may wait seconds for a core.
pub const EVENTUALLY: Duration = Duration::from_secs(20);

/// Waits for what a background task makes true (a sync round's write, a history write, a
/// policy poll): polls `f` every 25 ms until it gives `Some`, for at most [`EVENTUALLY`], then
/// fails naming `what` and the last thing `f` saw. A fixed sleep instead fails whenever the
/// machine is slower than the sleep's guess.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        match f().await {
            Ok(v) => return v,
            Err(last) if started.elapsed() >= EVENTUALLY => {
                panic!("{what}: not after {EVENTUALLY:?}; last seen: {last}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(25)).await,
        }
    }
}

pub struct TestApp {
    pub base: String,
    pub http: reqwest::Client,
    pub handle: actix_web::dev::ServerHandle,
    pub done: tokio::task::JoinHandle<std::io::Result<u64>>,
    pub dir: Arc<tempfile::TempDir>,
    /// Envoy's rate limit service, when `server.grpc_bind` was set.
    pub grpc_port: Option<u16>,
}

pub fn settings(dir: &std::path::Path) -> Settings {
    let mut s = Settings::default();
    s.server.bind = "127.0.0.1:0".into();
    s.server.workers = 2;
    s.store.path = PathBuf::from(dir);
    s.auth.admin_token = Secret::new(ADMIN);
    s.sync.interval_ms = DurationMs(50);
    s.history.write_interval_ms = Some(DurationMs(50));
    s.quotas.refresh_ms = DurationMs(100);
    s
}

pub async fn spawn_app() -> TestApp {
    spawn_with(|_| {}).await
}

pub async fn spawn_with(tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    spawn_in(dir, tweak).await
}

/// Starts an app on an existing data directory (restart tests). A stopped app's HTTP workers
/// let go of the store on their own threads, a moment after its stop returns (a process that
/// exits lets go of it at once): the embedded store's lock is waited for, up to 10 s, as a
/// service manager restarting quotad waits for the old process to exit.
pub async fn spawn_in(dir: Arc<tempfile::TempDir>, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let mut s = settings(dir.path());
    tweak(&mut s);
    let started = Instant::now();
    let app = loop {
        match Application::build(s.clone()).await {
            Ok(app) => break app,
            Err(e)
                if e.to_string().contains("Cannot acquire lock")
                    && started.elapsed() < Duration::from_secs(10) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("app starts: {e:?}"),
        }
    };
    launch(app, dir)
}

/// Starts an app and returns, with it, what it logged while starting (plain text, no colours).
/// The log is caught for the start-up only: a subscriber of this future, not a global one.
pub async fn spawn_logged(tweak: impl FnOnce(&mut Settings)) -> (TestApp, String) {
    use tracing::instrument::WithSubscriber;
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let mut s = settings(dir.path());
    tweak(&mut s);
    let log = Log::default();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(log.clone())
        .finish();
    let app = Application::build(s)
        .with_subscriber(subscriber)
        .await
        .expect("app starts");
    let text = String::from_utf8(log.0.lock().unwrap().clone()).unwrap();
    (launch(app, dir), text)
}

/// A log sink the test can read back.
#[derive(Clone, Default)]
struct Log(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Log {
    type Writer = Log;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Starts an app on a given store (several instances on one store).
pub async fn spawn_on_store(store: DynStore, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_on_store_at(store, Arc::new(SystemClock), tweak).await
}

/// Starts an app on a given store and clock (a test clock drives hours and days).
pub async fn spawn_on_store_at(
    store: DynStore,
    clock: Arc<dyn Clock>,
    tweak: impl FnOnce(&mut Settings),
) -> TestApp {
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let mut s = settings(dir.path());
    tweak(&mut s);
    let app = Application::build_with(s, store, clock)
        .await
        .expect("app starts");
    launch(app, dir)
}

fn launch(app: Application, dir: Arc<tempfile::TempDir>) -> TestApp {
    let base = format!("http://127.0.0.1:{}", app.port());
    let grpc_port = app.grpc_port();
    let handle = app.handle();
    let done = tokio::spawn(app.run_until_stopped());
    TestApp {
        base,
        http: reqwest::Client::new(),
        handle,
        done,
        dir,
        grpc_port,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Stops like SIGTERM does; returns the hits that could not be written.
    pub async fn stop(self) -> (u64, Arc<tempfile::TempDir>) {
        self.handle.stop(true).await;
        let unsynced = self.done.await.unwrap().unwrap();
        (unsynced, self.dir)
    }

    pub async fn put_quota(&self, tenant: &str, policy: Value) -> reqwest::Response {
        self.http
            .put(self.url(&format!("/v1/quotas/{tenant}")))
            .bearer_auth(ADMIN)
            .json(&policy)
            .send()
            .await
            .unwrap()
    }

    pub async fn check(&self, body: Value) -> reqwest::Response {
        self.http
            .post(self.url("/v1/check"))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn check_json(&self, tenant: &str, client: &str) -> (u16, Value) {
        let r = self
            .check(json!({"tenant": tenant, "client": client}))
            .await;
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    pub async fn admin_get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(ADMIN)
            .send()
            .await
            .unwrap()
    }

    /// An admin GET that must answer 200 with JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        let r = self.admin_get(path).await;
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, 200, "GET {path}: {text}");
        serde_json::from_str(&text).unwrap()
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        let r = self.http.get(self.url("/metrics")).send().await.unwrap();
        r.text().await.unwrap()
    }

    /// One series' value on `/metrics`, by its full name with labels.
    pub async fn metric(&self, series: &str) -> f64 {
        let text = self.metrics_text().await;
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} not in /metrics:\n{text}"))
    }

    /// Waits until this instance's usage of `client` counts `count` on its first limit: the
    /// store holds what was admitted (another instance's hits, once written).
    pub async fn usage_reaches(&self, tenant: &str, client: &str, count: u64) {
        let path = format!("/v1/usage/{tenant}/{client}");
        let what = format!("{tenant}/{client} counts {count} in the store");
        eventually(&what, || async {
            // A 404 until this instance has polled the tenant's policy.
            let r = self.admin_get(&path).await;
            let status = r.status().as_u16();
            let u: Value = r.json().await.unwrap();
            (status == 200 && u["limits"][0]["count"] == count)
                .then_some(())
                .ok_or_else(|| format!("{status} {u}"))
        })
        .await
    }

    /// Checks until one is admitted, for at most [`EVENTUALLY`]: a change made elsewhere (a
    /// policy, a grant, a reset on another instance) reaches this one at its next poll or read
    /// back. Each denied try consumes nothing; the admitted one counts.
    pub async fn admitted_eventually(&self, tenant: &str, client: &str, what: &str) {
        eventually(what, || async {
            let (status, body) = self.check_json(tenant, client).await;
            (status == 200)
                .then_some(())
                .ok_or_else(|| format!("{status} {body}"))
        })
        .await
    }

    /// Waits until the usage history of `client` holds `admitted` and `denied` checks in the
    /// last 24 hours (the sync task writes it).
    pub async fn history_reaches(&self, tenant: &str, client: &str, admitted: u64, denied: u64) {
        let path = format!("/v1/usage/{tenant}/{client}/history");
        eventually(&format!("{tenant}/{client}'s history written"), || async {
            let v = self.get_json(&path).await;
            let total = &v["total"];
            (total["admitted"] == admitted && total["denied"] == denied)
                .then_some(())
                .ok_or_else(|| v.to_string())
        })
        .await
    }

    pub async fn usage(&self, tenant: &str, client: &str) -> Value {
        let r = self
            .admin_get(&format!("/v1/usage/{tenant}/{client}"))
            .await;
        assert_eq!(r.status(), 200);
        r.json().await.unwrap()
    }
}

/// POSTs raw bytes with this content type (or none).
pub async fn post_raw(
    app: &TestApp,
    path: &str,
    ct: Option<&str>,
    body: Vec<u8>,
) -> reqwest::Response {
    let mut req = app.http.post(app.url(path)).body(body);
    if let Some(ct) = ct {
        req = req.header("content-type", ct);
    }
    req.send().await.unwrap()
}

/// Asserts the contract's error shape and returns the body.
pub async fn assert_error(r: reqwest::Response, status: u16, code: &str) -> Value {
    assert_eq!(r.status().as_u16(), status, "status");
    let body: Value = r.json().await.expect("JSON error body");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    body
}

/// The methods an `Allow` header names (None when there is no such header). Several `Allow`
/// fields are one comma-separated list (RFC 9110 §5.3).
pub fn allowed_methods(r: &reqwest::Response) -> Option<std::collections::BTreeSet<String>> {
    let fields: Vec<&str> = r
        .headers()
        .get_all("allow")
        .iter()
        .map(|v| v.to_str().expect("ASCII Allow"))
        .collect();
    (!fields.is_empty()).then(|| {
        fields
            .iter()
            .flat_map(|f| f.split(','))
            .map(|m| m.trim().to_owned())
            .filter(|m| !m.is_empty())
            .collect()
    })
}
