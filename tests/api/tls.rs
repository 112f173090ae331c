//! TLS on quotad's ports (`[server.tls]`): HTTPS and gRPC over TLS with a CA and certificates
//! this test makes (rcgen), a certificate rotated under a running server the way Kubernetes
//! swaps a mounted secret, and start-up refusing a pair it cannot serve.
//!
//! Each check looks at the certificate the server presented (its DER, byte for byte), not only
//! at whether a handshake worked.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use quotad::config::{DurationMs, Settings};
use quotad::startup::Application;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls::pki_types::ServerName;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::grpc::descriptor;
use crate::helpers::*;

/// A test CA.
struct Pki {
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A server certificate for `localhost` and 127.0.0.1, and its key.
struct Leaf {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
    /// Its not-after, unix seconds (1 January of the year asked for).
    not_after: i64,
}

impl Pki {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "quotad test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { ca }
    }

    /// A certificate of its own key, expiring on 1 January of `year`.
    fn leaf(&self, year: i32) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let not_after = chrono::NaiveDate::from_ymd_opt(year, 1, 1)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap()
            .and_utc()
            .timestamp();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().to_vec(),
            not_after,
        }
    }

    /// An HTTPS client trusting this CA only, on a new connection for every request (each one
    /// sees the certificate served at that moment).
    fn https_client(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca.pem().as_bytes()).unwrap())
            .tls_info(true)
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
    }

    fn rustls_client(&self, alpn: &[u8]) -> tokio_rustls::TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        let mut c = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        c.alpn_protocols = vec![alpn.to_vec()];
        Arc::new(c).into()
    }

    /// A TLS connection to `port`, handshaken, offering `alpn`.
    async fn connect(&self, port: u16, alpn: &[u8]) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let name = ServerName::try_from("localhost").unwrap();
        self.rustls_client(alpn)
            .connect(name, tcp)
            .await
            .expect("TLS handshake")
    }

    /// The certificate `port` presents to a new connection, and the protocol agreed.
    async fn served(&self, port: u16, alpn: &[u8]) -> (Vec<u8>, Option<Vec<u8>>) {
        let tls = self.connect(port, alpn).await;
        let (_, conn) = tls.get_ref();
        let der = conn.peer_certificates().expect("a certificate")[0].to_vec();
        (der, conn.alpn_protocol().map(<[u8]>::to_vec))
    }

    async fn grpc(&self, port: u16) -> RateLimitServiceClient<Channel> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(self.ca.pem()))
            .domain_name("localhost");
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .expect("gRPC over TLS connects");
        RateLimitServiceClient::new(channel)
    }
}

/// The certificate files as Kubernetes mounts a secret: `tls.crt` and `tls.key` are links
/// through `..data`, a link to a directory of this version's files, swapped by a rename.
struct Mounted {
    dir: tempfile::TempDir,
    version: std::cell::Cell<u32>,
}

impl Mounted {
    fn new(cert_pem: &str, key_pem: &str) -> Self {
        let m = Self {
            dir: tempfile::tempdir().unwrap(),
            version: Default::default(),
        };
        m.install(cert_pem, key_pem);
        for f in ["tls.crt", "tls.key"] {
            std::os::unix::fs::symlink(Path::new("..data").join(f), m.dir.path().join(f)).unwrap();
        }
        m
    }

    /// Both files replaced at once: a new directory, a new link to it renamed over `..data`.
    fn install(&self, cert_pem: &str, key_pem: &str) {
        let v = self.version.get() + 1;
        self.version.set(v);
        let name = format!("..v{v}");
        let data = self.dir.path().join(&name);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("tls.crt"), cert_pem).unwrap();
        std::fs::write(data.join("tls.key"), key_pem).unwrap();
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }

    fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }
}

fn use_tls(s: &mut Settings, files: &Mounted) {
    s.server.tls.cert_file = Some(files.cert());
    s.server.tls.key_file = Some(files.key());
    s.server.grpc_bind = Some("127.0.0.1:0".into());
}

