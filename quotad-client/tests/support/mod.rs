//! What the token budget tests run against: a real quotad (the embedded store, in a temporary
//! directory), a fake OpenAI-compatible upstream on a real port, and the app under test, a
//! reverse proxy to it behind [`TokenBudgetLayer`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream;
use quotad::config::{DurationMs, Secret, Settings};
use quotad::startup::Application;
use quotad_client::{Check, Client, PromptEstimate, TokenBudgetLayer, Unreachable};
use serde_json::{json, Value};
use tokio::sync::Notify;

pub const ADMIN: &str = "client-test-admin";
/// The usage of every non-streaming answer: `total_tokens`.
pub const JSON_TOTAL: u64 = 300;
/// The usage of every streamed answer that was asked for it.
pub const STREAM_TOTAL: u64 = 420;
/// The prompt's estimate of every request (`PromptEstimate::Fixed`).
pub const PROMPT: u64 = 20;

/// A quotad on 127.0.0.1 whose tenant `acme` has `policy`: its base URL, and the directory
/// of its store (removed when dropped).
pub async fn quotad(policy: Value) -> (String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Settings::default();
    s.server.bind = "127.0.0.1:0".into();
    s.server.workers = 1;
    s.store.path = dir.path().to_path_buf();
    s.auth.admin_token = Secret::new(ADMIN);
    s.sync.interval_ms = DurationMs(50);
    let app = Application::build(s).await.expect("quotad starts");
    let base = format!("http://127.0.0.1:{}", app.port());
    tokio::spawn(app.run_until_stopped());
    let r = reqwest::Client::new()
        .put(format!("{base}/v1/quotas/acme"))
        .bearer_auth(ADMIN)
        .json(&policy)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    (base, dir)
}

/// The count of limit `limit` of client `key` of `acme`.
pub async fn count(base: &str, key: &str, limit: &str) -> u64 {
    let u = Client::new(base)
        .token(ADMIN)
        .usage("acme", key)
        .await
        .unwrap();
    u["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["limit_id"] == limit)
        .unwrap_or_else(|| panic!("no limit {limit} in {u}"))["count"]
        .as_u64()
        .unwrap()
}

/// The count of `limit` once it is `want` (reservations end in tasks of their own, a moment
/// after the answer), or what it still is after 5 seconds.
pub async fn count_reaches(base: &str, key: &str, limit: &str, want: u64) -> u64 {
    let mut last = count(base, key, limit).await;
    for _ in 0..250 {
        if last == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        last = count(base, key, limit).await;
    }
    last
}

/// What the fake upstream saw and answered.
#[derive(Default)]
pub struct Upstream {
    /// Answers with a usage, and the sum of their `total_tokens`.
    pub answered: AtomicU64,
    pub tokens: AtomicU64,
    /// Requests being worked on now, and the most there ever were at once.
    pub now: AtomicUsize,
    pub peak: AtomicUsize,
    /// How long each non-streaming answer takes.
    pub delay_ms: AtomicU64,
    /// Opens the gate a `gated` request waits at.
    pub gate: Notify,
    /// The last request body.
    pub last: std::sync::Mutex<Value>,
}

/// One request in the works: counted in `now` until dropped.
struct Working(Arc<Upstream>);

impl Working {
    fn new(u: &Arc<Upstream>) -> Self {
        let now = u.now.fetch_add(1, Ordering::SeqCst) + 1;
        u.peak.fetch_max(now, Ordering::SeqCst);
        Working(u.clone())
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

fn usage(total: u64) -> Value {
    json!({"prompt_tokens": 20, "completion_tokens": total - 20, "total_tokens": total})
}

/// `POST /v1/chat/completions` as OpenAI answers it: `model` says how. `broken`: 500 (after
/// the gate when `gated-broken`); `gated`: a stream that waits at the gate after its first
/// event; `no-usage`: an answer without usage. Streams carry their usage in a last event only
/// when `stream_options.include_usage` asks, as OpenAI's do.
async fn completions(State(u): State<Arc<Upstream>>, Json(req): Json<Value>) -> Response {
    *u.last.lock().unwrap() = req.clone();
    let working = Working::new(&u);
    let model = req["model"].as_str().unwrap_or("").to_owned();
    if model == "gated-broken" {
        u.gate.notified().await;
    }
    if model.ends_with("broken") {
        let body = json!({"error": {"message": "the model fell over", "type": "server_error"}});
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response();
    }
    if req["stream"] != true {
        tokio::time::sleep(Duration::from_millis(u.delay_ms.load(Ordering::SeqCst))).await;
        let mut body = json!({"id": "chatcmpl-1", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                         "finish_reason": "stop"}]});
        if model != "no-usage" {
            body["usage"] = usage(JSON_TOTAL);
            u.answered.fetch_add(1, Ordering::SeqCst);
            u.tokens.fetch_add(JSON_TOTAL, Ordering::SeqCst);
        }
        drop(working);
        return Json(body).into_response();
    }
    let with_usage = req["stream_options"]["include_usage"] == true;
    let chunk = |content: &str| {
        let c = json!({"id": "chatcmpl-2", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {"content": content}}]});
        format!("data: {c}\n\n")
    };
    let mut events = vec![chunk("hel"), chunk("lo")];
    if with_usage {
        let last = json!({"id": "chatcmpl-2", "object": "chat.completion.chunk",
            "choices": [], "usage": usage(STREAM_TOTAL)});
        events.push(format!("data: {last}\n\n"));
    }
    events.push("data: [DONE]\n\n".to_owned());
    let gated = model == "gated";
    let state = (
        events.into_iter(),
        u.clone(),
        with_usage,
        gated,
        Some(working),
    );
    let body = stream::unfold(
        state,
        |(mut events, u, with_usage, gated, working)| async move {
            let event = events.next()?;
            if gated && event.contains("\"lo\"") {
                u.gate.notified().await;
            }
            if event == "data: [DONE]\n\n" && with_usage {
                u.answered.fetch_add(1, Ordering::SeqCst);
                u.tokens.fetch_add(STREAM_TOTAL, Ordering::SeqCst);
            }
            let next = (events, u, with_usage, gated, working);
            Some((Ok::<_, std::io::Error>(event), next))
        },
    );
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from_stream(body))
        .unwrap()
}

