//! OpenTelemetry traces: a check's span reaches a real OTLP/HTTP endpoint (a receiver this test
//! starts on 127.0.0.1) as a child of the caller's `traceparent`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::helpers::*;

/// A bare OTLP/HTTP receiver: every POSTed body, as JSON. HTTP/1.1, keep-alive, Content-Length.
async fn receiver() -> (String, Arc<Mutex<Vec<Value>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                return;
            };
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0u8; length];
                    if conn.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    if let Ok(v) = serde_json::from_slice(&body) {
                        sink.lock().unwrap().push(v);
                    }
                    let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
                    if conn.get_mut().write_all(ok).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, got)
}

/// Every span received so far.
fn spans(got: &Mutex<Vec<Value>>) -> Vec<Value> {
    let mut out = Vec::new();
    for batch in got.lock().unwrap().iter() {
        for rs in batch["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    out
}

fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checks_span_reaches_the_otlp_endpoint_as_a_child_of_the_callers_traceparent() {
    let (url, got) = receiver().await;
    let app = spawn_with(|s| {
        s.traces.otlp_endpoint = Some(url.clone());
        // Unsampled new traces: only the caller's sampled trace is recorded.
        s.traces.sample_ratio = 0.0;
        s.traces.export_interval_ms = quotad::config::DurationMs(100);
    })
    .await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "per-minute", "max": 1, "window": "1m"}]}),
    )
    .await;
    let (trace_id, parent_id) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let traceparent = format!("00-{trace_id}-{parent_id}-01");
    for want in [200, 429] {
        let r = app
            .http
            .post(app.url("/v1/check"))
            .header("traceparent", &traceparent)
            .json(&json!({"tenant": "acme", "client": "k1"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), want);
    }
    // A check without a traceparent starts a trace of its own, unsampled at ratio 0.
    app.check(json!({"tenant": "acme", "client": "k2"})).await;
    let started = Instant::now();
    loop {
        let n = spans(&got).iter().filter(|s| s["name"] == "check").count();
        if n >= 2 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "spans received: {:?}",
            spans(&got)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let checks: Vec<Value> = spans(&got)
        .into_iter()
        .filter(|s| s["name"] == "check")
        .collect();
    assert_eq!(checks.len(), 2, "only the traced checks: {checks:?}");
    for s in &checks {
        assert_eq!(s["traceId"].as_str().unwrap().to_lowercase(), trace_id);
        assert_eq!(
            s["parentSpanId"].as_str().unwrap().to_lowercase(),
            parent_id
        );
        // Tenant ids stay in the process unless metrics.tenant_labels lets them out.
        assert!(attribute(s, "quotad.tenant").is_none(), "{s}");
    }
    let allowed: Vec<&Value> = checks
        .iter()
        .map(|s| &attribute(s, "quotad.allowed").unwrap()["boolValue"])
        .collect();
    assert!(allowed.contains(&&json!(true)) && allowed.contains(&&json!(false)));
    assert_eq!(
        attribute(&checks[0], "quotad.limit_id").unwrap()["stringValue"],
        "per-minute"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_rate_limit_calls_span_continues_the_traceparent_of_its_metadata() {
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    let (url, got) = receiver().await;
    let app = spawn_with(|s| {
        s.server.grpc_bind = Some("127.0.0.1:0".into());
        s.traces.otlp_endpoint = Some(url.clone());
        s.traces.export_interval_ms = quotad::config::DurationMs(100);
        // Every new trace recorded: the admin request and the sync rounds too.
        s.traces.sample_ratio = 1.0;
        // Tenant ids may leave the process: the span says the tenant too.
        s.metrics.tenant_labels = true;
    })
    .await;
    app.put_quota(
        "acme",
        json!({"limits": [{"id": "per-minute", "max": 5, "window": "1m"}]}),
    )
    .await;
    let mut c = crate::grpc::client(&app).await;
    let (trace_id, parent_id) = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331");
    let mut req = tonic::Request::new(RateLimitRequest {
        domain: "acme".into(),
        descriptors: vec![crate::grpc::descriptor(&[("client", "k1")])],
        hits_addend: 0,
    });
    req.metadata_mut().insert(
        "traceparent",
        format!("00-{trace_id}-{parent_id}-01").parse().unwrap(),
    );
    c.should_rate_limit(req).await.unwrap();
    let started = Instant::now();
    let span = loop {
        if let Some(s) = spans(&got)
            .into_iter()
            .find(|s| s["name"] == "should_rate_limit")
        {
            break s;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no span");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(span["traceId"].as_str().unwrap().to_lowercase(), trace_id);
    assert_eq!(
        span["parentSpanId"].as_str().unwrap().to_lowercase(),
        parent_id
    );
    assert_eq!(
        attribute(&span, "quotad.allowed").unwrap()["boolValue"],
        true
    );
    assert_eq!(
        attribute(&span, "quotad.tenant").unwrap()["stringValue"],
        "acme"
    );
    // The admin request that put the policy, by its route template and status.
    let all = spans(&got);
    let admin = all
        .iter()
        .find(|s| s["name"] == "admin")
        .expect("an admin span");
    assert_eq!(
        attribute(admin, "http.route").unwrap()["stringValue"],
        "/v1/quotas/{tenant}"
    );
    let status = &attribute(admin, "http.response.status_code").unwrap()["intValue"];
    // OTLP JSON writes a 64-bit integer as a string or a number.
    assert!(status == &json!("201") || status == &json!(201), "{status}");
    // A sync round, its store write a child of it.
    let started = Instant::now();
    loop {
        let all = spans(&got);
        let child_of_a_round = all.iter().any(|w| {
            w["name"] == "sync.write"
                && all.iter().any(|r| {
                    r["name"] == "sync_round"
                        && r["spanId"] == w["parentSpanId"]
                        && r["traceId"] == w["traceId"]
                })
        });
        if child_of_a_round {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no sync spans");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
