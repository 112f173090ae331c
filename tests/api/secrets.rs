//! No secret leaves quotad: the real binary, configured with every kind of secret it takes
//! (admin and check tokens, a scoped token's hash, a store password, a TLS key), is asked
//! everything a caller can ask with right, wrong and missing tokens, and none of those secrets
//! may then appear in its log (at trace level), its metrics, its traces or any answer.
//!
//! The grep is only worth something if it sees what it searches: each place is first shown to
//! hold something the test knows is there (the port in the log, an echoed request id in the
//! answers, a trace id in the exported spans, the actors' names in the audit log).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::grpc::descriptor;
use crate::helpers::EVENTUALLY;

/// 256 random bits as 64 hex digits: well over the 128 bits quotad asks of a token.
fn random_hex() -> String {
    format!(
        "{:032x}{:032x}",
        rand::random::<u128>(),
        rand::random::<u128>()
    )
}

/// The base64 lines of a PEM file (its armour left out).
fn pem_body(pem: &str) -> Vec<&str> {
    pem.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("-----") && !l.is_empty())
        .collect()
}

/// What must never be seen, each with the name a failure gives it: every token whole and its
/// first and last 16 characters (a truncated echo is still a leak), and the key file as its
/// lines and as 20-character pieces of its base64 body, one of which any quote of 40 or more
/// characters of it contains however it is wrapped. Pieces that the certificate also holds
/// (an EC key file carries its public key) are left out.
fn needles(tokens: &[(&str, &str)], key_pem: &str, cert_pem: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (name, t) in tokens {
        out.push((name.to_string(), t.to_string()));
        out.push((format!("{name} (first 16)"), t[..16].to_owned()));
        out.push((format!("{name} (last 16)"), t[t.len() - 16..].to_owned()));
    }
    let cert = pem_body(cert_pem).concat();
    let lines = pem_body(key_pem);
    for (i, l) in lines.iter().enumerate() {
        out.push((format!("key file line {}", i + 2), l.to_string()));
    }
    let body = lines.concat();
    for (i, piece) in body.as_bytes().chunks(20).enumerate() {
        let piece = std::str::from_utf8(piece).unwrap();
        if piece.len() == 20 && !cert.contains(piece) {
            out.push((format!("key body at {}", i * 20), piece.to_owned()));
        }
    }
    out
}

/// Every place a needle occurs in a haystack, with up to 150 characters of its line on each
/// side.
fn findings(needles: &[(String, String)], places: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (secret, needle) in needles {
        for (place, text) in places {
            for (at, _) in text.match_indices(needle.as_str()) {
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                let line_end = text[at..].find('\n').map_or(text.len(), |i| at + i);
                let before: String = text[line_start..at].chars().rev().take(150).collect();
                let before: String = before.chars().rev().collect();
                let after: String = text[at..line_end]
                    .chars()
                    .take(needle.len() + 150)
                    .collect();
                found.push(format!("{secret} in {place}: ...{before}{after}..."));
            }
        }
    }
    found
}

/// A bare OTLP/HTTP receiver keeping every POSTed body as text (as in traces.rs).
async fn receiver() -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    let got: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = got.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let sink = sink.clone();
            tokio::spawn(async move {
                let mut conn = tokio::io::BufReader::new(conn);
                loop {
                    let (mut length, mut line) = (0usize, String::new());
                    loop {
                        line.clear();
                        if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let l = line.trim_end().to_ascii_lowercase();
                        if l.is_empty() {
                            break;
                        }
                        if let Some(v) = l.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0u8; length];
                    if conn.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    sink.lock()
                        .unwrap()
                        .push(String::from_utf8_lossy(&body).into_owned());
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

/// The quotad process; killed if the test ends before it was stopped.
struct Quotad(Child);

impl Drop for Quotad {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Which port a log line announces: (is the gRPC port, port).
fn announced(line: &str) -> Option<(bool, u16)> {
    let grpc = line.contains("Envoy rate limit service");
    if !grpc && !line.contains("quotad listening") {
        return None;
    }
    let at = line.find("port=")? + 5;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((grpc, digits.parse().ok()?))
}

/// Copies a stream of the child into `log`, reporting the ports it announces.
fn drain(
    stream: impl Read + Send + 'static,
    log: Arc<Mutex<String>>,
    ports: mpsc::Sender<(bool, u16)>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            if let Some(p) = announced(&line) {
                let _ = ports.send(p);
            }
            let mut log = log.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    })
}

/// Every answer the test was given, as status, header lines and body, by what was asked.
#[derive(Default)]
struct Answers(Vec<(String, String)>);

impl Answers {
    async fn keep(&mut self, what: &str, req: reqwest::RequestBuilder) -> (u16, String) {
        let r = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = r.status().as_u16();
        let mut text = format!("{status}\n");
        for (k, v) in r.headers() {
            text += &format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes()));
        }
        let body = r.text().await.unwrap();
        text += &format!("\n{body}");
        self.0.push((format!("the answer to {what}"), text));
        (status, body)
    }

    /// Asks and asserts the status.
    async fn expect(&mut self, want: u16, what: &str, req: reqwest::RequestBuilder) -> String {
        let (status, body) = self.keep(what, req).await;
        assert_eq!(status, want, "{what}: {body}");
        body
    }
}

