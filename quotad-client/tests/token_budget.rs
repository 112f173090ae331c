//! [`quotad_client::TokenBudgetLayer`] in front of a reverse proxy to a fake OpenAI-compatible
//! upstream, against a real quotad: what is reserved, what is settled, and what a budget and an
//! in-flight limit let through.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};
use support::*;

fn tokens_per_minute(max: u64) -> Value {
    json!({"limits": [{"id": "tokens-per-minute", "max": max, "window": "1m"}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn estimates_too_high_and_too_low_both_end_at_the_real_usage() {
    let (base, _dir) = quotad(tokens_per_minute(100_000)).await;
    let (up, seen) = upstream().await;
    let addr = app(&base, &up).await;
    let mut want = 0;
    // max_tokens 10 estimates 30, under the 300 answered; 5000 estimates 5020, over it; none
    // estimates the default 1000 + 20.
    for max_tokens in [Some(10), Some(5_000), None] {
        let mut body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        if let Some(m) = max_tokens {
            body["max_tokens"] = m.into();
        }
        let r = chat(addr, "k1", body).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert!(r.headers().contains_key("ratelimit-remaining"));
        let answer: Value = r.json().await.unwrap();
        // The answer goes on as the upstream gave it.
        assert_eq!(answer["usage"]["total_tokens"], JSON_TOTAL, "{answer}");
        assert_eq!(answer["choices"][0]["message"]["content"], "hello");
        want += JSON_TOTAL;
        let got = count_reaches(&base, "k1", "tokens-per-minute", want).await;
        assert_eq!(got, want, "after max_tokens {max_tokens:?}");
    }
    assert_eq!(seen.tokens.load(Ordering::SeqCst), want);
    // A request sent to the upstream as the caller wrote it: not a stream, nothing added.
    assert!(seen.last.lock().unwrap().get("stream_options").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_passes_through_as_it_comes_and_settles_from_its_last_event() {
    let (base, _dir) = quotad(tokens_per_minute(100_000)).await;
    let (up, seen) = upstream().await;
    let addr = app(&base, &up).await;
    let body = json!({"model": "gated", "stream": true, "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}]});
    let mut r = chat(addr, "k1", body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    // The first event arrives while the upstream waits at its gate: nothing is held back.
    let first = tokio::time::timeout(Duration::from_secs(5), r.chunk())
        .await
        .expect("the first event comes before the stream ends")
        .unwrap()
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("\"hel\""));
    // Meanwhile the estimate is held: 100 + 20.
    assert_eq!(count(&base, "k1", "tokens-per-minute").await, 120);
    seen.gate.notify_one();
    let mut rest = Vec::from(&first[..]);
    while let Some(c) = r.chunk().await.unwrap() {
        rest.extend_from_slice(&c);
    }
    let text = String::from_utf8(rest).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(text.contains(&format!("\"total_tokens\":{STREAM_TOTAL}")));
    // The layer asked for the usage, which the caller did not.
    assert_eq!(
        seen.last.lock().unwrap()["stream_options"],
        json!({"include_usage": true})
    );
    let got = count_reaches(&base, "k1", "tokens-per-minute", STREAM_TOTAL).await;
    assert_eq!(got, STREAM_TOTAL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_without_usage_and_a_stream_that_never_reports_settle_at_the_estimate() {
    let policy = json!({"limits": [
        {"id": "tokens-per-minute", "max": 100_000, "window": "1m"},
        {"id": "slots", "max": 4, "in_flight": "holds"}]});
    let (base, _dir) = quotad(policy).await;
    let (up, _seen) = upstream().await;
    let addr = app(&base, &up).await;
    let body = json!({"model": "no-usage", "max_tokens": 200});
    let r = chat(addr, "k1", body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let answer: Value = r.json().await.unwrap();
    assert!(answer.get("usage").is_none());
    assert_eq!(count_reaches(&base, "k1", "slots", 0).await, 0);
    assert_eq!(count(&base, "k1", "tokens-per-minute").await, 220);
    // A stream whose caller said not to include the usage: the estimate again.
    let body = json!({"model": "m", "stream": true, "max_tokens": 300,
        "stream_options": {"include_usage": false}});
    let text = chat(addr, "k1", body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.ends_with("data: [DONE]\n\n") && !text.contains("usage"));
    assert_eq!(count_reaches(&base, "k1", "slots", 0).await, 0);
    assert_eq!(count(&base, "k1", "tokens-per-minute").await, 220 + 320);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_drops_a_stream_midway_is_charged_the_estimate() {
    let policy = json!({"limits": [
        {"id": "tokens-per-minute", "max": 100_000, "window": "1m"},
        {"id": "slots", "max": 4, "in_flight": "holds"}]});
    let (base, _dir) = quotad(policy).await;
    let (up, seen) = upstream().await;
    let addr = app(&base, &up).await;
    let body = json!({"model": "gated", "stream": true, "max_tokens": 500});
    let mut r = chat(addr, "k1", body).send().await.unwrap();
    assert!(r.chunk().await.unwrap().is_some());
    assert_eq!(count(&base, "k1", "slots").await, 1);
    drop(r);
    // The upstream is still at its gate: the reservation ends because the caller left.
    assert_eq!(count_reaches(&base, "k1", "slots", 0).await, 0);
    assert_eq!(count(&base, "k1", "tokens-per-minute").await, 520);
    assert_eq!(seen.answered.load(Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_that_leaves_before_the_answer_is_charged_the_estimate() {
    let policy = json!({"limits": [
        {"id": "tokens-per-minute", "max": 100_000, "window": "1m"},
        {"id": "slots", "max": 4, "in_flight": "holds"}]});
    let (base, _dir) = quotad(policy).await;
    let (up, seen) = upstream().await;
    let addr = app(&base, &up).await;
    // The upstream waits at its gate (and would answer 500 after it, were it opened).
    let body = json!({"model": "gated-broken", "max_tokens": 700});
    let caller = tokio::spawn(chat(addr, "k1", body).send());
    for _ in 0..250 {
        if seen.now.load(Ordering::SeqCst) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.now.load(Ordering::SeqCst), 1, "the upstream has it");
    assert_eq!(count(&base, "k1", "slots").await, 1);
    // The caller goes away while the upstream works.
    caller.abort();
    assert!(caller.await.unwrap_err().is_cancelled());
    // Not released: the upstream may be doing the work. The slot comes back.
    assert_eq!(count_reaches(&base, "k1", "slots", 0).await, 0);
    assert_eq!(count(&base, "k1", "tokens-per-minute").await, 720);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_error_releases_the_hold() {
    let (base, _dir) = quotad(tokens_per_minute(100_000)).await;
    let (up, seen) = upstream().await;
    let addr = app(&base, &up).await;
    let body = json!({"model": "gated-broken", "max_tokens": 400});
    let sent = tokio::spawn(chat(addr, "k1", body).send());
    // Held while the upstream works on it...
    assert_eq!(
        count_reaches(&base, "k1", "tokens-per-minute", 420).await,
        420
    );
    seen.gate.notify_one();
    let r = sent.await.unwrap().unwrap();
    assert_eq!(r.status(), 500);
    let answer: Value = r.json().await.unwrap();
    assert_eq!(answer["error"]["type"], "server_error");
    // ...and given back once it failed.
    assert_eq!(count_reaches(&base, "k1", "tokens-per-minute", 0).await, 0);
}

/// The most the real tokens admitted may reach: quotad admits a reservation only while the
/// counts (real costs settled, estimates still held) plus its estimate stay within `max`, and
/// charges a settle above its estimate past `max` (docs/reservations.md). So once the last
/// reservation is admitted, what can still come on top of `max` is each open reservation's
/// real cost beyond its estimate: at most one per caller.
fn bound(max: u64, callers: u64, worst_under: u64) -> u64 {
    max + callers * worst_under
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_callers_keep_a_budget_within_their_under_estimates() {
    const BUDGET: u64 = 10_000;
    const CALLERS: u64 = 8;
    // Estimates of 100 + 20 (180 under the 300 answered) and 900 + 20 (600 over it).
    const SIZES: [u64; 2] = [100, 900];
    let (base, _dir) = quotad(tokens_per_minute(BUDGET)).await;
    let (up, seen) = upstream().await;
    seen.delay_ms.store(30, Ordering::SeqCst);
    let addr = app(&base, &up).await;
    let mut callers = Vec::new();
    for c in 0..CALLERS {
        callers.push(tokio::spawn(async move {
            let (mut admitted, mut denied_in_a_row, mut i) = (0u64, 0, c);
            // Until denied for half a second: what is held then is spent, not still in flight.
            while denied_in_a_row < 10 {
                let max_tokens = SIZES[(i % 2) as usize];
                i += 1;
                let body = json!({"model": "m", "max_tokens": max_tokens});
                let r = chat(addr, "shared", body).send().await.unwrap();
                match r.status().as_u16() {
                    200 => {
                        let answer: Value = r.json().await.unwrap();
                        admitted += answer["usage"]["total_tokens"].as_u64().unwrap();
                        denied_in_a_row = 0;
                    }
                    429 => {
                        denied_in_a_row += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    s => panic!("{s}"),
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for c in callers {
        admitted += c.await.unwrap();
    }
    let worst_under = JSON_TOTAL - (SIZES[0] + PROMPT);
    let most = bound(BUDGET, CALLERS, worst_under);
    assert_eq!(most, 11_440);
    assert!(
        admitted <= most,
        "{admitted} real tokens admitted, over {most}"
    );
    // The budget was used: the callers stopped because it was spent, not before.
    assert!(admitted > BUDGET - (SIZES[1] + PROMPT), "{admitted}");
    assert_eq!(admitted, seen.tokens.load(Ordering::SeqCst));
    // What quotad counts is what the upstream answered, every estimate settled.
    let got = count_reaches(&base, "shared", "tokens-per-minute", admitted).await;
    assert_eq!(got, admitted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_flight_limit_of_four_keeps_the_upstream_to_four_at_once() {
    const CALLERS: usize = 10;
    const EACH: usize = 2;
    let policy = json!({"limits": [
        {"id": "slots", "max": 4, "in_flight": "holds"},
        {"id": "tokens-per-minute", "max": 1_000_000, "window": "1m"}]});
    let (base, _dir) = quotad(policy).await;
    let (up, seen) = upstream().await;
    seen.delay_ms.store(150, Ordering::SeqCst);
    let addr = app(&base, &up).await;
    let mut callers = Vec::new();
    for _ in 0..CALLERS {
        // Each caller until EACH of its requests are answered, trying again after a 429.
        callers.push(tokio::spawn(async move {
            let (mut answered, mut denied) = (0, 0);
            while answered < EACH && denied < 500 {
                let r = chat(addr, "k1", json!({"model": "m", "max_tokens": 10}))
                    .send()
                    .await
                    .unwrap();
                let status = r.status().as_u16();
                let body: Value = r.json().await.unwrap();
                match status {
                    200 => answered += 1,
                    429 => {
                        assert_eq!(body["limit_id"], "slots", "{body}");
                        denied += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    s => panic!("{s} {body}"),
                }
            }
            (answered, denied)
        }));
    }
    let (mut answered, mut denied) = (0, 0);
    for c in callers {
        let (a, d) = c.await.unwrap();
        (answered, denied) = (answered + a, denied + d);
    }
    assert_eq!(answered, CALLERS * EACH, "{denied} denied");
    assert!(
        denied > 0,
        "ten callers at once, and none was refused a slot"
    );
    let peak = seen.peak.load(Ordering::SeqCst);
    assert!(
        (2..=4).contains(&peak),
        "{peak} requests at the upstream at once"
    );
    assert_eq!(
        seen.answered.load(Ordering::SeqCst),
        (CALLERS * EACH) as u64
    );
    assert_eq!(count_reaches(&base, "k1", "slots", 0).await, 0);
}
