//! One client API over many lock services: the [`LockBackend`] trait, what each
//! backend declares it guarantees ([`Capabilities`]), the backend-neutral
//! [`Guard`], and [`connect`], which picks the backend from a URL.
//!
//! Where it sits: above the native client ([`crate::Client`] is one
//! implementation) and beside the other backends, each in its own module
//! behind a cargo feature of the same name (all on by default):
//!
//! | URL | backend | recipe |
//! |---|---|---|
//! | `fencelock://h:p`, `http://h:p` | [`crate::Client`] | the fencelock server |
//! | `redis://h:p[/db]`, `rediss://…` | `redis` | Lua scripts, a FIFO ticket queue, token from `INCR` |
//! | `redlock://h1:p1,h2:p2,h3:p3`, `redlock+tls://…` | `redlock` | majority of independent Redis nodes, no token |
//! | `etcd://h:p[,h:p…]`, `etcd+tls://…` | `etcd` | lease + `prefix/leaseID` key, wait on the predecessor |
//! | `zk://h:p[,h:p…]` | `zookeeper` | ephemeral sequential node, wait on the predecessor |
//! | `postgres://…[?sslmode=…]` | `postgres` | lease table on the database clock, `LISTEN/NOTIFY` |
//! | `fencelock+json://h:7071`, `fencelock+json+tls://…` | [`json`] | the fencelock server's HTTP/JSON API |
//!
//! TLS and credentials (Redis and etcd TLS with `ca=`, `cert=`, `key=`;
//! PostgreSQL's `sslmode`; `user:password@` for Redis ACL users, etcd,
//! ZooKeeper digest and PostgreSQL; `token=` for a fencelock server's bearer
//! token) are described in the `url` module's docs and [`tls`]; a refused
//! handshake or password is [`Error::Security`], a token the fencelock server
//! refuses [`Error::Unauthenticated`] or [`Error::PermissionDenied`].
//!
//! Every backend gives the same guard: a token (where it can), a conservative
//! [`Guard::deadline`], a [`Guard::lost`] signal that always fires on loss, a
//! watchdog that renews at TTL/3, and release as compare-and-delete. What
//! differs is declared in [`Capabilities`], so a caller can refuse a backend
//! that cannot give what it needs (e.g. [`LockOptions::require_fencing`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, WithLockError};
use crate::types::{CheckResult, LockOptions};

mod election;
#[cfg(feature = "etcd")]
pub mod etcd;
mod guard;
pub mod json;
mod keepalive;
mod multi_guard;
pub(crate) mod native;
mod outcome;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redlock;
mod request;
pub mod tls;
mod url;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub(crate) use election::{leader_stream, LeaderSink};
pub use election::{Election, Leader, LeaderEvent, LeaderStream, Leadership};
pub use guard::Guard;
pub(crate) use guard::Held;
pub(crate) use keepalive::{KeptLease, Renew, Renewed};
pub use multi_guard::MultiGuard;
pub use outcome::Outcome;
pub use request::LockRequest;
pub use url::{BackendUrl, Scheme};

/// A boxed future, as the object-safe trait methods return.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a grant's fencing token is worth. `#[non_exhaustive]`: a new scope
/// breaks no caller.
///
/// # Examples
///
/// A resource that fences writes keeps the highest token it has seen per lock
/// name: with `PerLock`, the tokens of two locks cannot be compared.
///
/// ```no_run
/// use fencelock::{Fencing, LockBackend};
///
/// # async fn demo(url: &str) -> Result<(), fencelock::Error> {
/// let backend = fencelock::connect(url).await?;
/// match backend.capabilities().fencing {
///     Fencing::Global | Fencing::PerLock => println!("writes can carry a token"),
///     Fencing::None => eprintln!("{}: a paused holder's late write cannot be refused", backend.kind()),
///     _ => eprintln!("a scope this program does not know"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Fencing {
    /// No token: nothing orders two grants (Redlock, advisory locks). A paused
    /// holder can write after its lock went to someone else, and no resource can
    /// tell.
    None,
    /// Tokens of one lock strictly increase; tokens of different locks are
    /// unrelated.
    PerLock,
    /// Tokens strictly increase across every lock of the service.
    Global,
}

impl fmt::Display for Fencing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fencing::None => "none",
            Fencing::PerLock => "per lock",
            Fencing::Global => "global",
        })
    }
}

