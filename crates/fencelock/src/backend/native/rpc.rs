//! The RPC layer: one tonic channel, a deadline on every call, and retries with
//! backoff that reuse the request id.
//!
//! Where it sits: below everything else in the crate. [`Rpc::call`] runs one
//! logical request: each attempt gets the time left until the operation's
//! deadline (sent as `grpc-timeout` and enforced locally); an attempt that fails
//! with a retryable status (see [`crate::error`]) is retried after
//! [`Backoff::delay`], until the deadline. The caller builds each attempt from the
//! same message, so every retry carries the same `request_id` and the server
//! answers a retry with the first outcome (never a second grant). The tonic
//! [`Channel`] reconnects by itself on the next attempt after a transport failure.
//!
//! [`Servers`] is the group as the client knows it: a list of endpoints and the
//! one it talks to now. A retryable failure moves the client on: to the leader
//! a follower named (`fencelock-leader` metadata, retried at once), else to the
//! next endpoint of the list. Retries keep their request id across servers, so
//! a retry that reaches the new leader after a fail-over still never grants
//! twice (the dedup memory is replicated state).
//!
//! [`Rpc::send`] is [`Rpc::call`] for the operations that may ride the
//! client's shared stream (acquire, release, lease grant, keep-alive): each
//! attempt goes over the [`Transport`] the client was built with (see
//! [`super::transport`]), under the same loop, so both transports retry,
//! time out and fail over by the same rules.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fencelock_proto::v1::lock_client::LockClient;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Response, Status};

use crate::backend::native::auth::Auth;
use crate::backend::native::mux::FramedDial;
use crate::backend::native::tls::ClientTls;
use crate::backend::native::transport::{self, Conn, StreamOp, StreamSlot, Transport};
use crate::backend::native::wire::{leader_hint, Grpc, KEEP_ALIVE_INTERVAL, KEEP_ALIVE_TIMEOUT};
use crate::backoff::Backoff;
use crate::error::{is_retryable, is_timeout, Error};
use crate::metrics;

/// How many times one call follows a leader hint without a backoff delay.
const HINT_JUMPS: u32 = 3;

/// With several servers, an attempt of a call that does not wait gets at most
/// half the time left (but at least this): a server that hangs (stopped, cut
/// off from its peers, still starting) leaves time to try another.
const MIN_ATTEMPT: Duration = Duration::from_millis(250);

/// The servers of one group, and the one this client talks to now.
#[derive(Debug)]
pub(crate) struct Servers {
    /// The endpoints as configured (`http://host:port`), in order.
    urls: Vec<String>,
    dial: Dial,
    now: Mutex<Current>,
    /// Session streams opened so far, on every server.
    streams_opened: Arc<AtomicU64>,
}

/// How to open a connection to a server.
#[derive(Debug, Clone)]
pub(crate) struct Dial {
    pub connect_timeout: Duration,
    /// For `https://` servers.
    pub tls: Option<ClientTls>,
    /// The bearer token every call carries, if any (its `Debug` hides it).
    pub auth: Auth,
}

impl Dial {
    /// The gRPC client of a connection to one server.
    fn client(&self, ch: Channel) -> Grpc {
        LockClient::with_interceptor(ch, self.auth.clone())
    }

    /// Where the framed session to the server at `url` goes: a plaintext
    /// (`http://`) server only; over TLS the session is the gRPC call.
    fn framed(&self, url: &str) -> Option<FramedDial> {
        let addr = url.strip_prefix("http://")?.trim_end_matches('/');
        Some(FramedDial {
            addr: addr.to_string(),
            authorization: bytes::Bytes::copy_from_slice(self.auth.header_bytes()),
            timeout: self.connect_timeout,
        })
    }
}

#[derive(Debug)]
struct Current {
    /// Bumped at every switch, so that one failure moves the client once
    /// however many calls saw it.
    gen: u64,
    url: String,
    client: Grpc,
    /// The shared stream to this server (opened on first use).
    stream: Arc<StreamSlot>,
    /// One lazily connecting channel per server ever used.
    channels: HashMap<String, Channel>,
}

