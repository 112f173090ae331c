//! HTTP tests: the real server on a real port (127.0.0.1:0), spoken to over HTTP.

mod access;
mod answers;
mod apply;
mod checks;
mod conformance;
mod console;
mod console_a11y;
mod deploy;
mod errors;
mod fuzz;
mod grpc;
mod headers;
mod helpers;
mod history;
mod lifecycle;
mod memory;
mod openapi;
mod outage;
mod proxy;
mod quotas;
mod reset;
mod routing;
mod secrets;
mod tls;
mod tokens;
mod traces;
