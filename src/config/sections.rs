//! The sections of the configuration and their built-in defaults.
//!
//! The `Default` impls are the source of every default: `config/default.toml` spells the same
//! values out for operators, and a test holds the two equal.

use std::path::PathBuf;

use serde::Deserialize;

use super::values::comma_list;
use super::{DurationMs, Secret};
use crate::domain::PolicyDoc;

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerSettings {
    /// Listen address.
    pub bind: String,
    /// HTTP worker threads; 0 = one per core.
    pub workers: usize,
    /// A client must send its whole request head within this time, and then its whole body
    /// within as long again (408 past it), so that a body that never comes holds nothing.
    pub request_timeout_ms: DurationMs,
    /// Idle keep-alive connections close after this.
    pub keep_alive_ms: DurationMs,
    /// Most open connections per worker.
    pub max_connections: usize,
    /// In-flight requests get this long to finish at shutdown.
    pub shutdown_timeout_ms: DurationMs,
    /// Most bytes of request header fields, counted as `name: value\r\n` each; more gets 431.
    pub max_header_bytes: usize,
    /// Where Envoy's rate limit service (gRPC) listens; unset: not served.
    pub grpc_bind: Option<String>,
    /// The time slice each HTTP worker asks of the scheduler, in µs (Linux 6.12 and later,
    /// `crate::os::sched`); 0: the kernel's own.
    pub worker_slice_us: u64,
    /// TLS on the HTTP port and the gRPC port; off (plain text) unless both files are set.
    pub tls: TlsSettings,
}

/// `[server.tls]`: one certificate for both of quotad's ports, read again when its files
/// change (`crate::tls`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM: the server's certificate first, then any intermediates.
    pub cert_file: Option<PathBuf>,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// How often both files are read again, and swapped in when they changed.
    pub reload_interval_ms: DurationMs,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            cert_file: None,
            key_file: None,
            // Reading two files of a few KiB costs nothing at this pace, and it adds at most
            // 10 s to the time a renewed certificate (cert-manager, kubelet's secret sync of
            // about a minute) takes to reach new connections.
            reload_interval_ms: DurationMs(10_000),
        }
    }
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
            grpc_bind: None,
            worker_slice_us: 100,
            tls: TlsSettings::default(),
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
    /// Deadline of a store call on the check path (first touch of a key, strict mode). Unset:
    /// [`StoreSettings::check_timeout`] picks one for the store's kind.
    pub timeout_ms: Option<DurationMs>,
    /// Cassandra/Scylla driver timeout of one request (sync batches included). A counter write
    /// that runs out of it is in doubt until read back (`tasks::doubts`, which waits this long); longer than the server's own write
    /// and read timeouts (5 s by default), so that a slow node answers for itself.
    pub request_timeout_ms: DurationMs,
    /// Cassandra/Scylla consistency level, e.g. `local_quorum`, `quorum`, `one`.
    pub consistency: String,
    /// Cassandra/Scylla: most requests one store call keeps in flight (a sync round's client
    /// batches, a read's queries).
    pub max_concurrency: usize,
    /// Pins this instance to one write shard (0..256). Unset (the default): it claims any free
    /// shard through the store. A pin that a live instance holds stops start-up.
    pub shard: Option<i16>,
    /// Replication of the keyspace `quotad migrate` creates (a CQL map).
    pub replication: String,
    /// The local datacenter (set it with several: LOCAL_QUORUM is local to the coordinator).
    pub local_dc: Option<String>,
    /// Password authentication to Cassandra/Scylla, when both are set.
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// The same, read from files at start (a mounted Kubernetes Secret); one trailing newline
    /// is dropped. Each excludes its inline form.
    pub username_file: Option<PathBuf>,
    pub password_file: Option<PathBuf>,
    /// TLS to the nodes: the PEM bundle of the CAs their certificates chain to. Set: every
    /// connection is TLS; unset: plain text.
    pub tls_ca_file: Option<PathBuf>,
    /// quotad's client certificate chain and its key (PEM), for nodes that require one.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// Each node's certificate must name the node (its address, or `tls_server_name`).
    pub tls_verify_hostname: bool,
    /// The DNS name every node's certificate carries, checked instead of the node's address.
    pub tls_server_name: Option<String>,
}

impl Default for StoreSettings {
    fn default() -> Self {
        Self {
            kind: StoreKind::Embedded,
            path: PathBuf::from("./data"),
            cache_mb: 256,
            nodes: vec!["127.0.0.1:9042".into()],
            keyspace: "quota".into(),
            timeout_ms: None,
            request_timeout_ms: DurationMs(6_000),
            consistency: "local_quorum".into(),
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            shard: None,
            replication: "{'class': 'SimpleStrategy', 'replication_factor': 1}".into(),
            local_dc: None,
            username: None,
            password: None,
            username_file: None,
            password_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            tls_verify_hostname: true,
            tls_server_name: None,
        }
    }
}

/// `store.max_concurrency` by default.
pub const DEFAULT_MAX_CONCURRENCY: usize = 32;

