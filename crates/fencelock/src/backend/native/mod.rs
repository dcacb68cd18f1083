//! The native fencelock server as a [`LockBackend`]: [`Client`] is one
//! implementation among the others, and its native grant (`LockGuard`) the
//! `Held` part of a [`Guard`].
//!
//! Where it sits: a child of `backend` (it uses the trait, the guard and the
//! URL grammar from there; nothing there uses it but `connect`). The
//! [`Client`] type is defined here so that its parts can use it without
//! importing one another: `client` (connecting, the plain RPCs), `acquire`
//! (taking a lock), `guard` (a held lock), over `registry` (leases shared by
//! TTL), `lease_rpc` (grant, revoke, the watchdog), `rpc` (deadlines,
//! retries), `transport` (the shared stream or unary calls under `rpc`),
//! `mux` (one multiplexed stream), `session` (its public face), `wire` (the
//! gRPC client type and request ids), `auth` (the bearer token),
//! `tls` and `proto` (decoding answers).

mod acquire;
mod auth;
mod client;
mod election;
mod guard;
mod lease_rpc;
mod mux;
pub(crate) mod proto;
mod registry;
mod rpc;
mod session;
mod tls;
mod transport;
mod watch;
mod wire;

pub use auth::check_auth_token;
pub use client::{ClientBuilder, DEFAULT_LEASE_LINGER, DEFAULT_RPC_TIMEOUT};
pub use session::Session;
pub use tls::ClientTls;
pub use transport::Transport;

use std::sync::Arc;
use std::time::Duration;

use super::{BoxFuture, Capabilities, Fencing, Guard, Held, Leader, LeaderStream, Leadership, LockBackend, MultiGuard};
use crate::backend::Outcome;
use crate::error::Error;
use crate::types::{CheckResult, LockOptions};
use guard::LockGuard;
use registry::Registry;
use rpc::Rpc;

/// A connection to a fencelock server. Cheap to clone (an `Arc` inside); clones
/// share the connection and the leases. `Send + Sync`.
///
/// # Examples
///
/// Connect once and share the client: clones use the same connection and the
/// same leases. List every member of a group, so that the client can move to
/// another when one is down.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Client, LockBackend, Outcome};
///
/// # async fn demo() -> Result<(), fencelock::Error> {
/// let client = Client::connect("fencelock://10.0.0.1:7070,10.0.0.2:7070,10.0.0.3:7070").await?;
/// let worker = client.clone(); // hand clones to tasks; do not connect per lock
/// let outcome = worker.lock("jobs/nightly").wait(Duration::from_secs(5)).acquire().await?;
/// if let Outcome::Acquired(guard) = outcome {
///     println!("held under token {}", guard.fencing_token()?);
///     guard.release().await?;
/// }
/// // A process about to exit ends the lease kept for the next lock.
/// client.close().await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) rpc: Rpc,
    pub(crate) leases: Arc<Registry>,
    /// [`ClientBuilder::identity`]: sent with every acquire that names none.
    pub(crate) identity: Option<String>,
}

impl LockBackend for Client {
    fn kind(&self) -> &'static str {
        "fencelock"
    }

    /// Global durable tokens (fsynced through Raft before a grant is
    /// acknowledged), server-side FIFO queues with push grants, lock-delay.
    ///
    /// `survives_failover` is true when the client was given several members
    /// of a group (`fencelock://a,b,c`): a grant is durable on a majority
    /// before it is acknowledged, a new leader keeps it, and the client moves
    /// past a member that is down to whichever leads. Given one address it is
    /// false, even if that node belongs to a group: when it is down, the
    /// client has nowhere else to go. (The client cannot tell a list of
    /// unrelated single nodes from a group: listing them is a mistake.)
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::Global,
            durable_tokens: true,
            fifo: true,
            push_wakeup: true,
            server_ttl: true,
            survives_failover: self.servers_given() > 1,
            lock_delay: true,
            holder_identity: true,
            election: true,
            shared: true,
            semaphores: true,
            hold_at_least: true,
            once_per: true,
            multi_lock: true,
            min_ttl: Duration::from_millis(100),
        }
    }

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Outcome<Guard>, Error>> {
        Box::pin(async move { Ok(self.acquire_guard(name, opts).await?.map(LockGuard::into_guard)) })
    }

    fn acquire_all<'a>(
        &'a self,
        names: &'a [&'a str],
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Outcome<MultiGuard>, Error>> {
        Box::pin(async move {
            let outcome = self.acquire_all_guards(names, opts).await?;
            Ok(outcome.map(|gs| MultiGuard::new(gs.into_iter().map(LockGuard::into_guard).collect())))
        })
    }

    fn check<'a>(&'a self, name: &'a str, token: u64) -> BoxFuture<'a, Result<CheckResult, Error>> {
        Box::pin(Client::check(self, name, token))
    }

    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Outcome<Leadership>, Error>> {
        Box::pin(async move {
            match self.campaign_guard(name, opts).await? {
                Outcome::Acquired(g) => Ok(Outcome::Acquired(Leadership::new(g.into_guard(), opts.value.clone())?)),
                other => Ok(other.map(|_| unreachable!("the grant is matched above"))),
            }
        })
    }

    fn leader<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Leader>, Error>> {
        Box::pin(self.leader_of(name))
    }

    fn observe<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LeaderStream, Error>> {
        Box::pin(self.observe_election(name))
    }

    /// Revokes the lease that lingers after the last release (see
    /// [`ClientBuilder::lease_linger`](crate::ClientBuilder::lease_linger)).
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.inner.leases.close_idle())
    }
}

impl Client {
    /// The election `name` on this server: `client.election("db-primary")
    /// .value(addr).campaign()`. See [`crate::Election`].
    pub fn election(&self, name: impl Into<String>) -> crate::Election {
        crate::Election::new(Arc::new(self.clone()), name.into())
    }
}

impl LockGuard {
    /// The backend-neutral [`Guard`] over this native grant.
    pub(crate) fn into_guard(self) -> Guard {
        let (name, token, watch) = (self.name().to_string(), self.token(), self.lease_watch());
        Guard::new(name, Some(token), "fencelock", watch, Box::new(self))
    }
}

impl Held for LockGuard {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(LockGuard::release(*self))
    }

    fn release_in_background(self: Box<Self>) {
        drop(self); // a dropped LockGuard releases in the background
    }

    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(LockGuard::set_value(self, value)))
    }

    fn complete_slot(&self, slot: String, exit_code: i32) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(LockGuard::complete_slot(self, slot, exit_code)))
    }

    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(LockGuard::downgrade(self)))
    }
}
