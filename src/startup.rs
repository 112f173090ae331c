//! Wiring: builds the store, the limiter, the policy cache, the background tasks and the HTTP
//! server from `Settings`. Tests use the same path with `server.bind = 127.0.0.1:0`.

use std::net::TcpListener;
use std::sync::Arc;

use actix_web::dev::{Server, ServerHandle};
use actix_web::{middleware, web, App};
use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::{Clock, FleetClock};
use crate::config::{Role, Settings, StoreKind};
use crate::http::{self, AppState, Auth};
use crate::limiter::{Limiter, LimiterConfig, Membership};
use crate::metrics::Metrics;
use crate::policy::PolicyCache;
use crate::scylla::store::{parse_consistency, ScyllaOptions, ScyllaStore};
use crate::store::embedded::EmbeddedStore;
use crate::store::DynStore;
use crate::tasks::clock::ClockTask;
use crate::tasks::fleet::{Fleet, FleetConfig};
use crate::tasks::retention::{Retention, RetentionConfig};
use crate::tasks::sync::{SyncConfig, Syncer};
use crate::tls::{Certificate, TlsFiles};

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StartError(pub String);

/// Opens the store the settings name.
pub async fn open_store(settings: &Settings) -> Result<DynStore, StartError> {
    match settings.store.kind {
        StoreKind::Embedded => {
            let s =
                EmbeddedStore::open_with_cache(&settings.store.path, settings.store.cache_mb << 20)
                    .map_err(|e| StartError(format!("embedded store: {e}")))?;
            tracing::info!(path = %s.path().display(), "embedded store open");
            Ok(Arc::new(s))
        }
        StoreKind::Scylla => {
            let opts = scylla_options(settings)?;
            let s = ScyllaStore::connect(opts)
                .await
                .map_err(|e| StartError(format!("scylla store: {e}")))?;
            tracing::info!("scylla store connected");
            Ok(Arc::new(s))
        }
    }
}

/// The scylla store's options from the `store` section.
pub fn scylla_options(settings: &Settings) -> Result<ScyllaOptions, StartError> {
    let st = &settings.store;
    let opts = ScyllaOptions {
        nodes: st.nodes.clone(),
        keyspace: st.keyspace.clone(),
        consistency: parse_consistency(&st.consistency)
            .map_err(|e| StartError(format!("store.consistency: {e}")))?,
        request_timeout: st.request_timeout_ms.get(),
        replication: st.replication.clone(),
        local_dc: st.local_dc.clone(),
        username: st.username.clone(),
        password: st.password.as_ref().map(|p| p.expose().to_owned()),
        tls: match &st.tls_ca_file {
            None => None,
            Some(ca) => Some(
                crate::scylla::cql::StoreTls::load(&crate::scylla::cql::TlsFiles {
                    ca_file: ca.clone(),
                    client_cert: st.tls_cert_file.clone().zip(st.tls_key_file.clone()),
                    verify_hostname: st.tls_verify_hostname,
                    server_name: st.tls_server_name.clone(),
                })
                .map_err(|e| StartError(format!("store.{e}")))?,
            ),
        },
        max_concurrency: st.max_concurrency,
        ..ScyllaOptions::default()
    };
    opts.validate()
        .map_err(|e| StartError(format!("store.{e}")))?;
    Ok(opts)
}

pub struct Application {
    port: u16,
    /// The gRPC rate limit service: its port, its stop signal, its task.
    grpc: Option<GrpcServer>,
    /// `server.shutdown_timeout_ms`: how long calls in flight get at shutdown.
    shutdown_grace: std::time::Duration,
    server: Server,
    admin_token: String,
    shutdown: watch::Sender<bool>,
    sync: JoinHandle<u64>,
    refresh: JoinHandle<()>,
    /// The janitor of old history and audit entries: awaited at shutdown, so that nothing holds
    /// the store once `run_until_stopped` returns (the embedded store's file is then free).
    retention: JoinHandle<()>,
    /// The fleet heartbeat (scylla store), told to release the lease after the drain.
    fleet: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    /// OpenTelemetry traces: their last spans are sent at shutdown.
    traces: Option<Arc<crate::traces::Traces>>,
    /// The reloader of the TLS certificate (`server.tls`), stopped with the other tasks.
    tls: Option<JoinHandle<()>>,
    /// The expiry of holds nobody ended.
    expiry: JoinHandle<()>,
    /// The readings of the store's clock (`tasks::clock`).
    clock: JoinHandle<()>,
}

