use std::path::Path;

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// 128 bits: as strong as a token must be.
const STRONG: &str = "5f0c2a9e8b7d6c5f4a3b2c1d0e9f8a7b";

#[test]
fn defaults_serve_on_8080_with_the_embedded_store() {
    let s = Settings::load_from(None, env(&[])).unwrap();
    assert_eq!(s.server.bind, "127.0.0.1:8080");
    assert_eq!(s.store.kind, StoreKind::Embedded);
    assert_eq!(s.store.keyspace, "quota");
}

#[test]
fn the_contract_environment_variables_work() {
    let s = Settings::load_from(
        None,
        env(&[
            ("QUOTAD__SERVER__BIND", "127.0.0.1:18080"),
            ("QUOTAD__STORE__KIND", "scylla"),
            ("QUOTAD__STORE__PATH", "/tmp/q"),
            ("QUOTAD__STORE__NODES", "10.0.0.1:9042, 10.0.0.2:9042"),
            ("QUOTAD__STORE__KEYSPACE", "quota_test"),
            ("QUOTAD__AUTH__ADMIN_TOKEN", STRONG),
            (
                "QUOTAD__AUTH__CHECK_TOKEN",
                "0f1e2d3c4b5a69788796a5b4c3d2e1f0",
            ),
            ("QUOTAD__SYNC__INTERVAL_MS", "500"),
            ("QUOTAD_TEST_SCYLLA_NODES", "ignored: single underscore"),
        ]),
    )
    .unwrap();
    assert_eq!(s.server.bind, "127.0.0.1:18080");
    assert_eq!(s.store.kind, StoreKind::Scylla);
    assert_eq!(s.store.nodes, vec!["10.0.0.1:9042", "10.0.0.2:9042"]);
    assert_eq!(s.auth.admin_token.expose(), STRONG);
    assert_eq!(s.sync.interval_ms, DurationMs(500));
    assert!(!format!("{s:?}").contains(STRONG), "secret printed");
}

#[test]
fn forward_auth_reads_no_cost_unless_named_and_both_proxies_pairs_in_order() {
    let s = Settings::load_from(None, env(&[])).unwrap();
    assert_eq!(s.forward_auth.cost_header, None);
    assert_eq!(s.forward_auth.resource_from, ["original", "forwarded"]);
    let s = Settings::load_from(
        None,
        env(&[
            ("QUOTAD__FORWARD_AUTH__COST_HEADER", "X-Cost"),
            ("QUOTAD__FORWARD_AUTH__RESOURCE_FROM", "forwarded"),
        ]),
    )
    .unwrap();
    assert_eq!(s.forward_auth.cost_header.as_deref(), Some("X-Cost"));
    assert_eq!(s.forward_auth.resource_from, ["forwarded"]);
}

#[test]
fn the_header_limit_defaults_to_16_kib_and_reads_from_the_environment() {
    let s = Settings::load_from(None, env(&[])).unwrap();
    assert_eq!(s.server.max_header_bytes, 16_384);
    let s =
        Settings::load_from(None, env(&[("QUOTAD__SERVER__MAX_HEADER_BYTES", "8192")])).unwrap();
    assert_eq!(s.server.max_header_bytes, 8192);
    let e = Settings::load_from(None, env(&[("QUOTAD__SERVER__MAX_HEADER_BYTES", "131073")]))
        .unwrap_err()
        .0;
    assert!(e.contains("server.max_header_bytes"), "{e}");
}

#[test]
fn durations_read_as_units() {
    let s = Settings::load_from(None, env(&[("QUOTAD__SYNC__INTERVAL_MS", "1s")])).unwrap();
    assert_eq!(s.sync.interval_ms, DurationMs(1000));
    let s = Settings::load_from(None, env(&[("QUOTAD__QUOTAS__REFRESH_MS", "10m")])).unwrap();
    assert_eq!(s.quotas.refresh_ms, DurationMs(600_000));
}