/// What a backend guarantees, stated honestly. Tests check the backend against
/// its own declaration (one conformance suite, every backend).
/// `#[non_exhaustive]`, so that a new capability breaks no caller: read the
/// fields; build one (to compare with) from [`Capabilities::new`] and the
/// `with_*` methods.
///
/// # Examples
///
/// Check at start-up that the backend gives what the program relies on. For
/// fencing alone, [`LockOptions::require_fencing`](crate::LockOptions::require_fencing)
/// makes every acquire check it.
///
/// ```no_run
/// use fencelock::{Error, Fencing, LockBackend};
///
/// # async fn demo(url: &str) -> Result<(), Error> {
/// let backend = fencelock::connect(url).await?;
/// let caps = backend.capabilities();
/// if caps.fencing == Fencing::None || !caps.fifo {
///     return Err(Error::Unsupported(format!("{} gives no tokens or no FIFO queue", backend.kind())));
/// }
/// if !caps.survives_failover {
///     eprintln!("warning: the loss of one {} server loses every lock", backend.kind());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Whether grants carry a fencing token, and its scope.
    pub fencing: Fencing,
    /// Tokens never go backwards, even across a crash or restart of the backend
    /// (the counter is durable before a grant is acknowledged).
    pub durable_tokens: bool,
    /// Waiters are granted in arrival order, and a new request never overtakes
    /// one that waits.
    pub fifo: bool,
    /// A waiter is woken by the backend when its turn comes (not by polling
    /// for the lock), and only the next waiter is woken. A waiter may still
    /// refresh its own liveness every TTL/3 (Redis, PostgreSQL queues).
    pub push_wakeup: bool,
    /// The backend expires a lock by itself when its holder stops renewing (a
    /// crashed holder blocks others for at most the TTL).
    pub server_ttl: bool,
    /// A granted lock survives the loss of one backend server (replication with
    /// a quorum, or a majority of independent nodes), and the client reaches
    /// the servers left. It can depend on the URL: a fencelock client given
    /// several members of a group has it, one given a single address has not.
    pub survives_failover: bool,
    /// [`LockOptions::lock_delay`] is supported.
    pub lock_delay: bool,
    /// The backend keeps a holder identity and value ([`LockOptions::identity`],
    /// [`LockOptions::value`]) and shows them when the lock is described (the
    /// fencelock server's `describe`; [`LockBackend::leader`] on the others). A
    /// backend without it refuses an acquire that carries either with
    /// [`Error::Unsupported`] rather than drop them silently.
    pub holder_identity: bool,
    /// Leader election: [`LockBackend::campaign`], [`LockBackend::leader`] and
    /// [`LockBackend::observe`] work, the leader's term is its fencing token,
    /// and a campaign whose lease is lost while it waits fails at once. A
    /// backend without it refuses them with [`Error::Unsupported`].
    pub election: bool,
    /// Read-write locks ([`LockOptions::shared`]): many readers or one writer,
    /// every grant with its own token (where the backend has tokens), strict
    /// FIFO across modes. [`Guard::downgrade`] only on the fencelock server:
    /// the other backends that declare this answer it with
    /// [`Error::Unsupported`]. A backend without them refuses a shared
    /// acquire with [`Error::Unsupported`].
    pub shared: bool,
    /// Semaphores ([`LockOptions::permits`], [`LockOptions::weight`]): up to
    /// N permits, each holder with its own lease and token. A backend without
    /// them refuses such an acquire with [`Error::Unsupported`].
    pub semaphores: bool,
    /// [`LockOptions::hold_at_least`]: the server keeps the lock closed until
    /// that long after the grant however it ends, timed by its own monotonic
    /// clock. A backend without it refuses such an acquire with
    /// [`Error::Unsupported`].
    pub hold_at_least: bool,
    /// [`LockOptions::once_per`] and [`Guard::complete_slot`]: the server
    /// records completed slots. A backend without it refuses such an acquire
    /// with [`Error::Unsupported`].
    pub once_per: bool,
    /// Atomic multi-locks ([`LockBackend::acquire_all`]): several locks taken
    /// all at once or none, decided in one step of the service, one token per
    /// lock; a waiting one queues on every lock at once, so multi-locks never
    /// deadlock one another and no partial hold exists. A backend without
    /// them refuses [`LockBackend::acquire_all`] with [`Error::Unsupported`]
    /// before anything is sent (taking the locks one after another would
    /// give neither guarantee).
    pub multi_lock: bool,
    /// The smallest TTL the backend keeps; a shorter one is refused with
    /// [`Error::Unsupported`] rather than silently lengthened. Larger TTLs may
    /// be rounded up to the backend's granularity (whole seconds for etcd); the
    /// guard's deadline always uses the TTL the backend granted.
    pub min_ttl: Duration,
}

impl Capabilities {
    /// A backend with `fencing` and nothing else: no durable tokens, no FIFO,
    /// no push wake-up, no server-side TTL, no fail-over, no lock-delay, and
    /// the engine's shortest TTL (100 ms) as `min_ttl`.
    pub const fn new(fencing: Fencing) -> Capabilities {
        Capabilities {
            fencing,
            durable_tokens: false,
            fifo: false,
            push_wakeup: false,
            server_ttl: false,
            survives_failover: false,
            lock_delay: false,
            holder_identity: false,
            election: false,
            shared: false,
            semaphores: false,
            hold_at_least: false,
            once_per: false,
            multi_lock: false,
            min_ttl: MIN_TTL,
        }
    }

    /// With [`durable_tokens`](#structfield.durable_tokens) set to `yes`.
    pub const fn with_durable_tokens(mut self, yes: bool) -> Self {
        self.durable_tokens = yes;
        self
    }

