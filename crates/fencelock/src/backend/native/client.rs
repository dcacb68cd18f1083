//! [`Client`]: the entry point. Connecting, taking locks, and the plain RPCs.
//!
//! Where it sits: on top of [`crate::backend::native::rpc`] (deadlines, retries) and
//! [`crate::backend::native::registry`] (shared leases). [`Client::lock`] builds a
//! [`LockRequest`] (see [`crate::backend::native::acquire`]). Everything else here is one RPC.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use fencelock_proto::v1 as pb;

use super::{lease_rpc, Client, Inner};
use crate::backend::native::acquire;
use crate::backend::native::auth::Auth;
use crate::backend::native::registry::Registry;
use crate::backend::native::rpc::{Dial, Rpc, Servers};
use crate::backend::native::session::Session;
use crate::backend::native::tls::ClientTls;
use crate::backend::native::transport::Transport;
use crate::backend::native::wire::{new_request_id, request};
use crate::backend::tls::TlsFiles;
use crate::backend::LockRequest;
use crate::backend::Outcome;
use crate::backend::{BackendUrl, Scheme};
use crate::backoff::Backoff;
use crate::error::Error;
use crate::types::{CheckResult, Grant, LockInfo, LockOptions};

/// Default deadline of one RPC (beyond the wait of a waiting acquire).
pub const DEFAULT_RPC_TIMEOUT: Duration = Duration::from_secs(10);

/// Default of [`ClientBuilder::lease_linger`].
pub const DEFAULT_LEASE_LINGER: Duration = Duration::from_secs(2);

/// Configures a [`Client`]; from [`Client::builder`]. Its `Debug` hides the
/// token.
///
/// # Examples
///
/// A client of a group with TLS, a bearer token and an identity shown to
/// operators. A token read from a file must be trimmed: a trailing newline
/// fails [`connect`](ClientBuilder::connect) with [`Error::InvalidArgument`].
///
/// ```no_run
/// use std::path::Path;
/// use std::time::Duration;
/// use fencelock::{Client, ClientTls};
///
/// # async fn demo(token: String) -> Result<(), fencelock::Error> {
/// let tls = ClientTls::from_files(Path::new("/etc/fencelock/ca.pem"), None, None)?;
/// let client = Client::builder("fencelock://lock-1.internal,lock-2.internal,lock-3.internal")
///     .tls(tls) // the URL then means fencelock+tls://
///     .token(token.trim())
///     .identity("billing-worker-3")
///     .rpc_timeout(Duration::from_secs(5))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
///
/// The same from a URL alone:
/// `fencelock+tls://lock-1.internal,lock-2.internal?ca=/etc/fencelock/ca.pem&token=…`.
#[derive(Clone)]
pub struct ClientBuilder {
    url: String,
    rpc_timeout: Duration,
    connect_timeout: Duration,
    backoff: Backoff,
    lease_linger: Duration,
    tls: Option<ClientTls>,
    token: Option<String>,
    identity: Option<String>,
    transport: Option<Transport>,
}

impl fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &self.url)
            .field("rpc_timeout", &self.rpc_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("backoff", &self.backoff)
            .field("lease_linger", &self.lease_linger)
            .field("tls", &self.tls)
            // Never the token.
            .field("token", &self.token.as_ref().map(|_| "***"))
            .field("identity", &self.identity)
            .field("transport", &self.transport)
            .finish()
    }
}

impl ClientBuilder {
    /// Deadline of every RPC; a waiting acquire gets its wait plus this. Retries
    /// happen within it. Default 10 s.
    pub fn rpc_timeout(mut self, timeout: Duration) -> Self {
        self.rpc_timeout = timeout;
        self
    }