/// The check path's store deadline when `store.timeout_ms` is unset, by store kind: the
/// embedded store answers in microseconds, so 50 ms only ever cuts off a stuck disk; a
/// Cassandra/ScyllaDB node answers in milliseconds but pauses for tens to hundreds (garbage
/// collection, compaction, a busy machine), and a check cut off by a pause is decided by
/// `on_store_failure` while the store is healthy.
pub const EMBEDDED_CHECK_TIMEOUT_MS: u64 = 50;
pub const SCYLLA_CHECK_TIMEOUT_MS: u64 = 1_000;
/// `sync.max_delay_ms` when unset on a Cassandra/ScyllaDB store: a counter far from its limit
/// is written (and, in a fleet, read back) every 2 s instead of every round. On the embedded
/// store it is the sync interval (every round: its writes are local and cheap).
pub const SCYLLA_MAX_SYNC_DELAY_MS: u64 = 2_000;

impl StoreSettings {
    /// The deadline of a store call on the check path: `timeout_ms`, or the kind's default.
    pub fn check_timeout(&self) -> std::time::Duration {
        let ms = self.timeout_ms.map_or(
            match self.kind {
                StoreKind::Embedded => EMBEDDED_CHECK_TIMEOUT_MS,
                StoreKind::Scylla => SCYLLA_CHECK_TIMEOUT_MS,
            },
            |t| t.0,
        );
        std::time::Duration::from_millis(ms)
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyncSettings {
    /// How often admitted hits are written to the store.
    pub interval_ms: DurationMs,
    /// The longest admitted hits of a counter wait before they are written when nothing
    /// presses for sooner: what a crash (SIGKILL) can lose. Unset: the interval on the embedded
    /// store, [`SCYLLA_MAX_SYNC_DELAY_MS`] on Cassandra/ScyllaDB.
    pub max_delay_ms: Option<DurationMs>,
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
            max_delay_ms: None,
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
    /// Most open reservations (holds) of one tenant taken on this instance; a reserving check
    /// beyond it is refused (429 `resource_exhausted`).
    pub max_open_holds_per_tenant: usize,
    /// Most open reservations of all tenants together taken on this instance.
    pub max_open_holds: usize,
}

impl Default for LimiterSettings {
    fn default() -> Self {
        Self {
            shards: 64,
            idle_ms: DurationMs(60_000),
            max_counters: 1_000_000,
            max_clients_per_tenant: 100_000,
            max_open_holds_per_tenant: 100_000,
            max_open_holds: 1_000_000,
        }
    }
}

/// Fleet membership on the scylla store (`crate::tasks::fleet`).
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetSettings {
    /// How often an instance renews its shard lease and reads who else is live.
    pub heartbeat_ms: DurationMs,
    /// How long a lease lives unrenewed: a killed instance leaves N this long after it died.
    pub lease_ttl_ms: DurationMs,
    /// How often an instance writes its region's heartbeat and reads the others'.
    pub region_heartbeat_ms: DurationMs,
    /// Another region's heartbeat older than this, as read here, means the region is cut off
    /// (or its writes lag this far behind): counters keep to their region's budget.
    pub region_stale_ms: DurationMs,
    /// How often an instance reads the store's clock, on which every instance cuts its
    /// buckets (`crate::tasks::clock`).
    pub clock_interval_ms: DurationMs,
    /// A host clock further than this from the store's is logged and alerted on (it is
    /// corrected for counting, but not for the rest of the host).
    pub clock_warn_ms: DurationMs,
}

impl Default for FleetSettings {
    fn default() -> Self {
        Self {
            heartbeat_ms: DurationMs(1_000),
            lease_ttl_ms: DurationMs(5_000),
            region_heartbeat_ms: DurationMs(250),
            region_stale_ms: DurationMs(1_000),
            clock_interval_ms: DurationMs(5_000),
            clock_warn_ms: DurationMs(100),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSettings {
    /// Adds `quotad_tenant_checks_total{tenant,decision}`. Off by default: one series per tenant.
    pub tenant_labels: bool,
}

/// OpenTelemetry traces (src/traces.rs): off unless an endpoint is set.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracesSettings {
    /// The OTLP/HTTP traces endpoint, e.g. `http://otel-collector:4318/v1/traces`.
    pub otlp_endpoint: Option<String>,
    /// The share of new traces recorded, 0 to 1; a caller's sampled trace is always continued.
    pub sample_ratio: f64,
    /// How often recorded spans are sent.
    pub export_interval_ms: DurationMs,
}

impl Default for TracesSettings {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            sample_ratio: 0.01,
            export_interval_ms: DurationMs(5_000),
        }
    }
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

/// Usage history (`crate::history`): how long its hourly and daily points are kept.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HistorySettings {
    /// Points older than this are deleted by the janitor, a whole day (embedded) or month
    /// (scylla) at a time.
    pub retention: DurationMs,
    /// How often the answers summed in memory are written, at the next sync round: a row per
    /// active client each time, so this (not the request rate) sets the history's write load.
    /// Unset: [`EMBEDDED_HISTORY_INTERVAL_MS`] or [`SCYLLA_HISTORY_INTERVAL_MS`].
    pub write_interval_ms: Option<DurationMs>,
}

/// `history.write_interval_ms` when unset: every second on the embedded store; every 10 s on
/// Cassandra/ScyllaDB, where a client's line is several counter updates (its hourly and
/// daily points and the day's client index) and, written every second, cost the node more
/// than the limits' own counters.
pub const EMBEDDED_HISTORY_INTERVAL_MS: u64 = 1_000;
pub const SCYLLA_HISTORY_INTERVAL_MS: u64 = 10_000;

impl Default for HistorySettings {
    fn default() -> Self {
        Self {
            retention: DurationMs(400 * DAY_MS),
            write_interval_ms: None,
        }
    }
}

/// The audit log: how long its entries are kept.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditSettings {
    /// Entries older than this are deleted by the janitor (whole months on the scylla store).
    pub retention: DurationMs,
}

impl Default for AuditSettings {
    fn default() -> Self {
        Self {
            retention: DurationMs(730 * DAY_MS),
        }
    }
}

const DAY_MS: u64 = 86_400_000;

/// `/v1/forward-auth`: where a proxy's subrequest carries the tenant, the client, the cost and
/// the original request, and what a denial answers. Whatever quotad reads here, the proxy must
/// set itself: a header the caller sent and the proxy passed on is the caller's to choose.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForwardAuthSettings {
    /// The request header naming the tenant.
    pub tenant_header: String,
    /// The request header naming the client.
    pub client_header: String,
    /// The request header with the cost; unset (the default): every request costs 1 and no
    /// header is read, since the shipped proxy setups pass their callers' headers on and a
    /// caller would pick its own cost (0 to pass for ever, a tenant's whole budget to deny
    /// everyone else). Set it only where the proxy itself sets or clears that header.
    pub cost_header: Option<String>,
    /// Where the original request's method and URI are read, in order: `original`
    /// (`X-Original-Method` + `X-Original-URI`, as the nginx example sets them) and `forwarded`
    /// (`X-Forwarded-Method` + `X-Forwarded-Uri`, as Traefik sets them). The first source with
    /// either header present is used, both of its headers together, never one from each.
    #[serde(deserialize_with = "comma_list")]
    pub resource_from: Vec<String>,
    /// The request header with a check token, when check tokens are configured (the
    /// `Authorization` header of a forwarded request is the end user's, not the proxy's).
    pub token_header: String,
    /// The status of a denial: 429, or 403 for nginx's `auth_request`, which passes on only
    /// 401 and 403 (map it back to 429 with `error_page`).
    pub deny_status: u16,
}

