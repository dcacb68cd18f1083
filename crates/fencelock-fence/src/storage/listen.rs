//! The storage server's accept loop: plaintext or TLS, HTTP/1.1, with the
//! timeouts that keep a silent or slow client from holding a connection (and
//! its task) for ever, and a graceful stop.
//!
//! - With TLS, the handshake must be done within
//!   [`super::Config::handshake_timeout`] of the accept; a handshake that
//!   fails (a plaintext client, a client without a required certificate, a
//!   scanner) or takes longer closes the connection, logged at debug.
//! - On every connection, plaintext or TLS, a request's headers must be in
//!   within [`super::Config::header_read_timeout`] of the connection's start
//!   or of the end of its previous request (hyper's timer): a client that
//!   connects and never speaks, or sends its headers a byte at a time, or
//!   keeps an idle connection open, is closed then.
//! - On shutdown the listener closes, idle connections close, and requests in
//!   progress finish before [`super::serve_with`] returns.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::tls::ServerTls;

/// After a failed `accept` (out of descriptors, most likely), wait this long
/// before the next, instead of spinning.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// How connections are taken.
#[derive(Clone)]
pub(crate) struct Listening {
    pub tls: Option<Arc<ServerTls>>,
    pub handshake_timeout: Duration,
    pub header_read_timeout: Duration,
}

/// Serve `router` on `listener` until `shutdown`; then stop accepting, close
/// idle connections, and return once the requests in progress are answered.
pub(crate) async fn serve(listener: TcpListener, router: Router, how: Listening, shutdown: impl Future<Output = ()>) {
    let (closing, close) = watch::channel(false);
    let mut conns = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => break,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(a) => a,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        while conns.try_join_next().is_some() {}
        // The configuration in use at the accept: a reloaded certificate
        // serves the connections accepted after it.
        let acceptor = how.tls.as_ref().map(|t| t.acceptor());
        conns.spawn(connection(tcp, peer, acceptor, router.clone(), how.clone(), close.clone()));
    }
    drop(listener);
    let _ = closing.send(true);
    while conns.join_next().await.is_some() {}
}

/// Errors of one connection that `accept` reports; the listener is fine.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
    )
}

async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    router: Router,
    how: Listening,
    mut close: watch::Receiver<bool>,
) {
    let Some(acceptor) = acceptor else {
        return http(tcp, router, how.header_read_timeout, close).await;
    };
    let handshake = tokio::time::timeout(how.handshake_timeout, acceptor.accept(tcp));
    let tls = tokio::select! {
        _ = close.wait_for(|c| *c) => return,
        r = handshake => r,
    };
    match tls {
        Ok(Ok(stream)) => http(stream, router, how.header_read_timeout, close).await,
        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(
            %peer,
            timeout = ?how.handshake_timeout,
            "TLS handshake not done within the handshake timeout; closed"
        ),
    }
}

async fn http<S>(stream: S, router: Router, header_read_timeout: Duration, mut close: watch::Receiver<bool>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(header_read_timeout);
    let service = TowerToHyperService::new(router);
    let mut served = std::pin::pin!(http.serve_connection(TokioIo::new(stream), service));
    tokio::select! {
        r = served.as_mut() => {
            if let Err(e) = r {
                tracing::trace!(error = %e, "connection ended with an error");
            }
            return;
        }
        _ = close.wait_for(|c| *c) => served.as_mut().graceful_shutdown(),
    }
    let _ = served.await;
}
