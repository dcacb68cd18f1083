//! The connection: ZooKeeper sessions, one shared per requested TTL and kept
//! for [`SESSION_LINGER`] after its last use; the watcher that loses every
//! guard of a session when it ends; the bound on each request; and how a
//! driver error becomes an [`Error`] (keeping it as the source).
//!
//! Where it sits: under [`super::ZkBackend`]; every request of the recipe
//! goes through [`request`] on a [`Session`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::ZkBackend;
use crate::backend::KeptLease;
use crate::error::Error;
use crate::lease::LeaseLost;

/// Bound of a connection attempt (every host of the URL tried once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Session timeout of the probe opened by `connect` and of the session `check`
/// opens when no lock session is live.
pub(super) const PROBE_SESSION: Duration = Duration::from_secs(5);
/// Bound of one request (a request on a disconnected session waits for the
/// reconnection, which the client gives up after 7/5 of the session timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a session is kept after its last use (see the module docs).
pub const SESSION_LINGER: Duration = Duration::from_secs(2);

/// Where and as whom sessions are opened: the connect string and the
/// `digest` credentials (`user:password`), if the URL gives them.
#[derive(Clone)]
pub(super) struct Login {
    /// `h:p,h:p` for the client.
    pub(super) hosts: String,
    pub(super) auth: Option<String>,
}

/// A session kept after its last use.
pub(super) struct Lingering {
    pub(super) session: Arc<Session>,
    pub(super) last_used: Instant,
}

impl ZkBackend {
    /// The connected session for `ttl`, opened if there is none. Opening holds
    /// the map's lock, so concurrent first acquires of one TTL share one session
    /// (and acquires of other TTLs wait for the opening, at most
    /// [`CONNECT_TIMEOUT`]). A session cut off from the ensemble is not handed
    /// to new acquires (its guards keep it): it may be reconnecting to a
    /// restarted server for a while, or expire, where a new session connects
    /// at once to whichever server answers (a kept session once delayed the
    /// first write after a restart of ZooKeeper by 4.6 s in chaos K4). Nor is
    /// a session that may still own a node nobody holds
    /// ([`Session::is_orphaning`]): that node goes only with the session.
    pub(super) async fn session(&self, ttl: Duration) -> Result<Arc<Session>, Error> {
        let mut sessions = self.sessions.lock().await;
        if let Some(live) = sessions.get(&ttl).and_then(Weak::upgrade).filter(|s| s.is_reusable()) {
            self.linger(ttl, &live);
            return Ok(live);
        }
        let session = Arc::new(Session::open(&self.login, ttl).await?);
        sessions.retain(|_, s| s.strong_count() > 0);
        sessions.insert(ttl, Arc::downgrade(&session));
        self.linger(ttl, &session);
        Ok(session)
    }

    /// Keeps `session` (for `ttl`) until [`SESSION_LINGER`] after now, its last
    /// use: one task per kept session ends it when that time passes unused.
    fn linger(&self, ttl: Duration, session: &Arc<Session>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let mut kept = self.lingering.lock().unwrap_or_else(PoisonError::into_inner);
        let now = crate::clock::now();
        let same = kept.get(&ttl).is_some_and(|l| Arc::ptr_eq(&l.session, session));
        let fresh = kept.insert(ttl, Lingering { session: session.clone(), last_used: now }).is_none();
        if fresh || !same {
            runtime.spawn(end_lingering(Arc::downgrade(&self.lingering), ttl, session.clone()));
        }
    }

    /// Any live session of this backend, or a new one that is not shared (for
    /// reads).
    pub(super) async fn any_session(&self) -> Result<Arc<Session>, Error> {
        let sessions = self.sessions.lock().await;
        if let Some(live) = sessions.values().filter_map(Weak::upgrade).find(|s| s.is_live()) {
            return Ok(live);
        }
        drop(sessions);
        Ok(Arc::new(Session::open(&self.login, PROBE_SESSION).await?))
    }
}

/// One ZooKeeper session shared by the guards of one TTL. Dropping the last
/// reference closes it (the server then deletes its nodes).
pub(super) struct Session {
    pub(super) client: zk::Client,
    pub(super) login: Login,
    /// The session id (the guards' lease id).
    pub(super) id: u64,
    /// The negotiated session timeout.
    pub(super) timeout: Duration,
    /// The leases of the guards on this session, lost together when it ends.
    leases: Arc<StdMutex<Vec<Weak<KeptLease>>>>,
    /// Watches the session state; aborted on drop.
    watcher: JoinHandle<()>,
    /// Set when the delete of a node no one holds any more gave up (its
    /// outcome unknown): the node may still be there, first in its queue, and
    /// goes only when the session does, so no new acquire may keep the session.
    orphaning: AtomicBool,
}

