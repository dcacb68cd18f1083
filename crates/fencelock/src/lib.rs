//! `fencelock` is the Rust client of the fencelock lock service: leases kept
//! alive by a watchdog, lock guards that report their loss, and fencing tokens.
//!
//! ```no_run
//! use std::time::Duration;
//! use fencelock::{Acquire, Client};
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
//!     Acquire::Acquired(guard) => {
//!         // Pass the fencing token with every write to the protected resource,
//!         // and stop as soon as the lease is lost.
//!         let token = guard.fencing_token()?;
//!         tokio::select! {
//!             _ = write_report(token) => {}
//!             reason = guard.lost() => eprintln!("lock lost ({reason}), stopped"),
//!         }
//!         guard.release().await?;
//!     }
//!     Acquire::Busy { holder_token, .. } => println!("busy (token {holder_token:?})"),
//!     Acquire::TimedOut => println!("still busy after 5 s"),
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
//! * [`Guard::lost`] fires when the server reports the lease gone (at the next
//!   keep-alive), when this client revokes it, or at the deadline if no keep-alive
//!   confirmed it by then. It always fires on loss; loss is final.
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
//! `backend` (the trait, the one guard and request, the URL dispatch and the
//! other backends), `client` (the native entry point and plain RPCs), `acquire`
//! (taking a native lock), `guard` (the native side of a held lock), `lease`
//! (lease state, deadline, watchdog), `registry` (leases shared by TTL),
//! `session` (multiplexed stream), `rpc` (deadlines and retries), `auth` (the
//! bearer token on every call), `backoff`, `types`, `error`, `metrics` (names
//! of the exported metrics). Lock names and limits are `fencelock-core`'s.

mod acquire;
mod auth;
pub mod backend;
mod backoff;
mod client;
mod error;
mod guard;
mod lease;
pub mod metrics;
mod registry;
mod rpc;
mod session;
mod tls;
mod types;

pub use auth::check_auth_token;
pub use backend::{connect, with_lock, Backend, Capabilities, Fencing, Guard, LockBackend, LockRequest};
pub use backoff::Backoff;
pub use client::{Client, ClientBuilder, DEFAULT_LEASE_LINGER, DEFAULT_RPC_TIMEOUT};
pub use error::{Cause, Error, NotAcquired, WithLockError};
pub use lease::{LeaseLost, LeaseWatch};
pub use session::Session;
pub use tls::ClientTls;
pub use types::{Acquire, Acquired, CheckResult, Holder, LockInfo, LockOptions, Waiter};