/// A server URL as tonic takes it: `http://` (`https://` with `tls`) is
/// added to a bare `host:port` (a leader hint, as a follower names it).
pub(crate) fn normalize(url: &str, tls: bool) -> String {
    let url = url.trim();
    if url.contains("://") {
        url.to_string()
    } else if tls {
        format!("https://{url}")
    } else {
        format!("http://{url}")
    }
}

fn endpoint(url: &str, dial: &Dial) -> Result<Endpoint, Error> {
    let mut ep = Endpoint::from_shared(url.to_string())
        .map_err(|e| Error::InvalidArgument(format!("bad server url {url:?}: {e}")))?;
    match (url.starts_with("https://"), &dial.tls) {
        (true, Some(tls)) => {
            ep = ep.tls_config(tls.config()).map_err(|e| Error::InvalidArgument(format!("TLS for {url}: {e}")))?;
        }
        (true, None) => {
            return Err(Error::InvalidArgument(format!(
                "{url} is https:// but no CA is given to verify it with (ClientBuilder::tls; CLI: --tls-ca)"
            )))
        }
        (false, Some(_)) => {
            return Err(Error::InvalidArgument(format!("{url} is plaintext but TLS is configured: use https://")))
        }
        (false, None) => {}
    }
    Ok(ep
        .connect_timeout(dial.connect_timeout)
        .tcp_nodelay(true)
        // Detect a dead connection (a server cut off, its packets dropped)
        // while a call hangs on it, within about 3 s: the call then fails,
        // retryably, and goes to another server; the next one reconnects.
        .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
        .keep_alive_timeout(KEEP_ALIVE_TIMEOUT))
}

/// "outer: inner: innermost", for errors whose Display hides the cause; a
/// cause that repeats the one before it word for word (hyper wraps a refused
/// connection in two alike "tcp connect error"s) is said once.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut last = out.clone();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if text != last {
            out.push_str(": ");
            out.push_str(&text);
        }
        last = text;
        source = s.source();
    }
    out
}

impl Servers {
    /// Checks every URL, then connects to the first server that answers, in
    /// list order. [`Error::Connect`] names every failure if none does.
    pub(crate) async fn connect(urls: Vec<String>, dial: Dial) -> Result<Servers, Error> {
        if urls.is_empty() {
            return Err(Error::InvalidArgument("no server url".into()));
        }
        let endpoints = urls.iter().map(|u| endpoint(u, &dial)).collect::<Result<Vec<_>, _>>()?;
        let mut failures = Vec::new();
        for (url, ep) in urls.iter().zip(endpoints) {
            match ep.connect().await {
                Ok(ch) => return Ok(Servers::with(urls.clone(), dial, url.clone(), ch)),
                Err(e) => failures.push((url, e)),
            }
        }
        let texts: Vec<String> = failures.iter().map(|(url, e)| format!("{url}: {}", error_chain(e))).collect();
        let message = texts.join("; ");
        // One server tried: its transport error is the cause.
        Err(match failures.pop() {
            Some((_, e)) if failures.is_empty() => Error::connect_caused(message, e),
            _ => Error::connect(message),
        })
    }

    fn with(urls: Vec<String>, dial: Dial, url: String, ch: Channel) -> Servers {
        let channels = HashMap::from([(url.clone(), ch.clone())]);
        let streams_opened = Arc::new(AtomicU64::new(0));
        let stream = Arc::new(StreamSlot::new(streams_opened.clone(), dial.framed(&url)));
        let now = Current { gen: 0, url, client: dial.client(ch), stream, channels };
        Servers { urls, dial, now: Mutex::new(now), streams_opened }
    }

    /// One server, connected lazily (for tests).
    #[cfg(test)]
    pub(crate) fn lazy(urls: &[&str]) -> Servers {
        let urls: Vec<String> = urls.iter().map(|u| u.to_string()).collect();
        let ch = Endpoint::from_shared(urls[0].clone()).expect("test url").connect_lazy();
        let dial = Dial { connect_timeout: Duration::from_secs(1), tls: None, auth: Auth::default() };
        Servers::with(urls.clone(), dial, urls[0].clone(), ch)
    }

    fn current(&self) -> (u64, Grpc) {
        let now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        (now.gen, now.client.clone())
    }

    /// The server talked to now, with its stream, and the generation.
    fn conn(&self) -> (u64, Conn) {
        let now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        (now.gen, Conn { grpc: now.client.clone(), stream: now.stream.clone() })
    }