    /// With [`fifo`](#structfield.fifo) set to `yes`.
    pub const fn with_fifo(mut self, yes: bool) -> Self {
        self.fifo = yes;
        self
    }

    /// With [`push_wakeup`](#structfield.push_wakeup) set to `yes`.
    pub const fn with_push_wakeup(mut self, yes: bool) -> Self {
        self.push_wakeup = yes;
        self
    }

    /// With [`server_ttl`](#structfield.server_ttl) set to `yes`.
    pub const fn with_server_ttl(mut self, yes: bool) -> Self {
        self.server_ttl = yes;
        self
    }

    /// With [`survives_failover`](#structfield.survives_failover) set to `yes`.
    pub const fn with_survives_failover(mut self, yes: bool) -> Self {
        self.survives_failover = yes;
        self
    }

    /// With [`lock_delay`](#structfield.lock_delay) set to `yes`.
    pub const fn with_lock_delay(mut self, yes: bool) -> Self {
        self.lock_delay = yes;
        self
    }

    /// With [`holder_identity`](#structfield.holder_identity) set to `yes`.
    pub const fn with_holder_identity(mut self, yes: bool) -> Self {
        self.holder_identity = yes;
        self
    }

    /// With [`election`](#structfield.election) set to `yes`.
    pub const fn with_election(mut self, yes: bool) -> Self {
        self.election = yes;
        self
    }

    /// With [`shared`](#structfield.shared) set to `yes`.
    pub const fn with_shared(mut self, yes: bool) -> Self {
        self.shared = yes;
        self
    }

    /// With [`semaphores`](#structfield.semaphores) set to `yes`.
    pub const fn with_semaphores(mut self, yes: bool) -> Self {
        self.semaphores = yes;
        self
    }

    /// With [`hold_at_least`](#structfield.hold_at_least) set to `yes`.
    pub const fn with_hold_at_least(mut self, yes: bool) -> Self {
        self.hold_at_least = yes;
        self
    }

    /// With [`once_per`](#structfield.once_per) set to `yes`.
    pub const fn with_once_per(mut self, yes: bool) -> Self {
        self.once_per = yes;
        self
    }

    /// With [`multi_lock`](#structfield.multi_lock) set to `yes`.
    pub const fn with_multi_lock(mut self, yes: bool) -> Self {
        self.multi_lock = yes;
        self
    }

    /// With [`min_ttl`](#structfield.min_ttl) `min_ttl`.
    pub const fn with_min_ttl(mut self, min_ttl: Duration) -> Self {
        self.min_ttl = min_ttl;
        self
    }

    /// A shared or semaphore acquire, where the backend has them; a weight
    /// within its semaphore.
    fn admit_sharing(&self, backend: &str, opts: &LockOptions) -> Result<(), Error> {
        if opts.mode == crate::LockMode::Shared && opts.permits == 0 && !self.shared {
            return Err(Error::Unsupported(format!(
                "{backend} has no read-write locks; use a backend that declares them (fencelock, zk, etcd, redis, postgres)"
            )));
        }
        if opts.permits > 0 && !self.semaphores {
            return Err(Error::Unsupported(format!(
                "{backend} has no semaphores; use a backend that declares them (fencelock, zk, etcd, redis, postgres lease mode)"
            )));
        }
        let most = opts.permits.max(1);
        if opts.weight == 0 || opts.weight > most {
            return Err(Error::InvalidArgument(format!(
                "weight {} is out of range (1 to {most}: the permits of the semaphore, 1 for a lock)",
                opts.weight
            )));
        }
        Ok(())
    }

