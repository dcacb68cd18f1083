//! Connection limits for the server's two listeners (gRPC and HTTP admin).
//!
//! Where it sits: between a bound [`TcpListener`] and the protocol servers
//! (tonic in `lib.rs`, hyper/axum in `admin::serve`). Every accepted
//! socket passes a [`Gate`], shared by both listeners, before a protocol server
//! sees it:
//!
//! - at most [`ConnLimits::max_connections`] open at once in total and
//!   [`ConnLimits::max_per_source`] from one IP address: one more is closed at
//!   once (a refusal, counted in the metrics and logged at most every
//!   [`LOG_EVERY`]). The process therefore never holds more accepted sockets than
//!   the total, however many arrive, and one address cannot take all of them;
//! - at most [`ConnLimits::new_per_source_per_sec`] new connections a second
//!   from one IP address, after a burst of [`ConnLimits::rate_burst`]: a
//!   source that opens connections (and TLS handshakes, which cost the node a
//!   signature each) in a loop is refused beyond that rate, however briefly it
//!   keeps each one;
//! - a connection that sends nothing within [`ConnLimits::handshake_timeout`] is
//!   closed before any protocol server holds it;
//! - a connection on which no byte moves either way for
//!   [`ConnLimits::idle_timeout`] is closed ([`Conn`]). A healthy client is not
//!   affected: while a call is in flight the Rust client pings every second, and a
//!   connection closed while idle is opened again by its next call (a lease
//!   keep-alive is a new call).
//!
//! - with TLS on ([`crate::access::tls`]), the TLS handshake must also be done within
//!   the handshake timeout; one that fails is counted and closed.
//!
//! The HTTP header-read timeout is the admin server's (hyper's), configured here.

use std::{
    collections::HashMap,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{atomic::Ordering::Relaxed, Arc, Mutex},
    task::{ready, Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::mpsc,
    time::{Instant, Sleep},
};

use super::tls::{Port, ServerTls};
use crate::clock;
use crate::metrics::Metrics;

/// At most one log line per kind of refusal this often, with the count since the last.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// After a failed `accept` (out of descriptors, most likely), wait this long
/// before the next, instead of spinning.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Connections handed over but not yet taken by the protocol server.
const HANDOVER_BUFFER: usize = 64;

/// The limits on accepted connections, for both listeners together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnLimits {
    /// Most connections open at once, both ports together. The default, 768,
    /// leaves a quarter of a 1,024-descriptor limit for the node's own files and
    /// its connections to peers.
    pub max_connections: usize,
    /// Most connections open at once from one IP address. The default, 256, is a
    /// third of the total: one address cannot take the rest from others. A
    /// native client of a plaintext node holds two (its gRPC channel, and its
    /// framed session: `framed.rs`), so that is 128 clients, as many as
    /// the 128 of one connection each before the framed session.
    pub max_per_source: usize,
    /// Most new connections a second from one IP address, after a burst (see
    /// [`ConnLimits::rate_burst`]) (default 100; 0: no limit).
    pub new_per_source_per_sec: u32,
    /// A connection that sends no byte within this is closed (default 10 s).
    pub handshake_timeout: Duration,
    /// A connection on which no byte moves either way for this is closed
    /// (default 300 s, longer than any server-side call of the admin port).
    pub idle_timeout: Duration,
    /// HTTP admin port: a request whose headers are not all in within this is
    /// closed (default 10 s).
    pub header_read_timeout: Duration,
    /// Most operations of one `Session` stream in flight at once (started,
    /// reply not yet handed to the stream; default 8,192). At the limit the
    /// node stops reading the stream until one finishes: a client that sends
    /// without reading its replies is held back by HTTP/2 flow control instead
    /// of growing the node's memory.
    pub session_ops_in_flight: usize,
    /// Most acquires of one `Session` stream in flight at once (default
    /// 4,096): one more is answered at once with `RESOURCE_EXHAUSTED`. Kept
    /// below [`ConnLimits::session_ops_in_flight`], so that waiting acquires
    /// never stop the node from reading the releases and cancels that would
    /// end them.
    pub session_acquires_in_flight: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: 768,
            max_per_source: 256,
            new_per_source_per_sec: 100,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            header_read_timeout: Duration::from_secs(10),
            session_ops_in_flight: 8192,
            session_acquires_in_flight: 4096,
        }
    }
}

impl ConnLimits {
    /// How many new connections one source may open at once before its rate
    /// applies: its whole share, and a second's worth on top (so a client
    /// that fills its share can still replace a connection at once).
    pub fn rate_burst(&self) -> usize {
        self.max_per_source.saturating_add(self.new_per_source_per_sec as usize)
    }

