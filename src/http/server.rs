//! The HTTP listener: the app on actix-server's workers, as actix-web's `HttpServer` would run
//! it, with each connection's stream [gated](super::conn) so that a peer who takes no answers
//! cannot make quotad read, parse and hold its requests without end. TLS, when configured, is
//! under the gate: the gate sees the requests and answers themselves.

use std::fmt;
use std::io;
use std::net::TcpListener;
use std::time::Duration;

use actix_http::{body::MessageBody, HttpService, Protocol, Request, Response};
use actix_service::{
    fn_service, map_config, IntoServiceFactory, ServiceFactory, ServiceFactoryExt,
};
use actix_tls::accept::rustls_0_23::{Acceptor, TlsStream};
use actix_tls::accept::TlsError;
use actix_web::dev::{AppConfig, Server};
use actix_web::rt::net::TcpStream;

use super::conn::Gated;

/// What the HTTP service takes over TLS: the gated stream, its protocol and its peer.
type TlsConn = (
    Gated<TlsStream<TcpStream>>,
    Protocol,
    Option<std::net::SocketAddr>,
);

/// How the listener treats connections (the `server.*` settings it serves).
#[derive(Clone, Debug)]
pub struct Listener {
    pub workers: usize,
    /// Per worker.
    pub max_connections: usize,
    pub keep_alive: Duration,
    /// For a request head, a TLS handshake, and an answer the peer takes no byte of.
    pub request_timeout: Duration,
    pub shutdown_timeout: Duration,
}

/// Serves `app` (built once on each worker) on `listener`, over TLS when given its
/// configuration.
pub fn serve<F, I, S, B>(
    listener: TcpListener,
    tls: Option<rustls::ServerConfig>,
    opts: &Listener,
    app: F,
) -> io::Result<Server>
where
    F: Fn() -> I + Send + Clone + 'static,
    I: IntoServiceFactory<S, Request>,
    S: ServiceFactory<Request, Config = AppConfig> + 'static,
    S::Error: Into<actix_web::Error> + 'static,
    S::InitError: fmt::Debug,
    S::Response: Into<Response<B>> + 'static,
    <S::Service as actix_service::Service<Request>>::Future: 'static,
    S::Service: 'static,
    B: MessageBody + 'static,
{
    let addr = listener.local_addr()?;
    let mut builder = Server::build()
        .max_concurrent_connections(opts.max_connections)
        .shutdown_timeout(opts.shutdown_timeout.as_secs().max(1));
    if opts.workers > 0 {
        builder = builder.workers(opts.workers);
    }
    let signal = builder.graceful_shutdown_signal();
    let opts = opts.clone();
    let name = format!("quotad-http-{addr}");
    // A macro, not a closure: the service's stream type differs with and without TLS.
    macro_rules! http {
        () => {{
            let signal = signal.clone();
            let fac = app()
                .into_factory()
                .map_err(|err| err.into().error_response());
            HttpService::build()
                .graceful_shutdown_signal(move || {
                    let signal = signal.clone();
                    async move { signal.notified().await }
                })
                .keep_alive(opts.keep_alive)
                .client_request_timeout(opts.request_timeout)
                .client_disconnect_timeout(Duration::from_secs(1))
                .h1_allow_half_closed(true)
                .local_addr(addr)
                .finish(map_config(fac, |_| AppConfig::default()))
        }};
    }
    let stall = opts.request_timeout;
    let builder = match tls {
        None => builder.listen(name, listener, move || {
            fn_service(move |io: TcpStream| async move {
                let peer = io.peer_addr().ok();
                Ok((Gated::new(io, stall), Protocol::Http1, peer))
            })
            .and_then(http!())
        })?,
        Some(mut config) => {
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            // A handshake slot for every connection a worker may hold: silent sockets can
            // then take no more slots than connections, and each is cut off at the timeout.
            actix_tls::accept::max_concurrent_tls_connect(opts.max_connections);
            builder.listen(name, listener, move || {
                let mut acceptor = Acceptor::new(config.clone());
                acceptor.set_handshake_timeout(stall);
                acceptor
                    .map_init_err(|_| ())
                    .map_err(TlsError::into_service_error)
                    .and_then(fn_service(move |io: TlsStream<TcpStream>| async move {
                        let peer = io.get_ref().0.peer_addr().ok();
                        Ok((Gated::new(io, stall), Protocol::Http1, peer))
                    }))
                    .and_then(ServiceFactoryExt::<TlsConn>::map_err(
                        http!(),
                        TlsError::Service,
                    ))
            })?
        }
    };
    Ok(builder.run())
}