    /// Checks a request against these capabilities before anything is sent:
    /// [`Error::InvalidArgument`] for a bad lock name (see `check_name`) or a
    /// TTL or wait out of range or a bad identity or value,
    /// [`Error::Unsupported`] if the caller asks for fencing, a lock-delay or a
    /// holder identity the backend cannot give.
    pub fn admit(&self, backend: &str, name: &str, opts: &LockOptions) -> Result<(), Error> {
        check_name(name)?;
        check_tag(opts)?;
        if (opts.identity.is_some() || !opts.value.is_empty()) && !self.holder_identity {
            return Err(Error::Unsupported(format!(
                "{backend} keeps no holder identity or value; use the fencelock backend or leave them out"
            )));
        }
        if opts.require_fencing && self.fencing == Fencing::None {
            return Err(Error::Unsupported(format!(
                "{backend} gives no fencing token, and this lock requires one; use a backend with fencing (fencelock, redis, etcd, zk, postgres) or do not require fencing"
            )));
        }
        if !opts.lock_delay.is_zero() && !self.lock_delay {
            return Err(Error::Unsupported(format!("{backend} has no lock-delay")));
        }
        if !opts.once_per.is_empty() && !self.once_per {
            return Err(Error::Unsupported(format!("{backend} records no completed slots; use the fencelock backend")));
        }
        if !opts.once_per.is_empty() {
            fencelock_core::check_slot(&opts.once_per).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        }
        if !opts.hold_at_least.is_zero() && !self.hold_at_least {
            return Err(Error::Unsupported(format!("{backend} has no hold-at-least; use the fencelock backend")));
        }
        self.admit_sharing(backend, opts)?;
        if opts.ttl >= MIN_TTL && opts.ttl < self.min_ttl {
            return Err(Error::Unsupported(format!(
                "{backend} keeps TTLs of at least {} ms, and {} ms was asked: a shorter lease would silently last longer",
                self.min_ttl.as_millis(),
                opts.ttl.as_millis()
            )));
        }
        if opts.ttl < MIN_TTL || opts.ttl > MAX_TTL {
            return Err(Error::InvalidArgument(format!(
                "ttl {} ms is out of range ({} ms to {} s)",
                opts.ttl.as_millis(),
                MIN_TTL.as_millis(),
                MAX_TTL.as_secs()
            )));
        }
        if opts.lock_delay > MAX_LOCK_DELAY {
            return Err(Error::InvalidArgument(format!(
                "lock-delay {} ms is out of range (at most {} s)",
                opts.lock_delay.as_millis(),
                MAX_LOCK_DELAY.as_secs()
            )));
        }
        if opts.hold_at_least > MAX_HOLD_AT_LEAST {
            return Err(Error::InvalidArgument(format!(
                "hold-at-least {} ms is out of range (at most {} h)",
                opts.hold_at_least.as_millis(),
                MAX_HOLD_AT_LEAST.as_secs() / 3600
            )));
        }
        if opts.wait > MAX_WAIT {
            return Err(Error::InvalidArgument(format!(
                "wait {} ms is out of range (at most {} s)",
                opts.wait.as_millis(),
                MAX_WAIT.as_secs()
            )));
        }
        Ok(())
    }
}

/// Lock names are the same on every backend, by the engine's rule
/// ([`fencelock_core::LockName`]: 1 to 512 bytes of UTF-8 without control
/// characters). A backend that cannot store some character (a `/` in a
/// ZooKeeper path) encodes it; the caller never sees the difference.
pub(crate) fn check_name(name: &str) -> Result<(), Error> {
    fencelock_core::LockName::new(name).map(drop).map_err(|e| Error::InvalidArgument(format!("invalid lock name: {e}")))
}

/// Identity and value by the engine's rules ([`fencelock_core::check_identity`],
/// [`fencelock_core::check_value`]).
fn check_tag(opts: &LockOptions) -> Result<(), Error> {
    let invalid = |e: fencelock_core::EngineError| Error::InvalidArgument(e.to_string());
    fencelock_core::check_identity(opts.identity.as_deref().unwrap_or("")).map_err(invalid)?;
    check_value(&opts.value)
}

