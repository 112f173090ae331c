//! Idempotency keys: a request sent again with the same `Idempotency-Key` is answered from the
//! first one's record instead of being done twice, on any instance.
//!
//! A key is claimed before the work (insert-if-absent, so of two instances racing with one key
//! only one goes ahead), its response recorded after, and both live for a fixed time (a day).
//! The claim holds a fingerprint of the request (method, path, body): the same key with another
//! request is refused rather than answered with the wrong record.

use std::time::Duration;

use async_trait::async_trait;

use super::StoreResult;

/// How long a key is remembered.
pub const IDEMPOTENCY_TTL: Duration = Duration::from_secs(86_400);

/// What the store knows of a key someone claimed already.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remembered {
    pub fingerprint: String,
    /// The first request's response body; None while it is still being done (or if it ended
    /// without a known outcome).
    pub response: Option<String>,
}

/// The outcome of a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begun {
    /// The key was free and is now this request's.
    Claimed,
    /// Someone claimed it first.
    Seen(Remembered),
}

/// Idempotency keys in the store, each under a scope (the tenant).
#[async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Claims `key` with the request's fingerprint for `ttl`, unless it is claimed already.
    async fn begin_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        ttl: Duration,
    ) -> StoreResult<Begun>;

    /// Records the response of a key this request claimed.
    async fn finish_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        response: &str,
        ttl: Duration,
    ) -> StoreResult<()>;

    /// Frees a key this request claimed and did nothing with, so a retry can go ahead.
    async fn abandon_idempotent(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
    ) -> StoreResult<()>;
}