/// quotad with TLS on both ports; the app's helpers speak HTTPS to it.
async fn spawn_tls(pki: &Pki, files: &Mounted, tweak: impl FnOnce(&mut Settings)) -> TestApp {
    let mut app = spawn_with(|s| {
        use_tls(s, files);
        tweak(s);
    })
    .await;
    app.base = format!("https://127.0.0.1:{}", http_port(&app));
    app.http = pki.https_client();
    app
}

fn http_port(app: &TestApp) -> u16 {
    app.base.rsplit(':').next().unwrap().parse().unwrap()
}

/// The certificate a new HTTPS connection was given, checking `/healthz` on the way. A new
/// client each time: one that resumed an earlier TLS session would be shown no certificate,
/// and would report the one of that session.
async fn https_served(pki: &Pki, app: &TestApp) -> Vec<u8> {
    let r = pki
        .https_client()
        .get(app.url("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let info = r.extensions().get::<reqwest::tls::TlsInfo>().expect("TLS");
    info.peer_certificate().expect("a certificate").to_vec()
}

#[tokio::test]
async fn checks_and_health_answer_over_https_with_the_configured_certificate() {
    let pki = Pki::new();
    let a = pki.leaf(2031);
    let files = Mounted::new(&a.cert_pem, &a.key_pem);
    let app = spawn_tls(&pki, &files, |_| {}).await;

    assert!(
        https_served(&pki, &app).await == a.der,
        "not the configured certificate"
    );
    let r = app
        .put_quota(
            "acme",
            json!({"limits": [{"id": "s", "max": 1, "window": "1m"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let (status, body) = app.check_json("acme", "k1").await;
    assert_eq!(
        (status, &body["allowed"], &body["remaining"]),
        (200, &json!(true), &json!(0))
    );
    let (status, body) = app.check_json("acme", "k1").await;
    assert_eq!((status, &body["allowed"]), (429, &json!(false)));
    // HTTP/1.1 is what the port offers (actix-web is built without HTTP/2).
    let (der, alpn) = pki.served(http_port(&app), b"http/1.1").await;
    assert!(der == a.der);
    assert_eq!(alpn.as_deref(), Some(&b"http/1.1"[..]));
    assert_eq!(
        app.metric("quotad_tls_cert_expiry_seconds").await,
        a.not_after as f64
    );
    app.stop().await;
}

#[tokio::test]
async fn the_grpc_service_answers_over_tls_while_a_handshake_stalls_and_never_in_plain_text() {
    let pki = Pki::new();
    let a = pki.leaf(2031);
    let files = Mounted::new(&a.cert_pem, &a.key_pem);
    // A handshake deadline far longer than the test waits: a stalled handshake that held up
    // the accept loop would fail the call below.
    let app = spawn_tls(&pki, &files, |s| {
        s.server.request_timeout_ms = DurationMs(120_000)
    })
    .await;
    let r = app
        .put_quota(
            "shop",
            json!({"limits": [{"id": "per-second", "max": 3, "window": "1s", "resource": "path=/api"}]}),
        )
        .await;
    assert_eq!(r.status(), 201);
    let port = app.grpc_port.unwrap();
    let stalled = TcpStream::connect(("127.0.0.1", port)).await.unwrap();

    let call = async {
        let mut c = pki.grpc(port).await;
        c.should_rate_limit(RateLimitRequest {
            domain: "shop".into(),
            descriptors: vec![descriptor(&[("client", "k1"), ("path", "/api")])],
            hits_addend: 0,
        })
        .await
        .unwrap()
        .into_inner()
    };
    let r = tokio::time::timeout(EVENTUALLY, call)
        .await
        .expect("a gRPC call while another connection stalls its handshake");
    assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
    assert_eq!(r.statuses[0].limit_remaining, 2, "{r:?}");

    let (der, alpn) = pki.served(port, b"h2").await;
    assert!(der == a.der, "the gRPC port serves the same certificate");
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]));

    // gRPC in plain text (HTTP/2 prior knowledge) gets no answer from the TLS port.
    let plain = async {
        let mut c = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await?;
        c.should_rate_limit(RateLimitRequest::default())
            .await
            .map_err(Into::into)
            .map(|_| ())
    };
    let plain: Result<(), Box<dyn std::error::Error>> = plain.await;
    assert!(plain.is_err(), "a plain-text gRPC call was answered");
    drop(stalled);
    app.stop().await;
}

#[tokio::test]
async fn plain_http_on_the_tls_port_gets_no_http_answer() {
    let pki = Pki::new();
    let a = pki.leaf(2031);
    let files = Mounted::new(&a.cert_pem, &a.key_pem);
    let app = spawn_tls(&pki, &files, |_| {}).await;
    let port = http_port(&app);

    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(EVENTUALLY, tcp.read_to_end(&mut got)).await;
    assert!(
        read.is_ok(),
        "the connection was neither answered nor closed"
    );
    assert!(
        !got.starts_with(b"HTTP/"),
        "plain HTTP answered: {:?}",
        String::from_utf8_lossy(&got)
    );
    let plain = reqwest::get(format!("http://127.0.0.1:{port}/healthz")).await;
    assert!(plain.is_err(), "{plain:?}");
    app.stop().await;
}

#[tokio::test]
async fn a_handshake_that_never_comes_is_cut_off_on_both_ports() {
    let pki = Pki::new();
    let a = pki.leaf(2031);
    let files = Mounted::new(&a.cert_pem, &a.key_pem);
    let app = spawn_tls(&pki, &files, |s| {
        s.server.request_timeout_ms = DurationMs(500)
    })
    .await;
    for port in [http_port(&app), app.grpc_port.unwrap()] {
        let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut buf = [0u8; 64];
        // The server closes it (0 bytes or a reset) once the deadline passes; a server without
        // one would leave this read waiting.
        let read = tokio::time::timeout(EVENTUALLY, silent.read(&mut buf)).await;
        assert!(
            matches!(read, Ok(Ok(0)) | Ok(Err(_))),
            "port {port}: {read:?}"
        );
    }
    assert!(https_served(&pki, &app).await == a.der, "serving goes on");
    app.stop().await;
}

/// Silent sockets cannot hold every TLS handshake slot: with more of them than actix-tls's
/// default of 256 handshakes in progress on the one worker, a real client's handshake still
/// completes at once, not when the silent ones time out.
#[tokio::test]
async fn silent_sockets_by_the_hundred_do_not_delay_a_real_handshake() {
    let pki = Pki::new();
    let a = pki.leaf(2031);
    let files = Mounted::new(&a.cert_pem, &a.key_pem);
    let app = spawn_tls(&pki, &files, |s| {
        s.server.workers = 1;
        s.server.request_timeout_ms = DurationMs(20_000);
    })
    .await;
    let port = http_port(&app);
    let mut silent = Vec::new();
    for _ in 0..300 {
        silent.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    // Let the worker take every one of them into a handshake.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let served = tokio::time::timeout(std::time::Duration::from_secs(5), https_served(&pki, &app))
        .await
        .expect("a real handshake waited behind 300 silent sockets");
    assert!(served == a.der);
    drop(silent);
    app.stop().await;
}

/// A series of `/metrics` (over HTTPS) as a number.
async fn reloads(app: &TestApp, outcome: &str) -> f64 {
    app.metric(&format!(
        "quotad_tls_reloads_total{{outcome=\"{outcome}\"}}"
    ))
    .await
}

#[tokio::test]
async fn a_rotated_certificate_reaches_new_connections_and_a_bad_one_is_never_served() {
    let pki = Pki::new();
    let (a, b, c) = (pki.leaf(2031), pki.leaf(2032), pki.leaf(2033));
    let files = Mounted::new(&a.cert_pem, &a.key_pem);
    let app = spawn_tls(&pki, &files, |s| {
        s.server.tls.reload_interval_ms = DurationMs(200);
        // The connection opened before the rotation stays open through it.
        s.server.request_timeout_ms = DurationMs(120_000);
        s.server.keep_alive_ms = DurationMs(120_000);
    })
    .await;
    let port = http_port(&app);
    assert!(https_served(&pki, &app).await == a.der);
    let mut before = pki.connect(port, b"http/1.1").await;

    files.install(&b.cert_pem, &b.key_pem);
    eventually("a new HTTPS connection gets certificate B", || async {
        let der = https_served(&pki, &app).await;
        (der == b.der)
            .then_some(())
            .ok_or_else(|| format!("served A: {}", der == a.der))
    })
    .await;
    let (der, _) = pki.served(app.grpc_port.unwrap(), b"h2").await;
    assert!(der == b.der, "the gRPC port serves B too");
    assert_eq!(
        app.metric("quotad_tls_cert_expiry_seconds").await,
        b.not_after as f64
    );
    assert_eq!(reloads(&app, "ok").await, 1.0);

    // The connection made before still has A, and is still served.
    let (_, conn) = before.get_ref();
    assert!(conn.peer_certificates().unwrap()[0].as_ref() == a.der.as_slice());
    before
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    before.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    // C's certificate with B's key, then files that are not PEM: each refused, B served on.
    let bad = [
        (c.cert_pem.as_str(), b.key_pem.as_str()),
        ("not a certificate", "not a key"),
    ];
    for (i, (cert, key)) in bad.into_iter().enumerate() {
        let refused = reloads(&app, "error").await;
        files.install(cert, key);
        eventually(&format!("bad pair {i} refused"), || async {
            let now = reloads(&app, "error").await;
            (now > refused).then_some(()).ok_or_else(|| now.to_string())
        })
        .await;
        assert!(
            https_served(&pki, &app).await == b.der,
            "bad pair {i}: B no longer served"
        );
        assert_eq!(
            app.metric("quotad_tls_cert_expiry_seconds").await,
            b.not_after as f64
        );
    }
    assert_eq!(reloads(&app, "ok").await, 1.0);
    app.stop().await;
}

/// What `Application::build` says when it refuses to start.
async fn refused(tweak: impl FnOnce(&mut Settings)) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut s = settings(dir.path());
    tweak(&mut s);
    match Application::build(s).await {
        Ok(_) => panic!("started"),
        Err(e) => e.0,
    }
}

#[tokio::test]
async fn start_up_refuses_a_pair_it_cannot_serve_naming_the_file_and_never_the_key() {
    let pki = Pki::new();
    let (a, b) = (pki.leaf(2031), pki.leaf(2032));
    let secret_lines = |pem: &str| -> Vec<String> {
        pem.lines()
            .filter(|l| !l.starts_with("-----") && l.len() > 8)
            .map(str::to_owned)
            .collect()
    };

    // A's certificate with B's key.
    let files = Mounted::new(&a.cert_pem, &b.key_pem);
    let e = refused(|s| use_tls(s, &files)).await;
    let key = files.key().display().to_string();
    assert!(e.contains("server.tls.key_file") && e.contains(&key), "{e}");
    assert!(e.contains("is not the key of the certificate"), "{e}");
    for l in secret_lines(&b.key_pem) {
        assert!(!e.contains(&l), "key material in {e}");
    }

    // A key file whose PEM is broken: named, not quoted.
    let broken = "-----BEGIN PRIVATE KEY-----\nc2VjcmV0IGtleSBtYXRlcmlhbA==\n";
    let files = Mounted::new(&a.cert_pem, broken);
    let e = refused(|s| use_tls(s, &files)).await;
    assert!(e.contains(&files.key().display().to_string()), "{e}");
    assert!(!e.contains("c2VjcmV0"), "key material in {e}");

    // No certificate in the certificate file; a certificate file that is not there.
    let files = Mounted::new("hello", &a.key_pem);
    let e = refused(|s| use_tls(s, &files)).await;
    assert!(
        e.contains("server.tls.cert_file") && e.contains("no PEM CERTIFICATE"),
        "{e}"
    );
    let missing = files.dir.path().join("absent.crt");
    let e = refused(|s| {
        use_tls(s, &files);
        s.server.tls.cert_file = Some(missing.clone());
    })
    .await;
    assert!(
        e.contains(&missing.display().to_string()) && e.contains("cannot read"),
        "{e}"
    );
}