/// A `ShouldRateLimit` call for tenant acme with this `authorization` (or none); its result,
/// kept whole (status, message, metadata).
async fn grpc_call(
    c: &mut RateLimitServiceClient<Channel>,
    answers: &mut Answers,
    what: &str,
    authorization: Option<String>,
) -> Result<i32, tonic::Code> {
    let mut req = tonic::Request::new(RateLimitRequest {
        domain: "acme".into(),
        descriptors: vec![descriptor(&[("client", "g1")])],
        hits_addend: 0,
    });
    if let Some(a) = authorization {
        req.metadata_mut()
            .insert("authorization", a.parse().unwrap());
    }
    let r = c.should_rate_limit(req).await;
    answers
        .0
        .push((format!("the gRPC answer to {what}"), format!("{r:?}")));
    r.map(|r| r.into_inner().overall_code).map_err(|s| s.code())
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn no_secret_reaches_a_log_a_metric_a_trace_or_an_answer() {
    let (admin, check, password, scoped, wrong) = (
        random_hex(),
        random_hex(),
        random_hex(),
        random_hex(),
        random_hex(),
    );
    let dir = tempfile::tempdir().unwrap();

    // A CA, and a certificate for 127.0.0.1 signed by it, its key in a file.
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "quotad secrets test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let key_pem = key.serialize_pem();
    let cert_file = write(dir.path(), "tls.crt", &cert.pem());
    let key_file = write(dir.path(), "tls.key", &key_pem);

    // The admin token and the store password from files (with the newline an editor leaves),
    // the check token inline, the scoped token as its hash in the file given to --config.
    let admin_file = write(dir.path(), "admin-token", &format!("{admin}\n"));
    let password_file = write(dir.path(), "store-password", &format!("{password}\n"));
    let config = write(
        dir.path(),
        "quotad.toml",
        &format!(
            "[[auth.tokens]]\nname = \"acme-admins\"\nhash = \"{}\"\nrole = \"tenant_admin\"\n\
             tenants = [\"acme\"]\n",
            quotad::config::tokens::hash(&scoped)
        ),
    );

    let rt = tokio::runtime::Runtime::new().unwrap();
    let (otlp, spans) = rt.block_on(receiver());
    let mut child = Command::new(env!("CARGO_BIN_EXE_quotad"))
        .arg("--config")
        .arg(&config)
        .arg("serve")
        .current_dir(dir.path())
        .env("QUOTAD__SERVER__BIND", "127.0.0.1:0")
        .env("QUOTAD__SERVER__GRPC_BIND", "127.0.0.1:0")
        .env("QUOTAD__SERVER__TLS__CERT_FILE", &cert_file)
        .env("QUOTAD__SERVER__TLS__KEY_FILE", &key_file)
        .env("QUOTAD__STORE__PATH", dir.path().join("data"))
        .env("QUOTAD__STORE__USERNAME", "quotad")
        .env("QUOTAD__STORE__PASSWORD_FILE", &password_file)
        .env("QUOTAD__AUTH__ADMIN_TOKEN_FILE", &admin_file)
        .env("QUOTAD__AUTH__CHECK_TOKEN", &check)
        // Every target at its most talkative: what quotad and its libraries (actix, h2,
        // rustls, hyper, opentelemetry) could ever write, written.
        .env("QUOTAD__LOG__LEVEL", "trace")
        .env("QUOTAD__TRACES__OTLP_ENDPOINT", &otlp)
        .env("QUOTAD__TRACES__SAMPLE_RATIO", "1")
        .env("QUOTAD__TRACES__EXPORT_INTERVAL_MS", "100ms")
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log: Arc<Mutex<String>> = Arc::default();
    let (tx, rx) = mpsc::channel();
    let readers = [
        drain(child.stdout.take().unwrap(), log.clone(), tx.clone()),
        drain(child.stderr.take().unwrap(), log.clone(), tx),
    ];
    let mut quotad = Quotad(child);

    let (mut http_port, mut grpc_port) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_port.is_none() || grpc_port.is_none() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((true, p)) => grpc_port = Some(p),
            Ok((false, p)) => http_port = Some(p),
            Err(_) => panic!(
                "quotad did not announce both ports; its log:\n{}",
                log.lock().unwrap()
            ),
        }
    }
    let (http_port, grpc_port) = (http_port.unwrap(), grpc_port.unwrap());

    let marker = random_hex();
    let trace_id = random_hex()[..32].to_owned();
    let trace_id = trace_id.as_str();
    let answers = rt.block_on(async {
        let base = format!("https://127.0.0.1:{http_port}");
        let url = |p: &str| format!("{base}{p}");
        let http = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(ca.pem().as_bytes()).unwrap())
            .build()
            .unwrap();
        let mut a = Answers::default();
        let policy = json!({"limits": [{"id": "per-minute", "max": 1, "window": "1m"}]});

        // The admin token: a policy, with an id the answer must echo (the grep's control).
        a.expect(
            201,
            "PUT /v1/quotas/acme with the admin token",
            http.put(url("/v1/quotas/acme"))
                .bearer_auth(&admin)
                .header("x-request-id", &marker)
                .json(&policy),
        )
        .await;

        // Checks: the check token admitted then denied, a wrong token and none refused.
        let body = json!({"tenant": "acme", "client": "k1"});
        let check_req = |t: Option<&str>| {
            let r = http.post(url("/v1/check")).json(&body);
            match t {
                Some(t) => r.bearer_auth(t),
                None => r,
            }
        };
        a.expect(200, "a check with the check token", check_req(Some(&check)))
            .await;
        a.expect(429, "a check over the limit", check_req(Some(&check)))
            .await;
        a.expect(401, "a check with a wrong token", check_req(Some(&wrong)))
            .await;
        a.expect(401, "a check without a token", check_req(None))
            .await;
        a.expect(
            401,
            "a batch with a wrong token",
            http.post(url("/v1/check/batch"))
                .bearer_auth(&wrong)
                .json(&json!({"checks": [body.clone()]})),
        )
        .await;

        // The admin API with the check token (a role that may not), a wrong token and none.
        let admin_routes = [
            ("GET", "/v1/quotas/acme"),
            ("PUT", "/v1/quotas/acme"),
            ("GET", "/v1/quotas"),
            ("GET", "/v1/audit"),
            ("GET", "/v1/whoami"),
        ];
        for (method, path) in admin_routes {
            let req = |t: Option<&str>| {
                let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
                let r = http.request(m, url(path)).json(&policy);
                match t {
                    Some(t) => r.bearer_auth(t),
                    None => r,
                }
            };
            let what = format!("{method} {path}");
            a.expect(
                403,
                &format!("{what} with the check token"),
                req(Some(&check)),
            )
            .await;
            a.expect(
                401,
                &format!("{what} with a wrong token"),
                req(Some(&wrong)),
            )
            .await;
            a.expect(401, &format!("{what} without a token"), req(None))
                .await;
        }

        // The scoped token: its tenant, another tenant, the list, who it is.
        a.expect(
            200,
            "PUT /v1/quotas/acme with the tenant_admin token",
            http.put(url("/v1/quotas/acme"))
                .bearer_auth(&scoped)
                .json(&json!({"limits": [{"id": "per-minute", "max": 2, "window": "1m"}]})),
        )
        .await;
        a.expect(
            200,
            "GET /v1/quotas/acme with the tenant_admin token",
            http.get(url("/v1/quotas/acme")).bearer_auth(&scoped),
        )
        .await;
        for method in ["GET", "PUT"] {
            let m = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
            a.expect(
                403,
                &format!("{method} /v1/quotas/globex with the tenant_admin token of acme"),
                http.request(m, url("/v1/quotas/globex"))
                    .bearer_auth(&scoped)
                    .json(&policy),
            )
            .await;
        }
        a.expect(
            200,
            "GET /v1/quotas with the tenant_admin token",
            http.get(url("/v1/quotas")).bearer_auth(&scoped),
        )
        .await;
        let who = a
            .expect(
                200,
                "GET /v1/whoami with the tenant_admin token",
                http.get(url("/v1/whoami")).bearer_auth(&scoped),
            )
            .await;
        assert!(who.contains("acme-admins"), "{who}");

        // Forward-auth: the check token in its own header, beside an end user's Authorization.
        let forward = |token: &str| {
            http.get(url("/v1/forward-auth"))
                .header("X-Quota-Tenant", "acme")
                .header("X-Quota-Client", "k2")
                .header("X-Quota-Token", token)
                .header("Authorization", format!("Bearer {wrong}"))
        };
        a.expect(200, "forward-auth with the check token", forward(&check))
            .await;
        a.expect(401, "forward-auth with a wrong token", forward(&wrong))
            .await;

        // gRPC over TLS: the check token, a wrong one, none.
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca.pem()))
            .domain_name("localhost");
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{grpc_port}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .expect("gRPC over TLS connects");
        let mut c = RateLimitServiceClient::new(channel);
        let bearer = |t: &str| Some(format!("Bearer {t}"));
        let what = "a gRPC call with the check token";
        let r = grpc_call(&mut c, &mut a, what, bearer(&check)).await;
        assert_eq!(r, Ok(Code::Ok as i32), "{what}");
        let what = "a gRPC call with a wrong token";
        let r = grpc_call(&mut c, &mut a, what, bearer(&wrong)).await;
        assert_eq!(r, Err(tonic::Code::Unauthenticated), "{what}");
        let r = grpc_call(&mut c, &mut a, "a gRPC call without a token", None).await;
        assert_eq!(r, Err(tonic::Code::Unauthenticated));

        // The audit log names each change's actor, never its token.
        let audit = a
            .expect(
                200,
                "GET /v1/audit with the admin token",
                http.get(url("/v1/audit")).bearer_auth(&admin),
            )
            .await;
        assert!(
            audit.contains("\"admin_token\"") && audit.contains("\"acme-admins\""),
            "the audit log names both actors: {audit}"
        );
        a.expect(
            200,
            "GET /v1/audit with the tenant_admin token",
            http.get(url("/v1/audit")).bearer_auth(&scoped),
        )
        .await;
        for path in ["/readyz", "/healthz"] {
            a.expect(200, &format!("GET {path}"), http.get(url(path)))
                .await;
        }

        // Last, an admin request in a trace of the test's own: once its span has been
        // exported, so have the spans of everything before it.
        let who = a
            .expect(
                200,
                "GET /v1/whoami with the admin token",
                http.get(url("/v1/whoami"))
                    .bearer_auth(&admin)
                    .header("traceparent", format!("00-{trace_id}-00f067aa0ba902b7-01")),
            )
            .await;
        assert!(who.contains("admin_token"), "{who}");
        let started = Instant::now();
        while !spans
            .lock()
            .unwrap()
            .iter()
            .any(|b| b.to_lowercase().contains(trace_id))
        {
            assert!(
                started.elapsed() < EVENTUALLY,
                "the last admin request's span was not exported; {} batches received",
                spans.lock().unwrap().len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let metrics = a
            .expect(200, "GET /metrics", http.get(url("/metrics")))
            .await;
        assert!(metrics.contains("quotad_checks_total"), "{metrics}");
        a
    });

    // SAFETY: kill(2) on the pid of our own child, not yet reaped; no memory is touched.
    let killed = unsafe { libc::kill(quotad.0.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(killed, 0, "SIGTERM sent");
    let status = quotad.0.wait().unwrap();
    for r in readers {
        r.join().unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(status.code(), Some(0), "exit 0 after draining; log:\n{log}");

    // Each place holds what the test knows is there: the grep below sees what it searches.
    assert!(log.contains(&format!("port={http_port}")), "{log}");
    assert!(
        log.contains(" TRACE ") && log.contains(" DEBUG "),
        "QUOTAD__LOG__LEVEL=trace logs trace and debug lines:\n{log}"
    );
    let mut places: Vec<(String, String)> = vec![("the log".into(), log)];
    places.extend(answers.0);
    assert!(
        places.iter().any(|(_, t)| t.contains(&marker)),
        "the echoed x-request-id is among the answers"
    );
    let batches = spans.lock().unwrap().clone();
    assert!(batches.iter().any(|b| b.contains("\"admin\"")));
    places.extend(
        batches
            .into_iter()
            .enumerate()
            .map(|(i, b)| (format!("exported trace batch {i}"), b)),
    );

    let tokens = [
        ("the admin token", admin.as_str()),
        ("the check token", check.as_str()),
        ("the store password", password.as_str()),
        ("the tenant_admin token", scoped.as_str()),
        ("the wrong token", wrong.as_str()),
    ];
    let needles = needles(&tokens, &key_pem, &cert.pem());
    // The grep itself catches a token and a piece of the key planted in a text.
    let planted = format!("x {check} y\n{}", pem_body(&key_pem)[0]);
    let caught = findings(&needles, &[("a planted text".into(), planted)]).join("\n");
    assert!(
        caught.contains("the check token in") && caught.contains("key file line 2 in"),
        "the grep misses a planted secret: {caught}"
    );
    let found = findings(&needles, &places);
    assert!(
        found.is_empty(),
        "{} secret(s) leaked:\n{}",
        found.len(),
        found.join("\n")
    );
}