impl Application {
    /// Builds everything with the system clock and the configured store.
    pub async fn build(settings: Settings) -> Result<Self, StartError> {
        settings
            .refuse_open_checks_beyond_loopback()
            .map_err(|e| StartError(e.to_string()))?;
        let store = open_store(&settings).await?;
        // Buckets are cut on the store's clock once it is read (`tasks::clock`).
        Self::build_with(settings, store, Arc::new(FleetClock::system())).await
    }

    /// Builds with a given store and clock (tests: failing stores, shared stores).
    pub async fn build_with(
        settings: Settings,
        store: DynStore,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StartError> {
        let metrics = Arc::new(Metrics::new(settings.metrics.tenant_labels));
        let tls = tls_certificate(&settings, &metrics)?;
        let fleet = join_fleet(&settings, &store, &metrics).await?;
        let membership = fleet
            .as_ref()
            .map_or_else(|| Arc::new(Membership::alone()), Fleet::membership);
        // The fleet's time, read before the first check (a clock of tests' is left alone).
        let mut clock_task = ClockTask::new(
            store.clone(),
            clock.clone(),
            membership.clone(),
            metrics.clone(),
            settings.fleet.clock_interval_ms.get(),
            i64::try_from(settings.fleet.clock_warn_ms.get().as_millis()).unwrap_or(i64::MAX),
        );
        clock_task.start().await;
        let limiter = Arc::new(Limiter::new(
            store.clone(),
            clock.clone(),
            metrics.clone(),
            limiter_config(&settings, membership.clone()),
        ));
        let default_policy = settings
            .default_policy()
            .map_err(|e| StartError(e.to_string()))?;
        let policies = Arc::new(PolicyCache::new(store.clone(), default_policy));
        policies
            .reload(true)
            .await
            .map_err(|e| StartError(format!("loading policies: {e}")))?;

        let admin_token = admin_token(&settings);
        let auth = Auth::new(
            &admin_token,
            settings.auth.check_token.expose(),
            &settings.auth.tokens,
            metrics.clone(),
        );
        let traces = crate::traces::Traces::start(&settings.traces, settings.metrics.tenant_labels)
            .map_err(StartError)?
            .map(Arc::new);
        let checks = Arc::new(crate::checks::CheckService::new(
            limiter.clone(),
            policies.clone(),
            metrics.clone(),
            traces.clone(),
        ));
        let holds = Arc::new(crate::holds::HoldService::new(
            limiter.clone(),
            policies.clone(),
            store.clone(),
            metrics.clone(),
            (
                settings.limiter.max_open_holds_per_tenant,
                settings.limiter.max_open_holds,
            ),
        ));
        let state = AppState {
            checks,
            holds: holds.clone(),
            limiter: limiter.clone(),
            policies: policies.clone(),
            store: store.clone(),
            metrics: metrics.clone(),
            auth: Arc::new(auth),
            store_timeout: settings.store.check_timeout(),
            request_timeout: settings.server.request_timeout_ms.get(),
            fleet: membership,
            forward_auth: Arc::new(http::ForwardAuth::new(&settings.forward_auth)),
            traces: traces.clone(),
        };
        let grpc = match &settings.server.grpc_bind {
            Some(bind) => Some(grpc_server(
                bind,
                state.clone(),
                &settings.grpc,
                tls.as_ref().map(Certificate::grpc_acceptor),
            )?),
            None => None,
        };
        let (server, port) =
            http_server(&settings, state, tls.as_ref().map(Certificate::http_config))?;

        let (shutdown, rx) = watch::channel(false);
        let syncer = Syncer::new(
            limiter,
            store.clone(),
            metrics.clone(),
            sync_config(&settings),
        )
        .with_traces(traces.clone());
        let sync = tokio::spawn(syncer.run(rx.clone()));
        let retention = Retention::new(store.clone(), clock, metrics, retention_config(&settings));
        let retention = tokio::spawn(retention.run(rx.clone()));
        let tls_on = tls.is_some();
        let tls = tls.map(|c| {
            tokio::spawn(c.watch(settings.server.tls.reload_interval_ms.get(), rx.clone()))
        });
        let expiry = tokio::spawn(crate::tasks::holds::run(holds, rx.clone()));
        let clock_task = tokio::spawn(clock_task.run(rx.clone()));
        let refresh = tokio::spawn(policies.run(settings.quotas.refresh_ms.get(), rx));
        let fleet = fleet.map(|f| {
            let (leave, rx) = watch::channel(false);
            (leave, tokio::spawn(f.run(rx)))
        });
        tracing::info!(port, tls = tls_on, store = store.kind(), "quotad listening");
        Ok(Self {
            port,
            grpc,
            shutdown_grace: settings.server.shutdown_timeout_ms.get(),
            server,
            admin_token,
            shutdown,
            sync,
            refresh,
            retention,
            expiry,
            clock: clock_task,
            fleet,
            traces,
            tls,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of Envoy's rate limit service, when `server.grpc_bind` is set.
    pub fn grpc_port(&self) -> Option<u16> {
        self.grpc.as_ref().map(|g| g.port)
    }

    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// Stops the server gracefully (what SIGTERM does).
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until SIGTERM/SIGINT (or `handle().stop`), then finishes requests in flight,
    /// writes every pending hit and returns the number it could not write (0 normally).
    pub async fn run_until_stopped(self) -> std::io::Result<u64> {
        let served = self.server.await;
        // No more checks from either server before the drain.
        if let Some(g) = self.grpc {
            let _ = g.stop.send(true);
            // In-flight calls get the same grace as HTTP requests.
            if tokio::time::timeout(self.shutdown_grace, g.task)
                .await
                .is_err()
            {
                tracing::warn!("gRPC calls still in flight at the shutdown timeout");
            }
        }
        tracing::info!("HTTP server stopped; writing pending hits");
        let _ = self.shutdown.send(true);
        let _ = self.refresh.await;
        let _ = self.retention.await;
        let _ = self.expiry.await;
        let _ = self.clock.await;
        if let Some(tls) = self.tls {
            let _ = tls.await;
        }
        let unsynced = self.sync.await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "sync task failed");
            u64::MAX
        });
        // The lease is held through the drain (its writes go to this instance's shard), and
        // given back only after it, so another instance can take the shard at once.
        if let Some((leave, task)) = self.fleet {
            let _ = leave.send(true);
            let _ = task.await;
        }
        if let Some(t) = self.traces {
            // The exporter's thread blocks on its last batch: not on a runtime thread.
            let _ = tokio::task::spawn_blocking(move || t.shutdown()).await;
        }
        served.map(|_| unsynced)
    }
}

/// Claims a write shard before serving, on a store that a fleet can share (scylla). The embedded
/// store is one process: a fleet of one, with nothing to claim.
async fn join_fleet(
    settings: &Settings,
    store: &DynStore,
    metrics: &Arc<Metrics>,
) -> Result<Option<Fleet>, StartError> {
    if settings.store.kind != StoreKind::Scylla {
        // What `/readyz` says too: shard 0 of a fleet of one.
        metrics.fleet().seen(1, Some(0));
        return Ok(None);
    }
    let cfg = FleetConfig {
        heartbeat: settings.fleet.heartbeat_ms.get(),
        lease_ttl: settings.fleet.lease_ttl_ms.get(),
        region_heartbeat: settings.fleet.region_heartbeat_ms.get(),
        region_stale: settings.fleet.region_stale_ms.get(),
        heal_grace: std::time::Duration::from_millis(settings.sync_max_delay_ms())
            + 2 * settings.sync.interval_ms.get(),
        pin: settings.store.shard,
        timeout: settings.store.request_timeout_ms.get(),
    };
    Fleet::join(store.clone(), cfg, metrics.clone())
        .await
        .map(Some)
        .map_err(|e| StartError(format!("joining the fleet: {e}")))
}

/// The certificate of `server.tls`, read and checked; none when TLS is off.
fn tls_certificate(
    settings: &Settings,
    metrics: &Arc<Metrics>,
) -> Result<Option<Certificate>, StartError> {
    let t = &settings.server.tls;
    let (Some(cert), Some(key)) = (&t.cert_file, &t.key_file) else {
        return Ok(None);
    };
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
    };
    Certificate::load(files, metrics.clone())
        .map(Some)
        .map_err(|e| StartError(e.to_string()))
}