impl Session {
    /// Opens a session asking for `ttl` as its timeout.
    pub(super) async fn open(login: &Login, ttl: Duration) -> Result<Session, Error> {
        let hosts = &login.hosts;
        let client = open_client_patiently(login, ttl).await.map_err(|e| e.backend(hosts))?;
        let leases = Arc::new(StdMutex::new(Vec::new()));
        let watcher = tokio::spawn(lose_all_when_ended(client.state_watcher(), leases.clone()));
        let id = client.session_id().0 as u64;
        let timeout = client.session_timeout();
        let orphaning = AtomicBool::new(false);
        Ok(Session { client, login: login.clone(), id, timeout, leases, watcher, orphaning })
    }

    /// True until the client learns that the session ended.
    pub(super) fn is_live(&self) -> bool {
        !self.client.state().is_terminated()
    }

    /// Whether the session is connected to a server now.
    pub(super) fn is_connected(&self) -> bool {
        matches!(self.client.state(), zk::SessionState::SyncConnected | zk::SessionState::ConnectedReadOnly)
    }

    /// Whether a new acquire may use this session: connected, and owning no
    /// node that nobody holds.
    fn is_reusable(&self) -> bool {
        self.is_connected() && !self.is_orphaning()
    }

    /// Whether a delete of a node nobody holds gave up on this session.
    pub(super) fn is_orphaning(&self) -> bool {
        self.orphaning.load(Ordering::Relaxed)
    }

    /// Marks the session as maybe owning a node nobody holds (see
    /// `orphaning`): it ends once its current users go.
    pub(super) fn orphan(&self) {
        self.orphaning.store(true, Ordering::Relaxed);
    }

