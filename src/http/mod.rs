//! The HTTP API (actix-web). Handlers parse input into domain types at the edge and hand them to
//! the check service (`crate::checks`), the limiter or the store; every error is an
//! [`ApiError`]. Tokens and principals are `crate::auth`'s.
//!
//! One module a job: `state` (what handlers share), `middleware` (before routing), `body`
//! (reading and parsing JSON bodies), `params` (query and path parameters), `responses` (the
//! error answers the document names), `error`, `routes` (the route table), `check` and
//! `forward_auth` (checks), `reservations` (settling and releasing what a check reserved), `quotas`, `usage`, `adjust` (reset and grant), `history`, `audit`,
//! `whoami`, `console` and `ops` (the handlers, each beside the types it answers with),
//! `idempotency` (`Idempotency-Key`), `server` and `conn` (the listener, and the gate on
//! each connection's reads), and `openapi` (the document, which only names handlers
//! and their types).

mod adjust;
mod audit;
mod body;
mod check;
mod conn;
mod console;
pub mod error;
mod forward_auth;
mod history;
mod idempotency;
mod middleware;
mod openapi;
mod ops;
mod params;
mod quotas;
mod reservations;
mod responses;
mod routes;
pub mod server;
mod state;
mod usage;
mod whoami;

pub use crate::auth::{digest, Auth, Principal, Refusal};
pub use audit::{audit_entry, AuditView};
pub use body::{body_deadline, json_body, parse_json, MAX_BODY};
pub use error::ApiError;
pub use middleware::{admin_span, header_bytes, limit_header_bytes, request_id, RequestId};
pub use routes::{query_config, routes, Route, ROUTES};
pub use state::AppState;
pub use state::ForwardAuth;