/// A 256-bit random token, hex.
fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

fn limiter_config(settings: &Settings, fleet: Arc<Membership>) -> LimiterConfig {
    LimiterConfig {
        shards: settings.limiter.shards,
        idle_ms: settings.limiter.idle_ms.0 as i64,
        store_timeout: settings.store.check_timeout(),
        fleet,
        sync_interval_ms: settings.sync.interval_ms.0 as i64,
        max_sync_delay_ms: settings.sync_max_delay_ms() as i64,
        max_counters: settings.limiter.max_counters,
        max_clients_per_tenant: settings.limiter.max_clients_per_tenant,
        // History rows live one sync round: as many as counters is room for every active client.
        max_history_rows: settings.limiter.max_counters,
    }
}

/// The configured admin token; without one (and without a scoped admin token), a random one.
fn admin_token(settings: &Settings) -> String {
    for t in settings.auth.tokens.iter().filter(|t| !t.sha256.is_empty()) {
        tracing::warn!(
            name = %t.name,
            role = t.role.as_str(),
            "auth.tokens entry kept as an unsalted sha256; replace it with the hash \
             `quotad hash-token` prints"
        );
    }
    let configured = settings.auth.admin_token.expose();
    let scoped_admin = settings.auth.tokens.iter().any(|t| t.role == Role::Admin);
    if !configured.is_empty() || scoped_admin {
        return configured.to_owned();
    }
    let token = random_token();
    // Logged once, on purpose: the admin API is never open by accident, and the operator who
    // started the process can still use it.
    tracing::warn!(
        admin_token = %token,
        "no admin token configured; generated one for this run"
    );
    token
}