#[test]
fn unknown_keys_and_bad_values_are_named() {
    let cases = [
        (("QUOTAD__SERVER__BINDD", "x"), "bindd"),
        (("QUOTAD__SERVER__BIND", "nowhere"), "server.bind"),
        (
            ("QUOTAD__SERVER__MAX_HEADER_BYTES", "16"),
            "server.max_header_bytes",
        ),
        (
            ("QUOTAD__SERVER__WORKER_SLICE_US", "50"),
            "server.worker_slice_us",
        ),
        (
            ("QUOTAD__SERVER__MAX_HEADER_BYTES", "1MiB"),
            "max_header_bytes",
        ),
        (("QUOTAD__STORE__KIND", "redis"), "redis"),
        (("QUOTAD__SYNC__INTERVAL_MS", "soon"), "soon"),
        (("QUOTAD__NOPE__X", "1"), "nope"),
        (("QUOTAD__STORE__KEYSPACE", "bad-name"), "store.keyspace"),
        (("QUOTAD__HISTORY__RETENTION", "1h"), "history.retention"),
        (
            ("QUOTAD__HISTORY__WRITE_INTERVAL_MS", "2h"),
            "history.write_interval_ms",
        ),
        (
            ("QUOTAD__FORWARD_AUTH__DENY_STATUS", "200"),
            "forward_auth.deny_status",
        ),
        (
            ("QUOTAD__FORWARD_AUTH__TENANT_HEADER", "bad header"),
            "forward_auth.tenant_header",
        ),
        (
            ("QUOTAD__FORWARD_AUTH__COST_HEADER", "bad header"),
            "forward_auth.cost_header",
        ),
        (
            ("QUOTAD__FORWARD_AUTH__RESOURCE_FROM", "original,x-real-uri"),
            "forward_auth.resource_from",
        ),
        (
            ("QUOTAD__FORWARD_AUTH__RESOURCE_FROM", "forwarded,forwarded"),
            "forward_auth.resource_from",
        ),
        (
            ("QUOTAD__FORWARD_AUTH__RESOURCE_FROM", ","),
            "forward_auth.resource_from",
        ),
        (("QUOTAD__AUDIT__RETENTION", "0"), "audit.retention"),
        (
            ("QUOTAD__AUDIT__RETENTION", "300000000y"),
            "audit.retention",
        ),
        // Unquoted CQL names are case-insensitive: one rule with `quotad migrate`, lowercase.
        (("QUOTAD__STORE__KEYSPACE", "Quota"), "store.keyspace"),
        (("QUOTAD__LOG__LEVEL", "=[="), "log.level"),
        (("QUOTAD__STORE__SHARD", "256"), "store.shard"),
        (("QUOTAD__STORE__SHARDS", "3"), "shards"),
        (("QUOTAD__FLEET__HEARTBEAT_MS", "0"), "fleet.heartbeat_ms"),
        (
            ("QUOTAD__FLEET__LEASE_TTL_MS", "1500ms"),
            "fleet.lease_ttl_ms",
        ),
        (("QUOTAD__STORE__CACHE_MB", "0"), "store.cache_mb"),
        (
            ("QUOTAD__LIMITER__MAX_COUNTERS", "0"),
            "limiter.max_counters",
        ),
        (
            ("QUOTAD__LIMITER__MAX_CLIENTS_PER_TENANT", "0"),
            "limiter.max_clients_per_tenant",
        ),
        (
            ("QUOTAD__LIMITER__MAX_OPEN_HOLDS_PER_TENANT", "0"),
            "limiter.max_open_holds_per_tenant",
        ),
        (
            ("QUOTAD__LIMITER__MAX_OPEN_HOLDS", "0"),
            "limiter.max_open_holds",
        ),
    ];
    for ((k, v), needle) in cases {
        let e = Settings::load_from(None, env(&[(k, v)])).unwrap_err().0;
        assert!(e.contains(needle), "{k}={v}: {e}");
    }
}

