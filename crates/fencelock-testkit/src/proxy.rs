//! A userspace TCP fault proxy for tests: it listens on 127.0.0.1:0, forwards
//! every accepted connection to one upstream address (a real server's port),
//! and can be switched at runtime between [`Mode`]s to produce the
//! network faults the real server cannot produce by itself.
//!
//! The faults are per connection, not per call: HTTP/2 multiplexes every call of a
//! client on one connection, so a mode applies to all calls in flight on it. Tests
//! are built around that (e.g. "every answer is lost until the connection is
//! reset").

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with the bytes of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both directions.
    Pass,
    /// A black hole: connections (new ones too) are accepted, and what they send
    /// is read but held back, in both directions, until the mode changes; then it
    /// flows on in order (a partition that heals).
    Hold,
    /// Forward client→server; read and discard server→client (answers lost after
    /// the server applied the request). The discarded bytes leave the connection's
    /// HTTP/2 state broken: follow with [`Mode::Reset`].
    DropReplies,
    /// Reset (RST) every current connection, and every new one as soon as it is
    /// accepted, until the mode changes.
    Reset,
}

#[derive(Debug, Clone, Copy)]
struct State {
    mode: Mode,
    /// Bumped on every switch to [`Mode::Reset`], so that a connection never misses
    /// a reset, even if the mode moves on before it looks.
    resets: u64,
}

struct Shared {
    state: watch::Sender<State>,
    accepted: AtomicUsize,
    dropped_bytes: AtomicU64,
    held_bytes: AtomicU64,
}

/// A running proxy; it stops when dropped.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `upstream`, in [`Mode::Pass`].
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().unwrap();
        let (state, _) = watch::channel(State { mode: Mode::Pass, resets: 0 });
        let shared = Arc::new(Shared {
            state,
            accepted: AtomicUsize::new(0),
            dropped_bytes: AtomicU64::new(0),
            held_bytes: AtomicU64::new(0),
        });
        let accept = tokio::spawn(accept_loop(listener, upstream, shared.clone()));
        Proxy { addr, shared, accept }
    }

    /// The URL clients connect to, for the native gRPC client.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the mode; takes effect at once for current connections too.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.state.send_modify(|s| {
            if mode == Mode::Reset {
                s.resets += 1;
            }
            s.mode = mode;
        });
    }

    /// Resets every current connection and goes on in [`Mode::Pass`]: the client's
    /// next attempt reconnects.
    pub fn reset_then_pass(&self) {
        self.set_mode(Mode::Reset);
        self.set_mode(Mode::Pass);
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Server→client bytes discarded in [`Mode::DropReplies`] so far.
    pub fn dropped_bytes(&self) -> u64 {
        self.shared.dropped_bytes.load(Ordering::SeqCst)
    }

    /// Bytes (either direction) that arrived in [`Mode::Hold`] and were held
    /// back, so far: proof that a hold delayed something.
    pub fn held_bytes(&self) -> u64 {
        self.shared.held_bytes.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // End every connection task too.
        self.set_mode(Mode::Reset);
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else { continue };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        let state = shared.state.subscribe();
        tokio::spawn(connection(client, upstream, shared.clone(), state));
    }
}

/// One proxied connection, until either side closes it or the proxy resets it.
async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut state: watch::Receiver<State>,
) {
    let resets = state.borrow_and_update().resets;
    if state.borrow().mode == Mode::Reset {
        return reset(client);
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else { return reset(client) };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        tokio::select! {
            _ = pump(&mut cr, &mut sw, Direction::ToServer, &shared) => {}
            _ = pump(&mut sr, &mut cw, Direction::ToClient, &shared) => {}
            _ = state.wait_for(|s| s.resets != resets) => {}
        }
    }
    // The server side first: it drops the calls of this connection before the
    // client (which backs off before it retries) can send them again.
    reset(server);
    reset(client);
}

/// Closes `s` with an RST (zero linger), not a FIN.
fn reset(s: TcpStream) {
    let _ = s.set_zero_linger();
    drop(s);
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Copies `from` to `to` as the mode says. Returns at EOF or on an error.
async fn pump<R, W>(from: &mut R, to: &mut W, dir: Direction, shared: &Shared) -> io::Result<()>
where
    R: AsyncReadExt + Unpin,
    W: AsyncWriteExt + Unpin,
{
    let mut state = shared.state.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            return Ok(());
        }
        // Held bytes wait here (in order) until the mode changes.
        if state.borrow().mode == Mode::Hold {
            shared.held_bytes.fetch_add(n as u64, Ordering::SeqCst);
        }
        let mode = match state.wait_for(|s| s.mode != Mode::Hold).await {
            Ok(s) => s.mode,
            Err(_) => return Ok(()),
        };
        match (mode, dir) {
            (Mode::Reset, _) => return Ok(()),
            (Mode::DropReplies, Direction::ToClient) => {
                shared.dropped_bytes.fetch_add(n as u64, Ordering::SeqCst);
            }
            _ => {
                to.write_all(&buf[..n]).await?;
                to.flush().await?;
            }
        }
    }
}
