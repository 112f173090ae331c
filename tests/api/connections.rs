//! Every connection has a deadline and a bound: bodies that never end, gRPC connections that
//! send nothing or open no stream, the streams of one gRPC connection. Spoken to in raw bytes,
//! as an attacker would, on real ports.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::*;

/// Reads until the server closes the connection, for at most `within`; what it sent.
async fn answer_then_close(what: &str, s: &mut TcpStream, within: Duration) -> String {
    let mut answer = Vec::new();
    let read = tokio::time::timeout(within, s.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer).into_owned();
    assert!(
        read.is_ok(),
        "{what}: still open after {within:?}, answer: {text}"
    );
    text
}

/// A chunked body that never ends gets 408 at the deadline on a route that reads it, and its
/// connection is closed; on a route that takes no body, or one refused before its body is read,
/// the answer comes at once and the connection is closed too (actix-http alone drains a chunked
/// body for as long as it lasts). Meanwhile `/healthz` answers.
#[tokio::test]
async fn chunked_bodies_that_never_end_are_cut_off_on_every_route() {
    let app = spawn_with(|s| s.server.request_timeout_ms = quotad::config::DurationMs(1_000)).await;
    let addr = app.base.trim_start_matches("http://").to_owned();
    let chunked = |line: &str| {
        format!(
            "{line}\r\nHost: q\r\nContent-Type: application/json\r\n\
             Transfer-Encoding: chunked\r\n\r\na\r\n{{\"tenant\":\r\n"
        )
    };
    let started = Instant::now();
    let mut checks = Vec::new();
    for _ in 0..50 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(chunked("POST /v1/check HTTP/1.1").as_bytes())
            .await
            .unwrap();
        checks.push(s);
    }
    let mut others = Vec::new();
    for line in [
        "GET /healthz HTTP/1.1",
        "POST /v1/no-such-route HTTP/1.1",
        "PUT /v1/quotas/acme HTTP/1.1", // no admin token: refused before the body
    ] {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(chunked(line).as_bytes()).await.unwrap();
        others.push((line, s));
    }
    let t = Instant::now();
    let r = app.http.get(app.url("/healthz")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        t.elapsed() < Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    for (line, mut s) in others {
        let answer = answer_then_close(line, &mut s, Duration::from_secs(5)).await;
        assert!(answer.starts_with("HTTP/1.1 "), "{line}: {answer}");
        assert!(!answer.starts_with("HTTP/1.1 408"), "{line}: {answer}");
    }
    for mut s in checks {
        let answer = answer_then_close("check", &mut s, Duration::from_secs(10)).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("\"code\":\"request_timeout\""), "{answer}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the last 408 came after {:?}",
        started.elapsed()
    );
}

/// A chunked body that does end is read whole, and its connection is kept for the next request.
#[tokio::test]
async fn chunked_bodies_that_end_are_answered_and_the_connection_kept() {
    let app = spawn_app().await;
    let quota = serde_json::json!({"limits": [{"id": "m", "max": 10, "period": "minute"}]});
    assert!(app.put_quota("acme", quota).await.status().is_success());
    let addr = app.base.trim_start_matches("http://").to_owned();
    let mut s = TcpStream::connect(&addr).await.unwrap();
    let body = r#"{"tenant":"acme","client":"k"}"#;
    let req = format!(
        "POST /v1/check HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n\
         GET /healthz HTTP/1.1\r\nHost: q\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let answer = answer_then_close("two requests", &mut s, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(answer.matches("HTTP/1.1 200").count(), 2, "{answer}");
}

/// The client's first bytes of HTTP/2: the connection preface.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// An empty SETTINGS frame (length 0, type 4, no flags, stream 0).
const EMPTY_SETTINGS: &[u8] = &[0, 0, 0, 4, 0, 0, 0, 0, 0];

/// gRPC connections that send nothing, half a preface, or a preface and no stream are closed
/// once silent for `grpc.idle_timeout_ms`, and no sooner than most of it.
#[tokio::test]
async fn grpc_connections_that_stay_silent_are_closed_at_the_idle_timeout() {
    let app = spawn_with(|s| {
        s.server.grpc_bind = Some("127.0.0.1:0".into());
        s.server.request_timeout_ms = quotad::config::DurationMs(500);
        s.grpc.idle_timeout_ms = quotad::config::DurationMs(1_500);
    })
    .await;
    let addr = format!("127.0.0.1:{}", app.grpc_port.unwrap());
    let preface_and_settings = [PREFACE, EMPTY_SETTINGS].concat();
    let sends: [(&str, &[u8]); 3] = [
        ("nothing", b""),
        ("half a preface", &PREFACE[..10]),
        ("a preface and no stream", &preface_and_settings),
    ];
    let mut silent = Vec::new();
    for (what, bytes) in sends {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(bytes).await.unwrap();
        silent.push((what, s));
    }
    let started = Instant::now();
    for (what, mut s) in silent {
        let mut sink = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(6), s.read_to_end(&mut sink)).await;
        assert!(read.is_ok(), "{what}: still open after 6 s");
        assert!(
            started.elapsed() >= Duration::from_millis(1_000),
            "{what}: closed after {:?}",
            started.elapsed()
        );
    }
}