#[test]
fn scoped_tokens_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("t.toml");
    let h = "a".repeat(64);
    std::fs::write(
        &f,
        format!(
            "[[auth.tokens]]\nsha256 = \"{h}\"\nrole = \"tenant_admin\"\ntenants = [\"acme\"]\n\
             [[auth.tokens]]\nsha256 = \"{h}\"\nrole = \"check\"\n"
        ),
    )
    .unwrap();
    let s = Settings::load_from(Some(&f), env(&[])).unwrap();
    assert_eq!(s.auth.tokens.len(), 2);
    assert_eq!(s.auth.tokens[0].role, Role::TenantAdmin);
    for (body, needle) in [
        (
            "sha256 = \"xyz\"\nrole = \"admin\"",
            "auth.tokens[0].sha256",
        ),
        ("hash = \"xyz\"\nrole = \"admin\"", "auth.tokens[0].hash"),
        ("role = \"admin\"", "exactly one of hash and sha256"),
        (
            &format!(
                "hash = \"{}\"\nsha256 = \"{h}\"\nrole = \"admin\"",
                tokens::hash(STRONG)
            ),
            "exactly one of hash and sha256",
        ),
        (
            &format!("sha256 = \"{h}\"\nrole = \"tenant_admin\""),
            "auth.tokens[0].tenants",
        ),
        (&format!("sha256 = \"{h}\"\nrole = \"root\""), "root"),
        (
            &format!("sha256 = \"{h}\"\nrole = \"check\"\ntenants = [\"a b\"]"),
            "auth.tokens[0].tenants",
        ),
        (
            &format!("name = \"tab\\there\"\nsha256 = \"{h}\"\nrole = \"admin\""),
            "auth.tokens[0].name",
        ),
        (
            &format!("name = \"admin_token\"\nsha256 = \"{h}\"\nrole = \"admin\""),
            "auth.tokens[0].name",
        ),
        (
            &format!(
                "name = \"ops\"\nsha256 = \"{h}\"\nrole = \"admin\"\n\
                 [[auth.tokens]]\nname = \"ops\"\nsha256 = \"{h}\"\nrole = \"check\""
            ),
            "auth.tokens[1].name",
        ),
    ] {
        std::fs::write(&f, format!("[[auth.tokens]]\n{body}\n")).unwrap();
        let e = Settings::load_from(Some(&f), env(&[])).unwrap_err().0;
        assert!(e.contains(needle), "{body}: {e}");
    }
}

#[test]
fn files_layer_under_the_environment_and_default_policies_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("q.toml");
    std::fs::write(
        &f,
        "[server]\nbind = \"127.0.0.1:9999\"\n[sync]\ninterval_ms = \"250ms\"\n\
         [quotas.default]\nlimits = [{ id = \"a\", max = 5, window = \"1s\" }]\n",
    )
    .unwrap();
    let s = Settings::load_from(Some(&f), env(&[])).unwrap();
    assert_eq!(s.server.bind, "127.0.0.1:9999");
    assert!(s.default_policy().unwrap().is_some());
    let s = Settings::load_from(Some(&f), env(&[("QUOTAD__SERVER__BIND", "127.0.0.1:1")])).unwrap();
    assert_eq!(s.server.bind, "127.0.0.1:1");
    std::fs::write(
        &f,
        "[quotas.default]\nlimits = [{ id = \"a\", max = 0, window = \"1s\" }]\n",
    )
    .unwrap();
    let e = Settings::load_from(Some(&f), env(&[])).unwrap_err().0;
    assert!(e.contains("quotas.default.limits[0].max"), "{e}");
    assert!(Settings::load_from(Some(Path::new("/no/such.toml")), env(&[])).is_err());
}

#[test]
fn config_default_toml_is_the_built_in_defaults() {
    // The file spells the defaults out for operators; the `Default` impls are the source.
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_FILE);
    let from_file: Settings = config::Config::builder()
        .add_source(config::File::from(path.as_path()).required(true))
        .build()
        .unwrap()
        .try_deserialize()
        .unwrap();
    assert_eq!(from_file, Settings::default());
    assert_eq!(
        Settings::load_from(None, env(&[])).unwrap(),
        Settings::default()
    );
}

#[test]
fn a_zero_request_timeout_is_named() {
    let e = Settings::load_from(
        None,
        env(&[
            ("QUOTAD__STORE__KIND", "scylla"),
            ("QUOTAD__STORE__REQUEST_TIMEOUT_MS", "0"),
        ]),
    )
    .unwrap_err()
    .0;
    assert!(e.starts_with("store.request_timeout_ms:"), "{e}");
}

