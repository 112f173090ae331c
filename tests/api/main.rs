//! HTTP tests: the real server on a real port (127.0.0.1:0), spoken to over HTTP.

mod access;
mod checks;
mod errors;
mod helpers;
mod lifecycle;
mod memory;
mod openapi;
mod outage;
mod quotas;
