//! The one way a check is decided, whoever asks: `POST /v1/check`, its batch, forward-auth and
//! Envoy's rate limit service all hand a [`Check`] (or several) to the [`CheckService`], which
//! resolves the policy, decides, and records the metrics and the trace. The entry points only
//! read their protocol's input and write its answer; none of them calls the limiter.
//!
//! A check decided in memory (the common case) takes the policy lent from the cache and never
//! builds the future that may wait for the store; only a check that must wait holds a policy of
//! its own.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use crate::domain::{ClientId, Policy, TenantId};
use crate::limiter::{Binding, CheckInput, Decision, Limiter, AHEAD};
use crate::metrics::Metrics;
use crate::policy::PolicyCache;
use crate::traces::Traces;

/// One check, as every entry point reads it: validated ids, the resource (normalised where it
/// is a request's path), the cost.
#[derive(Debug)]
pub struct Check<'a> {
    pub tenant: TenantId,
    pub client: ClientId,
    pub resource: Option<Cow<'a, str>>,
    pub cost: u64,
}

impl Check<'_> {
    /// The check as one that takes a hold: in-flight limits apply to it.
    pub fn input_reserving(&self) -> CheckInput<'_> {
        CheckInput {
            reserve: true,
            ..self.input()
        }
    }

    fn input(&self) -> CheckInput<'_> {
        CheckInput {
            tenant: &self.tenant,
            client: &self.client,
            resource: self.resource.as_deref(),
            cost: self.cost,
            reserve: false,
        }
    }
}

/// One item of a batch, decided.
pub enum Outcome {
    Decided(Decision),
    /// The tenant has no quota (and there is no default).
    NoQuota,
    /// The caller may not check for this tenant, and why; nothing was decided.
    NotAllowed(crate::auth::Refusal),
}

/// A client's check over several resources at once (Envoy's descriptors): the decision, the
/// policy it was decided under, and what each resource's own limits have left (None for a
/// resource no limit matches). `each` is empty while the store fails: the decision's binding
/// stands for every resource then, rather than a peek decided by the failure rule again.
pub struct Several {
    pub decision: Decision,
    pub policy: Arc<Policy>,
    pub each: Vec<Option<Binding>>,
}

/// The check service: what every entry point shares to decide.
pub struct CheckService {
    limiter: Arc<Limiter>,
    policies: Arc<PolicyCache>,
    metrics: Arc<Metrics>,
    traces: Option<Arc<Traces>>,
}

impl CheckService {
    pub fn new(
        limiter: Arc<Limiter>,
        policies: Arc<PolicyCache>,
        metrics: Arc<Metrics>,
        traces: Option<Arc<Traces>>,
    ) -> Self {
        Self {
            limiter,
            policies,
            metrics,
            traces,
        }
    }

    /// The traces, for an entry point's own span around more than one check (gRPC).
    pub fn traces(&self) -> Option<&Arc<Traces>> {
        self.traces.as_ref()
    }

