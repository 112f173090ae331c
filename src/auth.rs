//! Who a request is: bearer tokens checked against what the configuration keeps of them, and
//! what each principal may do. Tokens are never stored, logged or exported. The single tokens
//! (and deprecated `sha256` entries) are kept as SHA-256 digests, compared with every digest in
//! constant time, so the time an answer takes does not tell which matched. Salted `hash`
//! entries cost an argon2 run: a token that verified is remembered by its digest, so each
//! token pays that once per process, and an unknown one pays it only where its digest starts
//! as the salt does (`config::tokens`).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use actix_web::http::header;
use actix_web::HttpRequest;
use sha2::{Digest, Sha256};

use crate::config::tokens::TokenHash;
use crate::config::{Role, TokenSettings};

/// Bearer tokens, kept as SHA-256 digests and compared in constant time: the tokens themselves
/// are never stored, logged or exported.
pub struct Auth {
    tokens: Vec<TokenEntry>,
    /// Salted entries: the hash and who it is.
    hashed: Vec<(TokenHash, Principal)>,
    /// The digests of tokens that verified against `hashed`, with the entry's index. At most
    /// one token per entry can verify, so this holds no more than `hashed` does.
    verified: RwLock<HashMap<[u8; 32], usize>>,
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
/// Why a request's token does not let it through: no token or an unknown one, or one whose
/// role or tenants do not cover what it asks. Each entry point answers it in its protocol's
/// terms (401 and 403, UNAUTHENTICATED and PERMISSION_DENIED).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Unauthenticated(&'static str),
    #[error("{0}")]
    PermissionDenied(&'static str),
}

const FORBIDDEN: Refusal = Refusal::PermissionDenied("this token may not do that for this tenant");

impl Principal {
    fn covers(&self, tenant: &str) -> bool {
        self.tenants.as_ref().is_none_or(|t| t.contains(tenant))
    }

    /// May manage and read this tenant's quotas and usage.
    pub fn may_manage(&self, tenant: &str) -> Result<(), Refusal> {
        match self.role {
            Role::Admin => Ok(()),
            Role::TenantAdmin if self.covers(tenant) => Ok(()),
            _ => Err(FORBIDDEN),
        }
    }

    /// May run checks for this tenant.
    pub fn may_check(&self, tenant: &str) -> Result<(), Refusal> {
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
        let mut hashed = Vec::new();
        for t in tokens {
            let principal = |id: &str| Principal {
                role: t.role,
                name: if t.name.is_empty() {
                    format!("{}-{}", t.role.as_str(), id).into()
                } else {
                    t.name.as_str().into()
                },
                tenants: t
                    .tenants
                    .as_ref()
                    .map(|v| Arc::new(v.iter().cloned().collect())),
            };
            if !t.hash.is_empty() {
                // Refused by Settings::validate before we get here when it does not parse.
                if let Ok(h) = TokenHash::parse(&t.hash) {
                    let id = hex::encode(digest(&t.hash));
                    hashed.push((h, principal(&id[..8])));
                }
                continue;
            }
            let mut d = [0u8; 32];
            if hex::decode_to_slice(&t.sha256, &mut d).is_err() {
                continue; // refused by Settings::validate before we get here
            }
            entries.push(TokenEntry {
                digest: d,
                principal: principal(&t.sha256[..8]),
            });
        }
        let checks_open = !entries
            .iter()
            .map(|e| &e.principal)
            .chain(hashed.iter().map(|(_, p)| p))
            .any(|p| p.role == Role::Check);
        Self {
            tokens: entries,
            hashed,
            verified: RwLock::new(HashMap::new()),
            checks_open,
        }
    }

    /// The principal of the request's bearer token: 401 when missing or unknown.
    pub fn identify(&self, req: &HttpRequest) -> Result<Principal, Refusal> {
        let value = req
            .headers()
            .get(header::AUTHORIZATION)
            .ok_or(Refusal::Unauthenticated(
                "missing Authorization: Bearer token",
            ))?;
        let token = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Unauthenticated(
                "Authorization must be: Bearer <token>",
            ))?;
        self.principal_of(token)
    }

    /// The principal of a token: 401 when unknown.
    fn principal_of(&self, token: &str) -> Result<Principal, Refusal> {
        let got = digest(token);
        // Compare against every entry, so the time taken does not tell which one matched.
        let mut found = None;
        for e in &self.tokens {
            if same(&got, &e.digest) && found.is_none() {
                found = Some(&e.principal);
            }
        }
        if let Some(p) = found {
            return Ok(p.clone());
        }
        self.hashed_principal(token, &got)
            .ok_or(Refusal::Unauthenticated("invalid token"))
    }

    /// The salted entry this token verifies against: remembered, or one argon2 run for each
    /// entry whose salt starts as the token's digest does.
    fn hashed_principal(&self, token: &str, got: &[u8; 32]) -> Option<Principal> {
        if self.hashed.is_empty() {
            return None;
        }
        if let Some(&i) = self.verified.read().ok()?.get(got) {
            return Some(self.hashed[i].1.clone());
        }
        let i = self
            .hashed
            .iter()
            .position(|(h, _)| h.may_match(got) && h.verify(token))?;
        if let Ok(mut v) = self.verified.write() {
            v.insert(*got, i);
        }
        Some(self.hashed[i].1.clone())
    }

    /// For `/v1/forward-auth`: as [`Auth::checker`], with the token taken from `header` (the
    /// proxy's), as a bare token or `Bearer <token>`.
    pub fn checker_in(
        &self,
        req: &HttpRequest,
        header: &header::HeaderName,
    ) -> Result<Option<Principal>, Refusal> {
        let value = req
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim());
        self.checker_with(value)
    }

    /// As [`Auth::checker`], for a token found elsewhere (gRPC metadata, a proxy's header).
    pub fn checker_with(&self, token: Option<&str>) -> Result<Option<Principal>, Refusal> {
        if self.checks_open {
            return Ok(None);
        }
        let token = token
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Unauthenticated("missing check token"))?;
        self.principal_of(token).map(Some)
    }

    /// For the admin API: a token whose role may use it (check-only tokens get 403).
    pub fn admin(&self, req: &HttpRequest) -> Result<Principal, Refusal> {
        let p = self.identify(req)?;
        if p.role == Role::Check {
            return Err(Refusal::PermissionDenied(
                "this token may not use the admin API",
            ));
        }
        Ok(p)
    }

    /// For `/v1/check`: None when checks are open, else the caller (401 without a valid token).
    pub fn checker(&self, req: &HttpRequest) -> Result<Option<Principal>, Refusal> {
        if self.checks_open {
            return Ok(None);
        }
        self.identify(req).map(Some)
    }
}