    /// How long to try the first connection. Default 5 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Delays between retries of one request. Default 50 ms doubling to 2 s.
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long a lease whose last lock was released is kept (renewed, holding
    /// nothing) before it is revoked, so that the next acquire with the same TTL
    /// needs no new lease: a loop of acquire → release then costs two commands
    /// on the server, not four. Zero revokes at once. Dropping the last clone of
    /// the client revokes lingering leases at once, in the background; a
    /// process about to exit awaits [`LockBackend::close`](crate::LockBackend::close) instead. Default 2 s.
    pub fn lease_linger(mut self, linger: Duration) -> Self {
        self.lease_linger = linger;
        self
    }

    /// Talks TLS to every server of the URL, verifying them with `tls`'s CA
    /// (and presenting its client certificate, if any), whatever the URL's
    /// scheme (`fencelock://a` then means `fencelock+tls://a`, as `--tls-ca`
    /// does for the CLI). It replaces the URL's `ca=`, `cert=` and `key=`.
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Authenticates every call with the bearer token `token`, for servers
    /// that require one: each RPC, and the opening of a [`Session`] stream,
    /// carries `authorization: Bearer <token>`. The token is opaque; it must be
    /// non-empty visible ASCII without whitespace (see
    /// [`check_auth_token`](crate::check_auth_token)), else [`connect`](Self::connect)
    /// fails with [`Error::InvalidArgument`]. It is never shown (`Debug` hides
    /// it). A server that refuses it answers [`Error::Unauthenticated`] or
    /// [`Error::PermissionDenied`], which are not retried. It replaces the
    /// URL's `token=`.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// The holder identity sent with every acquire of this client that does not
    /// name its own ([`LockOptions::identity`]), e.g. `"host:pid"` or a pod
    /// name: it is what `fencelock locks` and [`Client::describe`] show for the
    /// holder and the waiters. At most 256 bytes of UTF-8 without control
    /// characters (checked at connect). Default none: a library does not guess
    /// what identifies its process (the CLI sends `hostname:pid`).
    pub fn identity(mut self, identity: impl Into<String>) -> Self {
        self.identity = Some(identity.into());
        self
    }

    /// How acquires, releases, lease grants and keep-alives travel: [`Transport::Stream`]
    /// (the default) sends them as small
    /// messages on one long-lived `Session` stream per server connection,
    /// shared by every lock and lease of the client, many in flight at once;
    /// [`Transport::Unary`] makes one gRPC call each, for simple tools and
    /// debugging. Both retry, time out, fail over and keep request ids by
    /// the same rules (see the `transport` module). Other calls (revokes,
    /// checks, describe, watches...) are unary either way. It replaces the
    /// URL's `transport=stream|unary`.
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = Some(transport);
        self
    }

    /// Connects to the first server of the list that answers. Fails with
    /// [`Error::InvalidArgument`] for a malformed URL or token, or the URL of
    /// another backend; [`Error::Security`] for a TLS file that cannot be
    /// read; [`Error::Connect`] if no server can be reached now. Later
    /// failures are retried by every RPC until its deadline, following the
    /// leader a follower names, else moving along the list.
    pub async fn connect(self) -> Result<Client, Error> {
        let url = BackendUrl::parse(&self.url)?;
        let identity = self.identity.as_deref().unwrap_or("");
        fencelock_core::check_identity(identity).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if url.scheme != Scheme::Native {
            return Err(Error::InvalidArgument(format!(
                "{url}: a Client talks to a fencelock server (fencelock://, fencelock+tls://, http://, https://); \
                 fencelock::connect takes the {} backend",
                url.scheme
            )));
        }
        let tls = match self.tls {
            Some(tls) => Some(tls),
            None => url_tls(&url)?,
        };
        let token = self.token.or_else(|| url.auth_token());
        let transport = match (self.transport, url.param(Transport::PARAM)) {
            (Some(t), _) => t,
            (None, Some(p)) => Transport::from_param(p)?,
            (None, None) => Transport::default(),
        };
        let auth = Auth::new(token.as_deref())?;
        let urls = BackendUrl { tls: tls.is_some(), ..url }.native_endpoint_list();
        let dial = Dial { connect_timeout: self.connect_timeout, tls, auth };
        let servers = Servers::connect(urls, dial).await?;
        let rpc = Rpc::new(servers, self.rpc_timeout, self.backoff, transport);
        let leases = Registry::new(rpc.clone(), tokio::runtime::Handle::current(), self.lease_linger);
        Ok(Client { inner: Arc::new(Inner { rpc, leases, identity: self.identity }) })
    }
}

