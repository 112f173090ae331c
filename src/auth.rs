//! Who a request is: bearer tokens checked against what the configuration keeps of them, and
//! what each principal may do. Tokens are never stored, logged or exported.
//!
//! Every token is looked up by its tag: HMAC-SHA256, under a key drawn at start and never
//! kept anywhere else, of the token's SHA-256. The single tokens and the deprecated `sha256`
//! entries are tagged once at start; a salted `hash` entry once a token verified against it.
//! A caller cannot compute any tag, so neither the index's hashing nor its comparisons tell it
//! anything about a configured token, and a token that is not in the index is refused there,
//! as fast as any other.
//!
//! argon2 runs only for a token whose SHA-256 starts as an entry's salt does (one in 65,536:
//! `config::tokens`) and that is neither known nor already refused; never on a request's own
//! thread, but in a pool of [`HASH_RUNS_AT_ONCE`] blocking thread(s), which a request waits for
//! without holding its worker. Its outcome is remembered by tag, whether or not the request
//! still waits for it: a verified token is in the index from then on, a refused one in a
//! bounded set ([`Refused`]), so a token costs at most one argon2 run per process however
//! often it is sent. A caller who makes fresh salt-prefix tokens (65,536 SHA-256 each) gets
//! one run each, at most one core's worth at a time, and the service keeps its other cores.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use actix_web::http::header;
use actix_web::HttpRequest;
use arc_swap::ArcSwap;
use ring::hmac;
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::config::tokens::TokenHash;
use crate::config::{Role, TokenSettings};
use crate::metrics::Metrics;

/// argon2 runs at once, per process: a wrong token may cost quotad this many cores, no more,
/// whatever the machine (each run is tens of milliseconds and 19 MiB).
pub const HASH_RUNS_AT_ONCE: usize = 1;

/// Refused tokens remembered: two generations of this many tags each (32 bytes and a set
/// slot: a few MiB at most). An attacker who fills them has paid an argon2 run per token, at
/// the pool's pace, so forgetting the oldest generation then costs little.
const REFUSED_PER_GENERATION: usize = 32_768;

/// A token's keyed tag: what the index and the refused set are keyed by.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Tag([u8; 32]);

/// Bearer tokens, kept as keyed tags of their SHA-256 (and salted hashes): the tokens
/// themselves are never stored, logged or exported.
pub struct Auth {
    /// The per-process HMAC key the tags are made with.
    key: hmac::Key,
    /// The single tokens and `sha256` entries, by tag; fixed at start.
    fixed: HashMap<Tag, Principal>,
    /// Salted entries: the hash and who it is.
    hashed: Arc<[(TokenHash, Principal)]>,
    /// What argon2 runs found, shared with the pool's threads, which write it.
    learned: Arc<Learned>,
    /// The pool's permits: [`HASH_RUNS_AT_ONCE`].
    runs: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    /// No check token is configured: `/v1/check` needs none.
    checks_open: bool,
}

/// What argon2 runs found out, by tag: tokens that verified (with their entry's index) and
/// tokens that did not.
struct Learned {
    /// Read on every request with a salted entry's token, written once per such token: a
    /// snapshot swapped whole, so that readers take no lock. At most one token per entry can
    /// verify, so it holds no more than the entries.
    verified: ArcSwap<HashMap<Tag, usize>>,
    /// Touched only by tokens that would need an argon2 run (rare for real callers): a plain
    /// mutex, never held across an `.await`.
    refused: Mutex<Refused>,
}

impl Learned {
    fn verified(&self, tag: &Tag) -> Option<usize> {
        self.verified.load().get(tag).copied()
    }

    fn refused(&self, tag: &Tag) -> bool {
        self.refused.lock().is_ok_and(|r| r.contains(tag))
    }

    /// Keeps what one argon2 run of `tag` found.
    fn learn(&self, tag: Tag, entry: Option<usize>) {
        if let Some(i) = entry {
            self.verified.rcu(|v| {
                let mut v = HashMap::clone(v);
                v.insert(tag, i);
                v
            });
        } else if let Ok(mut r) = self.refused.lock() {
            r.insert(tag);
        }
    }
}

