//! The HTTP baseline for `scripts/bench-http.sh`: an actix-web server built exactly like quotad
//! (same actix-web version and features, same tokio runtime shape, same worker count and
//! keep-alive) that parses the same `/v1/check` and `/v1/check/batch` JSON bodies with serde
//! and answers a fixed answer of the same shape and headers, without the limiter. The ratio
//! quotad/baseline is what quotad adds on top of the HTTP server itself.
//!
//! Run: `cargo run --release --example bench_baseline -- 127.0.0.1:18081`
//! (or `BENCH_BASELINE_BIND=127.0.0.1:18081`; default 127.0.0.1:18081).

use std::borrow::Cow;
use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use serde::{Deserialize, Serialize};

/// Same body as quotad's check: borrowed strings, unknown fields refused.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // parsed, as quotad does, then deliberately unused
struct CheckDto<'a> {
    #[serde(borrow, default)]
    tenant: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    client: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    resource: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<serde_json::Number>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchDto<'a> {
    #[serde(borrow)]
    checks: Vec<CheckDto<'a>>,
}

/// Same shape as quotad's answer.
#[derive(Serialize)]
struct Answer {
    allowed: bool,
    limit_id: Option<&'static str>,
    limit: Option<u64>,
    remaining: Option<u64>,
    reset_after_ms: Option<i64>,
    retry_after_ms: Option<i64>,
}

const FIXED: Answer = Answer {
    allowed: true,
    limit_id: Some("per-second"),
    limit: Some(1_000_000_000),
    remaining: Some(999_999_999),
    reset_after_ms: Some(1000),
    retry_after_ms: Some(0),
};

fn bad(msg: &str) -> HttpResponse {
    HttpResponse::BadRequest().json(serde_json::json!({
        "error": {"code": "invalid_argument", "message": msg, "field": "body"}
    }))
}

fn is_json(req: &HttpRequest) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

async fn check(req: HttpRequest, body: web::Bytes) -> HttpResponse {
    if !is_json(&req) {
        return HttpResponse::UnsupportedMediaType().finish();
    }
    match serde_json::from_slice::<CheckDto>(&body) {
        Ok(dto) if dto.tenant.is_some() && dto.client.is_some() => {}
        Ok(_) => return bad("tenant and client are required"),
        Err(e) => return bad(&e.to_string()),
    }
    let mut res = HttpResponse::Ok();
    for (name, value) in [
        ("RateLimit-Limit", "1000000000"),
        ("RateLimit-Remaining", "999999999"),
        ("RateLimit-Reset", "1"),
        ("X-RateLimit-Limit", "1000000000"),
        ("X-RateLimit-Remaining", "999999999"),
        ("X-RateLimit-Reset", "1"),
    ] {
        res.insert_header((name, value));
    }
    res.json(FIXED)
}

async fn batch(req: HttpRequest, body: web::Bytes) -> HttpResponse {
    if !is_json(&req) {
        return HttpResponse::UnsupportedMediaType().finish();
    }
    let n = match serde_json::from_slice::<BatchDto>(&body) {
        Ok(dto) if (1..=1000).contains(&dto.checks.len()) => dto.checks.len(),
        Ok(_) => return bad("a batch has 1 to 1000 checks"),
        Err(e) => return bad(&e.to_string()),
    };
    let results: Vec<&Answer> = std::iter::repeat_n(&FIXED, n).collect();
    HttpResponse::Ok().json(serde_json::json!({ "results": results }))
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let bind = std::env::args()
        .nth(1)
        .or_else(|| std::env::var("BENCH_BASELINE_BIND").ok())
        .unwrap_or_else(|| "127.0.0.1:18081".to_owned());
    eprintln!("bench_baseline listening on {bind}");
    // quotad's defaults: one worker per core, 5 s keep-alive and request timeout.
    HttpServer::new(|| {
        App::new()
            .app_data(web::PayloadConfig::new(64 * 1024))
            .route("/v1/check", web::post().to(check))
            .route("/v1/check/batch", web::post().to(batch))
            .route("/healthz", web::get().to(HttpResponse::Ok))
    })
    .keep_alive(Duration::from_secs(5))
    .client_request_timeout(Duration::from_secs(5))
    .max_connections(25_000)
    .bind(&bind)?
    .run()
    .await
}
