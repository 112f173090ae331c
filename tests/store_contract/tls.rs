//! A cluster that requires a password and TLS: quotad reaches it only with what the
//! configuration gives (`QUOTAD__STORE__*`, files included), and each way of getting it wrong
//! stops `quotad migrate` and the store with a message that says which. Scylla only: run with
//! the variables that reach such a cluster (docs/scylla.md#tls-and-passwords).

use std::path::{Path, PathBuf};

use quotad::scylla::cql::{StoreTls, TlsFiles};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

use super::*;

/// A CA of its own, that no node trusts and no node's certificate chains to, and a client
/// certificate it signed: written as PEM files in `dir`.
fn untrusted(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let client_key = KeyPair::generate().unwrap();
    let client = CertificateParams::new(vec!["quotad".to_owned()])
        .unwrap()
        .signed_by(&client_key, &issuer)
        .unwrap();
    let write = |name: &str, pem: String| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    (
        write("untrusted-ca.pem", ca_cert.pem()),
        write("untrusted-client.pem", client.pem()),
        write("untrusted-client.key", client_key.serialize_pem()),
    )
}

/// What a dry-run migration (no keyspace needed) says when it cannot connect.
async fn refusal(opts: &ScyllaOptions) -> String {
    match migrate::run(opts, true, &mut Vec::new()).await {
        Ok(_) => panic!("connected where it should have been refused"),
        Err(e) => e.to_string(),
    }
}

pub(crate) async fn each_refusal_says_why() {
    let settings = quotad::config::Settings::load(None).unwrap();
    let st = &settings.store;
    let (Some(ca), Some(password)) = (&st.tls_ca_file, &st.password) else {
        panic!(
            "configure the cluster's TLS and password through QUOTAD__STORE__TLS_CA_FILE and \
             QUOTAD__STORE__PASSWORD_FILE (or PASSWORD) to run this test"
        )
    };
    let password = password.expose().to_owned();
    let files = TlsFiles {
        ca_file: ca.clone(),
        client_cert: st.tls_cert_file.clone().zip(st.tls_key_file.clone()),
        verify_hostname: true,
        server_name: None,
    };
    let good = ScyllaOptions {
        nodes: nodes(),
        keyspace: unique_keyspace("tls"),
        ..base_options()
    };
    // The configuration as given connects: each refusal below is for its own cause.
    migrate::run(&good, true, &mut Vec::new()).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let (other_ca, other_cert, other_key) = untrusted(dir.path());
    let with_tls = |f: TlsFiles| ScyllaOptions {
        tls: Some(StoreTls::load(&f).unwrap()),
        ..good.clone()
    };
    let cases = [
        (
            ScyllaOptions {
                password: Some("not-the-password".into()),
                ..good.clone()
            },
            "refused the login",
        ),
        (
            with_tls(TlsFiles {
                ca_file: other_ca,
                ..files.clone()
            }),
            "is not signed by a CA of store.tls_ca_file",
        ),
        (
            with_tls(TlsFiles {
                server_name: Some("wrong.test".into()),
                ..files.clone()
            }),
            "does not name wrong.test",
        ),
        (
            with_tls(TlsFiles {
                client_cert: Some((other_cert, other_key)),
                ..files.clone()
            }),
            "refused quotad's TLS client certificate",
        ),
        (
            ScyllaOptions {
                tls: None,
                ..good.clone()
            },
            "set store.tls_ca_file",
        ),
    ];
    for (opts, needle) in cases {
        let m = refusal(&opts).await;
        eprintln!("refused: {m}");
        assert!(m.contains(needle), "expected {needle:?} in: {m}");
        assert!(!m.contains(&password), "the password is in: {m}");
    }
    // The store says the same as the migrator.
    let bad = ScyllaOptions {
        password: Some("not-the-password".into()),
        ..good.clone()
    };
    match ScyllaStore::connect(bad).await {
        Err(e) => assert!(e.to_string().contains("refused the login"), "{e}"),
        Ok(_) => panic!("the store connected with a wrong password"),
    }
}