    /// How many servers the client knows.
    fn count(&self) -> usize {
        self.urls.len()
    }

    /// The URL talked to now.
    pub(crate) fn url(&self) -> String {
        self.now.lock().unwrap_or_else(|p| p.into_inner()).url.clone()
    }

    /// After a retryable failure of an attempt made at generation `gen`: go to
    /// the leader `hint` names, else to the next server of the list. Returns
    /// whether the client now talks to another server than at `gen`.
    fn failed(&self, gen: u64, hint: Option<String>) -> bool {
        let mut now = self.now.lock().unwrap_or_else(|p| p.into_inner());
        if now.gen != gen {
            return true;
        }
        let next = match hint {
            // A hint is a bare host:port: the scheme is this client's.
            Some(h) => normalize(&h, self.dial.tls.is_some()),
            None if self.urls.len() > 1 => {
                let i = self.urls.iter().position(|u| *u == now.url).map_or(0, |i| (i + 1) % self.urls.len());
                self.urls[i].clone()
            }
            None => return false,
        };
        if next == now.url {
            return false;
        }
        let ch = match now.channels.get(&next) {
            Some(ch) => ch.clone(),
            None => match endpoint(&next, &self.dial) {
                Ok(ep) => ep.connect_lazy(),
                Err(_) => return false,
            },
        };
        tracing::debug!(from = %now.url, to = %next, "fencelock: switching server");
        now.channels.insert(next.clone(), ch.clone());
        now.client = self.dial.client(ch);
        // A new server, a new stream: the old one closes once its calls end.
        now.stream = Arc::new(StreamSlot::new(self.streams_opened.clone(), self.dial.framed(&next)));
        now.url = next;
        now.gen += 1;
        true
    }
}

impl Rpc {
    /// The time one attempt of `op` may take when `left` remains: all of it
    /// for a waiting acquire (cutting it would cost its place in the queue) or
    /// with one server; else half, at least [`MIN_ATTEMPT`].
    fn attempt_budget(&self, op: &str, left: Duration) -> Duration {
        if op == "acquire" || self.servers.urls.len() < 2 {
            left
        } else {
            (left / 2).max(MIN_ATTEMPT).min(left)
        }
    }
}

/// The connection to the group, shared by every handle of a [`crate::Client`].
#[derive(Debug, Clone)]
pub(crate) struct Rpc {
    servers: std::sync::Arc<Servers>,
    /// Deadline of a call that does not wait (and the part of a waiting acquire's
    /// deadline beyond its wait).
    pub(crate) rpc_timeout: Duration,
    backoff: Backoff,
    /// How [`Rpc::send`] sends.
    transport: Transport,
}

impl Rpc {
    pub(crate) fn new(servers: Servers, rpc_timeout: Duration, backoff: Backoff, transport: Transport) -> Rpc {
        Rpc { servers: Arc::new(servers), rpc_timeout, backoff, transport }
    }

    /// How many `Session` streams this client has opened.
    pub(crate) fn streams_opened(&self) -> u64 {
        self.servers.streams_opened.load(Ordering::Relaxed)
    }

    /// The server talked to now.
    pub(crate) fn server(&self) -> String {
        self.servers.url()
    }

    /// How many servers the client was given.
    pub(crate) fn servers_given(&self) -> usize {
        self.servers.count()
    }

    /// The retry policy.
    pub(crate) fn backoff(&self) -> Backoff {
        self.backoff
    }

    /// The raw tonic client of the server talked to now (for the session stream).
    pub(crate) fn raw(&self) -> Grpc {
        self.servers.current().1
    }

    /// The tonic client of the server talked to now, with the generation to
    /// pass to [`Rpc::fail_over`] (for long streams, such as a watch).
    pub(crate) fn current(&self) -> (u64, Grpc) {
        self.servers.current()
    }

    /// After a stream opened at generation `gen` failed: go to the leader
    /// `hint` names, else to the next server. Whether the server changed.
    pub(crate) fn fail_over(&self, gen: u64, hint: Option<String>) -> bool {
        self.servers.failed(gen, hint)
    }

    /// The deadline of a non-waiting call that starts now.
    pub(crate) fn deadline(&self) -> Instant {
        crate::clock::now() + self.rpc_timeout
    }