    /// Checks what the server cannot run with, and says why.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 || self.max_per_source == 0 {
            return Err("the connection limits (total and per source) must be at least 1".into());
        }
        if self.max_per_source > self.max_connections {
            return Err(format!(
                "the per-source connection limit ({}) is above the total ({})",
                self.max_per_source, self.max_connections
            ));
        }
        let timeouts = [self.handshake_timeout, self.idle_timeout, self.header_read_timeout];
        if timeouts.iter().any(Duration::is_zero) {
            return Err("the handshake, idle and header-read timeouts must be above zero".into());
        }
        let (ops, acquires) = (self.session_ops_in_flight, self.session_acquires_in_flight);
        if acquires == 0 || acquires >= ops {
            return Err(format!(
                "a session's acquires in flight ({acquires}) must be at least 1 and below its operations in \
                 flight ({ops}), so that waiting acquires never stop the node from reading the releases that \
                 end them"
            ));
        }
        Ok(())
    }
}

/// Admission of accepted connections: counts what is open, refuses what is
/// over a limit. Shared by both listeners.
pub struct Gate {
    limits: ConnLimits,
    open: Mutex<Open>,
    metrics: Arc<Metrics>,
    log: Mutex<RefusalLog>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
    /// New-connection allowance of each source that connected recently:
    /// (tokens left, when last counted).
    rate: HashMap<IpAddr, (f64, Instant)>,
}

/// Sources forgotten by the rate limit once it tracks this many (a full
/// allowance again, which is what an idle source has anyway).
const RATE_SOURCES: usize = 4096;

impl Open {
    /// Takes one new connection from `ip`'s allowance at `now`; `false` if it
    /// has none left.
    fn take_rate(&mut self, ip: IpAddr, now: Instant, per_sec: u32, burst: usize) -> bool {
        if per_sec == 0 {
            return true;
        }
        if self.rate.len() >= RATE_SOURCES && !self.rate.contains_key(&ip) {
            let full = |(left, at): &(f64, Instant)| {
                *left + now.saturating_duration_since(*at).as_secs_f64() * f64::from(per_sec) >= burst as f64
            };
            self.rate.retain(|_, r| !full(r));
            if self.rate.len() >= RATE_SOURCES {
                self.rate.clear();
            }
        }
        let (left, at) = self.rate.entry(ip).or_insert((burst as f64, now));
        *left = (*left + now.saturating_duration_since(*at).as_secs_f64() * f64::from(per_sec)).min(burst as f64);
        *at = now;
        if *left < 1.0 {
            return false;
        }
        *left -= 1.0;
        true
    }
}

/// Why a connection was closed by the gate, for the rate-limited log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Refusal {
    Total,
    PerSource,
    Rate,
    Handshake,
}

#[derive(Default)]
struct RefusalLog {
    last: HashMap<Refusal, Instant>,
    since: HashMap<Refusal, u64>,
}

impl Gate {
    pub fn new(limits: ConnLimits, metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Self { limits, open: Mutex::default(), metrics, log: Mutex::default() })
    }

    pub fn limits(&self) -> &ConnLimits {
        &self.limits
    }

    /// A permit for a connection from `ip`, or `None` (counted and logged) if a
    /// limit is reached.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Permit> {
        let ip = ip.to_canonical();
        let refused = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let from_ip = open.by_source.get(&ip).copied().unwrap_or(0);
            if open.total >= self.limits.max_connections {
                Some(Refusal::Total)
            } else if from_ip >= self.limits.max_per_source {
                Some(Refusal::PerSource)
            } else if !open.take_rate(
                ip,
                clock::mono_now(),
                self.limits.new_per_source_per_sec,
                self.limits.rate_burst(),
            ) {
                Some(Refusal::Rate)
            } else {
                open.total += 1;
                open.by_source.insert(ip, from_ip + 1);
                None
            }
        };
        match refused {
            Some(why) => {
                self.refuse(why, ip);
                None
            }
            None => {
                self.metrics.conns.opened();
                Some(Permit { gate: self.clone(), ip })
            }
        }
    }

    fn release(&self, ip: IpAddr) {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total -= 1;
        if let Some(n) = open.by_source.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.by_source.remove(&ip);
            }
        }
        self.metrics.conns.closed();
    }

    fn refuse(&self, why: Refusal, ip: IpAddr) {
        let c = &self.metrics.conns;
        match why {
            Refusal::Total => c.refused_total.fetch_add(1, Relaxed),
            Refusal::PerSource => c.refused_per_source.fetch_add(1, Relaxed),
            Refusal::Rate => c.refused_rate.fetch_add(1, Relaxed),
            Refusal::Handshake => c.handshake_timeouts.fetch_add(1, Relaxed),
        };
        if let Some(n) = self.due_log(why) {
            let (total, per_source) = (self.limits.max_connections, self.limits.max_per_source);
            match why {
                Refusal::Total => {
                    tracing::warn!(source = %ip, n, limit = total, "connections refused: the total limit is reached")
                }
                Refusal::PerSource => {
                    tracing::warn!(source = %ip, n, limit = per_source, "connections refused: the per-source limit is reached")
                }
                Refusal::Rate => {
                    let limit = self.limits.new_per_source_per_sec;
                    tracing::warn!(source = %ip, n, limit, "connections refused: the source opens new ones faster than its limit per second")
                }
                Refusal::Handshake => {
                    tracing::warn!(source = %ip, n, "connections closed: nothing sent within the handshake timeout")
                }
            }
        }
    }

    /// How many refusals of this kind to report now (this one included), or
    /// `None` if one was logged less than [`LOG_EVERY`] ago.
    fn due_log(&self, why: Refusal) -> Option<u64> {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let n = log.since.entry(why).or_insert(0);
        *n += 1;
        let now = clock::mono_now();
        if log.last.get(&why).is_some_and(|t| now < *t + LOG_EVERY) {
            return None;
        }
        log.last.insert(why, now);
        log.since.remove(&why)
    }
}