/// The fake upstream on 127.0.0.1: its base URL and what it sees.
pub async fn upstream() -> (String, Arc<Upstream>) {
    let state = Arc::new(Upstream::default());
    let router = Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (format!("http://{addr}"), state)
}

/// Passes a request on to `upstream` and its answer back as it comes.
async fn proxy(State(upstream): State<String>, req: Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    let url = format!("{upstream}{}", parts.uri.path());
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    let sent = reqwest::Client::new()
        .post(url)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let Ok(res) = sent else {
        return StatusCode::BAD_GATEWAY.into_response();
    };
    let mut out = Response::builder().status(res.status().as_u16());
    if let Some(ct) = res.headers().get(header::CONTENT_TYPE) {
        out = out.header(header::CONTENT_TYPE, ct.as_bytes());
    }
    out.body(Body::from_stream(res.bytes_stream())).unwrap()
}

/// The app under test: a proxy to `upstream` behind the layer, reserving as the client named
/// by `X-Api-Key` of `acme`, with the fixed prompt estimate [`PROMPT`]; `/health` unasked.
pub async fn app(quotad: &str, upstream: &str) -> SocketAddr {
    let layer = TokenBudgetLayer::new(
        Client::new(quotad),
        Unreachable::Deny,
        |req: &Request<Body>| {
            if req.uri().path() == "/health" {
                return None;
            }
            let key = req.headers().get("x-api-key")?.to_str().ok()?;
            Some(Check::new("acme", key).resource("POST /v1/chat/completions"))
        },
    )
    .prompt_estimate(PromptEstimate::Fixed(PROMPT))
    .default_completion(1000)
    .hold(Duration::from_secs(60));
    let router = Router::new()
        .route("/v1/chat/completions", post(proxy))
        .route("/health", get(|| async { "ok" }))
        .with_state(upstream.to_owned())
        .layer(layer);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// A chat completion request of client `key` to the app at `addr`.
pub fn chat(addr: SocketAddr, key: &str, body: Value) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .post(format!("http://{addr}/v1/chat/completions"))
        .header("x-api-key", key)
        .json(&body)
}