#[test]
fn a_grpc_idle_timeout_within_a_call_s_time_is_refused() {
    let e = Settings::load_from(
        None,
        env(&[
            ("QUOTAD__SERVER__REQUEST_TIMEOUT_MS", "20s"),
            ("QUOTAD__GRPC__IDLE_TIMEOUT_MS", "20s"),
        ]),
    )
    .unwrap_err()
    .0;
    assert!(e.starts_with("grpc.idle_timeout_ms:"), "{e}");
}

#[test]
fn weak_tokens_and_open_checks_beyond_loopback_stop_start_up() {
    for (pairs, needle) in [
        (
            vec![("QUOTAD__AUTH__ADMIN_TOKEN", "change-me-admin-token")],
            "auth.admin_token",
        ),
        (
            vec![("QUOTAD__AUTH__CHECK_TOKEN", "s3cret")],
            "auth.check_token",
        ),
    ] {
        let e = Settings::load_from(None, env(&pairs)).unwrap_err().0;
        assert!(e.contains(needle), "{pairs:?}: {e}");
        assert!(!e.contains("s3cret") && !e.contains("change-me"), "{e}");
    }
    // Serving checks open beyond loopback is refused; loading such a configuration is not
    // (`quotad migrate` in the same container listens on nothing).
    for (pairs, needle) in [
        (
            vec![("QUOTAD__SERVER__BIND", "0.0.0.0:8080")],
            "server.bind",
        ),
        (
            vec![("QUOTAD__SERVER__GRPC_BIND", "[::]:8081")],
            "server.grpc_bind",
        ),
    ] {
        let s = Settings::load_from(None, env(&pairs)).unwrap();
        let e = s.refuse_open_checks_beyond_loopback().unwrap_err().0;
        assert!(e.contains(needle), "{pairs:?}: {e}");
    }
    assert!(Settings::load_from(None, env(&[]))
        .unwrap()
        .refuse_open_checks_beyond_loopback()
        .is_ok());
    // Beyond loopback with a check token, or with open checks said out loud: it serves.
    for extra in [
        ("QUOTAD__AUTH__CHECK_TOKEN", STRONG),
        ("QUOTAD__AUTH__OPEN_CHECKS", "true"),
    ] {
        let s = Settings::load_from(
            None,
            env(&[("QUOTAD__SERVER__BIND", "0.0.0.0:8080"), extra]),
        )
        .unwrap();
        assert!(s.refuse_open_checks_beyond_loopback().is_ok(), "{extra:?}");
    }
}

#[test]
fn secrets_come_from_files_and_a_file_excludes_its_inline_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, content: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, content).unwrap();
        p.to_str().unwrap().to_owned()
    };
    let (admin, check) = (file("admin", &format!("{STRONG}\n")), file("check", STRONG));
    let (user, pass) = (
        file("user", "quotad\r\n"),
        file("pass", "hunter2-hunter2\n"),
    );
    let s = Settings::load_from(
        None,
        env(&[
            ("QUOTAD__AUTH__ADMIN_TOKEN_FILE", &admin),
            ("QUOTAD__AUTH__CHECK_TOKEN_FILE", &check),
            ("QUOTAD__STORE__USERNAME_FILE", &user),
            ("QUOTAD__STORE__PASSWORD_FILE", &pass),
        ]),
    )
    .unwrap();
    assert_eq!(s.auth.admin_token.expose(), STRONG);
    assert_eq!(s.auth.check_token.expose(), STRONG);
    assert_eq!(s.store.username.as_deref(), Some("quotad"));
    assert_eq!(
        s.store.password.as_ref().unwrap().expose(),
        "hunter2-hunter2"
    );
    let printed = format!("{s:?}");
    assert!(
        !printed.contains(STRONG) && !printed.contains("hunter2"),
        "{printed}"
    );
    let weak = file("weak", "s3cret\n");
    let empty = file("empty", "\n");
    for (pairs, needle) in [
        (
            vec![
                ("QUOTAD__STORE__PASSWORD_FILE", pass.as_str()),
                ("QUOTAD__STORE__PASSWORD", "x"),
            ],
            "store.password: set either",
        ),
        (
            vec![("QUOTAD__AUTH__ADMIN_TOKEN_FILE", "/no/such/file")],
            "auth.admin_token_file: cannot read /no/such/file",
        ),
        (
            vec![("QUOTAD__AUTH__ADMIN_TOKEN_FILE", weak.as_str())],
            "auth.admin_token: a token needs at least 128 bits",
        ),
        (
            vec![("QUOTAD__STORE__PASSWORD_FILE", empty.as_str())],
            "is empty",
        ),
    ] {
        let e = Settings::load_from(None, env(&pairs)).unwrap_err().0;
        assert!(e.contains(needle), "{pairs:?}: {e}");
        assert!(!e.contains("s3cret"), "{e}");
    }
}

