//! OpenTelemetry traces, off unless `traces.otlp_endpoint` is set.
//!
//! Each instance has its own tracer provider (no process-wide global), exporting in batches
//! over OTLP/HTTP (JSON) from a thread of its own, so the check path only records a span and
//! hands it over. A check's span continues the caller's trace when the request carries a W3C
//! `traceparent` (HTTP header or gRPC metadata); sampling is parent-based, and for new traces a
//! ratio (`traces.sample_ratio`). Its attributes are the decision and the binding limit, and the
//! tenant only where tenant ids may leave the process (`metrics.tenant_labels`, the rule that
//! keeps them out of metric labels). With traces off, a check pays one branch on an `Option`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{
    Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;

use crate::config::TracesSettings;
use crate::limiter::Decision;

/// This instance's tracer, or nothing when traces are off.
pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    tenant_attributes: bool,
}

/// A span under way; [`Traces::end_check`] ends it.
pub struct CheckSpan(opentelemetry_sdk::trace::Span);

impl Traces {
    /// The exporter and its provider, when an endpoint is set.
    pub fn start(s: &TracesSettings, tenant_attributes: bool) -> Result<Option<Traces>, String> {
        let Some(endpoint) = &s.otlp_endpoint else {
            return Ok(None);
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(endpoint.clone())
            .with_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("traces.otlp_endpoint: {e}"))?;
        let batches = BatchConfigBuilder::default()
            .with_scheduled_delay(s.export_interval_ms.get())
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batches)
            .build();
        let ratio = s.sample_ratio.clamp(0.0, 1.0);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                ratio,
            ))))
            .with_resource(Resource::builder().with_service_name("quotad").build())
            .build();
        let tracer = provider.tracer("quotad");
        Ok(Some(Traces {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
            tenant_attributes,
        }))
    }

    /// Starts a server span named `name` in the caller's trace, read from `traceparent` (and
    /// `tracestate`) if given.
    pub fn start_span(
        &self,
        name: &'static str,
        traceparent: Option<&str>,
        tracestate: Option<&str>,
    ) -> CheckSpan {
        let mut carrier = HashMap::new();
        if let Some(t) = traceparent {
            carrier.insert("traceparent".to_owned(), t.to_owned());
        }
        if let Some(t) = tracestate {
            carrier.insert("tracestate".to_owned(), t.to_owned());
        }
        let parent: Context = self.propagator.extract(&carrier);
        let span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_start_time(SystemTime::now())
            .start_with_context(&self.tracer, &parent);
        CheckSpan(span)
    }

    /// Ends a check's span with its decision (and its tenant, where allowed).
    pub fn end_check(&self, mut span: CheckSpan, tenant: &str, d: Option<&Decision>) {
        let s = &mut span.0;
        if s.is_recording() {
            match d {
                Some(d) => {
                    s.set_attribute(KeyValue::new("quotad.allowed", d.allowed));
                    if let Some(b) = &d.binding {
                        s.set_attribute(KeyValue::new("quotad.limit_id", b.limit_id.to_string()));
                        s.set_attribute(KeyValue::new("quotad.remaining", b.remaining as i64));
                    }
                    if let Some(rule) = d.store_failure {
                        s.set_attribute(KeyValue::new("quotad.store_failure", rule.as_str()));
                    }
                }
                None => s.set_status(Status::error("no quota for the tenant")),
            }
        }
        self.end_with_tenant(span, tenant);
    }

    /// Ends a span of a call that decided (`Some(allowed)`) or failed (`None`).
    pub fn end_call(&self, mut span: CheckSpan, tenant: &str, allowed: Option<bool>) {
        let s = &mut span.0;
        if s.is_recording() {
            match allowed {
                Some(a) => s.set_attribute(KeyValue::new("quotad.allowed", a)),
                None => s.set_status(Status::error("refused")),
            }
        }
        self.end_with_tenant(span, tenant);
    }

    /// Ends a check's or a call's span, naming its tenant where tenant ids may leave.
    fn end_with_tenant(&self, mut span: CheckSpan, tenant: &str) {
        let s = &mut span.0;
        if self.tenant_attributes && s.is_recording() {
            s.set_attribute(KeyValue::new("quotad.tenant", tenant.to_owned()));
        }
        s.end();
    }

    /// Ends an admin request's span with its method, route template and status (None: it
    /// failed before an answer).
    pub fn end_admin(&self, mut span: CheckSpan, method: &str, route: &str, status: Option<u16>) {
        let s = &mut span.0;
        if s.is_recording() {
            s.set_attribute(KeyValue::new("http.request.method", method.to_owned()));
            s.set_attribute(KeyValue::new("http.route", route.to_owned()));
            match status {
                Some(code) => {
                    s.set_attribute(KeyValue::new("http.response.status_code", code as i64));
                    if code >= 500 {
                        s.set_status(Status::error("server error"));
                    }
                }
                None => s.set_status(Status::error("no answer")),
            }
        }
        s.end();
    }

    /// A span in `parent`'s trace (a store call of a sync round, say).
    pub fn child(&self, parent: &CheckSpan, name: &'static str) -> CheckSpan {
        let cx = Context::new().with_remote_span_context(parent.0.span_context().clone());
        CheckSpan(
            self.tracer
                .span_builder(name)
                .with_kind(SpanKind::Internal)
                .start_with_context(&self.tracer, &cx),
        )
    }

    /// Ends a sync round's span or one of its store calls: `count` what it wrote or read,
    /// `error` why it failed.
    pub fn end_store(&self, mut span: CheckSpan, count: Option<u64>, error: Option<String>) {
        let s = &mut span.0;
        if s.is_recording() {
            if let Some(n) = count {
                s.set_attribute(KeyValue::new("quotad.count", n as i64));
            }
            if let Some(e) = error {
                s.set_status(Status::error(e));
            }
        }
        s.end();
    }

    /// Exports what is left; at shutdown.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "traces: the last spans could not be exported");
        }
    }
}