/// The tags of tokens argon2 refused, bounded: new tags go into the young generation; when it
/// is full it becomes the old one and the old one is forgotten. A tag is remembered for at
/// least [`REFUSED_PER_GENERATION`] refusals after its own.
#[derive(Default)]
struct Refused {
    young: HashSet<Tag>,
    old: HashSet<Tag>,
}

impl Refused {
    fn contains(&self, tag: &Tag) -> bool {
        self.young.contains(tag) || self.old.contains(tag)
    }

    fn insert(&mut self, tag: Tag) {
        if self.young.len() >= REFUSED_PER_GENERATION {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(tag);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }
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

const INVALID: Refusal = Refusal::Unauthenticated("invalid token");

impl Auth {
    /// `admin_token` and `check_token` are the contract's single tokens (empty = none);
    /// `tokens` the scoped ones, already validated by the configuration.
    pub fn new(
        admin_token: &str,
        check_token: &str,
        tokens: &[TokenSettings],
        metrics: Arc<Metrics>,
    ) -> Self {
        let mut key = [0u8; 32];
        rand::fill(&mut key);
        let key = hmac::Key::new(hmac::HMAC_SHA256, &key);
        let mut fixed = HashMap::new();
        let tag = |d: &[u8; 32]| tag_of(&key, d);
        let unscoped = |role, name: &str| Principal {
            role,
            name: name.into(),
            tenants: None,
        };
        if !admin_token.is_empty() {
            fixed.insert(
                tag(&digest(admin_token)),
                unscoped(Role::Admin, "admin_token"),
            );
        }
        if !check_token.is_empty() {
            // The same token twice: the admin role, as the first match has always been.
            fixed
                .entry(tag(&digest(check_token)))
                .or_insert_with(|| unscoped(Role::Check, "check_token"));
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
            fixed
                .entry(tag(&d))
                .or_insert_with(|| principal(&t.sha256[..8]));
        }
        // From the settings, not the index: a check token equal to another keeps one entry.
        let checks_open = check_token.is_empty() && !tokens.iter().any(|t| t.role == Role::Check);
        Self {
            key,
            fixed,
            hashed: hashed.into(),
            learned: Arc::new(Learned {
                verified: ArcSwap::from_pointee(HashMap::new()),
                refused: Mutex::new(Refused::default()),
            }),
            runs: Arc::new(Semaphore::new(HASH_RUNS_AT_ONCE)),
            metrics,
            checks_open,
        }
    }

    /// The principal of the request's bearer token: 401 when missing or unknown.
    pub async fn identify(&self, req: &HttpRequest) -> Result<Principal, Refusal> {
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
        self.principal_of(token).await
    }

    /// The principal of a token: 401 when unknown. Without an await for every token but the
    /// first sending of one that needs an argon2 run.
    async fn principal_of(&self, token: &str) -> Result<Principal, Refusal> {
        let sha = digest(token);
        let tag = tag_of(&self.key, &sha);
        if let Some(p) = self.fixed.get(&tag) {
            return Ok(p.clone());
        }
        if let Some(i) = self.learned.verified(&tag) {
            return Ok(self.hashed[i].1.clone());
        }
        let candidates: Vec<usize> = (0..self.hashed.len())
            .filter(|&i| self.hashed[i].0.may_match(&sha))
            .collect();
        if candidates.is_empty() || self.learned.refused(&tag) {
            return Err(INVALID);
        }
        self.run_argon2(token, tag, candidates).await
    }

    /// One argon2 run of `token` against the `candidates` entries, in the pool: waits for a
    /// permit (another request may have settled this token meanwhile), then runs on a blocking
    /// thread, which keeps the outcome even if this request has gone.
    async fn run_argon2(
        &self,
        token: &str,
        tag: Tag,
        candidates: Vec<usize>,
    ) -> Result<Principal, Refusal> {
        let permit = self
            .runs
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| INVALID)?;
        if let Some(i) = self.learned.verified(&tag) {
            return Ok(self.hashed[i].1.clone());
        }
        if self.learned.refused(&tag) {
            return Err(INVALID);
        }
        let (hashed, learned, metrics) = (
            self.hashed.clone(),
            self.learned.clone(),
            self.metrics.clone(),
        );
        let token = token.to_owned();
        let found = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let found = candidates.into_iter().find(|&i| hashed[i].0.verify(&token));
            metrics.token_hash_run(found.is_some());
            learned.learn(tag, found);
            found
        })
        .await
        .map_err(|_| INVALID)?;
        found.map(|i| self.hashed[i].1.clone()).ok_or(INVALID)
    }

    /// For `/v1/forward-auth`: as [`Auth::checker`], with the token taken from `header` (the
    /// proxy's), as a bare token or `Bearer <token>`.
    pub async fn checker_in(
        &self,
        req: &HttpRequest,
        header: &header::HeaderName,
    ) -> Result<Option<Principal>, Refusal> {
        let value = req
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.strip_prefix("Bearer ").unwrap_or(v).trim());
        self.checker_with(value).await
    }

    /// As [`Auth::checker`], for a token found elsewhere (gRPC metadata, a proxy's header).
    pub async fn checker_with(&self, token: Option<&str>) -> Result<Option<Principal>, Refusal> {
        if self.checks_open {
            return Ok(None);
        }
        let token = token
            .filter(|t| !t.is_empty())
            .ok_or(Refusal::Unauthenticated("missing check token"))?;
        self.principal_of(token).await.map(Some)
    }

    /// For the admin API: a token whose role may use it (check-only tokens get 403).
    pub async fn admin(&self, req: &HttpRequest) -> Result<Principal, Refusal> {
        let p = self.identify(req).await?;
        if p.role == Role::Check {
            return Err(Refusal::PermissionDenied(
                "this token may not use the admin API",
            ));
        }
        Ok(p)
    }

    /// For `/v1/check`: None when checks are open, else the caller (401 without a valid token).
    pub async fn checker(&self, req: &HttpRequest) -> Result<Option<Principal>, Refusal> {
        if self.checks_open {
            return Ok(None);
        }
        self.identify(req).await.map(Some)
    }
}

