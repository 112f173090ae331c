//! `Idempotency-Key`: an admin change sent again with the same key is answered from the first
//! one's record, on any instance, instead of being made twice (see `store::idempotency`).
//!
//! - No header: the change is made, as always.
//! - A key not seen in the last day: claimed, the change made, its answer recorded.
//! - The same key and the same request (method, path, body): the recorded answer, 200, with
//!   `Idempotent-Replayed: true`.
//! - The same key with another request: 400 on the header, nothing done.
//! - The same key while the first request is still at work, or after it ended without a known
//!   outcome (the store did not confirm a write that may have landed): 409, nothing done.
//!   A key whose first request failed with nothing done is freed, so a retry goes ahead.

use std::future::Future;

use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpRequest, HttpResponse};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::state::AppState;
use crate::domain::TenantId;
use crate::store::idempotency::{Begun, IDEMPOTENCY_TTL};
use crate::store::StoreError;

/// The request header.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";
/// The response header of an answer replayed from a record.
pub const REPLAYED: &str = "Idempotent-Replayed";
/// Longest key: 255 visible ASCII characters (a UUID needs 36).
const MAX_KEY_LEN: usize = 255;

/// How a change failed.
pub struct Failed {
    pub error: ApiError,
    /// The store did not confirm a write that may have landed: the key stays taken, so a
    /// retry cannot make the change twice.
    pub maybe_done: bool,
}

impl From<ApiError> for Failed {
    fn from(error: ApiError) -> Self {
        Failed {
            error,
            maybe_done: false,
        }
    }
}

impl From<StoreError> for Failed {
    fn from(e: StoreError) -> Self {
        Failed {
            maybe_done: matches!(e, StoreError::Uncertain(_)),
            error: e.into(),
        }
    }
}

/// The document's pattern of a key, as `adjust`'s operations spell it (`openapi`'s tests hold
/// [`valid_key`] to it).
#[cfg(test)]
pub const KEY_PATTERN: &str = "^[!-~]{1,255}$";

/// Whether `k` is a usable key: 1 to 255 visible ASCII characters.
pub fn valid_key(k: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic())
}

impl Failed {
    /// An error after the change was made (reading the answer): the key stays taken, so a
    /// retry cannot make the change again.
    pub fn after_the_change(error: impl Into<ApiError>) -> Self {
        Failed {
            error: error.into(),
            maybe_done: true,
        }
    }
}

/// The request's key: None without the header; 400 for an unusable one.
fn key_of(req: &HttpRequest) -> Result<Option<&str>, ApiError> {
    let Some(v) = req.headers().get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    v.to_str()
        .ok()
        .filter(|k| valid_key(k))
        .map(Some)
        .ok_or_else(|| {
            ApiError::invalid(
                IDEMPOTENCY_KEY,
                format!("{IDEMPOTENCY_KEY} must be 1 to {MAX_KEY_LEN} visible ASCII characters"),
            )
        })
}

/// The sha256 of the request's method, path and body, in hex.
fn fingerprint(req: &HttpRequest, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(req.method().as_str().as_bytes());
    h.update([0]);
    h.update(req.path().as_bytes());
    h.update([0]);
    h.update(body);
    hex::encode(h.finalize())
}

fn json_answer(body: String, replayed: bool) -> HttpResponse {
    let mut res = HttpResponse::Ok();
    res.insert_header((header::CONTENT_TYPE, "application/json"));
    if replayed {
        res.insert_header((REPLAYED, HeaderValue::from_static("true")));
    }
    res.body(body)
}

/// Makes the change `work` at most once per `Idempotency-Key` of `tenant` (see the module
/// comment); `work` answers with the JSON body of a 200.
pub async fn at_most_once<F, Fut>(
    req: &HttpRequest,
    state: &AppState,
    tenant: &TenantId,
    body: &[u8],
    work: F,
) -> Result<HttpResponse, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<String, Failed>>,
{
    let Some(key) = key_of(req)? else {
        return work()
            .await
            .map(|b| json_answer(b, false))
            .map_err(|f| f.error);
    };
    let fp = fingerprint(req, body);
    let scope = tenant.as_str();
    match state
        .store
        .begin_idempotent(scope, key, &fp, IDEMPOTENCY_TTL)
        .await?
    {
        Begun::Seen(r) if r.fingerprint != fp => Err(ApiError::invalid(
            IDEMPOTENCY_KEY,
            "this key was sent with another request in the last 24 hours; use a new key",
        )),
        Begun::Seen(r) => match r.response {
            Some(body) => Ok(json_answer(body, true)),
            None => Err(ApiError::Conflict(
                "a request with this key is still at work, or ended without a known outcome; \
                 read the usage and the audit log before sending it with a new key"
                    .into(),
            )),
        },
        Begun::Claimed => match work().await {
            Ok(answer) => {
                if let Err(e) = state
                    .store
                    .finish_idempotent(scope, key, &fp, &answer, IDEMPOTENCY_TTL)
                    .await
                {
                    // The change is made; a retry will hear 409 rather than make it again.
                    tracing::warn!(error = %e, key, "could not record an idempotent answer");
                }
                Ok(json_answer(answer, false))
            }
            Err(f) => {
                if !f.maybe_done {
                    if let Err(e) = state.store.abandon_idempotent(scope, key, &fp).await {
                        tracing::warn!(error = %e, key, "could not free an idempotency key");
                    }
                }
                Err(f.error)
            }
        },
    }
}