    /// Runs one logical request until `deadline`. `attempt(client, time_left)` must
    /// send the same message (same request id) every time. `op` names the call in
    /// logs and metrics.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, deadline: Instant, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(Grpc, Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.retry(op, deadline, |conn, left| attempt(conn.grpc, left)).await
    }

    /// [`Rpc::call`] of a request that may ride the shared stream: each
    /// attempt sends the message `build` makes for it (with the same request
    /// id every time) over the client's [`Transport`].
    pub(crate) async fn send<M, B>(&self, op: &'static str, deadline: Instant, mut build: B) -> Result<M::Reply, Error>
    where
        M: StreamOp,
        B: FnMut() -> M,
    {
        let via = self.transport;
        self.retry(op, deadline, |conn, left| transport::attempt(via, conn, build(), left)).await
    }

    /// The retry loop of [`Rpc::call`] and [`Rpc::send`].
    async fn retry<T, F, Fut>(&self, op: &'static str, deadline: Instant, mut attempt: F) -> Result<T, Error>
    where
        F: FnMut(Conn, Duration) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let (mut retries, mut jumps, mut hops) = (0u32, 0u32, 0usize);
        let mut last: Option<Status> = None;
        loop {
            let left = deadline.saturating_duration_since(crate::clock::now());
            if left.is_zero() {
                return Err(exhausted(last));
            }
            let (gen, client) = self.servers.conn();
            let budget = self.attempt_budget(op, left);
            let partial = budget < left;
            let status = match tokio::time::timeout(budget, attempt(client, budget)).await {
                Ok(Ok(resp)) => return Ok(resp.into_inner()),
                Ok(Err(status)) if is_retryable(&status) => status,
                // Only this attempt's share of the time ran out: try elsewhere.
                Ok(Err(status)) if partial && is_timeout(&status) => status,
                Ok(Err(status)) => return Err(Error::from_status(&status)),
                Err(_elapsed) if partial => {
                    Status::deadline_exceeded(format!("{} did not answer within {budget:?}", self.servers.url()))
                }
                // The deadline ran out in this attempt: a timeout if no
                // attempt was answered at all, else as when no retry is left
                // (on a loaded machine the last of a run of refused attempts
                // may still be connecting when the time is up).
                Err(_elapsed) => return Err(exhausted(last)),
            };
            let hint = leader_hint(&status);
            let hinted = hint.is_some();
            let switched = self.servers.failed(gen, hint);
            metrics::rpc_retry(op);
            if switched && hinted && jumps < HINT_JUMPS {
                // A follower named the leader: go there at once.
                jumps += 1;
                last = Some(status);
                continue;
            }
            // Moving to another server costs a short pause, not a longer one
            // each time: a dead server refuses at once, and one round over the
            // list should not use up the backoff. Once a whole round failed,
            // the backoff grows.
            let delay = if switched && hops < self.servers.count() {
                hops += 1;
                self.backoff.delay(0, fastrand::f64())
            } else {
                hops = 0;
                retries += 1;
                self.backoff.delay(retries - 1, fastrand::f64())
            };
            tracing::debug!(op, retries, hops, ?delay, %status, "fencelock: retrying");
            if crate::clock::now() + delay >= deadline {
                return Err(exhausted(Some(status)));
            }
            tokio::time::sleep(delay).await;
            last = Some(status);
        }
    }
}