impl Client {
    /// Connects to `url` (e.g. `fencelock://127.0.0.1:7070`, or a group's
    /// members comma-separated, see [`Client::builder`]) with the defaults.
    pub async fn connect(url: impl Into<String>) -> Result<Client, Error> {
        Client::builder(url).connect().await
    }

    /// A builder for a client of `url`, a fencelock server URL as every
    /// client of fencelock takes it (the CLI's `--server`, [`crate::connect`]):
    /// one server (`fencelock://host:port`, or `http://host:port`), or the
    /// members of a group, comma-separated, each with or without the scheme
    /// (`fencelock://a:7070,b:7070,c:7070`, `http://a:7070,http://b:7070`); a
    /// port left out is 7070. TLS is `fencelock+tls://` (or `https://`) with
    /// `?ca=FILE[&cert=FILE&key=FILE]`, or [`ClientBuilder::tls`]; a bearer
    /// token is `token=` or [`ClientBuilder::token`]. Parsed by
    /// [`BackendUrl::parse`](crate::backend::BackendUrl::parse), at connect.
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            url: url.into(),
            rpc_timeout: DEFAULT_RPC_TIMEOUT,
            connect_timeout: Duration::from_secs(5),
            backoff: Backoff::default(),
            lease_linger: DEFAULT_LEASE_LINGER,
            tls: None,
            token: None,
            identity: None,
            transport: None,
        }
    }

    /// The server this client talks to now (`http://host:port`): the first of
    /// its list that answered, or the leader it was last sent to.
    pub fn server(&self) -> String {
        self.inner.rpc.server()
    }

    /// How many `Session` streams the client has opened for its locks and
    /// leases ([`ClientBuilder::transport`]): one per server it talked to,
    /// and one more each time a stream broke. Zero with [`Transport::Unary`].
    /// For diagnostics and tests.
    pub fn streams_opened(&self) -> u64 {
        self.inner.rpc.streams_opened()
    }

    /// How many servers the client was given: more than one is a group it
    /// can fail over in (see [`Capabilities::survives_failover`](crate::Capabilities::survives_failover)).
    pub fn servers_given(&self) -> usize {
        self.inner.rpc.servers_given()
    }

    /// A request for the lock `name`, with default [`LockOptions`] (15 s TTL, try
    /// once, no lock-delay).
    pub fn lock(&self, name: impl Into<String>) -> LockRequest {
        LockRequest::new(Arc::new(self.clone()), name.into())
    }

    /// Is `token` the current live grant of `name`? (Chubby's CheckSequencer.) A
    /// window remains between this check and any action taken on its answer:
    /// prefer a resource that stores and compares tokens.
    pub async fn check(&self, name: &str, token: u64) -> Result<CheckResult, Error> {
        let msg = pb::CheckRequest { lock: name.to_string(), token };
        let rpc = &self.inner.rpc;
        rpc.call("check", rpc.deadline(), |mut c, left| {
            let req = request(msg.clone(), left);
            async move { c.check(req).await }
        })
        .await
        .map(CheckResult::from)
    }

    /// Tells the group that a fence refused a stale write on `lock`: its
    /// token `refused` was below `highest`, the highest token the fence had
    /// admitted, on `resource` (what the fence protects, a storage key; ""
    /// for none). This is how "a paused holder tried to write late" reaches
    /// an operator: every member's watch shows one
    /// [`WatchKind::WriteRefused`](crate::WatchKind::WriteRefused) event of
    /// the lock (with this client's authenticated identity), the server
    /// counts it and writes it to its audit log. Nothing about the lock
    /// changes. `fencelock_fence::report::Reporter` sends these from a
    /// fence's write path without blocking it.
    ///
    /// Needs the `check` verb on `lock` (as [`check`](Self::check) does).
    /// Refused before anything is written: [`Error::InvalidArgument`] for a
    /// bad name, a token 0, `refused >= highest` (a fence admits an equal
    /// token) or a resource over 256 bytes or with a control character;
    /// [`Error::LimitReached`] beyond the server's rate of reports (50 a
    /// second, bursts of 100, per node) or this identity's request rate.
    /// A report is not de-duplicated: one retried after a lost answer may be
    /// shown twice.
    pub async fn report_refusal(&self, lock: &str, refused: u64, highest: u64, resource: &str) -> Result<(), Error> {
        let msg = pb::ReportRefusalRequest {
            lock: lock.to_string(),
            refused_token: refused,
            highest_token: highest,
            resource: resource.to_string(),
        };
        let rpc = &self.inner.rpc;
        rpc.call("report_refusal", rpc.deadline(), |mut c, left| {
            let req = request(msg.clone(), left);
            async move { c.report_refusal(req).await }
        })
        .await
        .map(drop)
    }

    /// One lock as the server sees it (no holder and no waiters if nobody holds or
    /// waits for it).
    pub async fn describe(&self, name: &str) -> Result<LockInfo, Error> {
        self.describe_at(name).await.map(|(info, _)| info)
    }

    /// The slots of `name` that runs once per slot completed within the
    /// server's retention (7 days), newest first, at most 32: who ran each
    /// (token, identity) and how it ended.
    pub async fn completed_slots(&self, name: &str) -> Result<Vec<crate::types::CompletedSlot>, Error> {
        let resp = self.describe_lock(name).await?;
        Ok(resp.slots.into_iter().map(crate::types::CompletedSlot::from).collect())
    }

    /// [`describe`](Self::describe), and the first watch revision after the
    /// state it shows (`None` from a server too old to say).
    pub(crate) async fn describe_at(&self, name: &str) -> Result<(LockInfo, Option<crate::Revision>), Error> {
        let resp = self.describe_lock(name).await?;
        let next = resp.next.map(|r| crate::Revision { index: r.index, seq: r.seq });
        let info = resp.lock.map(LockInfo::from);
        Ok((info.ok_or_else(|| Error::Protocol("DescribeLockResponse without a lock".into()))?, next))
    }

    /// The `DescribeLock` call.
    async fn describe_lock(&self, name: &str) -> Result<pb::DescribeLockResponse, Error> {
        let msg = pb::DescribeLockRequest { lock: name.to_string() };
        let rpc = &self.inner.rpc;
        rpc.call("describe_lock", rpc.deadline(), |mut c, left| {
            let req = request(msg.clone(), left);
            async move { c.describe_lock(req).await }
        })
        .await
    }

    /// Held or waited-on locks whose name starts with `prefix`, sorted by name; at
    /// most `limit` (0 = the server's default, 1000).
    pub async fn list(&self, prefix: &str, limit: u32) -> Result<Vec<LockInfo>, Error> {
        let msg = pb::ListLocksRequest { prefix: prefix.to_string(), limit };
        let rpc = &self.inner.rpc;
        let resp = rpc
            .call("list_locks", rpc.deadline(), |mut c, left| {
                let req = request(msg.clone(), left);
                async move { c.list_locks(req).await }
            })
            .await?;
        Ok(resp.locks.into_iter().map(LockInfo::from).collect())
    }

    /// Releases the grant `(name, lease_id, token)` if it is current
    /// (compare-and-delete). `Ok(false)`: it was not (already released, lease gone,
    /// or a later holder); nothing changed. For grants from
    /// [`acquire_detached`](Self::acquire_detached); a guard releases itself.
    pub async fn release_raw(&self, name: &str, lease_id: u64, token: u64) -> Result<bool, Error> {
        let msg = pb::ReleaseRequest { request_id: new_request_id(), lease_id, lock: name.to_string(), token };
        let rpc = &self.inner.rpc;
        let resp = rpc.send("release", rpc.deadline(), || msg.clone()).await;
        match resp {
            Ok(r) => Ok(r.released),
            Err(Error::LeaseNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Replaces the value published with the grant `(name, lease_id, token)` if
    /// it is current (compare-and-set). `Ok(false)`: it was not; nothing
    /// changed. For grants from [`acquire_detached`](Self::acquire_detached); a
    /// guard has [`crate::Guard::set_value`].
    pub async fn set_value_raw(&self, name: &str, lease_id: u64, token: u64, value: Vec<u8>) -> Result<bool, Error> {
        crate::backend::check_value(&value)?;
        let msg = pb::SetValueRequest { request_id: new_request_id(), lease_id, lock: name.to_string(), token, value };
        let rpc = &self.inner.rpc;
        let resp = rpc
            .call("set_value", rpc.deadline(), |mut c, left| {
                let req = request(msg.clone(), left);
                async move { c.set_value(req).await }
            })
            .await;
        match resp {
            Ok(r) => Ok(r.set),
            Err(Error::LeaseNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Records that the grant `(name, lease_id, token)` completed `slot` with
    /// `exit_code`. `Ok(false)`: it was not the current grant; nothing
    /// recorded. A guard has [`crate::Guard::complete_slot`].
    pub async fn complete_slot_raw(
        &self,
        name: &str,
        lease_id: u64,
        token: u64,
        slot: &str,
        exit_code: i32,
    ) -> Result<bool, Error> {
        let (lock, slot, request_id) = (name.to_string(), slot.to_string(), new_request_id());
        let msg = pb::CompleteSlotRequest { request_id, lease_id, lock, token, slot, exit_code };
        let rpc = &self.inner.rpc;
        let resp = rpc
            .call("complete_slot", rpc.deadline(), |mut c, left| {
                let req = request(msg.clone(), left);
                async move { c.complete_slot(req).await }
            })
            .await;
        match resp {
            Ok(r) => Ok(r.completed),
            Err(Error::LeaseNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Turns the exclusive grant `(name, lease_id, token)` of a read-write
    /// lock into a shared one. `Ok(false)`: it was not a current exclusive
    /// grant; nothing changed. A guard has [`crate::Guard::downgrade`].
    pub async fn downgrade_raw(&self, name: &str, lease_id: u64, token: u64) -> Result<bool, Error> {
        let msg = pb::DowngradeRequest { request_id: new_request_id(), lease_id, lock: name.to_string(), token };
        let rpc = &self.inner.rpc;
        let resp = rpc
            .call("downgrade", rpc.deadline(), |mut c, left| {
                let req = request(msg.clone(), left);
                async move { c.downgrade(req).await }
            })
            .await;
        match resp {
            Ok(r) => Ok(r.downgraded),
            Err(Error::LeaseNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Gives the semaphore `name` `permits` permits from now on; returns the
    /// number it had. An admin's call ([`Error::PermissionDenied`] for anyone
    /// else when the server has authentication on). [`Error::InvalidArgument`]
    /// when `name` is not a semaphore now (a read-write lock, or nobody holds
    /// or waits for it) or when fewer permits than its holders use, or than
    /// one queued acquire asks for, would be left. A resize up grants the
    /// waiters at once; later acquires must name the new number. Setting the
    /// same number again changes nothing, so the call is retried on its own.
    pub async fn resize(&self, name: &str, permits: u32) -> Result<u32, Error> {
        let msg = pb::ResizeRequest { lock: name.to_string(), permits };
        let rpc = &self.inner.rpc;
        let resp = rpc
            .call("resize", rpc.deadline(), |mut c, left| {
                let req = request(msg.clone(), left);
                async move { c.resize(req).await }
            })
            .await?;
        Ok(resp.was)
    }

    /// Ends the lease now: its locks are released (without lock-delay) and its
    /// waits dropped. [`Error::LeaseNotFound`] if it is gone already. If it is a
    /// lease of this client, its guards see [`LeaseLost::Revoked`](crate::LeaseLost::Revoked).
    pub async fn revoke_lease(&self, lease_id: u64) -> Result<(), Error> {
        lease_rpc::revoke(&self.inner.rpc, lease_id).await?;
        self.inner.leases.revoked(lease_id);
        Ok(())
    }

    /// Acquires `name` on a fresh lease of its own, kept alive only while the
    /// request waits; after the grant nothing renews it, so the lock is held until
    /// [`release_raw`](Self::release_raw) or [`revoke_lease`](Self::revoke_lease),
    /// or until the lease expires one TTL after the grant. For scripts that hand
    /// the grant to another process. If the lock is not acquired, the lease is
    /// revoked before this returns.
    pub async fn acquire_detached(&self, name: &str, opts: LockOptions) -> Result<Outcome<Grant>, Error> {
        let start = crate::clock::now();
        let result = self.detached(&[name], &opts, start).await.and_then(super::proto::single);
        acquire::record(&result, start);
        result
    }

    /// [`acquire_detached`](Self::acquire_detached) of every lock of `names`
    /// at once (an atomic multi-lock, see [`crate::LockBackend::acquire_all`]):
    /// one grant per lock, in the order named, all on one lease of its own.
    /// Releasing one grant with [`release_raw`](Self::release_raw) leaves the
    /// others held; [`revoke_lease`](Self::revoke_lease) ends them all.
    pub async fn acquire_all_detached(&self, names: &[&str], opts: LockOptions) -> Result<Outcome<Vec<Grant>>, Error> {
        let start = crate::clock::now();
        let result = self.detached(names, &opts, start).await;
        acquire::record(&result, start);
        result
    }

    /// Opens a [`Session`]: a bidirectional stream of its own that carries many
    /// concurrent operations, for callers that manage their own leases (no
    /// watchdog, no guards, no retries); see [`Session`]. The client's own
    /// locks need none: they already share one stream ([`ClientBuilder::transport`]).
    pub async fn session(&self) -> Result<Session, Error> {
        let identity = self.inner.identity.clone().unwrap_or_default();
        Session::open(self.inner.rpc.raw(), self.inner.rpc.rpc_timeout, identity).await
    }

    pub(crate) fn runtime(&self) -> tokio::runtime::Handle {
        self.inner.leases.runtime()
    }
}

/// The TLS of a `fencelock+tls://` URL, from its `ca=` (required: a group's
/// certificates are signed by its own CA), `cert=` and `key=`; `None` for a
/// plaintext URL.
fn url_tls(url: &BackendUrl) -> Result<Option<ClientTls>, Error> {
    let Some(files) = TlsFiles::from_url(url)? else {
        return Ok(None);
    };
    if url.param("ca").is_none() {
        return Err(Error::InvalidArgument(format!(
            "{url}: name the CA of the group's certificates with ca=/path/ca.pem"
        )));
    }
    Ok(Some(ClientTls::from(files)))
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("rpc_timeout", &self.inner.rpc.rpc_timeout).finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_is_send_sync_and_clone() {
        fn check<T: Send + Sync + Clone + 'static>() {}
        check::<Client>();
        fn check_guard<T: Send + Sync + 'static>() {}
        check_guard::<crate::backend::native::guard::LockGuard>();
        check_guard::<crate::Guard>();
        check_guard::<crate::LeaseWatch>();
        check_guard::<Session>();
    }

    /// Compiles only if `with_lock` (with a closure borrowing the guard) and
    /// `acquire` can run on a multi-threaded runtime.
    #[allow(dead_code)]
    fn futures_are_send(client: Client) {
        fn is_send<T: Send + 'static>(_: T) {}
        let c = client.clone();
        is_send(
            async move { crate::with_lock(&c, "a", LockOptions::default(), async |g: &crate::Guard| g.token()).await },
        );
        is_send(client.lock("a").acquire());
    }

    /// Errors keep their sources: one server that cannot be reached is an
    /// `Error::Connect` caused by tonic's transport error.
    #[tokio::test]
    async fn connecting_to_a_closed_port_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let got = Client::builder(format!("http://{addr}")).connect_timeout(Duration::from_secs(1)).connect().await;
        let Err(Error::Connect { message, source: Some(cause) }) = got else { panic!("{got:?}") };
        assert!(message.contains(&format!("http://{addr}")), "{message}");
        assert!(cause.get().downcast_ref::<tonic::transport::Error>().is_some(), "{cause:?}");
    }

    /// Rule: the builder's Debug never shows the token.
    #[test]
    fn builder_debug_hides_the_token() {
        let b = Client::builder("http://127.0.0.1:7070").token("flt_0123abcd_sekritsekrit");
        let debug = format!("{b:?}");
        assert!(!debug.contains("sekrit") && debug.contains("token: Some(\"***\")"), "{debug}");
        let debug = format!("{:?}", Client::builder("http://127.0.0.1:7070"));
        assert!(debug.contains("token: None"), "{debug}");
    }

    /// Rule: a token that cannot be a header value fails connect with a clear
    /// InvalidArgument, before any dialing (the port here is closed: a
    /// Connect error would mean the token was not checked first).
    #[tokio::test]
    async fn an_invalid_token_fails_connect_before_dialing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        for bad in ["", "flt_1 sekrit", "flt_1sekrit\n"] {
            let got = Client::builder(format!("http://{addr}")).token(bad).connect().await;
            match got {
                Err(Error::InvalidArgument(m)) => {
                    assert!(m.starts_with("invalid auth token") && !m.contains("sekrit"), "{m}")
                }
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_malformed_url_is_an_invalid_argument() {
        let got = Client::connect("not a url").await;
        assert!(matches!(got, Err(Error::InvalidArgument(_))), "{got:?}");
    }

    /// Issue 16: one grammar for `Client::connect` and every other client
    /// (`BackendUrl`). Each URL here fails before any dialing, for the reason
    /// the parser or the TLS files give, not with a connect error.
    #[tokio::test]
    async fn the_client_takes_the_backend_url_grammar() {
        let cases = [
            ("127.0.0.1:7070", "no scheme"),
            ("http://a:7070,http://b:x", "bad port \"x\""),
            ("fencelock://a:1,redis://b:2", "one scheme, not both fencelock and redis"),
            ("redis://127.0.0.1:6379", "fencelock::connect takes the redis backend"),
            ("fencelock+tls://127.0.0.1:7070", "name the CA of the group's certificates with ca="),
            ("fencelock://127.0.0.1:7070?ca=/ca.pem", "ca= is for a TLS connection"),
            ("fencelock://127.0.0.1:7070?token=two%20words", "invalid auth token"),
        ];
        for (url, why) in cases {
            match Client::connect(url).await {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(why), "{url}: {m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        let missing = Client::connect("https://127.0.0.1:7070?ca=/nonexistent/ca.pem").await;
        assert!(
            matches!(&missing, Err(Error::Security { message, .. }) if message.contains("/nonexistent/ca.pem")),
            "{missing:?}"
        );
    }

    /// Every member of a list is dialled in order, whichever way the list is
    /// spelt: with both ports closed, the connect error names both.
    #[tokio::test]
    async fn every_member_of_a_list_is_tried() {
        let closed = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (a, b) = (closed(), closed());
        for url in [format!("fencelock://{a},{b}"), format!("http://{a},http://{b}"), format!("http://{a},{b}")] {
            let got = Client::builder(&url).connect_timeout(Duration::from_secs(1)).connect().await;
            match got {
                Err(Error::Connect { message: m, source: None }) => {
                    assert!(m.contains(&format!("http://{a}")) && m.contains(&format!("http://{b}")), "{url}: {m}")
                }
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
