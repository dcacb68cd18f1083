//! Virtual time. Every host reads the simulation's clock, in milliseconds since
//! the simulation started; it keeps running across a host's crash and restart, so
//! it is the monotonic clock the server gives the engine. Nothing here reads the
//! machine's clock.

use std::time::Duration;

use fencelock_core::Millis;

/// Milliseconds of virtual time since the simulation started (0 outside a host).
pub fn now_ms() -> Millis {
    turmoil::sim_elapsed().map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The token floor of a `LeaderStart` ([`fencelock_core::token_floor`]) on a
/// virtual wall clock that reads the virtual time since the epoch.
pub fn token_floor() -> u64 {
    fencelock_core::token_floor(now_ms() / 1000)
}

/// Sleep `ms` milliseconds of virtual time.
pub async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Sleep until the virtual clock reads at least `at`.
pub async fn sleep_until_ms(at: Millis) {
    while now_ms() < at {
        sleep_ms(at - now_ms()).await;
    }
}

/// Sleep until `at`, or forever when there is nothing to wait for.
pub async fn sleep_until_opt(at: Option<Millis>) {
    match at {
        Some(at) => sleep_until_ms(at).await,
        None => std::future::pending().await,
    }
}
