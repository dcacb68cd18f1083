//! `fencelock` is the Rust client of the fencelock lock service: leases kept
//! alive by a watchdog, lock guards that report their loss, and fencing tokens.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock::{Client, Outcome};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect("http://127.0.0.1:7070").await?;
//! match client
//!     .lock("reports/daily")
//!     .ttl(Duration::from_secs(15))
//!     .wait(Duration::from_secs(5))
//!     .acquire()
//!     .await?
//! {
//!     Outcome::Acquired(guard) => {
//!         // Pass the fencing token with every write to the protected resource,
//!         // and stop as soon as the lease is lost.
//!         let token = guard.fencing_token()?;
//!         tokio::select! {
//!             _ = write_report(token) => {}
//!             reason = guard.lost() => eprintln!("lock lost ({reason}), stopped"),
//!         }
//!         guard.release().await?;
//!     }
//!     Outcome::Busy { holder_token, .. } => println!("busy (token {holder_token:?})"),
//!     Outcome::TimedOut => println!("still busy after 5 s"),
//! }
//! # Ok(()) }
//! # async fn write_report(_token: u64) {}
//! ```
//!
//! Or let the library do the select and the release:
//!
//! ```no_run
//! # use fencelock::{with_lock, Client, Guard, LockOptions, WithLockError};
//! # async fn demo(client: Client) -> Result<(), WithLockError> {
//! let opts = LockOptions::default().ttl(std::time::Duration::from_secs(15));
//! let rows = with_lock(&client, "reports/daily", opts, async |guard: &Guard| {
//!     // Dropped (cancelled) at once if the lease is lost.
//!     write_rows(guard.token()).await
//! })
//! .await?;
//! # Ok(()) }
//! # async fn write_rows(_token: Option<u64>) -> usize { 0 }
//! ```
//!
//! [`with_lock`] takes any [`LockBackend`]: the same code runs on a
//! `fencelock::connect("redis://…")` backend.
//!
//! # The model
//! A client holds *leases* on the server, one per TTL it uses, shared by all its
//! locks with that TTL; a watchdog task per lease renews it every TTL/3 (±10 %).
//! A lock is bound to a lease and ends with it. Each grant carries a fencing token
//! greater than every token issued before it.
//!
//! # Timing contract
//! * [`Guard::deadline`] is conservative: the send time of the request that
//!   last confirmed the lease, plus the TTL. The server's deadline is never
//!   earlier.
//! * [`Guard::lost`] fires when the server reports the lease gone (pushed on the
//!   `WatchLeases` stream within a round trip of a revocation or expiry, else at
//!   the next keep-alive), when this client revokes it, or at the deadline if no
//!   keep-alive confirmed it by then. It always fires on loss; loss is final.
//! * [`Guard::jeopardy`] fires earlier: at the deadline minus TTL/3 if no
//!   keep-alive moved the deadline by then (stop starting new writes), and at
//!   once on loss.
//! * Every RPC has a deadline (default 10 s, [`ClientBuilder::rpc_timeout`]; a
//!   waiting acquire gets its wait on top). Transient failures are retried with
//!   exponential backoff and jitter within that deadline, with the same request
//!   id, so the server never applies a request twice.
//! * A waiting acquire is one RPC: the server pushes the grant (no polling).
//!   Dropping the future cancels it on the server.
//!
//! # Other lock services
//! [`backend`] puts the same [`Guard`] over Redis, Redlock, etcd, ZooKeeper and
//! PostgreSQL: [`connect`] a URL, take locks with `backend.lock(name)` (the
//! same [`LockRequest`] as [`Client::lock`]) or [`LockBackend::acquire`], and
//! read what each backend guarantees from [`Capabilities`]. The native
//! [`Client`] is one [`LockBackend`] among them, with the operations only the
//! fencelock server has (`describe`, `list`, `check`, `revoke_lease`,
//! `acquire_detached`, `session`).
//!
//! # Modules
//! No module imports one of its siblings that imports it back: the crate root
//! holds `error`, `types`, `lease` (the lease state, deadline and the renewal
//! loop every backend's watchdog runs), `backoff`, `clock` (the one place that
//! reads the time), `metrics` (names of the exported metrics) and `backend`;
//! `backend` holds the trait, the one guard
//! and request, the acquire outcome, the URL grammar and TLS files, and one
//! module per backend; `backend::native` holds the native client (the
//! `Client` type, with its methods in `client`, `acquire` and `guard`), its
//! leases (`registry`, `lease_rpc`), its transport (`rpc`, `session`, `auth`,
//! `tls`) and the decoding of the server's answers (`proto`). Lock names and
//! limits are `fencelock-core`'s.

pub mod backend;
mod backoff;
mod clock;
mod error;
mod lease;
pub mod metrics;
mod types;
mod unique;
pub mod watch;

pub use backend::native::check_auth_token;
pub use backend::native::{
    Client, ClientBuilder, ClientTls, Session, Transport, DEFAULT_LEASE_LINGER, DEFAULT_RPC_TIMEOUT,
};
pub use backend::{
    connect, with_lock, Backend, Capabilities, Fencing, Guard, LockBackend, LockRequest, MultiGuard, Outcome,
};
pub use backend::{Election, Leader, LeaderEvent, LeaderStream, Leadership};
pub use backoff::Backoff;
pub use error::LeaseLost;
pub use error::{Cause, Error, NotAcquired, WithLockError};
pub use lease::LeaseWatch;
pub use types::{CheckResult, CompletedSlot, Grant, Holder, LockInfo, LockMode, LockOptions, Waiter};
pub use watch::{ParseRevisionError, Revision, WatchEvent, WatchKind, WatchStream};