/// A token's tag, from its SHA-256.
fn tag_of(key: &hmac::Key, sha: &[u8; 32]) -> Tag {
    let mut t = [0u8; 32];
    t.copy_from_slice(hmac::sign(key, sha).as_ref());
    Tag(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tokens;

    const ADMIN: &str = "5f0c2a9e8b7d6c5f4a3b2c1d0e9f8a7b";
    const CHECK: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
    const SCOPED: &str = "Xk3pQ9vLm2Rt7wYz4Bn8Cd5Fg";

    fn hashed(name: &str, secret: &str, role: Role) -> TokenSettings {
        TokenSettings {
            name: name.into(),
            hash: tokens::hash(secret),
            sha256: String::new(),
            role,
            tenants: None,
        }
    }

    /// A wrong token whose SHA-256 starts as `secret`'s does, as a salted entry's salt does:
    /// the one kind of wrong token that needs an argon2 run to refuse.
    fn salt_prefix_token(secret: &str, nth: usize) -> String {
        let want = digest(secret);
        (0u64..)
            .map(|i| format!("wrong-{i}"))
            .filter(|t| digest(t)[..2] == want[..2] && t != secret)
            .nth(nth)
            .expect("one in 65,536 matches")
    }

    #[tokio::test]
    async fn tokens_are_found_by_their_tag_and_others_refused() {
        let metrics = Arc::new(Metrics::new(false));
        let sha = TokenSettings {
            name: "legacy".into(),
            hash: String::new(),
            sha256: hex::encode(digest(SCOPED)),
            role: Role::TenantAdmin,
            tenants: Some(vec!["acme".into()]),
        };
        let auth = Auth::new(ADMIN, CHECK, &[sha], metrics.clone());
        assert_eq!(auth.principal_of(ADMIN).await.unwrap().role, Role::Admin);
        assert_eq!(auth.principal_of(CHECK).await.unwrap().role, Role::Check);
        let p = auth.principal_of(SCOPED).await.unwrap();
        assert_eq!((p.role, &*p.name), (Role::TenantAdmin, "legacy"));
        for wrong in ["", "x", &ADMIN[1..], &format!("{ADMIN}0")] {
            assert_eq!(auth.principal_of(wrong).await.unwrap_err(), INVALID);
        }
        assert_eq!(metrics.token_hash_runs(), (0, 0));
    }

    #[tokio::test]
    async fn the_same_token_as_admin_and_check_is_admin_and_checks_stay_closed() {
        let auth = Auth::new(ADMIN, ADMIN, &[], Arc::new(Metrics::new(false)));
        assert_eq!(auth.principal_of(ADMIN).await.unwrap().role, Role::Admin);
        assert!(!auth.checks_open);
    }

    #[tokio::test]
    async fn a_salted_token_costs_one_argon2_run_and_a_wrong_one_at_most_one() {
        let metrics = Arc::new(Metrics::new(false));
        let auth = Auth::new(
            ADMIN,
            "",
            &[hashed("ops", SCOPED, Role::Check)],
            metrics.clone(),
        );
        assert!(!auth.checks_open);
        for _ in 0..3 {
            let p = auth.principal_of(SCOPED).await.unwrap();
            assert_eq!(&*p.name, "ops");
        }
        assert_eq!(
            metrics.token_hash_runs(),
            (1, 0),
            "verified once, then known"
        );

        // Random wrong tokens never reach argon2; one whose digest starts as the salt does
        // costs one run, and every resend is refused from memory.
        for i in 0..50 {
            let t = format!("random-{i}");
            if digest(&t)[..2] != digest(SCOPED)[..2] {
                assert_eq!(auth.principal_of(&t).await.unwrap_err(), INVALID);
            }
        }
        assert_eq!(metrics.token_hash_runs(), (1, 0));
        let wrong = salt_prefix_token(SCOPED, 0);
        for _ in 0..5 {
            assert_eq!(auth.principal_of(&wrong).await.unwrap_err(), INVALID);
        }
        assert_eq!(metrics.token_hash_runs(), (1, 1));
        // Eight at once, as over eight connections: still one run for a new one.
        let wrong = salt_prefix_token(SCOPED, 1);
        let all = futures::future::join_all((0..8).map(|_| auth.principal_of(&wrong))).await;
        assert!(all.iter().all(|r| r.as_ref().unwrap_err() == &INVALID));
        assert_eq!(metrics.token_hash_runs(), (1, 2));
    }

    #[tokio::test]
    async fn a_run_whose_request_went_away_is_remembered_all_the_same() {
        let metrics = Arc::new(Metrics::new(false));
        let auth = Auth::new(
            "",
            "",
            &[hashed("ops", SCOPED, Role::Check)],
            metrics.clone(),
        );
        let wrong = salt_prefix_token(SCOPED, 0);
        // Polled until the run has started on its blocking thread, then dropped.
        {
            let fut = auth.principal_of(&wrong);
            let _ = tokio::time::timeout(std::time::Duration::from_millis(1), fut).await;
        }
        // The permit comes back when the run ends; by then its outcome is kept.
        drop(auth.runs.clone().acquire_owned().await.unwrap());
        assert_eq!(auth.principal_of(&wrong).await.unwrap_err(), INVALID);
        assert_eq!(metrics.token_hash_runs(), (0, 1));
    }

    #[test]
    fn refused_tags_are_bounded_and_the_newest_kept() {
        let mut r = Refused::default();
        let tag = |i: u32| {
            let mut t = [0u8; 32];
            t[..4].copy_from_slice(&i.to_le_bytes());
            Tag(t)
        };
        let n = 3 * REFUSED_PER_GENERATION as u32;
        for i in 0..n {
            r.insert(tag(i));
        }
        assert!(r.len() <= 2 * REFUSED_PER_GENERATION, "{}", r.len());
        assert!(r.contains(&tag(n - 1)));
        assert!(r.contains(&tag(n - REFUSED_PER_GENERATION as u32)));
        assert!(!r.contains(&tag(0)));
    }
}
