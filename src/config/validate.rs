//! Checks of what deserializing cannot check: ranges, addresses, names, tokens and the
//! default policy. The first bad value stops start-up with a message that names its key.

use std::net::SocketAddr;

use super::{ConfigError, Role, Settings, StoreKind, HEADER_BYTES_CEILING};
use crate::domain::Policy;

impl Settings {
    /// Checks what deserializing cannot: ranges, addresses, names, tokens, the default policy.
    /// The first bad value stops start-up with a message that names its key.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_store()?;
        self.validate_limits()?;
        self.validate_tokens()?;
        self.validate_forward_auth()?;
        self.validate_traces()?;
        self.default_policy()?;
        Ok(())
    }

    fn validate_traces(&self) -> Result<(), ConfigError> {
        let t = &self.traces;
        if !(0.0..=1.0).contains(&t.sample_ratio) {
            return bad("traces.sample_ratio", "must be 0..=1".into());
        }
        if t.export_interval_ms.0 == 0 || t.export_interval_ms.0 > 3_600_000 {
            return bad("traces.export_interval_ms", "must be 1ms..=1h".into());
        }
        match &t.otlp_endpoint {
            Some(e) if !(e.starts_with("http://") || e.starts_with("https://")) => bad(
                "traces.otlp_endpoint",
                "must be an http:// or https:// URL (OTLP over HTTP)".into(),
            ),
            _ => Ok(()),
        }
    }

    fn validate_server(&self) -> Result<(), ConfigError> {
        if self.server.bind.parse::<SocketAddr>().is_err() {
            return bad(
                "server.bind",
                format!(
                    "{:?} is not an address such as 127.0.0.1:8080",
                    self.server.bind
                ),
            );
        }
        if let Some(g) = &self.server.grpc_bind {
            if g.parse::<SocketAddr>().is_err() {
                return bad(
                    "server.grpc_bind",
                    format!("{g:?} is not an address such as 127.0.0.1:8081"),
                );
            }
        }
        if self.grpc.client_key.is_empty() {
            return bad("grpc.client_key", "must not be empty".into());
        }
        if self.grpc.idle_timeout_ms.0 <= self.server.request_timeout_ms.0 {
            return bad(
                "grpc.idle_timeout_ms",
                "must be longer than server.request_timeout_ms (a call in flight is silent)".into(),
            );
        }
        if self.grpc.max_connections == 0 {
            return bad("grpc.max_connections", "must be at least 1".into());
        }
        if self.server.max_connections == 0 {
            return bad("server.max_connections", "must be at least 1".into());
        }
        if !(1024..=HEADER_BYTES_CEILING).contains(&self.server.max_header_bytes) {
            return bad(
                "server.max_header_bytes",
                format!("must be 1024..={HEADER_BYTES_CEILING}"),
            );
        }
        let slice = self.server.worker_slice_us as u128;
        let (min, max) = (
            crate::os::sched::MIN.as_micros(),
            crate::os::sched::MAX.as_micros(),
        );
        if slice != 0 && !(min..=max).contains(&slice) {
            return bad(
                "server.worker_slice_us",
                format!("must be 0 (the kernel's slice) or {min}..={max} (µs)"),
            );
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return bad("log.level", e.to_string());
        }
        self.validate_tls()
    }

    /// Both files or neither; whether they hold a usable pair is for start-up to find out
    /// (`crate::tls`), where the message names the file.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let t = &self.server.tls;
        match (&t.cert_file, &t.key_file) {
            (Some(_), None) => {
                return bad(
                    "server.tls.key_file",
                    "must be set with server.tls.cert_file (both or neither)".into(),
                )
            }
            (None, Some(_)) => {
                return bad(
                    "server.tls.cert_file",
                    "must be set with server.tls.key_file (both or neither)".into(),
                )
            }
            _ => {}
        }
        if !(100..=3_600_000).contains(&t.reload_interval_ms.0) {
            return bad("server.tls.reload_interval_ms", "must be 100ms..=1h".into());
        }
        Ok(())
    }

    fn validate_store(&self) -> Result<(), ConfigError> {
        let st = &self.store;
        if st.timeout_ms.is_some_and(|t| t.0 == 0) {
            return bad("store.timeout_ms", "must be more than 0".into());
        }
        // Only the scylla driver uses it; named here so the message names the setting.
        if st.kind == StoreKind::Scylla && st.request_timeout_ms.0 == 0 {
            return bad("store.request_timeout_ms", "must be more than 0".into());
        }
        if !(1..=1 << 20).contains(&st.cache_mb) {
            return bad("store.cache_mb", "must be 1..=1048576 (MiB)".into());
        }
        // The one keyspace rule, shared with `quotad migrate` and the store.
        if let Err(e) = crate::scylla::cql::validate_keyspace(&st.keyspace) {
            return bad("store.keyspace", e);
        }
        let max = crate::store::lease::MAX_SHARDS;
        if let Some(s) = st.shard.filter(|s| !(0..max).contains(s)) {
            return bad("store.shard", format!("{s} must be in 0..{max}"));
        }
        if st.kind == StoreKind::Scylla && st.nodes.is_empty() {
            return bad("store.nodes", "at least one host:port is needed".into());
        }
        if st.tls_cert_file.is_some() != st.tls_key_file.is_some() {
            return bad(
                "store.tls_cert_file",
                "tls_cert_file and tls_key_file go together".into(),
            );
        }
        if st.tls_ca_file.is_none() && (st.tls_cert_file.is_some() || st.tls_server_name.is_some())
        {
            return bad(
                "store.tls_ca_file",
                "TLS to the nodes needs the CA bundle their certificates chain to".into(),
            );
        }
        self.validate_fleet()
    }

    /// The lease heartbeat and lifetime: a lease must outlive a missed heartbeat, and CQL's
    /// TTL counts whole seconds.
    fn validate_fleet(&self) -> Result<(), ConfigError> {
        let f = &self.fleet;
        if f.heartbeat_ms.0 == 0 {
            return bad("fleet.heartbeat_ms", "must be more than 0".into());
        }
        if f.lease_ttl_ms.0 < 1_000 || f.lease_ttl_ms.0 < 2 * f.heartbeat_ms.0 {
            return bad(
                "fleet.lease_ttl_ms",
                "must be at least 1s and at least two heartbeats (fleet.heartbeat_ms)".into(),
            );
        }
        if f.clock_interval_ms.0 < 100 || f.clock_interval_ms.0 > 3_600_000 {
            return bad("fleet.clock_interval_ms", "must be 100 ms to 1 h".into());
        }
        if f.region_heartbeat_ms.0 == 0 {
            return bad("fleet.region_heartbeat_ms", "must be more than 0".into());
        }
        if f.region_stale_ms.0 < 2 * f.region_heartbeat_ms.0 {
            return bad(
                "fleet.region_stale_ms",
                "must be at least two region heartbeats (fleet.region_heartbeat_ms)".into(),
            );
        }
        Ok(())
    }

    /// Intervals and the limiter's memory bounds.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.sync.interval_ms.0 == 0 {
            return bad("sync.interval_ms", "must be more than 0".into());
        }
        if let Some(d) = self.sync.max_delay_ms {
            if d.0 < self.sync.interval_ms.0 || d.0 > 60_000 {
                return bad(
                    "sync.max_delay_ms",
                    "must be at least sync.interval_ms and at most 60s".into(),
                );
            }
        }
        if self
            .history
            .write_interval_ms
            .is_some_and(|w| w.0 == 0 || w.0 > 3_600_000)
        {
            return bad("history.write_interval_ms", "must be 1ms..=1h".into());
        }
        if self.quotas.refresh_ms.0 == 0 {
            return bad("quotas.refresh_ms", "must be more than 0".into());
        }
        if self.limiter.shards == 0 || self.limiter.shards > 65_536 {
            return bad("limiter.shards", "must be 1..=65536".into());
        }
        if self.limiter.max_counters == 0 {
            return bad("limiter.max_counters", "must be at least 1".into());
        }
        // A day: the embedded store keeps history by the day, and less would delete the day
        // being written.
        for (key, d) in [
            ("history.retention", self.history.retention),
            ("audit.retention", self.audit.retention),
        ] {
            // At most 100 years: "keep forever" must not wrap into a cut-off after now.
            if d.0 < 86_400_000 || d.0 > 100 * 366 * 86_400_000 {
                return bad(key, "must be 1d..=100y".into());
            }
        }
        for (key, n) in [
            (
                "limiter.max_clients_per_tenant",
                self.limiter.max_clients_per_tenant,
            ),
            (
                "limiter.max_open_holds_per_tenant",
                self.limiter.max_open_holds_per_tenant,
            ),
            ("limiter.max_open_holds", self.limiter.max_open_holds),
        ] {
            if n == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        Ok(())
    }

    /// For `quotad serve`: checks open (no check token) on an address beyond loopback stop
    /// start-up, unless `auth.open_checks` says something else guards the port. The other
    /// commands listen on nothing, so they do not ask.
    pub fn refuse_open_checks_beyond_loopback(&self) -> Result<(), ConfigError> {
        let a = &self.auth;
        let checks_need_token =
            !a.check_token.is_empty() || a.tokens.iter().any(|t| t.role == Role::Check);
        if !checks_need_token && !a.open_checks {
            let binds = std::iter::once(("server.bind", &self.server.bind)).chain(
                self.server
                    .grpc_bind
                    .iter()
                    .map(|g| ("server.grpc_bind", g)),
            );
            for (key, bind) in binds {
                if bind
                    .parse::<SocketAddr>()
                    .is_ok_and(|a| !a.ip().is_loopback())
                {
                    return bad(
                        key,
                        format!(
                            "{bind} is reachable beyond this machine and checks need no token: \
                             anyone who reaches it could spend any tenant's quota. Set \
                             auth.check_token (or a check token in auth.tokens), or \
                             auth.open_checks = true where something else guards the port"
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    fn validate_tokens(&self) -> Result<(), ConfigError> {
        let a = &self.auth;
        for (key, t) in [
            ("auth.admin_token", &a.admin_token),
            ("auth.check_token", &a.check_token),
        ] {
            if !t.is_empty() {
                if let Err(e) = super::tokens::check_strength(t.expose()) {
                    return bad(key, e);
                }
            }
        }
        let mut names = std::collections::HashSet::new();
        for (i, t) in self.auth.tokens.iter().enumerate() {
            let k = format!("auth.tokens[{i}]");
            // The audit log names the token that made each change: names must tell them apart.
            if !t.name.is_empty() {
                let printable = t.name.bytes().all(|b| (0x20..0x7f).contains(&b));
                if t.name.len() > 128 || !printable {
                    return bad(
                        &format!("{k}.name"),
                        "must be 1..=128 printable ASCII characters".into(),
                    );
                }
                let generated = ["admin-", "tenant_admin-", "check-"].iter().any(|p| {
                    t.name
                        .strip_prefix(p)
                        .is_some_and(|h| h.len() == 8 && h.bytes().all(|b| b.is_ascii_hexdigit()))
                });
                if ["admin_token", "check_token"].contains(&t.name.as_str()) || generated {
                    return bad(
                        &format!("{k}.name"),
                        format!("{:?} is the name quotad gives another token", t.name),
                    );
                }
                if !names.insert(t.name.as_str()) {
                    return bad(
                        &format!("{k}.name"),
                        format!("{:?} names another token too; names must be unique", t.name),
                    );
                }
            }
            match (t.hash.is_empty(), t.sha256.is_empty()) {
                (false, true) => {
                    if let Err(e) = super::tokens::TokenHash::parse(&t.hash) {
                        return bad(&format!("{k}.hash"), e);
                    }
                }
                (true, false) => {
                    if t.sha256.len() != 64 || hex::decode(&t.sha256).is_err() {
                        return bad(&format!("{k}.sha256"), "must be 64 hex digits".into());
                    }
                }
                _ => return bad(
                    &format!("{k}.hash"),
                    "exactly one of hash and sha256 is needed (quotad hash-token prints a hash)"
                        .into(),
                ),
            }
            match (&t.role, &t.tenants) {
                (Role::TenantAdmin, None) => {
                    return bad(
                        &format!("{k}.tenants"),
                        "a tenant_admin token needs tenants".into(),
                    )
                }
                (Role::Admin, Some(_)) => {
                    return bad(
                        &format!("{k}.tenants"),
                        "an admin token acts on every tenant; use tenant_admin to scope it".into(),
                    )
                }
                _ => {}
            }
            for tenant in t.tenants.iter().flatten() {
                if let Err(e) = crate::domain::TenantId::parse(tenant) {
                    return bad(&format!("{k}.tenants"), e.message);
                }
            }
        }
        Ok(())
    }

    fn validate_forward_auth(&self) -> Result<(), ConfigError> {
        let f = &self.forward_auth;
        for (key, name) in [
            ("forward_auth.tenant_header", Some(&f.tenant_header)),
            ("forward_auth.client_header", Some(&f.client_header)),
            ("forward_auth.cost_header", f.cost_header.as_ref()),
            ("forward_auth.token_header", Some(&f.token_header)),
        ] {
            let Some(name) = name else { continue };
            if actix_web::http::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return bad(key, format!("{name:?} is not a header name"));
            }
        }
        let mut sources = Vec::new();
        for name in &f.resource_from {
            let Some(s) = super::ResourceSource::parse(name) else {
                return bad(
                    "forward_auth.resource_from",
                    format!("{name:?} is not a source: \"original\" or \"forwarded\""),
                );
            };
            if sources.contains(&s) {
                return bad("forward_auth.resource_from", format!("{name:?} twice"));
            }
            sources.push(s);
        }
        if sources.is_empty() {
            return bad(
                "forward_auth.resource_from",
                "name at least one source: \"original\", \"forwarded\" or both, in order".into(),
            );
        }
        if !(400..=499).contains(&f.deny_status) {
            return bad(
                "forward_auth.deny_status",
                "must be a 4xx status (429, or 403 for nginx)".into(),
            );
        }
        Ok(())
    }

    /// The configured default policy, validated.
    pub fn default_policy(&self) -> Result<Option<Policy>, ConfigError> {
        self.quotas
            .default
            .as_ref()
            .map(|d| {
                Policy::from_doc(d, false)
                    .map_err(|e| ConfigError(format!("quotas.default.{}: {}", e.field, e.message)))
            })
            .transpose()
    }
}

/// A bad value: the key, and why.
fn bad(key: &str, why: String) -> Result<(), ConfigError> {
    Err(ConfigError(format!("{key}: {why}")))
}
