//! [`TokenBudgetLayer`]: a tower layer in front of an OpenAI-compatible API, which reserves
//! each request's estimated tokens in quotad and settles them at the answer's real usage (see
//! the crate's README).

mod body;
mod hold;
mod request;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Check, Client, Unreachable};

pub use body::TokenBody;
pub use request::PromptEstimate;

use body::Usage;
use hold::Hold;

/// Which check a request is (its tenant, client and resource; the cost is the estimate), or
/// None to let it through unasked and unread.
type Key<B> = Arc<dyn Fn(&Request<B>) -> Option<Check> + Send + Sync>;

/// Reserves each request's estimated tokens in quotad, and settles them at the answer's
/// `usage.total_tokens`; see the crate's documentation.
pub struct TokenBudgetLayer<B> {
    client: Client,
    key: Key<B>,
    unreachable: Unreachable,
    prompt: PromptEstimate,
    completion: u64,
    hold: Option<Duration>,
    max_body: usize,
}

impl<B> Clone for TokenBudgetLayer<B> {
    fn clone(&self) -> Self {
        TokenBudgetLayer {
            client: self.client.clone(),
            key: self.key.clone(),
            unreachable: self.unreachable,
            prompt: self.prompt,
            completion: self.completion,
            hold: self.hold,
            max_body: self.max_body,
        }
    }
}

impl<B> TokenBudgetLayer<B> {
    /// `key` names each request's check (its `cost` is replaced by the estimate); when quotad
    /// cannot be reached, or refuses the check itself, `unreachable` decides. The estimate is
    /// then the request body's bytes over 4 plus its `max_completion_tokens` or `max_tokens`
    /// (1024 when it names neither), held for the policy's `hold` (else 5 minutes), from a
    /// request body of at most 16 MiB.
    pub fn new(
        client: Client,
        unreachable: Unreachable,
        key: impl Fn(&Request<B>) -> Option<Check> + Send + Sync + 'static,
    ) -> Self {
        TokenBudgetLayer {
            client,
            key: Arc::new(key),
            unreachable,
            prompt: PromptEstimate::BytesPerToken(4),
            completion: 1024,
            hold: None,
            max_body: 16 << 20,
        }
    }

    /// How the prompt's tokens are estimated.
    pub fn prompt_estimate(mut self, prompt: PromptEstimate) -> Self {
        self.prompt = prompt;
        self
    }

    /// The completion's estimate for a request that names no `max_completion_tokens` or
    /// `max_tokens` (or whose body is not JSON).
    pub fn default_completion(mut self, tokens: u64) -> Self {
        self.completion = tokens;
        self
    }

    /// How long a reservation is held before it expires, keeping its estimate (1s to 1h):
    /// longer than the longest answer, or a long stream's settle finds it expired.
    pub fn hold(mut self, hold: Duration) -> Self {
        self.hold = Some(hold);
        self
    }

    /// The largest request body read; a larger one is answered 413.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }
}

impl<S, B> Layer<S> for TokenBudgetLayer<B> {
    type Service = TokenBudgetService<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        TokenBudgetService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`TokenBudgetLayer`] wraps around another.
pub struct TokenBudgetService<S, B> {
    inner: S,
    layer: TokenBudgetLayer<B>,
}

impl<S: Clone, B> Clone for TokenBudgetService<S, B> {
    fn clone(&self) -> Self {
        TokenBudgetService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

/// The layer's own answer: a JSON body with `status`.
fn answer<RB>(
    status: StatusCode,
    headers: Vec<(http::HeaderName, HeaderValue)>,
    body: String,
) -> Response<TokenBody<RB>> {
    let mut res = Response::new(TokenBody::own(body));
    *res.status_mut() = status;
    let h = res.headers_mut();
    h.extend(headers);
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

fn error<RB>(status: StatusCode, code: &str, message: String) -> Response<TokenBody<RB>> {
    let body = serde_json::json!({"error": {"code": code, "message": message}});
    answer(status, Vec::new(), body.to_string())
}

impl<S, B, RB> Service<Request<B>> for TokenBudgetService<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    RB: http_body::Body<Data = Bytes> + Send + 'static,
{
    type Response = Response<TokenBody<RB>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The inner service polled ready is the one to call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let check = (self.layer.key)(&req);
        let layer = self.layer.clone();
        Box::pin(async move {
            let Some(check) = check else {
                return Ok(inner.call(req).await?.map(TokenBody::passed));
            };
            let (mut parts, body) = req.into_parts();
            let bytes = match Limited::new(body, layer.max_body).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) if e.is::<LengthLimitError>() => {
                    let m = format!("the request body is over {} bytes", layer.max_body);
                    return Ok(error(StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large", m));
                }
                Err(e) => {
                    let m = format!("the request body could not be read: {e}");
                    return Ok(error(StatusCode::BAD_REQUEST, "invalid_argument", m));
                }
            };
            let prepared = request::prepare(bytes, layer.prompt, layer.completion);
            if prepared.rewritten {
                parts.headers.remove(header::TRANSFER_ENCODING);
                parts
                    .headers
                    .insert(header::CONTENT_LENGTH, prepared.body.len().into());
            }
            let req = Request::from_parts(parts, B::from(prepared.body));
            let check = Check {
                cost: Some(prepared.estimate),
                ..check
            };
            let (hold, headers) = match layer.client.reserve(&check, layer.hold).await {
                Ok(r) if r.allowed() => {
                    let hold = r.reservation.map(|r| Hold::new(layer.client.clone(), r));
                    (hold, r.headers)
                }
                // Denied: quotad's own answer, headers and body, without the request.
                Ok(r) => {
                    let body = r.body.to_string();
                    return Ok(answer(StatusCode::TOO_MANY_REQUESTS, r.headers, body));
                }
                Err(_) if layer.unreachable == Unreachable::Allow => (None, Vec::new()),
                Err(e) => {
                    let m = format!("the rate limiter could not decide: {e}");
                    let mut res = error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m);
                    let h = res.headers_mut();
                    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    return Ok(res);
                }
            };
            // Dropped while the upstream works (the caller went away), the hold settles at its
            // estimate; an error instead of an answer releases it.
            let res = match inner.call(req).await {
                Ok(res) => res,
                Err(e) => {
                    if let Some(h) = hold {
                        h.release();
                    }
                    return Err(e);
                }
            };
            let (mut parts, body) = res.into_parts();
            parts.headers.extend(headers);
            let body = match hold {
                None => TokenBody::passed(body),
                // An error answered before any body: the work did not happen.
                Some(h) if parts.status.is_client_error() || parts.status.is_server_error() => {
                    h.release();
                    TokenBody::passed(body)
                }
                Some(h) => {
                    let ct = parts.headers.get(header::CONTENT_TYPE);
                    let usage = Usage::of(ct.and_then(|v| v.to_str().ok()));
                    TokenBody::watched(body, h, usage)
                }
            };
            Ok(Response::from_parts(parts, body))
        })
    }
}
