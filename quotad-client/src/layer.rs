//! [`QuotaLayer`]: a tower layer that asks quotad before each request (see the crate's README).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{header, HeaderValue, Request, Response, StatusCode};
use tower_layer::Layer;
use tower_service::Service;

use crate::{Check, Client, Error};

/// What to do with a request when quotad cannot be reached (no connection, or no answer within
/// the client's deadline), as quotad's own `on_store_failure` says for its store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unreachable {
    /// Let the request through, without rate headers.
    Allow,
    /// Answer 503 with `Retry-After: 1`.
    Deny,
}

/// Which check a request is: its tenant, client, resource and cost, or None to let it through
/// unasked (a health route, say).
type Key<B> = Arc<dyn Fn(&Request<B>) -> Option<Check> + Send + Sync>;

/// Asks quotad for each request; see the crate's documentation.
pub struct QuotaLayer<B> {
    client: Client,
    key: Key<B>,
    unreachable: Unreachable,
}

impl<B> Clone for QuotaLayer<B> {
    fn clone(&self) -> Self {
        QuotaLayer {
            client: self.client.clone(),
            key: self.key.clone(),
            unreachable: self.unreachable,
        }
    }
}

impl<B> QuotaLayer<B> {
    /// `key` names each request's check; when quotad cannot be reached, `unreachable` decides.
    pub fn new(
        client: Client,
        unreachable: Unreachable,
        key: impl Fn(&Request<B>) -> Option<Check> + Send + Sync + 'static,
    ) -> Self {
        QuotaLayer {
            client,
            key: Arc::new(key),
            unreachable,
        }
    }
}

impl<S, B> Layer<S> for QuotaLayer<B> {
    type Service = QuotaService<S, B>;

    fn layer(&self, inner: S) -> Self::Service {
        QuotaService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`QuotaLayer`] wraps around another.
pub struct QuotaService<S, B> {
    inner: S,
    layer: QuotaLayer<B>,
}

impl<S: Clone, B> Clone for QuotaService<S, B> {
    fn clone(&self) -> Self {
        QuotaService {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, B, RB> Service<Request<B>> for QuotaService<S, B>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
    RB: From<String> + Send + 'static,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<RB>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The inner service polled ready is the one to call; a clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let check = (self.layer.key)(&req);
        let client = self.layer.client.clone();
        let unreachable = self.layer.unreachable;
        Box::pin(async move {
            let Some(check) = check else {
                return inner.call(req).await;
            };
            match client.check(&check).await {
                Ok(answer) if answer.allowed() => {
                    let mut res = inner.call(req).await?;
                    res.headers_mut().extend(answer.headers);
                    Ok(res)
                }
                Ok(answer) => {
                    // Denied: quotad's own answer, headers and body, without the request.
                    let mut res = Response::new(RB::from(answer.body.to_string()));
                    *res.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                    let h = res.headers_mut();
                    h.extend(answer.headers);
                    h.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    Ok(res)
                }
                // quotad refused the check itself (an unknown tenant, a bad id): as unreachable.
                Err(Error::Unreachable(_)) | Err(Error::Refused { .. })
                    if unreachable == Unreachable::Allow =>
                {
                    inner.call(req).await
                }
                Err(e) => {
                    let body = serde_json::json!({"error": {"code": "unavailable",
                        "message": format!("the rate limiter could not decide: {e}")}});
                    let mut res = Response::new(RB::from(body.to_string()));
                    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                    let h = res.headers_mut();
                    h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                    h.insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    Ok(res)
                }
            }
        })
    }
}