/// A value by the engine's rule ([`fencelock_core::check_value`]).
pub(crate) fn check_value(value: &[u8]) -> Result<(), Error> {
    fencelock_core::check_value(value).map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// The TTL range every backend accepts: the engine's.
pub(crate) const MIN_TTL: Duration = Duration::from_millis(fencelock_core::MIN_TTL_MS);
/// See `MIN_TTL`.
pub(crate) const MAX_TTL: Duration = Duration::from_millis(fencelock_core::MAX_TTL_MS);
/// The longest wait every backend accepts: the engine's.
pub(crate) const MAX_WAIT: Duration = Duration::from_millis(fencelock_core::MAX_WAIT_MS);
/// The longest lock-delay: the engine's.
pub(crate) const MAX_LOCK_DELAY: Duration = Duration::from_millis(fencelock_core::MAX_LOCK_DELAY_MS);
pub(crate) const MAX_HOLD_AT_LEAST: Duration = Duration::from_millis(fencelock_core::MAX_HOLD_AT_LEAST_MS);

/// A lock service. Object-safe: hold it as `Arc<dyn LockBackend>` (what
/// [`connect`] returns) and write the program once for every backend.
///
/// Contract for implementations (the conformance suite in
/// `crates/fencelock/tests/backends` checks each one):
/// * at most one live [`Guard`] per lock name at any time, among all clients,
///   as long as each guard is used only before its [`Guard::deadline`];
/// * a grant's token, where [`Capabilities::fencing`] is not `None`, is greater
///   than the token of every earlier grant of the same lock;
/// * contention is an outcome ([`Outcome::Busy`], [`Outcome::TimedOut`]), never
///   an error; a waiting acquire holds no resources after it returns or is
///   dropped;
/// * the guard renews itself every TTL/3 while it lives, and its
///   [`Guard::lost`] fires whenever the backend can no longer prove the lock
///   held; release is compare-and-delete (a guard whose lock went to someone
///   else releases nothing).
///
/// # Examples
///
/// Code written once for every backend takes `&dyn LockBackend` (or a
/// [`Backend`]); the native [`Client`](crate::Client) is one too.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{LockBackend, LockOptions, Outcome};
///
/// async fn nightly(backend: &dyn LockBackend) -> Result<bool, fencelock::Error> {
///     let opts = LockOptions::default().ttl(Duration::from_secs(30)).require_fencing(true);
///     let Outcome::Acquired(guard) = backend.acquire("jobs/nightly", &opts).await? else {
///         return Ok(false); // another host runs it
///     };
///     run_job(guard.fencing_token()?).await;
///     guard.release().await?;
///     Ok(true)
/// }
/// # async fn run_job(_token: u64) {}
/// # async fn demo(client: fencelock::Client) -> Result<(), fencelock::Error> {
/// nightly(&client).await?;
/// nightly(&*fencelock::connect("etcd://10.0.0.1:2379,10.0.0.2:2379").await?).await?;
/// # Ok(()) }
/// ```
pub trait LockBackend: Send + Sync + fmt::Debug {
    /// The backend's name: its URL scheme (`fencelock`, `redis`, `redlock`,
    /// `etcd`, `zk`, `postgres`), but `fencelock-json` for the native
    /// server's HTTP API (scheme `fencelock+json`).
    fn kind(&self) -> &'static str;

    /// What this backend guarantees.
    fn capabilities(&self) -> Capabilities;

    /// Takes the lock `name` with `opts`: tries once if `opts.wait` is zero,
    /// otherwise waits up to `opts.wait` (in FIFO order where
    /// [`Capabilities::fifo`]). Fails with [`Error::Unsupported`] before sending
    /// anything if `opts` asks for what the backend cannot give. Dropping the
    /// future withdraws the request.
    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Outcome<Guard>, Error>>;

    /// Takes every lock of `names` (2 to 16 distinct names) at once with
    /// `opts`: all of them or none, one [`Guard`] per lock in the order
    /// named, each with its own token. A try (`opts.wait` zero) is busy if any
    /// of them is not free (nothing is taken); a wait queues on every lock at
    /// once. Read-write locks only: `opts` may be shared, but names no
    /// permits, weight or slot. [`Error::Unsupported`], before anything is
    /// sent, where [`Capabilities::multi_lock`] is false.
    fn acquire_all<'a>(
        &'a self,
        names: &'a [&'a str],
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Outcome<MultiGuard>, Error>> {
        let _ = (names, opts);
        let kind = self.kind();
        Box::pin(async move {
            Err(Error::Unsupported(format!("{kind} has no atomic multi-lock; use the fencelock backend")))
        })
    }

    /// Is `token` the current grant of `name`? (Chubby's CheckSequencer.)
    /// [`Error::Unsupported`] where the backend cannot tell.
    fn check<'a>(&'a self, name: &'a str, token: u64) -> BoxFuture<'a, Result<CheckResult, Error>> {
        let _ = (name, token);
        let kind = self.kind();
        Box::pin(async move { Err(Error::Unsupported(format!("{kind} cannot check a token"))) })
    }

    /// Campaigns for the election `name`: waits as a candidate in the lock's
    /// queue (up to `opts.wait`, as [`acquire`](LockBackend::acquire) does) and
    /// answers the [`Leadership`], whose term is the grant's token. Unlike an
    /// acquire, it fails at once ([`Error::LeaseNotFound`]) when the
    /// candidate's lease is lost while it waits, rather than starting over.
    /// [`Error::Unsupported`] where [`Capabilities::election`] is false.
    /// Most callers want [`Election::campaign`] (`backend.election(name)`),
    /// which waits until elected.
    fn campaign<'a>(
        &'a self,
        name: &'a str,
        opts: &'a LockOptions,
    ) -> BoxFuture<'a, Result<Outcome<Leadership>, Error>> {
        Box::pin(async move {
            if !self.capabilities().election {
                return Err(election::unsupported(self.kind()));
            }
            election::campaign_by_acquire(self, name, opts).await
        })
    }

    /// The current leader of the election `name` (its holder, value and term),
    /// `None` when nobody leads. [`Error::Unsupported`] where
    /// [`Capabilities::election`] is false.
    fn leader<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Option<Leader>, Error>> {
        let _ = name;
        let kind = self.kind();
        Box::pin(async move { Err(election::unsupported(kind)) })
    }

    /// Follows the election `name`: the current leader first (if any), then
    /// every change, terms never going back. [`Error::Unsupported`] where
    /// [`Capabilities::election`] is false.
    fn observe<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<LeaderStream, Error>> {
        let _ = name;
        let kind = self.kind();
        Box::pin(async move { Err(election::unsupported(kind)) })
    }

    /// Ends what the client keeps between locks for the next one (the
    /// fencelock backend's lease, which lingers after the last release), and
    /// waits for the service to confirm, within the RPC timeout. A process
    /// about to exit calls it after its last release: otherwise that lease
    /// outlives the process by its TTL, counted against its identity's lease
    /// quota meanwhile. Locks still held are not touched. Nothing to do on
    /// the other backends.
    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A shared handle on any backend.
///
/// # Examples
///
/// Clones share one connection: hand one to each task.
///
/// ```no_run
/// use fencelock::{Backend, Outcome};
///
/// # async fn demo() -> Result<(), fencelock::Error> {
/// let backend: Backend = fencelock::connect("redis://cache.internal:6379").await?;
/// for shard in 0..4 {
///     let backend = backend.clone();
///     tokio::spawn(async move {
///         if let Ok(Outcome::Acquired(guard)) = backend.lock(format!("shard/{shard}")).acquire().await {
///             compact(shard, guard.token()).await;
///             let _ = guard.release().await;
///         }
///     });
/// }
/// # Ok(()) }
/// # async fn compact(_shard: u32, _token: Option<u64>) {}
/// ```
pub type Backend = Arc<dyn LockBackend>;