/// One admitted connection's place in the counts; given back on drop.
struct Permit {
    gate: Arc<Gate>,
    ip: IpAddr,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.gate.release(self.ip);
    }
}

/// TLS for one listener: the node's configuration and which port this is.
pub type ListenerTls = Option<(Arc<ServerTls>, Port)>;

/// Accept on `listener` until the receiver is dropped, and hand over the
/// connections that pass the gate and send something within the handshake
/// timeout (and finish the TLS handshake within it, with `tls`), with
/// `TCP_NODELAY` set: an answer written in several pieces (HTTP/2 headers,
/// data, trailers) must not wait for the peer's delayed ACK.
pub fn accept(listener: TcpListener, gate: Arc<Gate>, tls: ListenerTls) -> Admitted {
    let (tx, rx) = mpsc::channel(HANDOVER_BUFFER);
    tokio::spawn(accept_loop(listener, gate, tls, Handover { grpc: tx, framed: None }));
    rx
}

/// The connections a listener admitted, with their peers, as handed over.
pub type Admitted = mpsc::Receiver<(Stream, SocketAddr)>;

/// As [`accept`], for the gRPC port: a plaintext connection whose first byte
/// is the framed protocol's ([`fencelock_proto::framing::PREFACE`]) goes to
/// the second receiver, every other to the first (an HTTP/2 connection
/// begins with `P`).
pub fn accept_grpc(listener: TcpListener, gate: Arc<Gate>, tls: ListenerTls) -> (Admitted, Admitted) {
    let (grpc, grpc_rx) = mpsc::channel(HANDOVER_BUFFER);
    let (framed, framed_rx) = mpsc::channel(HANDOVER_BUFFER);
    tokio::spawn(accept_loop(listener, gate, tls, Handover { grpc, framed: Some(framed) }));
    (grpc_rx, framed_rx)
}

/// Where admitted connections go: to the protocol server, or, on the gRPC
/// port, the framed ones to theirs.
#[derive(Clone)]
struct Handover {
    grpc: mpsc::Sender<(Stream, SocketAddr)>,
    framed: Option<mpsc::Sender<(Stream, SocketAddr)>>,
}

impl Handover {
    /// Closed once the protocol server stopped taking connections.
    async fn closed(&self) {
        self.grpc.closed().await
    }

    /// The channel of a connection whose first byte is `first`.
    fn of(&self, first: Option<u8>) -> &mpsc::Sender<(Stream, SocketAddr)> {
        match (&self.framed, first) {
            (Some(framed), Some(b)) if b == fencelock_proto::framing::PREFACE[0] => framed,
            _ => &self.grpc,
        }
    }
}