/// Asks for the HTTP worker's time slice (`server.worker_slice_us`, `crate::os::sched`) on the
/// calling thread; the first worker logs what came of it.
fn worker_slice(us: u64) {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    if us == 0 {
        return;
    }
    let got = crate::os::sched::shorten(std::time::Duration::from_micros(us));
    LOGGED.call_once(|| match got {
        crate::os::sched::Slice::Set => tracing::info!(slice_us = us, "HTTP workers' time slice set"),
        other => tracing::info!(
            slice_us = us,
            outcome = ?other,
            "HTTP workers keep the kernel's time slice (a slice of their own needs Linux 6.12+ and the normal policy)"
        ),
    });
}

/// Binds the listener (port 0 picks a free one) and starts the HTTP server on it, over TLS
/// when given its configuration.
fn http_server(
    settings: &Settings,
    state: AppState,
    tls: Option<rustls::ServerConfig>,
) -> Result<(Server, u16), StartError> {
    let listener = TcpListener::bind(&settings.server.bind)
        .map_err(|e| StartError(format!("cannot listen on {}: {e}", settings.server.bind)))?;
    let port = listener
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?
        .port();
    let traces = state.traces.clone();
    let data = web::Data::new(state);
    let max_header_bytes = settings.server.max_header_bytes;
    let slice = settings.server.worker_slice_us;
    let body_timeout = settings.server.request_timeout_ms.get();
    let opts = http::server::Listener {
        workers: settings.server.workers,
        max_connections: settings.server.max_connections,
        keep_alive: settings.server.keep_alive_ms.get(),
        request_timeout: settings.server.request_timeout_ms.get(),
        shutdown_timeout: settings.server.shutdown_timeout_ms.get(),
    };
    let server = http::server::serve(listener, tls, &opts, move || {
        // The app is built once on each worker thread, at its start.
        worker_slice(slice);
        App::new()
            .wrap(middleware::from_fn(move |req, next| {
                http::limit_header_bytes(max_header_bytes, req, next)
            }))
            // Admin requests' spans, with traces on (off: the condition's one branch).
            .wrap(middleware::Condition::new(traces.is_some(), {
                let traces = traces.clone();
                middleware::from_fn(move |req, next| {
                    let t = traces.clone().expect("enabled only with traces");
                    http::admin_span(t, req, next)
                })
            }))
            // Around every route and refusal: no body outlives its deadline or its answer.
            .wrap(middleware::from_fn(move |req, next| {
                http::body_deadline(body_timeout, req, next)
            }))
            // The last wrapped runs first: every answer, a 431 included, carries the id.
            .wrap(middleware::from_fn(http::request_id))
            .app_data(data.clone())
            .app_data(http::query_config())
            .configure(http::routes)
    })
    .map_err(|e| StartError(format!("cannot serve: {e}")))?;
    Ok((server, port))
}