/// Connects to the lock service named by `url` (see the table in the
/// [module docs](self)). [`Error::InvalidArgument`] for a malformed URL or an
/// unknown scheme, [`Error::Unsupported`] for a backend whose cargo feature is
/// off, [`Error::Connect`] if the service cannot be reached now.
///
/// # Examples
///
/// The URL picks the backend; the code after it is the same for all.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::Outcome;
///
/// # async fn demo() -> Result<(), fencelock::Error> {
/// let backend = fencelock::connect("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379").await?;
/// // Or: "redis://:password@cache:6379/0", "rediss://cache:6380?ca=/etc/ssl/ca.pem",
/// // "zk://zk1:2181,zk2:2181", "postgres://app:secret@db/app?sslmode=require",
/// // "fencelock://a:7070,b:7070?token=…".
/// let outcome = backend.lock("jobs/nightly").ttl(Duration::from_secs(10)).acquire().await?;
/// if let Outcome::Acquired(guard) = outcome {
///     println!("{} granted token {:?}", guard.backend(), guard.token());
///     guard.release().await?;
/// }
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<Backend, Error> {
    let parsed = BackendUrl::parse(url)?;
    if !matches!(parsed.scheme, Scheme::Native | Scheme::Json) && parsed.param(url::TOKEN_PARAM).is_some() {
        return Err(Error::InvalidArgument(format!(
            "{parsed}: token= is the bearer token of a fencelock server; the {} backend takes its credentials as user:password@",
            parsed.scheme
        )));
    }
    match parsed.scheme {
        Scheme::Native => Ok(Arc::new(crate::Client::connect(parsed.raw).await?)),
        Scheme::Json => Ok(Arc::new(json::JsonBackend::connect(&parsed).await?)),
        #[cfg(feature = "redis")]
        Scheme::Redis => Ok(Arc::new(redis::RedisBackend::connect(&parsed).await?)),
        #[cfg(feature = "redis")]
        Scheme::Redlock => Ok(Arc::new(redlock::RedlockBackend::connect(&parsed).await?)),
        #[cfg(feature = "etcd")]
        Scheme::Etcd => Ok(Arc::new(etcd::EtcdBackend::connect(&parsed).await?)),
        #[cfg(feature = "zookeeper")]
        Scheme::ZooKeeper => Ok(Arc::new(zookeeper::ZkBackend::connect(&parsed).await?)),
        #[cfg(feature = "postgres")]
        Scheme::Postgres => Ok(Arc::new(postgres::PgBackend::connect(&parsed).await?)),
        #[allow(unreachable_patterns)]
        other => Err(Error::Unsupported(format!(
            "the {other} backend is not compiled in (enable the fencelock crate's feature \"{}\")",
            other.feature()
        ))),
    }
}

/// Acquires `name` on `backend`, runs `f` while holding it, and releases it:
/// the one `with_lock`, for every backend (the native [`crate::Client`]
/// included).
///
/// * Busy or timed out: [`WithLockError::NotAcquired`]; `f` does not run.
/// * If the lock is lost while `f` runs, `f`'s future is dropped at once (so
///   it stops at its current await point) and the result is
///   [`WithLockError::LeaseLost`].
/// * Otherwise the lock is released and `f`'s value returned. It is returned
///   even if the release fails (it is logged; the lock is then freed with the
///   lease): `f` finished while the lock was provably held.
///
/// `f` may borrow the guard (`async |g: &Guard| g.token()`), or be a plain
/// closure returning a future that does not (`|g: &Guard| { let t =
/// g.token(); async move { t } }`).
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{with_lock, Backend, Guard, LockOptions, NotAcquired, WithLockError};
///
/// # async fn demo(backend: Backend) -> Result<(), WithLockError> {
/// let opts = LockOptions::default().wait(Duration::from_secs(10));
/// let done = with_lock(&*backend, "reports/daily", opts, async |guard: &Guard| {
///     build_report(guard.token()).await
/// })
/// .await;
/// match done {
///     Ok(pages) => println!("{pages} pages"),
///     Err(WithLockError::NotAcquired(NotAcquired::TimedOut)) => println!("another host still has it"),
///     // Dropped part-way: the report may be half written.
///     Err(WithLockError::LeaseLost(reason)) => eprintln!("lock lost ({reason})"),
///     Err(e) => return Err(e),
/// }
/// # Ok(()) }
/// # async fn build_report(_token: Option<u64>) -> usize { 0 }
/// ```
pub async fn with_lock<T, F>(backend: &dyn LockBackend, name: &str, opts: LockOptions, f: F) -> Result<T, WithLockError>
where
    F: AsyncFnOnce(&Guard) -> T,
{
    let guard = backend.acquire(name, &opts).await?.acquired().map_err(WithLockError::NotAcquired)?;
    let result = {
        let work = f(&guard);
        tokio::select! {
            biased;
            reason = guard.lost() => Err(reason),
            value = work => Ok(value),
        }
    };
    match result {
        Ok(value) => {
            if let Err(e) = guard.release().await {
                tracing::warn!(lock = name, error = %e, "fencelock: release after with_lock failed");
            }
            Ok(value)
        }
        Err(reason) => Err(WithLockError::LeaseLost(reason)),
    }
}