    /// Adds a guard's lease to those lost when the session ends (at once if it
    /// ended already).
    pub(super) fn register(&self, lease: &Arc<KeptLease>) {
        let mut leases = self.leases.lock().unwrap_or_else(PoisonError::into_inner);
        leases.retain(|l| l.strong_count() > 0);
        leases.push(Arc::downgrade(lease));
        drop(leases);
        if !self.is_live() {
            lease.lose(LeaseLost::NotFound);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// Drops the kept session for `ttl` once [`SESSION_LINGER`] has passed since
/// its last use (or when another session replaced it, or the backend is gone).
async fn end_lingering(kept: Weak<StdMutex<HashMap<Duration, Lingering>>>, ttl: Duration, session: Arc<Session>) {
    let session = Arc::downgrade(&session);
    loop {
        let until = {
            let Some(kept) = kept.upgrade() else { return };
            let mut kept = kept.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(l) = kept.get(&ttl).filter(|l| Weak::ptr_eq(&Arc::downgrade(&l.session), &session)) else {
                return;
            };
            let until = l.last_used + SESSION_LINGER;
            if crate::clock::now() >= until {
                kept.remove(&ttl);
                return;
            }
            until
        };
        tokio::time::sleep_until(until).await;
    }
}

/// Waits until the session ends (expired, closed, authentication failed), then
/// loses every lease registered on it.
async fn lose_all_when_ended(states: zk::StateWatcher, leases: Arc<StdMutex<Vec<Weak<KeptLease>>>>) {
    let state = terminal_state(states).await;
    tracing::warn!(%state, "fencelock: zk session ended; its locks are lost");
    let leases = std::mem::take(&mut *leases.lock().unwrap_or_else(PoisonError::into_inner));
    for lease in leases.iter().filter_map(Weak::upgrade) {
        lease.lose(LeaseLost::NotFound);
    }
}

/// Resolves once the client learns that `session` ended.
pub(super) async fn ended(session: &Session) {
    terminal_state(session.client.state_watcher()).await;
}

/// The state that ends the session `states` watches, once it comes.
async fn terminal_state(mut states: zk::StateWatcher) -> zk::SessionState {
    let mut state = states.state();
    while !state.is_terminated() {
        state = states.changed().await;
    }
    state
}

/// A new client session with `timeout` asked for, logged in with `digest`
/// if `login` says so; every host is tried once.
pub(super) async fn open_client(login: &Login, timeout: Duration) -> Result<zk::Client, NoSession> {
    let mut connector = zk::Client::connector().with_session_timeout(timeout).with_fail_eagerly();
    if let Some(auth) = &login.auth {
        connector = connector.with_auth("digest", auth.as_bytes());
    }
    let connect = connector.connect(&login.hosts);
    match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(NoSession(Some(e))),
        Err(_) => Err(NoSession(None)),
    }
}

/// As [`open_client`], again after a short pause while the hosts fail or do
/// not answer in time, until [`CONNECT_TIMEOUT`]: a lock session asks for its
/// TTL as the session timeout, and the driver gives a server 2/5 of it to
/// answer the handshake (400 ms for a 1 s TTL), which a server busy or just
/// started misses. The backend's `connect` has already found the server, so a
/// failed round here is taken for a slow server, not a dead one. An
/// authentication failure is not tried again.
async fn open_client_patiently(login: &Login, timeout: Duration) -> Result<zk::Client, NoSession> {
    let end = crate::clock::now() + CONNECT_TIMEOUT;
    loop {
        match open_client(login, timeout).await {
            Err(NoSession(Some(zk::Error::NoHosts | zk::Error::ConnectionLoss | zk::Error::Timeout)))
                if crate::clock::now() + RETRY_PAUSE < end =>
            {
                tokio::time::sleep(RETRY_PAUSE).await
            }
            done => return done,
        }
    }
}

/// The pause between two rounds of [`open_client_patiently`].
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Why [`open_client`] opened no session: the driver's error, or `None` if
/// none came within [`CONNECT_TIMEOUT`].
#[derive(Debug)]
pub(super) struct NoSession(Option<zk::Error>);

impl NoSession {
    /// What to say of it after `hosts` (the driver's text stays in the source).
    fn text(&self) -> String {
        match self.0 {
            Some(_) => "cannot open a session".into(),
            None => format!("no session within {} s", CONNECT_TIMEOUT.as_secs()),
        }
    }

    /// As [`Error::Connect`] (at connect), caused by the driver's error.
    pub(super) fn connect(self, hosts: &str) -> Error {
        let message = format!("zk {hosts}: {}", self.text());
        match self.0 {
            Some(e) => Error::connect_caused(message, e),
            None => Error::connect(message),
        }
    }

    /// As [`Error::Backend`] (a session opened later), caused by the
    /// driver's error.
    pub(super) fn backend(self, hosts: &str) -> Error {
        let message = format!("{hosts}: {}", self.text());
        match self.0 {
            Some(e) => Error::backend_caused("zk", message, e),
            None => Error::backend("zk", message),
        }
    }
}

/// Errors after which the session, and every node it owned, is gone.
pub(super) fn session_ended(e: &zk::Error) -> bool {
    matches!(e, zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed)
}

/// Errors the server answers when it refuses a write (nothing changed).
pub(super) fn refused(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::NodeExists
            | zk::Error::NoAuth
            | zk::Error::InvalidAcl
            | zk::Error::NoChildrenForEphemerals
            | zk::Error::BadArguments(_)
            | zk::Error::QuotaExceeded
    )
}

/// [`Error::Backend`] caused by `e` (its text left to it); [`Error::Security`] if the server
/// refused it for want of rights (`NoAuth`) or refused the login.
pub(super) fn fail(what: &str, e: zk::Error) -> Error {
    match e {
        zk::Error::NoAuth => Error::security(
            format!("zk: {what}: not authorized: the node's ACL does not admit this client (digest login user:password@ of the identity that created it)"),
            e,
        ),
        zk::Error::AuthFailed => Error::security(format!("zk: {what}: the server refused the login"), e),
        e => Error::backend_caused("zk", what, e),
    }
}

/// A request bounded by [`REQUEST_TIMEOUT`] (then [`zk::Error::Timeout`]).
pub(super) async fn request<T>(f: impl Future<Output = Result<T, zk::Error>>) -> Result<T, zk::Error> {
    tokio::time::timeout(REQUEST_TIMEOUT, f).await.unwrap_or(Err(zk::Error::Timeout))
}

#[cfg(test)]
mod tests {
    use crate::backend::zookeeper::ZkBackend;
    use crate::backend::BackendUrl;
    use crate::error::Error;

    /// Errors keep their sources: no server on the port is an
    /// `Error::Connect` whose chain holds the `zookeeper_client::Error`.
    #[tokio::test]
    async fn a_refused_connection_keeps_the_zookeeper_error() {
        let port = crate::backend::refused_port();
        let url = BackendUrl::parse(&format!("zk://127.0.0.1:{port}")).unwrap();
        let err = ZkBackend::connect(&url).await.unwrap_err();
        assert!(matches!(err, Error::Connect { .. }), "{err:?}");
        assert!(crate::error::caused_by::<zookeeper_client::Error>(&err), "{err:?}");
    }
}
