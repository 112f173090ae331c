//! Configuration: built-in defaults, then `config/default.toml` (if present), then the file
//! given with `--config`, then environment variables `QUOTAD__<SECTION>__<KEY>`.
//!
//! Every section refuses unknown keys and every value is checked, so a typo or a bad value
//! stops start-up with a message that names it. Durations read as `250ms`, `1s`, `10m` (a bare
//! number is milliseconds). Secrets never print: `Secret` shows `***` in logs and debug output.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer};

use crate::domain::{Policy, PolicyDoc};

/// A duration read from configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DurationMs(pub u64);

impl DurationMs {
    pub fn get(self) -> Duration {
        Duration::from_millis(self.0)
    }
}

impl<'de> Deserialize<'de> for DurationMs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = DurationMs;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a duration such as 250ms, 1s, 10m (or a number of milliseconds)")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<DurationMs, E> {
                Ok(DurationMs(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DurationMs, E> {
                u64::try_from(v)
                    .map(DurationMs)
                    .map_err(|_| E::custom("a duration cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DurationMs, E> {
                let v = v.trim();
                if let Ok(ms) = v.parse::<u64>() {
                    return Ok(DurationMs(ms));
                }
                humantime::parse_duration(v)
                    .map(|d| DurationMs(d.as_millis() as u64))
                    .map_err(|e| E::custom(format!("invalid duration {v:?}: {e}")))
            }
        }
        d.deserialize_any(V)
    }
}

/// A secret value that never prints.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_empty() { "\"\"" } else { "***" })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret)
    }
}

/// A comma-separated list in a string (as environment variables give it) or a list.
fn comma_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum L {
        S(String),
        V(Vec<String>),
    }
    Ok(match L::deserialize(d)? {
        L::S(s) => s
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        L::V(v) => v,
    })
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Listen address.
    pub bind: String,
    /// HTTP worker threads; 0 = one per core.
    pub workers: usize,
    /// A client must send its whole request head within this time.
    pub request_timeout_ms: DurationMs,
    /// Idle keep-alive connections close after this.
    pub keep_alive_ms: DurationMs,
    /// Most open connections per worker.
    pub max_connections: usize,
    /// In-flight requests get this long to finish at shutdown.
    pub shutdown_timeout_ms: DurationMs,
    /// Most bytes of request header fields, counted as `name: value\r\n` each; more gets 431.
    pub max_header_bytes: usize,
}