/// The server's first SETTINGS frame advertises `SETTINGS_MAX_CONCURRENT_STREAMS` of 100.
#[tokio::test]
async fn the_grpc_server_advertises_its_stream_limit() {
    let app = spawn_with(|s| s.server.grpc_bind = Some("127.0.0.1:0".into())).await;
    let mut s = TcpStream::connect(("127.0.0.1", app.grpc_port.unwrap()))
        .await
        .unwrap();
    s.write_all(&[PREFACE, EMPTY_SETTINGS].concat())
        .await
        .unwrap();
    let mut head = [0u8; 9];
    s.read_exact(&mut head).await.unwrap();
    assert_eq!(head[3], 4, "the first frame is SETTINGS: {head:?}");
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).await.unwrap();
    let settings: Vec<(u16, u32)> = payload
        .chunks(6)
        .map(|c| {
            (
                u16::from_be_bytes([c[0], c[1]]),
                u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
            )
        })
        .collect();
    assert!(
        settings.contains(&(3, quotad::grpc::conn::MAX_STREAMS_PER_CONNECTION)),
        "{settings:?}"
    );
    assert_eq!(quotad::grpc::conn::MAX_STREAMS_PER_CONNECTION, 100);
}

/// At most `grpc.max_connections` gRPC connections are open at once: one past it is closed as
/// soon as it is accepted, and a place freed is taken again.
#[tokio::test]
async fn grpc_connections_past_the_cap_are_closed_at_once() {
    let app = spawn_with(|s| {
        s.server.grpc_bind = Some("127.0.0.1:0".into());
        s.grpc.max_connections = 2;
    })
    .await;
    let addr = format!("127.0.0.1:{}", app.grpc_port.unwrap());
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        s.write_all(&[PREFACE, EMPTY_SETTINGS].concat())
            .await
            .unwrap();
        let mut head = [0u8; 9];
        s.read_exact(&mut head).await.unwrap();
        assert_eq!(head[3], 4, "admitted: the server's SETTINGS");
        open.push(s);
    }
    let mut third = TcpStream::connect(&addr).await.unwrap();
    let answer = answer_then_close("the third", &mut third, Duration::from_secs(2)).await;
    assert!(answer.is_empty(), "{answer}");
    drop(open.pop());
    eventually("a freed place is taken again", || {
        let addr = addr.clone();
        async move {
            let mut s = TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
            s.write_all(&[PREFACE, EMPTY_SETTINGS].concat())
                .await
                .map_err(|e| e.to_string())?;
            let mut head = [0u8; 9];
            s.read_exact(&mut head).await.map_err(|e| e.to_string())?;
            Ok(())
        }
    })
    .await;
}

/// A peer that pipelines checks and reads no answer gets no more of them read once its answers
/// back up: quotad stops reading the connection, and closes it once the peer has taken no byte
/// for `server.request_timeout_ms`. Without the bound, actix-http reads and parses on, and the
/// connection stays open for as long as the peer keeps it.
#[tokio::test]
async fn pipelined_requests_whose_answers_are_not_read_are_read_no_further_and_cut_off() {
    let app = spawn_with(|s| s.server.request_timeout_ms = quotad::config::DurationMs(1_000)).await;
    let quota = serde_json::json!({"limits": [{"id": "m", "max": 1_000_000, "period": "hour"}]});
    assert!(app.put_quota("acme", quota).await.status().is_success());
    let addr = app.base.trim_start_matches("http://").parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let s = socket.connect(addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let body = r#"{"tenant":"acme","client":"piper"}"#;
    let one = format!(
        "POST /v1/check HTTP/1.1\r\nHost: q\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    const SENT: usize = 100_000;
    let all = one.repeat(SENT);
    // Writes as much as the connection takes; once quotad stops reading, that is all.
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(all.as_bytes()).await;
        wr
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut answers = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buf = vec![0u8; 65536];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answers.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    writer.abort();
    let answered = String::from_utf8_lossy(&answers)
        .matches("HTTP/1.1 200")
        .count();
    assert!(
        read.is_ok(),
        "the connection was still open after the peer read nothing for 4 s ({answered} answers)"
    );
    let r = app
        .check(serde_json::json!({"tenant": "acme", "client": "piper"}))
        .await;
    let counted = 1_000_000
        - 1
        - r.json::<serde_json::Value>().await.unwrap()["remaining"]
            .as_u64()
            .unwrap() as usize;
    // What was answered before quotad stopped reading sits in the kernel's buffers (at most
    // `net.ipv4.tcp_wmem`'s 4 MiB): a few thousand answers.
    assert!(
        counted < SENT / 5,
        "{counted} of {SENT} pipelined checks were counted with no answer read"
    );
    assert!(
        counted >= answered,
        "{answered} answered, {counted} counted"
    );
}
