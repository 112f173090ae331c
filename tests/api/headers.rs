//! Header fields over `server.max_header_bytes` get 431 in the contract's shape before routing,
//! auth or the body; exactly at the limit passes; actix's own fixed limits stand behind it.

use serde_json::Value;

use crate::helpers::*;

/// `name: value\r\n` of each field: what `server.max_header_bytes` counts.
fn field_bytes(fields: &[(String, String)]) -> usize {
    fields.iter().map(|(n, v)| n.len() + v.len() + 4).sum()
}

/// Sends `GET path` with exactly these header fields (plus `Host` and `Connection: close`) on a
/// fresh connection, byte for byte as given; returns the status, the header fields (lower-case
/// names) and the body of the answer.
async fn raw_get(
    app: &TestApp,
    path: &str,
    fields: &[(String, String)],
) -> (u16, Vec<(String, String)>, Vec<u8>) {
    use std::io::{Read, Write};
    let addr = app.base.strip_prefix("http://").unwrap().to_owned();
    let mut head = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n");
    for (n, v) in fields {
        head.push_str(&format!("{n}: {v}\r\n"));
    }
    head.push_str("\r\n");
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).unwrap();
        let end = answer
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .expect("an answer head");
        let text = String::from_utf8(answer[..end].to_vec()).unwrap();
        let mut lines = text.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap();
        let headers = lines
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_ascii_lowercase(), v.trim().to_owned())
            })
            .collect();
        (status.parse().unwrap(), headers, answer[end + 4..].to_vec())
    })
    .await
    .unwrap()
}

/// Header fields that, with `raw_get`'s own `Host` and `Connection`, take exactly `total` bytes.
fn padded_to(total: usize) -> Vec<(String, String)> {
    let own = field_bytes(&[
        ("host".into(), "x".into()),
        ("connection".into(), "close".into()),
    ]);
    let pad = total - own - field_bytes(&[("x-pad".into(), String::new())]);
    vec![("x-pad".into(), "p".repeat(pad))]
}

fn assert_431_body(body: &[u8], limit: usize) {
    let b: Value = serde_json::from_slice(body).expect("a JSON error body");
    assert_eq!(b["error"]["code"], "request_header_fields_too_large", "{b}");
    let message = b["error"]["message"].as_str().unwrap();
    assert!(message.contains(&limit.to_string()), "{b}");
}

#[tokio::test]
async fn header_fields_over_max_header_bytes_get_431_and_exactly_at_it_pass() {
    let app = spawn_with(|s| s.server.max_header_bytes = 4096).await;

    let (status, _, _) = raw_get(&app, "/healthz", &padded_to(4096)).await;
    assert_eq!(status, 200, "exactly at the limit");
    let (status, headers, body) = raw_get(&app, "/healthz", &padded_to(4097)).await;
    assert_eq!(status, 431, "one byte over");
    assert!(
        headers
            .iter()
            .any(|(n, v)| n == "content-type" && v.starts_with("application/json")),
        "{headers:?}"
    );
    assert_431_body(&body, 4096);

    // The sum counts, not the largest field: 50 fields of 90 bytes each are 4500.
    let many: Vec<(String, String)> = (0..50)
        .map(|i| (format!("x-f{i:02}"), "v".repeat(81)))
        .collect();
    assert_eq!(field_bytes(&many), 4500);
    let (status, _, body) = raw_get(&app, "/healthz", &many).await;
    assert_eq!(status, 431);
    assert_431_body(&body, 4096);

    // Before routing and auth: an admin route without a token, an unknown path.
    for path in ["/v1/quotas", "/v1/nothing"] {
        let (status, _, body) = raw_get(&app, path, &padded_to(5000)).await;
        assert_eq!(status, 431, "{path}");
        assert_431_body(&body, 4096);
    }
}

#[tokio::test]
async fn the_default_header_limit_is_16_kib() {
    let app = spawn_app().await;
    let get = |pad: usize| {
        app.http
            .get(app.url("/healthz"))
            .header("x-pad", "p".repeat(pad))
            .send()
    };
    assert_eq!(get(15 * 1024).await.unwrap().status(), 200);
    let r = get(16 * 1024).await.unwrap();
    assert_error(r, 431, "request_header_fields_too_large").await;
}

/// What actix-http enforces by itself, before quotad sees the request (documented in docs/api.md
/// and at `server.max_header_bytes`): past 96 header fields a bare 431 with no body. A limit as
/// high as the configuration allows is reachable: a 120 KiB header block passes.
#[tokio::test]
async fn actix_limits_stand_behind_max_header_bytes() {
    let app =
        spawn_with(|s| s.server.max_header_bytes = quotad::config::HEADER_BYTES_CEILING).await;
    let (status, _, _) = raw_get(&app, "/healthz", &padded_to(120 * 1024)).await;
    assert_eq!(status, 200);

    let fields = |n: usize| -> Vec<(String, String)> {
        (0..n).map(|i| (format!("x-{i}"), "v".into())).collect()
    };
    // 94 of ours and raw_get's 2 are 96: still parsed.
    let (status, _, _) = raw_get(&app, "/healthz", &fields(94)).await;
    assert_eq!(status, 200);
    let (status, _, body) = raw_get(&app, "/healthz", &fields(95)).await;
    assert_eq!(status, 431);
    assert!(body.is_empty(), "{}", String::from_utf8_lossy(&body));
}
