//! The client's only clock: tokio's monotonic instant, read here and nowhere
//! else in this crate (`clippy.toml` bans `Instant::now` elsewhere).
//!
//! The client reads time for its own deadlines only: a lease's conservative
//! local deadline (`sent + ttl`, see [`crate::lease`]), the watchdog's renewal
//! and backoff timers, the wait of an acquire, and RPC timeouts. The server
//! never sees these readings; a lease's expiry is decided by the server's clock.
//!
//! It reads [`tokio::time::Instant`], not `std`'s, so that it follows tokio's
//! paused test clock: under `#[tokio::test(start_paused = true)]` the watchdog's
//! deadlines move with virtual time, and the tests assert exact instants.

use tokio::time::Instant;

/// The monotonic instant now, on tokio's clock (virtual when paused).
#[allow(clippy::disallowed_methods)] // the one place in the client that reads the clock
pub(crate) fn now() -> Instant {
    Instant::now()
}