fn sync_config(settings: &Settings) -> SyncConfig {
    SyncConfig {
        interval: settings.sync.interval_ms.get(),
        timeout: settings.sync.timeout_ms.get(),
        janitor_interval: settings.sync.janitor_interval_ms.get(),
        janitor_budget: 10_000,
        history_interval: settings.history_write_interval(),
        drain_timeout: settings.sync.drain_timeout_ms.get(),
        // A tenth of the interval: enough for the fleet's writes of a tick to land.
        settle: settings.sync.interval_ms.get() / 10,
        // Past the store's own request timeouts, no replica still applies a write.
        doubt_wait: settings.store.request_timeout_ms.get(),
    }
}

fn retention_config(settings: &Settings) -> RetentionConfig {
    RetentionConfig {
        history: settings.history.retention.get(),
        audit: settings.audit.retention.get(),
        interval: settings.sync.janitor_interval_ms.get(),
        budget: 10_000,
        timeout: settings.sync.timeout_ms.get(),
    }
}

/// The gRPC server of Envoy's rate limit service, running.
struct GrpcServer {
    port: u16,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Binds `bind` (port 0 picks a free one) and serves Envoy's rate limit service on it, each
/// call within `server.request_timeout_ms`, each connection within the bounds of
/// `crate::grpc::conn`; over TLS when given an acceptor, each handshake within that time too.
fn grpc_server(
    bind: &str,
    state: AppState,
    grpc: &crate::config::GrpcSettings,
    tls: Option<tokio_rustls::TlsAcceptor>,
) -> Result<GrpcServer, StartError> {
    let call_timeout = state.request_timeout;
    let std_listener = TcpListener::bind(bind)
        .map_err(|e| StartError(format!("cannot listen on {bind} (server.grpc_bind): {e}")))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| StartError(e.to_string()))?;
    let port = std_listener
        .local_addr()
        .map_err(|e| StartError(e.to_string()))?
        .port();
    let listener =
        tokio::net::TcpListener::from_std(std_listener).map_err(|e| StartError(e.to_string()))?;
    let service = crate::grpc::RateLimiter::new(state.checks, state.auth, grpc).service();
    let (stop, mut rx) = watch::channel(false);
    let tls_on = tls.is_some();
    let idle = grpc.idle_timeout_ms.get();
    let places = Arc::new(tokio::sync::Semaphore::new(grpc.max_connections));
    let task = tokio::spawn(async move {
        let router = crate::grpc::conn::server(call_timeout).add_service(service);
        let stopped = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        let res = match tls {
            Some(acceptor) => {
                let incoming = crate::tls::tls_incoming(listener, acceptor, call_timeout)
                    .filter_map(move |c| {
                        let admitted =
                            c.map(|io| crate::grpc::conn::IdleIo::admit(io, idle, &places));
                        futures::future::ready(admitted.transpose())
                    });
                router.serve_with_incoming_shutdown(incoming, stopped).await
            }
            None => {
                let incoming =
                    tonic::transport::server::TcpIncoming::from(listener).filter_map(move |c| {
                        let admitted =
                            c.map(|io| crate::grpc::conn::IdleIo::admit(io, idle, &places));
                        futures::future::ready(admitted.transpose())
                    });
                router.serve_with_incoming_shutdown(incoming, stopped).await
            }
        };
        if let Err(e) = res {
            tracing::error!(error = %e, "gRPC server failed");
        }
    });
    tracing::info!(
        port,
        tls = tls_on,
        "Envoy rate limit service (gRPC) listening"
    );
    Ok(GrpcServer { port, stop, task })
}