/// The most `server.max_header_bytes` may be: actix-http refuses a request head (request line and
/// header fields) of 128 KiB or more by itself, with a bare 431, before quotad sees it.
pub const HEADER_BYTES_CEILING: usize = 128 * 1024;

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            bind: "127.0.0.1:8080".into(),
            workers: 0,
            request_timeout_ms: DurationMs(5_000),
            keep_alive_ms: DurationMs(5_000),
            max_connections: 25_000,
            shutdown_timeout_ms: DurationMs(10_000),
            max_header_bytes: 16 * 1024,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Embedded,
    Scylla,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StoreSettings {
    pub kind: StoreKind,
    /// Directory of the embedded store.
    pub path: PathBuf,
    /// Page cache of the embedded store, MiB.
    pub cache_mb: usize,
    /// Cassandra/Scylla contact points, `host:port`.
    #[serde(deserialize_with = "comma_list")]
    pub nodes: Vec<String>,
    pub keyspace: String,
    /// Deadline of a store call on the check path (first touch of a key, strict mode).
    pub timeout_ms: DurationMs,
    /// Cassandra/Scylla driver timeout of one request (sync batches included). A counter write
    /// that runs out of it is uncertain and never resent.
    pub request_timeout_ms: DurationMs,
    /// Cassandra/Scylla consistency level, e.g. `local_quorum`, `quorum`, `one`.
    pub consistency: String,
    /// This instance's write shard (0..shards); give every instance of a fleet its own.
    pub shard: i16,
    /// How many write shards a counter is spread over (readers sum them).
    pub shards: i16,
    /// Replication of the keyspace `quotad migrate` creates (a CQL map).
    pub replication: String,
    /// The local datacenter (set it with several: LOCAL_QUORUM is local to the coordinator).
    pub local_dc: Option<String>,
    /// Password authentication to Cassandra/Scylla, when both are set.
    pub username: Option<String>,
    pub password: Option<Secret>,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            kind: StoreKind::Embedded,
            path: PathBuf::from("./data"),
            cache_mb: 256,
            nodes: vec!["127.0.0.1:9042".into()],
            keyspace: "quota".into(),
            timeout_ms: DurationMs(50),
            request_timeout_ms: DurationMs(2_000),
            consistency: "local_quorum".into(),
            shard: 0,
            shards: 1,
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
            local_dc: None,
            username: None,
            password: None,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthSettings {
    /// Bearer token for the admin API; a random one is made (and logged once) when empty and
    /// no `admin` entry is in `tokens`.
    pub admin_token: Secret,
    /// Bearer token for `/v1/check`; empty (and no `check` entry in `tokens`) = checks need none.
    pub check_token: Secret,
    /// Tokens with a role and optionally a tenant scope, stored as SHA-256 hashes
    /// (`quotad hash-token` prints one).
    pub tokens: Vec<TokenSettings>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Everything, for every tenant.
    Admin,
    /// Manage and read the listed tenants' quotas and usage (and check them).
    TenantAdmin,
    /// Call `/v1/check` for the listed tenants (all when none are listed).
    Check,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSettings {
    /// A name for logs (never the token).
    #[serde(default)]
    pub name: String,
    /// Hex SHA-256 of the token.
    pub sha256: String,
    pub role: Role,
    /// The tenants this token may act on; required for `tenant_admin`, optional for `check`.
    #[serde(default)]
    pub tenants: Option<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyncSettings {
    /// How often admitted hits are written to the store.
    pub interval_ms: DurationMs,
    /// Deadline of one sync write or read.
    pub timeout_ms: DurationMs,
    /// How often the janitor deletes expired buckets.
    pub janitor_interval_ms: DurationMs,
    /// How long shutdown keeps trying to write pending hits.
    pub drain_timeout_ms: DurationMs,
}

impl Default for SyncSettings {
    fn default() -> Self {
        Self {
            interval_ms: DurationMs(250),
            timeout_ms: DurationMs(5_000),
            janitor_interval_ms: DurationMs(60_000),
            drain_timeout_ms: DurationMs(10_000),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaSettings {
    /// A policy change made elsewhere is enforced here within this time.
    pub refresh_ms: DurationMs,
    /// The policy of tenants that have none of their own (none: such tenants get 404).
    pub default: Option<PolicyDoc>,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            refresh_ms: DurationMs(1_000),
            default: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimiterSettings {
    /// Lock shards of the in-memory counters.
    pub shards: usize,
    /// Counters untouched this long leave memory (and are re-read from the store on next use).
    pub idle_ms: DurationMs,
    /// Most counters (key x limit) held in memory; checks needing more go to the store.
    pub max_counters: usize,
    /// Most distinct clients of one tenant held in memory; the same beyond it.
    pub max_clients_per_tenant: usize,
}

impl Default for LimiterSettings {
    fn default() -> Self {
        Self {
            shards: 64,
            idle_ms: DurationMs(60_000),
            max_counters: 1_000_000,
            max_clients_per_tenant: 100_000,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// Adds `quotad_tenant_checks_total{tenant,decision}`. Off by default: one series per tenant.
    pub tenant_labels: bool,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogSettings {
    /// A tracing filter, e.g. `info` or `quotad=debug,info`.
    pub level: String,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            level: "info".into(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    pub server: ServerSettings,
    pub store: StoreSettings,
    pub auth: AuthSettings,
    pub sync: SyncSettings,
    pub quotas: QuotaSettings,
    pub limiter: LimiterSettings,
    pub metrics: MetricsSettings,
    pub log: LogSettings,
}

#[derive(Debug, thiserror::Error)]
#[error("configuration: {0}")]
pub struct ConfigError(pub String);

/// The file read first when it exists (relative to the working directory).
pub const DEFAULT_FILE: &str = "config/default.toml";

impl Settings {
    /// Loads the layers; `file` is the `--config` argument.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_from(file, std::env::vars())
    }

    /// As `load`, with the environment given (tests).
    pub fn load_from(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let mut b = config::Config::builder();
        if Path::new(DEFAULT_FILE).exists() {
            b = b.add_source(config::File::from(Path::new(DEFAULT_FILE)).required(true));
        }
        if let Some(f) = file {
            if !f.exists() {
                return Err(ConfigError(format!(
                    "config file {} does not exist",
                    f.display()
                )));
            }
            b = b.add_source(config::File::from(f).required(true));
        }
        let vars: config::Map<String, String> = env
            .into_iter()
            .filter(|(k, _)| k.starts_with("QUOTAD__"))
            .collect();
        b = b.add_source(
            config::Environment::with_prefix("QUOTAD")
                .separator("__")
                .source(Some(vars)),
        );
        let c = b.build().map_err(|e| ConfigError(e.to_string()))?;
        let s: Settings = c
            .try_deserialize()
            .map_err(|e| ConfigError(e.to_string()))?;
        s.validate()?;
        Ok(s)
    }

    /// Checks what deserializing cannot: ranges, addresses, names, tokens, the default policy.
    /// The first bad value stops start-up with a message that names its key.
    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_server()?;
        self.validate_store()?;
        self.validate_limits()?;
        self.validate_tokens()?;
        self.default_policy()?;
        Ok(())
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
        if self.server.max_connections == 0 {
            return bad("server.max_connections", "must be at least 1".into());
        }
        if !(1024..=HEADER_BYTES_CEILING).contains(&self.server.max_header_bytes) {
            return bad(
                "server.max_header_bytes",
                format!("must be 1024..={HEADER_BYTES_CEILING}"),
            );
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return bad("log.level", e.to_string());
        }
        Ok(())
    }

    fn validate_store(&self) -> Result<(), ConfigError> {
        let st = &self.store;
        if st.timeout_ms.0 == 0 {
            return bad("store.timeout_ms", "must be more than 0".into());
        }
        // Only the scylla driver uses it; named here so the message names the setting.
        if st.kind == StoreKind::Scylla && st.request_timeout_ms.0 == 0 {
            return bad("store.request_timeout_ms", "must be more than 0".into());
        }
        if !(1..=1 << 20).contains(&st.cache_mb) {
            return bad("store.cache_mb", "must be 1..=1048576 (MiB)".into());
        }
        let ks = &st.keyspace;
        if ks.is_empty()
            || ks.len() > 48
            || !ks.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
            || !ks.as_bytes()[0].is_ascii_alphabetic()
        {
            return bad(
                "store.keyspace",
                format!("{ks:?} must be 1 to 48 letters, digits or _, starting with a letter"),
            );
        }
        if st.shards < 1 || st.shard < 0 || st.shard >= st.shards {
            return bad(
                "store.shard",
                format!(
                    "shard {} must be in 0..store.shards ({})",
                    st.shard, st.shards
                ),
            );
        }
        if st.kind == StoreKind::Scylla && st.nodes.is_empty() {
            return bad("store.nodes", "at least one host:port is needed".into());
        }
        Ok(())
    }

    /// Intervals and the limiter's memory bounds.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        if self.sync.interval_ms.0 == 0 {
            return bad("sync.interval_ms", "must be more than 0".into());
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
        if self.limiter.max_clients_per_tenant == 0 {
            return bad(
                "limiter.max_clients_per_tenant",
                "must be at least 1".into(),
            );
        }
        Ok(())
    }

    fn validate_tokens(&self) -> Result<(), ConfigError> {
        for (i, t) in self.auth.tokens.iter().enumerate() {
            let k = format!("auth.tokens[{i}]");
            if t.sha256.len() != 64 || hex::decode(&t.sha256).is_err() {
                return bad(
                    &format!("{k}.sha256"),
                    "must be 64 hex digits (quotad hash-token prints them)".into(),
                );
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

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
                ("QUOTAD__AUTH__ADMIN_TOKEN", "s3cret"),
                ("QUOTAD__AUTH__CHECK_TOKEN", "c"),
                ("QUOTAD__SYNC__INTERVAL_MS", "500"),
                ("QUOTAD_TEST_SCYLLA_NODES", "ignored: single underscore"),
            ]),
        )
        .unwrap();
        assert_eq!(s.server.bind, "127.0.0.1:18080");
        assert_eq!(s.store.kind, StoreKind::Scylla);
        assert_eq!(s.store.nodes, vec!["10.0.0.1:9042", "10.0.0.2:9042"]);
        assert_eq!(s.auth.admin_token.expose(), "s3cret");
        assert_eq!(s.sync.interval_ms, DurationMs(500));
        assert!(!format!("{s:?}").contains("s3cret"), "secret printed");
    }

    #[test]
    fn the_header_limit_defaults_to_16_kib_and_reads_from_the_environment() {
        let s = Settings::load_from(None, env(&[])).unwrap();
        assert_eq!(s.server.max_header_bytes, 16_384);
        let s = Settings::load_from(None, env(&[("QUOTAD__SERVER__MAX_HEADER_BYTES", "8192")]))
            .unwrap();
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
                ("QUOTAD__SERVER__MAX_HEADER_BYTES", "1MiB"),
                "max_header_bytes",
            ),
            (("QUOTAD__STORE__KIND", "redis"), "redis"),
            (("QUOTAD__SYNC__INTERVAL_MS", "soon"), "soon"),
            (("QUOTAD__NOPE__X", "1"), "nope"),
            (("QUOTAD__STORE__KEYSPACE", "bad-name"), "store.keyspace"),
            (("QUOTAD__LOG__LEVEL", "=[="), "log.level"),
            (("QUOTAD__STORE__CACHE_MB", "0"), "store.cache_mb"),
            (
                ("QUOTAD__LIMITER__MAX_COUNTERS", "0"),
                "limiter.max_counters",
            ),
            (
                ("QUOTAD__LIMITER__MAX_CLIENTS_PER_TENANT", "0"),
                "limiter.max_clients_per_tenant",
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
            (
                &format!("sha256 = \"{h}\"\nrole = \"tenant_admin\""),
                "auth.tokens[0].tenants",
            ),
            (&format!("sha256 = \"{h}\"\nrole = \"root\""), "root"),
            (
                &format!("sha256 = \"{h}\"\nrole = \"check\"\ntenants = [\"a b\"]"),
                "auth.tokens[0].tenants",
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
        let s =
            Settings::load_from(Some(&f), env(&[("QUOTAD__SERVER__BIND", "127.0.0.1:1")])).unwrap();
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
}
