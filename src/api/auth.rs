//! Who a request is: bearer tokens checked against SHA-256 digests, and what each principal may
//! do. Tokens are never stored, logged or exported, only their digests; a token is compared
//! with every digest in constant time, so the time an answer takes does not tell which matched.

use std::collections::HashSet;
use std::sync::Arc;

use actix_web::http::header;
use actix_web::HttpRequest;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use crate::config::{Role, TokenSettings};

/// Bearer tokens, kept as SHA-256 digests and compared in constant time: the tokens themselves
/// are never stored, logged or exported.
pub struct Auth {
    tokens: Vec<TokenEntry>,
    /// No check token is configured: `/v1/check` needs none.
    checks_open: bool,
}

struct TokenEntry {
    digest: [u8; 32],
    principal: Principal,
}

/// Who a request is, once its token matched.
#[derive(Clone, Debug)]
pub struct Principal {
    pub role: Role,
    /// The token's configured name (the audit log's actor): `admin_token` and `check_token`
    /// for the single tokens.
    pub name: Arc<str>,
    /// None: every tenant.
    tenants: Option<Arc<HashSet<String>>>,
}

/// What a principal that is not allowed gets. It says nothing about whether the tenant exists.
const FORBIDDEN: ApiError =
    ApiError::PermissionDenied("this token may not do that for this tenant");

impl Principal {
    fn covers(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|t| t.contains(tenant))
    }

    /// May manage and read this tenant's quotas and usage.
    pub fn may_manage(&self, tenant: &str) -> Result<(), ApiError> {
        match self.role {
            Role::Admin => Ok(()),
            Role::TenantAdmin if self.covers(tenant) => Ok(()),
            _ => Err(FORBIDDEN),
        }
    }

    /// May run checks for this tenant.
    pub fn may_check(&self, tenant: &str) -> Result<(), ApiError> {
        if self.covers(tenant) {
            Ok(())
        } else {
            Err(FORBIDDEN)
        }
    }

    /// Whether the quota list shows this tenant to this principal.
    pub fn sees(&self, tenant: &str) -> bool {
        self.may_manage(tenant).is_ok()
    }

    /// The tenants this principal is limited to, sorted; None: every tenant.
    pub fn tenants(&self) -> Option<Vec<&str>> {
        self.tenants.as_ref().map(|t| {
            let mut v: Vec<&str> = t.iter().map(String::as_str).collect();
            v.sort_unstable();
            v
        })
    }
}

/// A token's SHA-256: what `auth.tokens[].sha256` holds and `quotad hash-token` prints.
pub fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Constant-time equality of two digests.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Auth {
    /// `admin_token` and `check_token` are the contract's single tokens (empty = none);
    /// `tokens` the scoped ones, already validated by the configuration.
    pub fn new(admin_token: &str, check_token: &str, tokens: &[TokenSettings]) -> Self {
        let mut entries = Vec::new();
        let unscoped = |role, name: &str| Principal {
            role,
            name: name.into(),
            tenants: None,
        };
        if !admin_token.is_empty() {
            entries.push(TokenEntry {
                digest: digest(admin_token),
                principal: unscoped(Role::Admin, "admin_token"),
            });
        }
        if !check_token.is_empty() {
            entries.push(TokenEntry {
                digest: digest(check_token),
                principal: unscoped(Role::Check, "check_token"),
            });
        }
        for t in tokens {
            let mut d = [0u8; 32];
            if hex::decode_to_slice(&t.sha256, &mut d).is_err() {
                continue; // refused by Settings::validate before we get here
            }
            entries.push(TokenEntry {
                digest: d,
                principal: Principal {
                    role: t.role,
                    name: if t.name.is_empty() {
                        format!("{}-{}", t.role.as_str(), &t.sha256[..8]).into()
                    } else {
                        t.name.as_str().into()
                    },
                    tenants: t
                        .tenants
                        .as_ref()
                        .map(|v| Arc::new(v.iter().cloned().collect())),
                },
            });
        }
        let checks_open = !entries.iter().any(|e| e.principal.role == Role::Check);
        Self {
            tokens: entries,
            checks_open,
        }
    }

    /// The principal of the request's bearer token: 401 when missing or unknown.
    pub fn identify(&self, req: &HttpRequest) -> Result<Principal, ApiError> {
        let value = req
            .headers()
            .get(header::AUTHORIZATION)
            .ok_or(ApiError::Unauthenticated(
                "missing Authorization: Bearer token",
            ))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(ApiError::Unauthenticated(
                "Authorization must be: Bearer <token>",
            ))?;
        self.principal_of(token)
    }

    /// The principal of a token: 401 when unknown.
    fn principal_of(&self, token: &str) -> Result<Principal, ApiError> {
        let got = digest(token);
        // Compare against every entry, so the time taken does not tell which one matched.
        let mut found = None;
        for e in &self.tokens {
            if same(&got, &e.digest) && found.is_none() {
                found = Some(&e.principal);
            }
        }
        found
            .cloned()
            .ok_or(ApiError::Unauthenticated("invalid token"))
    }

    /// For `/v1/forward-auth`: as [`Auth::checker`], with the token taken from `header` (the
    /// proxy's), as a bare token or `Bearer <token>`.
    pub fn checker_in(
        &self,
        req: &HttpRequest,
        header: &header::HeaderName,
    ) -> Result<Option<Principal>, ApiError> {
        let value = req
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim());
        self.checker_with(value)
    }

    /// As [`Auth::checker`], for a token found elsewhere (gRPC metadata, a proxy's header).
    pub fn checker_with(&self, token: Option<&str>) -> Result<Option<Principal>, ApiError> {
        if self.checks_open {
            return Ok(None);
        }
        let token = token
            .filter(|t| !t.is_empty())
            .ok_or(ApiError::Unauthenticated("missing check token"))?;
        self.principal_of(token).map(Some)
    }

    /// For the admin API: a token whose role may use it (check-only tokens get 403).
    pub fn admin(&self, req: &HttpRequest) -> Result<Principal, ApiError> {
        let p = self.identify(req)?;
        if p.role == Role::Check {
            return Err(ApiError::PermissionDenied(
                "this token may not use the admin API",
            ));
        }
        Ok(p)
    }

    /// For `/v1/check`: None when checks are open, else the caller (401 without a valid token).
    pub fn checker(&self, req: &HttpRequest) -> Result<Option<Principal>, ApiError> {
        if self.checks_open {
            return Ok(None);
        }
        self.identify(req).map(Some)
    }
}