async fn accept_loop(listener: TcpListener, gate: Arc<Gate>, tls: ListenerTls, tx: Handover) {
    loop {
        let accepted = tokio::select! {
            _ = tx.closed() => return,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::debug!(error = %e, "accept failed");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        // Over a limit: the stream is dropped, so closed, here.
        let Some(permit) = gate.admit(peer.ip()) else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(handshake(stream, peer, permit, tls.clone(), tx.clone()));
    }
}

/// Hands `stream` over once it has a byte to read (or is closed by its peer)
/// and, with TLS, has finished the TLS handshake; closes it if either takes
/// longer than the handshake timeout, or if the TLS handshake fails.
async fn handshake(stream: TcpStream, peer: SocketAddr, permit: Permit, tls: ListenerTls, tx: Handover) {
    let gate = permit.gate.clone();
    let deadline = clock::mono_now() + gate.limits.handshake_timeout;
    let mut byte = [0u8; 1];
    let first_byte = tokio::time::timeout_at(deadline, stream.peek(&mut byte));
    let arrived = tokio::select! {
        _ = tx.closed() => return,
        r = first_byte => r.is_ok(),
    };
    // Only a plaintext connection is told apart by its first byte.
    let first = (tls.is_none() && arrived).then_some(byte[0]);
    if !arrived {
        drop(stream);
        return gate.refuse(Refusal::Handshake, peer.ip().to_canonical());
    }
    let conn = Conn::new(stream, gate.limits.idle_timeout, permit);
    let stream = match tls {
        None => Stream::Plain(conn),
        Some((tls, port)) => {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                r = tokio::time::timeout_at(deadline, tls.acceptor(port).accept(conn)) => r,
            };
            match accepted {
                Ok(Ok(s)) => {
                    let certs = s.get_ref().1.peer_certificates().unwrap_or_default();
                    let member = tls.verify_peer(certs).map_err(Arc::from);
                    Stream::Tls(Box::new(s), member)
                }
                Ok(Err(e)) => return gate.tls_failed(peer, &e.to_string()),
                Err(_) => return gate.refuse(Refusal::Handshake, peer.ip().to_canonical()),
            }
        }
    };
    let _ = tx.of(first).send((stream, peer)).await;
}

impl Gate {
    /// A TLS handshake that failed: counted, logged at debug (a scanner or a
    /// plaintext client can cause any number of them).
    fn tls_failed(&self, peer: SocketAddr, why: &str) {
        self.metrics.conns.tls_failures.fetch_add(1, Relaxed);
        tracing::debug!(%peer, error = why, "TLS handshake failed");
    }
}

/// An admitted connection as a protocol server gets it: plaintext or TLS.
pub enum Stream {
    Plain(Conn),
    /// With whether the client's certificate is a member's (see
    /// [`ConnInfo::member`]), decided once, at the handshake.
    Tls(Box<tokio_rustls::server::TlsStream<Conn>>, Result<(), Arc<str>>),
}

/// What tonic puts in every request's extensions about its connection.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client's address.
    pub remote: Option<SocketAddr>,
    /// The common name of the presented certificate's subject (see
    /// [`crate::access::auth::subject_common_name`]), read once per connection.
    pub client_cn: Option<Arc<str>>,
    /// Whether the presented certificate is a node certificate of the
    /// cluster CA (see [`crate::access::tls::ServerTls::verify_peer`]), or why not;
    /// verified once at the handshake, not on every Raft call.
    pub member: Result<(), Arc<str>>,
}

impl Stream {
    pub(crate) fn info(&self) -> ConnInfo {
        match self {
            Stream::Plain(c) => {
                let member = Err(Arc::from("no TLS"));
                ConnInfo { remote: c.io.peer_addr().ok(), client_cn: None, member }
            }
            Stream::Tls(t, member) => {
                let (c, session) = t.get_ref();
                let leaf = session.peer_certificates().and_then(|c| c.first());
                let client_cn = leaf.and_then(|leaf| crate::access::auth::subject_common_name(leaf)).map(Arc::from);
                ConnInfo { remote: c.io.peer_addr().ok(), client_cn, member: member.clone() }
            }
        }
    }
}

macro_rules! delegate {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            Stream::Plain($s) => {
                let $s = Pin::new($s);
                $e
            }
            Stream::Tls($s, _) => {
                let $s = Pin::new(&mut **$s);
                $e
            }
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        delegate!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(c) => c.is_write_vectored(),
            Stream::Tls(t, _) => t.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        delegate!(self, s => s.poll_shutdown(cx))
    }
}

impl tonic::transport::server::Connected for Stream {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.info()
    }
}

/// An admitted connection: closed (reads fail with `TimedOut`) once no byte has
/// moved either way for the idle timeout; gives its place back when dropped.
pub struct Conn {
    io: TcpStream,
    idle: Duration,
    last: Instant,
    timer: Pin<Box<Sleep>>,
    permit: Permit,
}

impl Conn {
    fn new(io: TcpStream, idle: Duration, permit: Permit) -> Self {
        let last = clock::mono_now();
        Self { io, idle, last, timer: Box::pin(tokio::time::sleep_until(last + idle)), permit }
    }