/// A port of 127.0.0.1 that refuses connections: bound, then let go. For the
/// tests that a refused connection keeps the driver's error as its source.
#[cfg(test)]
pub(crate) fn refused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("a bound address").port()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(fencing: Fencing, lock_delay: bool) -> Capabilities {
        Capabilities {
            fencing,
            durable_tokens: false,
            fifo: false,
            push_wakeup: false,
            server_ttl: true,
            survives_failover: false,
            lock_delay,
            holder_identity: false,
            election: false,
            shared: false,
            semaphores: false,
            hold_at_least: false,
            once_per: false,
            multi_lock: false,
            min_ttl: MIN_TTL,
        }
    }

    /// A shared or semaphore acquire is refused before anything is sent where
    /// the backend has neither, and a weight outside its semaphore everywhere.
    #[test]
    fn shared_and_semaphore_acquires_need_the_capability_and_a_weight_in_range() {
        let plain = caps(Fencing::PerLock, false);
        let both = plain.with_shared(true).with_semaphores(true);
        let shared = LockOptions::default().shared();
        assert!(matches!(plain.admit("zk", "a", &shared), Err(Error::Unsupported(m)) if m.contains("read-write")));
        assert!(both.admit("fencelock", "a", &shared).is_ok());
        let sem = LockOptions::default().permits(3).weight(2);
        assert!(matches!(plain.admit("zk", "a", &sem), Err(Error::Unsupported(m)) if m.contains("semaphores")));
        assert!(both.admit("fencelock", "a", &sem).is_ok());
        for bad in [
            LockOptions::default().permits(3).weight(4),
            LockOptions::default().weight(2),
            LockOptions::default().weight(0),
        ] {
            assert!(
                matches!(both.admit("fencelock", "a", &bad), Err(Error::InvalidArgument(m)) if m.contains("weight"))
            );
        }
    }

    /// Issue 18: a hold-at-least is refused before anything is sent where the
    /// backend cannot keep it, and checked against the engine's limit.
    #[test]
    fn hold_at_least_needs_the_capability_and_a_duration_in_range() {
        let plain = caps(Fencing::PerLock, false);
        let native = plain.with_hold_at_least(true);
        let held = LockOptions::default().hold_at_least(Duration::from_secs(600));
        assert!(matches!(plain.admit("etcd", "a", &held), Err(Error::Unsupported(m)) if m.contains("hold-at-least")));
        assert_eq!(native.admit("fencelock", "a", &held), Ok(()));
        let too_long = LockOptions::default().hold_at_least(MAX_HOLD_AT_LEAST + Duration::from_millis(1));
        let got = native.admit("fencelock", "a", &too_long);
        assert!(matches!(got, Err(Error::InvalidArgument(ref m)) if m.contains("at most 24 h")), "{got:?}");
    }

    /// Issue 18: a slot is refused before anything is sent where the backend
    /// records none, and checked by the engine's rule everywhere else.
    #[test]
    fn once_per_needs_the_capability_and_a_valid_slot() {
        let plain = caps(Fencing::PerLock, false);
        let native = Capabilities { once_per: true, ..plain };
        let slot = LockOptions::default().once_per("2026-11-23");
        assert!(matches!(plain.admit("zk", "a", &slot), Err(Error::Unsupported(m)) if m.contains("slots")));
        assert_eq!(native.admit("fencelock", "a", &slot), Ok(()));
        // A run once per a slot may wait: the server tells a waiter the slot is done.
        let waits = LockOptions::default().once_per("2026-11-23").wait(Duration::from_secs(3600));
        assert_eq!(native.admit("fencelock", "a", &waits), Ok(()));
        let bad = LockOptions::default().once_per("a\nb");
        let got = native.admit("fencelock", "a", &bad);
        assert!(matches!(got, Err(Error::InvalidArgument(ref m)) if m.contains("invalid slot")), "{got:?}");
    }

    #[test]
    fn a_fenced_lock_is_refused_by_a_backend_without_tokens() {
        let opts = LockOptions { require_fencing: true, ..LockOptions::default() };
        let got = caps(Fencing::None, false).admit("redlock", "a", &opts);
        assert!(matches!(got, Err(Error::Unsupported(ref m)) if m.contains("redlock")), "{got:?}");
        assert_eq!(caps(Fencing::PerLock, false).admit("redis", "a", &opts), Ok(()));
        assert_eq!(caps(Fencing::None, false).admit("redlock", "a", &LockOptions::default()), Ok(()));
    }

    /// Issue 17: a backend that keeps no holder identity refuses one (and a
    /// value) rather than drop it; the limits are the engine's, for every backend.
    #[test]
    fn identity_and_value_are_refused_by_a_backend_without_them_and_checked_for_all() {
        let tagged = LockOptions::default().identity("host:1");
        let got = caps(Fencing::PerLock, false).admit("redis", "a", &tagged);
        assert!(
            matches!(got, Err(Error::Unsupported(ref m)) if m.starts_with("redis keeps no holder identity")),
            "{got:?}"
        );
        let valued = LockOptions::default().value(&b"v"[..]);
        assert!(matches!(caps(Fencing::PerLock, false).admit("etcd", "a", &valued), Err(Error::Unsupported(_))));
        let native = caps(Fencing::Global, true).with_holder_identity(true);
        assert_eq!(native.admit("fencelock", "a", &tagged), Ok(()));
        assert_eq!(native.admit("fencelock", "a", &valued), Ok(()));
        let big = LockOptions::default().value(vec![0u8; fencelock_core::MAX_VALUE_BYTES + 1]);
        let want = Err(Error::InvalidArgument("invalid value: 4097 bytes (must be at most 4096 bytes)".into()));
        assert_eq!(native.admit("fencelock", "a", &big), want);
        assert_eq!(caps(Fencing::PerLock, false).admit("redis", "a", &big), want, "invalid before unsupported");
    }

    #[test]
    fn names_are_checked_alike_for_every_backend() {
        let caps = caps(Fencing::Global, true);
        let opts = LockOptions::default();
        let max = fencelock_core::MAX_LOCK_NAME_BYTES;
        for bad in ["", "a\nb", &"x".repeat(max + 1)] {
            assert!(matches!(caps.admit("x", bad, &opts), Err(Error::InvalidArgument(_))), "{bad:?}");
        }
        for good in ["a", "jobs/nightly report", "ключ", &"x".repeat(max)] {
            assert_eq!(caps.admit("x", good, &opts), Ok(()), "{good:?}");
        }
    }

    #[test]
    fn a_ttl_below_the_backends_minimum_is_refused_not_lengthened() {
        let caps = Capabilities { min_ttl: Duration::from_secs(1), ..caps(Fencing::PerLock, false) };
        let short = LockOptions { ttl: Duration::from_millis(500), ..LockOptions::default() };
        assert!(matches!(caps.admit("etcd", "a", &short), Err(Error::Unsupported(ref m)) if m.contains("1000 ms")));
        let exact = LockOptions { ttl: Duration::from_secs(1), ..LockOptions::default() };
        assert_eq!(caps.admit("etcd", "a", &exact), Ok(()));
    }

    #[test]
    fn lock_delay_and_ttl_are_checked_before_sending() {
        let delayed = LockOptions { lock_delay: Duration::from_secs(1), ..LockOptions::default() };
        assert!(matches!(caps(Fencing::Global, false).admit("etcd", "a", &delayed), Err(Error::Unsupported(_))));
        assert_eq!(caps(Fencing::Global, true).admit("fencelock", "a", &delayed), Ok(()));
        let short = LockOptions { ttl: Duration::from_millis(99), ..LockOptions::default() };
        assert!(matches!(caps(Fencing::Global, true).admit("x", "a", &short), Err(Error::InvalidArgument(_))));
        let long_wait = LockOptions { wait: MAX_WAIT + Duration::from_millis(1), ..LockOptions::default() };
        assert!(matches!(caps(Fencing::Global, true).admit("x", "a", &long_wait), Err(Error::InvalidArgument(_))));
        let long_delay =
            LockOptions { lock_delay: MAX_LOCK_DELAY + Duration::from_millis(1), ..LockOptions::default() };
        assert!(matches!(caps(Fencing::Global, true).admit("x", "a", &long_delay), Err(Error::InvalidArgument(_))));
    }

    /// Rule: a fencelock URL's `token=` reaches the client builder (a bad
    /// one fails its check there, before any dialing: the port is closed);
    /// another backend's URL with `token=` is a clear error. No message
    /// shows the token.
    #[tokio::test]
    async fn url_tokens_go_to_the_native_client_and_nowhere_else() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let err = connect(&format!("fencelock://{addr}?token=sekrit%20sekrit")).await.err().unwrap();
        assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("invalid auth token")), "{err:?}");
        let err = crate::Client::connect(format!("http://{addr}?token=")).await.unwrap_err();
        assert!(matches!(&err, Error::InvalidArgument(m) if m.contains("invalid auth token: it is empty")), "{err:?}");
        for other in
            ["redis://h?token=sekrit", "etcd://h?token=sekrit", "zk://h?token=sekrit", "postgres://u@h/db?token=sekrit"]
        {
            let err = connect(other).await.err().unwrap();
            let msg = err.to_string();
            assert!(
                matches!(err, Error::InvalidArgument(_)) && msg.contains("token=***: token= is the bearer token"),
                "{msg}"
            );
            assert!(!msg.contains("sekrit"), "{msg}");
        }
    }
}
