//! A client of [quotad](../README.md)'s HTTP API, and a [`tower`](https://docs.rs/tower) layer
//! that asks quotad before each request it lets through.
//!
//! - [`Client`]: typed calls of `POST /v1/check`, `POST /v1/check/batch` and
//!   `GET /v1/usage/{tenant}/{client}`, each with a deadline; and reservations: a check that
//!   holds an estimate ([`Client::reserve`]), settled at the real cost once the work is done
//!   ([`Client::settle`]) or released if it never happened ([`Client::release`]).
//! - [`QuotaLayer`]: for every request, closures say the tenant, the client and the resource;
//!   quotad decides. Admitted, the request goes on and its response carries quotad's
//!   `RateLimit-*` headers; denied, the layer answers 429 itself with quotad's headers
//!   (`Retry-After` among them) and body. When quotad cannot be reached within the deadline,
//!   [`Unreachable`] says what to do: let the request through, or answer 503.
//! - [`TokenBudgetLayer`]: the same in front of an OpenAI-compatible API, whose cost (tokens) is
//!   known only from the answer: each request reserves an estimate read from its body, and is
//!   settled at the answer's `usage.total_tokens`, streamed or not.

mod layer;
mod openai;
mod reservation;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use layer::{QuotaLayer, QuotaService, Unreachable};
pub use openai::{PromptEstimate, TokenBody, TokenBudgetLayer, TokenBudgetService};
pub use reservation::{Ended, Reservation, ReservationState, Reserved};

/// One check, as `POST /v1/check` takes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Check {
    pub tenant: String,
    pub client: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// How much the request costs (1 when absent).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<u64>,
}

impl Check {
    pub fn new(tenant: impl Into<String>, client: impl Into<String>) -> Self {
        Check {
            tenant: tenant.into(),
            client: client.into(),
            ..Check::default()
        }
    }

    pub fn resource(mut self, resource: impl Into<String>) -> Self {
        self.resource = Some(resource.into());
        self
    }

    pub fn cost(mut self, cost: u64) -> Self {
        self.cost = Some(cost);
        self
    }
}

/// quotad's answer to a check: the decision, its headers and its body.
#[derive(Clone, Debug)]
pub struct Answer {
    /// 200 admitted, 429 denied (a `dry_run` policy admits and says `dry_run_denied`).
    pub status: http::StatusCode,
    /// The rate headers quotad sent: `RateLimit-*`, `X-RateLimit-*` and, on a denial,
    /// `Retry-After`, for the caller's own answer.
    pub headers: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The decision as JSON (`allowed`, `limit_id`, `remaining`, `retry_after_ms`, ...).
    pub body: serde_json::Value,
}

impl Answer {
    pub fn allowed(&self) -> bool {
        self.status == http::StatusCode::OK
    }
}

/// What went wrong asking quotad.
#[derive(Debug)]
pub enum Error {
    /// No answer within the deadline, or no connection.
    Unreachable(String),
    /// quotad answered with an error of its own (`{"error": {"code", "message", "field"}}`).
    Refused {
        status: http::StatusCode,
        body: serde_json::Value,
    },
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Unreachable(m) => write!(f, "quotad unreachable: {m}"),
            Error::Refused { status, body } => write!(f, "quotad answered {status}: {body}"),
        }
    }
}

impl std::error::Error for Error {}

/// The rate headers of quotad's answers, the ones a caller passes on.
const RATE_HEADERS: [&str; 7] = [
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
];

/// A check's answer as read: status, rate headers, body.
type Decision = (
    http::StatusCode,
    Vec<(http::HeaderName, http::HeaderValue)>,
    serde_json::Value,
);

/// A client of one quotad (or a load balancer in front of a fleet).
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
    deadline: Duration,
}

impl Client {
    /// quotad at `base` (`http://quotad:8080`), with a deadline of 250 ms a call.
    pub fn new(base: impl Into<String>) -> Self {
        Client {
            base: base.into().trim_end_matches('/').to_owned(),
            token: None,
            http: reqwest::Client::new(),
            deadline: Duration::from_millis(250),
        }
    }

    /// The bearer token: a check token for checks, an admin or tenant_admin one for usage.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// How long a call may take before it counts as unreachable.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(self.deadline);
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn send(&self, r: reqwest::RequestBuilder) -> Result<reqwest::Response, Error> {
        r.send()
            .await
            .map_err(|e| Error::Unreachable(e.to_string()))
    }

    /// `POST /v1/check`: 200 and 429 are answers; anything else is an error.
    pub async fn check(&self, check: &Check) -> Result<Answer, Error> {
        let res = self
            .send(self.request(reqwest::Method::POST, "/v1/check").json(check))
            .await?;
        let (status, headers, body) = Self::decision(res).await?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// A check's answer: its status, rate headers and body when 200 or 429, else an error.
    async fn decision(res: reqwest::Response) -> Result<Decision, Error> {
        let status = res.status();
        let headers = res
            .headers()
            .iter()
            .filter(|(n, _)| RATE_HEADERS.contains(&n.as_str()))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        let body: serde_json::Value = res
            .json()
            .await
            .map_err(|e| Error::Unreachable(e.to_string()))?;
        match status.as_u16() {
            200 | 429 => Ok((status, headers, body)),
            _ => Err(Error::Refused { status, body }),
        }
    }

    /// `POST /v1/check/batch`: one result a check, in order (`{"allowed": ...}` or
    /// `{"error": ...}`).
    pub async fn batch(&self, checks: &[Check]) -> Result<Vec<serde_json::Value>, Error> {
        #[derive(Serialize)]
        struct Batch<'a> {
            checks: &'a [Check],
        }
        #[derive(Deserialize)]
        struct Results {
            results: Vec<serde_json::Value>,
        }
        let res = self
            .send(
                self.request(reqwest::Method::POST, "/v1/check/batch")
                    .json(&Batch { checks }),
            )
            .await?;
        Self::json::<Results>(res).await.map(|r| r.results)
    }

    /// `GET /v1/usage/{tenant}/{client}?all=true`: every limit's count, consuming nothing.
    pub async fn usage(&self, tenant: &str, client: &str) -> Result<serde_json::Value, Error> {
        let path = format!("/v1/usage/{tenant}/{client}?all=true");
        let res = self.send(self.request(reqwest::Method::GET, &path)).await?;
        Self::json(res).await
    }

    async fn json<T: serde::de::DeserializeOwned>(res: reqwest::Response) -> Result<T, Error> {
        let status = res.status();
        if !status.is_success() {
            let body = res.json().await.unwrap_or(serde_json::Value::Null);
            return Err(Error::Refused { status, body });
        }
        res.json()
            .await
            .map_err(|e| Error::Unreachable(e.to_string()))
    }
}