    /// Decides one check; None when the tenant has no quota. With traces on, a `check` span in
    /// the caller's trace, whose W3C `traceparent` and `tracestate` `header` reads (called only
    /// then).
    pub async fn decide<'h>(
        &self,
        c: &Check<'_>,
        header: impl Fn(&str) -> Option<&'h str>,
    ) -> Option<Decision> {
        self.traced(c, header, self.decide_untraced(c), |d| d).await
    }

    /// Decides a check that takes a hold (in-flight limits apply), as [`CheckService::decide`]
    /// does; with the decision, the policy it was decided under and its instant, for the hold.
    pub async fn decide_reserving<'h>(
        &self,
        c: &Check<'_>,
        header: impl Fn(&str) -> Option<&'h str>,
    ) -> Option<(Decision, Arc<Policy>, i64)> {
        self.traced(c, header, self.decide_reserving_untraced(c), |d| &d.0)
            .await
    }

    /// Runs `decided` inside a `check` span of the caller's trace, when traces are on.
    async fn traced<'h, T>(
        &self,
        c: &Check<'_>,
        header: impl Fn(&str) -> Option<&'h str>,
        decided: impl std::future::Future<Output = Option<T>>,
        decision: impl Fn(&T) -> &Decision,
    ) -> Option<T> {
        let Some(t) = &self.traces else {
            return decided.await;
        };
        let span = t.start_span("check", header("traceparent"), header("tracestate"));
        let d = decided.await;
        t.end_check(span, c.tenant.as_str(), d.as_ref().map(decision));
        d
    }

    async fn decide_reserving_untraced(
        &self,
        c: &Check<'_>,
    ) -> Option<(Decision, Arc<Policy>, i64)> {
        let started = Instant::now();
        let policy = self
            .policies
            .resolve(c.tenant.as_str(), c.client.as_str())?;
        let now = self.limiter.clock().now_ms();
        let input = c.input_reserving();
        let d = match self.limiter.check_now_at(&policy, input, now) {
            Ok(d) => d,
            Err(miss) => Box::pin(self.limiter.check_missed(&policy, input, miss)).await,
        };
        self.metrics.check_decided(
            c.tenant.as_str(),
            d.label(),
            started.elapsed().as_secs_f64(),
        );
        Some((d, policy, now))
    }

    async fn decide_untraced(&self, c: &Check<'_>) -> Option<Decision> {
        let started = Instant::now();
        let now = self.limiter.clock().now_ms();
        let input = c.input();
        // Decided in memory under the lent policy when it can be; only a check that must wait
        // for the store holds a policy of its own.
        let in_memory = self
            .policies
            .with(c.tenant.as_str(), c.client.as_str(), |policy| {
                self.limiter
                    .check_now_at(policy, input, now)
                    .map_err(|miss| (policy.clone(), miss))
            })?;
        let d = match in_memory {
            Ok(d) => d,
            Err((policy, miss)) => Box::pin(self.limiter.check_missed(&policy, input, miss)).await,
        };
        self.metrics.check_decided(
            c.tenant.as_str(),
            d.label(),
            started.elapsed().as_secs_f64(),
        );
        Some(d)
    }

    /// Decides a batch in order, each check as if sent alone, at one instant and under the
    /// policies in force when it began (one snapshot), the metrics summed over it. `allowed`
    /// says whether the caller may check for an item's tenant, or why not.
    pub async fn decide_batch(
        &self,
        checks: &[Check<'_>],
        allowed: impl Fn(&Check<'_>) -> Result<(), crate::auth::Refusal>,
    ) -> Vec<Outcome> {
        let policies = self.policies.view();
        let mut metrics = self.metrics.batch_checks();
        let mut out = Vec::with_capacity(checks.len());
        // One read of the system clock for them all; an item's duration runs from the end of
        // the one before (one read of the monotonic clock per item).
        let now = self.limiter.clock().now_ms();
        let mut started = Instant::now();
        for (i, c) in checks.iter().enumerate() {
            if i % AHEAD == 0 {
                let next = checks[i..].iter().take(AHEAD);
                self.limiter
                    .bring_in(next.map(|c| (c.tenant.as_str(), c.client.as_str())));
            }
            if let Err(refusal) = allowed(c) {
                out.push(Outcome::NotAllowed(refusal));
                started = Instant::now();
                continue;
            }
            let Some(policy) = policies.resolve(c.tenant.as_str(), c.client.as_str()) else {
                out.push(Outcome::NoQuota);
                started = Instant::now();
                continue;
            };
            let input = c.input();
            let d = match self.limiter.check_now_at(policy, input, now) {
                Ok(d) => d,
                Err(miss) => Box::pin(self.limiter.check_missed(policy, input, miss)).await,
            };
            let done = Instant::now();
            metrics.check_decided(
                c.tenant.as_str(),
                d.label(),
                done.duration_since(started).as_secs_f64(),
            );
            started = done;
            out.push(Outcome::Decided(d));
        }
        out
    }

    /// Decides one check of `client` over several resources at once: all or nothing, over
    /// every limit any of them meets, at `cost`. None when the tenant has no quota.
    pub async fn decide_several(
        &self,
        tenant: &TenantId,
        client: &ClientId,
        cost: u64,
        resources: &[Option<&str>],
    ) -> Option<Several> {
        self.several(tenant, client, cost, resources, false).await
    }

    /// Charges `cost` of work done to every limit any of `resources` meets, whatever they have
    /// left (no check is decided or counted), and says what each has left after it. None when
    /// the tenant has no quota.
    pub async fn charge_several(
        &self,
        tenant: &TenantId,
        client: &ClientId,
        cost: u64,
        resources: &[Option<&str>],
    ) -> Option<Several> {
        self.several(tenant, client, cost, resources, true).await
    }

    async fn several(
        &self,
        tenant: &TenantId,
        client: &ClientId,
        cost: u64,
        resources: &[Option<&str>],
        charge: bool,
    ) -> Option<Several> {
        let policy = self.policies.resolve(tenant.as_str(), client.as_str())?;
        let input = CheckInput {
            tenant,
            client,
            resource: None,
            cost,
            reserve: false,
        };
        let decision = if charge {
            self.limiter.charge_any(&policy, input, resources).await
        } else {
            let started = Instant::now();
            let d = self.limiter.check_any(&policy, input, resources).await;
            self.metrics
                .check_decided(tenant.as_str(), d.label(), started.elapsed().as_secs_f64());
            d
        };
        let mut each = Vec::new();
        if decision.store_failure.is_none() {
            each.reserve(resources.len());
            for r in resources {
                let peek = self
                    .limiter
                    .peek(
                        &policy,
                        CheckInput {
                            resource: *r,
                            ..input
                        },
                    )
                    .await;
                each.push(peek.binding);
            }
        }
        Some(Several {
            decision,
            policy,
            each,
        })
    }
}

/// Milliseconds as whole seconds, rounded up (the RateLimit-Reset and Retry-After unit).
pub fn ceil_secs(ms: i64) -> i64 {
    (ms.max(0) + 999) / 1000
}