impl Default for ForwardAuthSettings {
    fn default() -> Self {
        Self {
            tenant_header: "X-Quota-Tenant".into(),
            client_header: "X-Quota-Client".into(),
            cost_header: None,
            resource_from: vec!["original".into(), "forwarded".into()],
            token_header: "X-Quota-Token".into(),
            deny_status: 429,
        }
    }
}

/// A pair of headers in which a proxy names the original request's method and URI
/// (`forward_auth.resource_from`): read as a pair, so that the method of one request and the
/// path of another are never put together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResourceSource {
    /// `X-Original-Method` + `X-Original-URI` (nginx, as the example sets them).
    Original,
    /// `X-Forwarded-Method` + `X-Forwarded-Uri` (Traefik's ForwardAuth).
    Forwarded,
}

impl ResourceSource {
    /// As `forward_auth.resource_from` names it.
    pub fn parse(name: &str) -> Option<ResourceSource> {
        match name {
            "original" => Some(ResourceSource::Original),
            "forwarded" => Some(ResourceSource::Forwarded),
            _ => None,
        }
    }

    /// The method header and the URI header, in lower case.
    pub fn headers(self) -> (&'static str, &'static str) {
        match self {
            ResourceSource::Original => ("x-original-method", "x-original-uri"),
            ResourceSource::Forwarded => ("x-forwarded-method", "x-forwarded-uri"),
        }
    }
}

/// Envoy's rate limit service (`server.grpc_bind`): how a descriptor names its client.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcSettings {
    /// The descriptor entry whose key is this is the client (e.g. `remote_address`, or a
    /// header's descriptor key); the other entries, in order, are the resource.
    pub client_key: String,
    /// Usage reported after the work, as Envoy AI Gateway does: a request with `hits_addend`
    /// 0 checks and takes nothing; one above 0 (the tokens a stream used, at its end) is
    /// charged whatever the limits have left. Off: every call is a check, 0 meaning 1.
    pub usage_after_the_fact: bool,
    /// A connection that neither sends nor is sent a byte for this long is closed (one that
    /// sends nothing, half a preface, or opens no stream); longer than a call may take.
    pub idle_timeout_ms: DurationMs,
    /// Most gRPC connections open at once; one past it is closed as soon as it is accepted.
    pub max_connections: usize,
}

impl Default for GrpcSettings {
    fn default() -> Self {
        Self {
            client_key: "client".into(),
            usage_after_the_fact: false,
            idle_timeout_ms: DurationMs(15_000),
            max_connections: 4_096,
        }
    }
}