/// The error once the deadline leaves no room for another retry: the server
/// kept refusing or dropping the call (a closed connection arrives as
/// `Cancelled`), so it is unavailable; with no answer at all, a timeout.
fn exhausted(last: Option<Status>) -> Error {
    match last {
        Some(s) => Error::Unavailable(s.message().to_string()),
        None => Error::Timeout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn rpc() -> Rpc {
        // Never connected: the tests below never touch the channel.
        let backoff = Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(4) };
        Rpc::new(Servers::lazy(&["http://127.0.0.1:1"]), Duration::from_secs(5), backoff, Transport::Unary)
    }

    fn not_leader(leader: &str) -> Status {
        let mut s = Status::unavailable("not the leader");
        s.metadata_mut().insert(crate::backend::native::wire::LEADER_HEADER, leader.parse().unwrap());
        s
    }

    /// A chain of errors for [`error_chain`]: each says `text`, caused by the rest.
    #[derive(Debug)]
    struct Chain(&'static str, Option<Box<Chain>>);

    impl std::fmt::Display for Chain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Chain {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|c| c as &(dyn std::error::Error + 'static))
        }
    }

    fn chain(texts: &[&'static str]) -> Chain {
        texts.iter().rev().fold(None, |cause, t| Some(Chain(t, cause.map(Box::new)))).expect("one text at least")
    }

    /// Clear errors: every cause is named, in order, and one that repeats
    /// the cause before it word for word (hyper's two "tcp connect error"s)
    /// only once.
    #[test]
    fn an_error_chain_says_each_cause_once() {
        let refused = chain(&["transport error", "tcp connect error", "tcp connect error", "Connection refused"]);
        assert_eq!(error_chain(&refused), "transport error: tcp connect error: Connection refused");
        let distinct = chain(&["a", "b", "a"]);
        assert_eq!(error_chain(&distinct), "a: b: a", "only a repeat of the cause just before is left out");
    }

    /// A follower's hint moves the client to the leader; without one, a
    /// failure moves it along the list, round and round; a failure seen by a
    /// call of an older generation moves it no further.
    #[tokio::test]
    async fn failures_move_to_the_named_leader_or_the_next_server() {
        let s = Servers::lazy(&["http://a:1", "http://b:2", "http://c:3"]);
        assert_eq!(s.url(), "http://a:1");
        assert!(s.failed(0, leader_hint(&not_leader("c:3"))));
        assert_eq!(s.url(), "http://c:3");
        assert!(s.failed(0, None), "an older generation's failure: already moved");
        assert_eq!(s.url(), "http://c:3");
        assert!(s.failed(1, None));
        assert_eq!(s.url(), "http://a:1");
        assert!(s.failed(2, None));
        assert_eq!(s.url(), "http://b:2");
        assert!(!s.failed(3, leader_hint(&not_leader("b:2"))), "the hint names this server: stay");
        let one = Servers::lazy(&["http://a:1"]);
        assert!(!one.failed(0, None), "one server: nowhere else to go");
    }

    /// A call refused by a follower is retried at once on the leader it named,
    /// with the same attempt (the same request id).
    #[tokio::test(start_paused = true)]
    async fn a_not_leader_answer_is_retried_on_the_leader_at_once() {
        let backoff = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(1) };
        let rpc =
            Rpc::new(Servers::lazy(&["http://a:1", "http://b:2"]), Duration::from_secs(5), backoff, Transport::Unary);
        let calls = AtomicU32::new(0);
        let start = crate::clock::now();
        let got = rpc
            .call("test", start + Duration::from_secs(5), |_, _| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        Err(not_leader("b:2"))
                    } else {
                        Ok(Response::new(n))
                    }
                }
            })
            .await;
        assert_eq!(got, Ok(1));
        assert_eq!(rpc.server(), "http://b:2");
        assert_eq!(crate::clock::now(), start, "no backoff before following the hint");
    }

    /// A server that hangs gets half the time left; then the call moves on
    /// and the next server answers, within the one deadline.
    #[tokio::test(start_paused = true)]
    async fn a_hung_server_costs_half_the_time_then_the_next_one_answers() {
        let backoff = Backoff { initial: Duration::from_millis(1), max: Duration::from_millis(1) };
        let rpc =
            Rpc::new(Servers::lazy(&["http://a:1", "http://b:2"]), Duration::from_secs(5), backoff, Transport::Unary);
        let calls = AtomicU32::new(0);
        let start = crate::clock::now();
        let got = rpc
            .call("keep_alive", start + Duration::from_secs(4), |_, left| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        assert_eq!(left, Duration::from_secs(2));
                        futures::future::pending().await
                    } else {
                        Ok(Response::new(n))
                    }
                }
            })
            .await;
        assert_eq!(got, Ok(1));
        assert_eq!(rpc.server(), "http://b:2");
        assert!(crate::clock::now() - start < Duration::from_millis(2100));
        // A waiting acquire is never cut short: its place in the queue would go.
        assert_eq!(rpc.attempt_budget("acquire", Duration::from_secs(4)), Duration::from_secs(4));
        assert_eq!(rpc.attempt_budget("keep_alive", Duration::from_millis(300)), Duration::from_millis(250));
        assert_eq!(rpc.attempt_budget("keep_alive", Duration::from_millis(100)), Duration::from_millis(100));
    }

    #[tokio::test]
    async fn retries_unavailable_then_succeeds() {
        let calls = AtomicU32::new(0);
        let got = rpc()
            .call("test", crate::clock::now() + Duration::from_secs(5), |_, _| {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < 3 {
                        Err(Status::unavailable("no leader"))
                    } else {
                        Ok(Response::new(n))
                    }
                }
            })
            .await;
        assert_eq!(got, Ok(3));
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[tokio::test]
    async fn does_not_retry_a_server_refusal() {
        let calls = AtomicU32::new(0);
        let got: Result<(), _> = rpc()
            .call("test", crate::clock::now() + Duration::from_secs(5), |_, _| {
                calls.fetch_add(1, Ordering::SeqCst);
                async { Err(Status::not_found("lease 9 not found")) }
            })
            .await;
        assert_eq!(got, Err(Error::LeaseNotFound("lease 9 not found".into())));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    /// Rule: a refused token is not retried, on any server of the list (the
    /// call does not move on to the next one either).
    #[tokio::test]
    async fn does_not_retry_an_auth_refusal() {
        for status in [Status::unauthenticated("no token"), Status::permission_denied("not yours")] {
            let rpc = Rpc::new(
                Servers::lazy(&["http://a:1", "http://b:2"]),
                Duration::from_secs(5),
                Backoff::default(),
                Transport::Unary,
            );
            let calls = AtomicU32::new(0);
            let got: Result<(), _> = rpc
                .call("test", crate::clock::now() + Duration::from_secs(5), |_, _| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let status = status.clone();
                    async move { Err(status) }
                })
                .await;
            assert_eq!(got, Err(Error::from_status(&status)));
            assert!(matches!(got, Err(Error::Unauthenticated(_) | Error::PermissionDenied(_))), "{got:?}");
            assert_eq!(calls.load(Ordering::SeqCst), 1);
            assert_eq!(rpc.server(), "http://a:1");
        }
    }

    /// Rule: the Debug of a Dial (and so of the servers and the client's
    /// connection) never shows the token.
    #[test]
    fn dial_debug_hides_the_token() {
        let auth = Auth::new(Some("flt_0123abcd_sekrit")).unwrap();
        let dial = Dial { connect_timeout: Duration::from_secs(1), tls: None, auth };
        let debug = format!("{dial:?}");
        assert!(!debug.contains("sekrit") && debug.contains("***"), "{debug}");
    }

    #[tokio::test(start_paused = true)]
    async fn retries_stop_at_the_deadline_with_unavailable() {
        let start = crate::clock::now();
        let deadline = start + Duration::from_millis(500);
        let got: Result<(), _> = rpc().call("test", deadline, |_, _| async { Err(Status::unavailable("down")) }).await;
        assert_eq!(got, Err(Error::Unavailable("down".into())));
        assert!(crate::clock::now() <= deadline, "never sleeps past the deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_attempt_ends_at_the_deadline_with_timeout() {
        let start = crate::clock::now();
        let got: Result<(), _> = rpc()
            .call("test", start + Duration::from_millis(300), |_, left| async move {
                assert_eq!(left, Duration::from_millis(300));
                futures::future::pending().await
            })
            .await;
        assert_eq!(got, Err(Error::Timeout));
        assert_eq!(crate::clock::now() - start, Duration::from_millis(300));
    }

    /// Refused attempts, then one that the deadline cuts (a loaded machine,
    /// still connecting): unavailable, as the refusals say, not a timeout.
    /// CI once saw a timeout from calls over connections reset at once.
    #[tokio::test(start_paused = true)]
    async fn refused_attempts_then_one_cut_by_the_deadline_are_unavailable() {
        let start = crate::clock::now();
        let attempts = std::sync::atomic::AtomicU32::new(0);
        let got: Result<(), _> = rpc()
            .call("test", start + Duration::from_millis(500), |_, _| {
                let n = attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async move {
                    if n < 2 {
                        return Err(Status::unavailable("connection reset"));
                    }
                    futures::future::pending().await
                }
            })
            .await;
        assert_eq!(got, Err(Error::Unavailable("connection reset".into())));
        assert_eq!(attempts.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}