    fn touch(&mut self, moved: bool) {
        if moved {
            self.last = clock::mono_now();
        }
    }

    /// Ready with an error once the connection has been idle for too long;
    /// otherwise re-arms the timer for the last activity plus the idle timeout.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            ready!(self.timer.as_mut().poll(cx));
            let due = self.last + self.idle;
            if clock::mono_now() >= due {
                self.metrics_idle();
                return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, "connection idle for too long"));
            }
            self.timer.as_mut().reset(due);
        }
    }

    fn metrics_idle(&self) {
        self.permit.gate.metrics.conns.idle_closed.fetch_add(1, Relaxed);
    }
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(r) => {
                let moved = buf.filled().len() > before;
                self.touch(moved);
                Poll::Ready(r)
            }
            Poll::Pending => self.poll_idle(cx).map(Err),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = ready!(Pin::new(&mut self.io).poll_write(cx, buf));
        self.touch(matches!(r, Ok(n) if n > 0));
        Poll::Ready(r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = ready!(Pin::new(&mut self.io).poll_write_vectored(cx, bufs));
        self.touch(matches!(r, Ok(n) if n > 0));
        Poll::Ready(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate(total: usize, per_source: usize) -> Arc<Gate> {
        let limits = ConnLimits { max_connections: total, max_per_source: per_source, ..ConnLimits::default() };
        Gate::new(limits, Arc::new(Metrics::default()))
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Finding "connections without limits" (issue 14): one address gets at
    /// most its share; others still get in; a closed connection frees its place.
    #[test]
    fn per_source_and_total_limits_and_places_come_back() {
        let g = gate(3, 2);
        let a1 = g.admit(ip(2)).expect("first from .2");
        let _a2 = g.admit(ip(2)).expect("second from .2");
        assert!(g.admit(ip(2)).is_none(), "a third from .2 is over the per-source limit");
        let _b1 = g.admit(ip(1)).expect("another address still gets in");
        assert!(g.admit(ip(3)).is_none(), "over the total");
        drop(a1);
        assert!(g.admit(ip(2)).is_some(), "a closed connection gives its place back");
        let m = &g.metrics.conns;
        assert_eq!(m.refused_per_source.load(Relaxed), 1);
        assert_eq!(m.refused_total.load(Relaxed), 1);
    }

    /// An IPv4 client reaching an IPv6 listener counts as its IPv4 address.
    #[test]
    fn mapped_addresses_count_as_their_ipv4_source() {
        let g = gate(10, 1);
        let _a = g.admit(ip(2)).expect("first");
        assert!(g.admit(IpAddr::from(std::net::Ipv4Addr::new(127, 0, 0, 2).to_ipv6_mapped())).is_none());
    }

    /// A source that opens connections in a loop, closing each at once, gets
    /// its burst and then its rate; another source is not affected.
    #[test]
    fn new_connections_per_source_are_rate_limited_after_a_burst() {
        let limits =
            ConnLimits { max_connections: 100, max_per_source: 5, new_per_source_per_sec: 10, ..ConnLimits::default() };
        let g = Gate::new(limits, Arc::new(Metrics::default()));
        let admitted = (0..30).filter(|_| g.admit(ip(2)).is_some()).count();
        assert_eq!(
            admitted, 15,
            "the burst (5 + 10), then nothing within the same instant (each permit is dropped at once)"
        );
        assert!(g.admit(ip(3)).is_some(), "another address still gets in");
        assert_eq!(g.metrics.conns.refused_rate.load(Relaxed), 15);

        let mut open = Open::default();
        let t0 = clock::mono_now();
        assert!((0..5).all(|_| open.take_rate(ip(2), t0, 10, 5)));
        assert!(!open.take_rate(ip(2), t0, 10, 5));
        assert!(open.take_rate(ip(2), t0 + Duration::from_millis(100), 10, 5), "a tenth of a second gives one back");
        assert!(!open.take_rate(ip(2), t0 + Duration::from_millis(100), 10, 5));
        assert!((0..100).all(|_| open.take_rate(ip(2), t0, 0, 5)), "0 is no limit");
    }

    #[test]
    fn limits_that_cannot_work_are_refused() {
        let bad = |f: fn(&mut ConnLimits)| {
            let mut l = ConnLimits::default();
            f(&mut l);
            l.validate().unwrap_err()
        };
        assert!(bad(|l| l.max_connections = 0).contains("at least 1"));
        assert!(bad(|l| l.max_per_source = 1000).contains("above the total"));
        assert!(bad(|l| l.idle_timeout = Duration::ZERO).contains("above zero"));
        ConnLimits::default().validate().expect("the defaults are valid");
    }
}