#[test]
fn store_tls_settings_go_together() {
    for (pairs, needle) in [
        (
            vec![("QUOTAD__STORE__TLS_CERT_FILE", "/c.pem")],
            "store.tls_cert_file",
        ),
        (
            vec![
                ("QUOTAD__STORE__TLS_CERT_FILE", "/c.pem"),
                ("QUOTAD__STORE__TLS_KEY_FILE", "/c.key"),
            ],
            "store.tls_ca_file",
        ),
        (
            vec![("QUOTAD__STORE__TLS_SERVER_NAME", "db.example.com")],
            "store.tls_ca_file",
        ),
    ] {
        let e = Settings::load_from(None, env(&pairs)).unwrap_err().0;
        assert!(e.contains(needle), "{pairs:?}: {e}");
    }
}

#[test]
fn tls_is_off_by_default_and_reads_both_files_from_the_environment() {
    let s = Settings::load_from(None, env(&[])).unwrap();
    assert_eq!(
        (&s.server.tls.cert_file, &s.server.tls.key_file),
        (&None, &None)
    );
    assert_eq!(s.server.tls.reload_interval_ms, DurationMs(10_000));
    let s = Settings::load_from(
        None,
        env(&[
            ("QUOTAD__SERVER__TLS__CERT_FILE", "/tls/tls.crt"),
            ("QUOTAD__SERVER__TLS__KEY_FILE", "/tls/tls.key"),
            ("QUOTAD__SERVER__TLS__RELOAD_INTERVAL_MS", "30s"),
        ]),
    )
    .unwrap();
    assert_eq!(
        s.server.tls.cert_file.as_deref(),
        Some(Path::new("/tls/tls.crt"))
    );
    assert_eq!(
        s.server.tls.key_file.as_deref(),
        Some(Path::new("/tls/tls.key"))
    );
    assert_eq!(s.server.tls.reload_interval_ms, DurationMs(30_000));
}

#[test]
fn tls_needs_both_files_and_a_sane_reload_interval() {
    let load = |pairs: &[(&str, &str)]| Settings::load_from(None, env(pairs)).unwrap_err().0;
    let e = load(&[("QUOTAD__SERVER__TLS__CERT_FILE", "/tls/tls.crt")]);
    assert!(e.contains("server.tls.key_file"), "{e}");
    let e = load(&[("QUOTAD__SERVER__TLS__KEY_FILE", "/tls/tls.key")]);
    assert!(e.contains("server.tls.cert_file"), "{e}");
    let e = load(&[("QUOTAD__SERVER__TLS__RELOAD_INTERVAL_MS", "0")]);
    assert!(e.contains("server.tls.reload_interval_ms"), "{e}");
    let e = load(&[("QUOTAD__SERVER__TLS__CERT", "/tls/tls.crt")]);
    assert!(e.contains("cert"), "{e}");
}

#[test]
fn a_syntax_error_names_the_line_but_never_quotes_it() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("q.toml");
    std::fs::write(
        &f,
        "[auth]\nadmin_token = \"quotad-secret-9f2c71e0b4a35d86 \n",
    )
    .unwrap();
    let e = Settings::load_from(Some(&f), env(&[])).unwrap_err().0;
    assert!(!e.contains("quotad-secret"), "{e}");
    assert!(e.contains("line 2"), "{e}");
    assert!(e.contains("q.toml"), "{e}");
}
