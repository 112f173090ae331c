//! A token budget in front of an OpenAI-compatible API: a reverse proxy whose
//! `/v1/chat/completions` (and `/v1/completions`) go through [`TokenBudgetLayer`], each caller
//! (its `X-Api-Key`; `anonymous` without one) reserving its estimated tokens in quotad and
//! settled at the answer's usage.
//!
//! Run quotad, give the tenant a budget, then this example:
//!
//! ```sh
//! TOKEN=$(openssl rand -hex 32)
//! QUOTAD__AUTH__ADMIN_TOKEN=$TOKEN cargo run --release        # quotad on 127.0.0.1:8080
//! curl -X PUT localhost:8080/v1/quotas/acme -H "Authorization: Bearer $TOKEN" \
//!   -H 'Content-Type: application/json' -d '{"limits": [
//!     {"id": "tokens-per-minute", "max": 10000, "window": "1m"},
//!     {"id": "slots", "max": 4, "in_flight": "holds"}]}'
//! UPSTREAM_URL=https://api.openai.com UPSTREAM_API_KEY=sk-... \
//!   cargo run -p quotad-client --features rustls --example openai_budget
//! curl localhost:3000/v1/chat/completions -H 'X-Api-Key: key-1' -H 'Content-Type: application/json' \
//!   -d '{"model": "gpt-4o-mini", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}'
//! ```
//!
//! Environment:
//! - `UPSTREAM_URL` (required): the API's base, without `/v1` (`https://api.openai.com`,
//!   `http://127.0.0.1:8000` for a local vLLM or llama.cpp server). `https` needs the crate's
//!   `rustls` feature.
//! - `UPSTREAM_API_KEY`: sent as `Authorization: Bearer ...` to the upstream; without it, the
//!   caller's own `Authorization` goes on.
//! - `QUOTAD_URL` (`http://127.0.0.1:8080`), `QUOTAD_TOKEN` (quotad's check token, if it has
//!   one), `QUOTAD_TENANT` (`acme`).
//! - `LISTEN` (`127.0.0.1:3000`); `RUST_LOG` for the logs (`info` unless set: the layer warns
//!   of each reservation it could not end; `quotad_client=debug` also shows settles that took a
//!   caller past a limit).

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use quotad_client::{Check, Client, PromptEstimate, TokenBudgetLayer, Unreachable};

/// Where requests go, and how.
#[derive(Clone)]
struct Upstream {
    base: String,
    key: Option<String>,
    http: reqwest::Client,
}

/// Headers of one hop, not passed on.
const HOP: [&str; 6] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

fn pass_on(from: &HeaderMap, mut to: impl FnMut(&str, &[u8])) {
    for (name, value) in from {
        if !HOP.contains(&name.as_str()) {
            to(name.as_str(), value.as_bytes());
        }
    }
}

/// Sends the request on, and the answer back as it comes (a stream stays a stream).
async fn proxy(State(up): State<Upstream>, req: Request<Body>) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    // The layer has read the body already: this takes it whole, as it is.
    let Ok(body) = axum::body::to_bytes(body, usize::MAX).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let mut out = up
        .http
        .request(parts.method, format!("{}{path}", up.base))
        .body(body);
    let mut headers = reqwest::header::HeaderMap::new();
    pass_on(&parts.headers, |n, v| {
        if let (Ok(n), Ok(v)) = (
            reqwest::header::HeaderName::from_bytes(n.as_bytes()),
            reqwest::header::HeaderValue::from_bytes(v),
        ) {
            headers.append(n, v);
        }
    });
    // The caller's key is for the budget, not for the upstream.
    headers.remove("x-api-key");
    if up.key.is_some() {
        headers.remove(reqwest::header::AUTHORIZATION);
    }
    out = out.headers(headers);
    if let Some(key) = &up.key {
        out = out.bearer_auth(key);
    }
    let res = match out.send().await {
        Ok(res) => res,
        Err(e) => {
            tracing::warn!(error = %e, "the upstream could not be reached");
            return (StatusCode::BAD_GATEWAY, "the upstream could not be reached").into_response();
        }
    };
    let mut back = Response::builder().status(res.status().as_u16());
    pass_on(res.headers(), |n, v| {
        back = std::mem::take(&mut back).header(n, v);
    });
    back.body(Body::from_stream(res.bytes_stream()))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_owned())
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let Ok(base) = std::env::var("UPSTREAM_URL") else {
        tracing::error!("UPSTREAM_URL is required: the API's base, e.g. https://api.openai.com");
        std::process::exit(2);
    };
    let upstream = Upstream {
        base: base.trim_end_matches('/').to_owned(),
        key: std::env::var("UPSTREAM_API_KEY").ok(),
        http: reqwest::Client::new(),
    };
    let mut quotad = Client::new(env("QUOTAD_URL", "http://127.0.0.1:8080"));
    if let Ok(token) = std::env::var("QUOTAD_TOKEN") {
        quotad = quotad.token(token);
    }
    let tenant = env("QUOTAD_TENANT", "acme");
    let budget = TokenBudgetLayer::new(quotad, Unreachable::Deny, move |req: &Request<Body>| {
        let key = req.headers().get("x-api-key");
        let client = key.and_then(|k| k.to_str().ok()).unwrap_or("anonymous");
        Some(Check::new(tenant.as_str(), client).resource(req.uri().path()))
    })
    // Bytes over 4 err high for the prompt; a settle gives the difference back.
    .prompt_estimate(PromptEstimate::BytesPerToken(4))
    .default_completion(1024)
    // Longer than the longest answer: a stream's settle must find its reservation open.
    .hold(Duration::from_secs(600));
    let app = Router::new()
        .route("/v1/chat/completions", post(proxy))
        .route("/v1/completions", post(proxy))
        .with_state(upstream)
        .layer(budget);
    let listen = env("LISTEN", "127.0.0.1:3000");
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .unwrap_or_else(|e| panic!("cannot listen on {listen}: {e}"));
    tracing::info!("token budget proxy on {listen}, upstream {base}");
    axum::serve(listener, app).await.unwrap();
}
