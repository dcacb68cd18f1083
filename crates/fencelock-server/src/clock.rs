//! The server's only clock: monotonic milliseconds from a fixed base.
//!
//! The engine never reads a clock; the driver reads this one and passes `now` in
//! every input. Wall-clock time is never used for an expiry (a jump of the system
//! clock changes nothing). `clippy.toml` bans `Instant::now` (`std`'s and
//! tokio's) elsewhere. The wall clock is read for one thing only: the token
//! floor of a `LeaderStart` ([`Clock::token_floor`]), which is not an expiry.
//! Connection timers read tokio's instant here too; they never decide a lease.
//!
//! Where it sits: [`Clock`] is what the server reads; the [`TimeSource`] under it
//! is a seam. A node runs on [`Monotonic`] (the real monotonic clock) unless its
//! caller passes another source to [`crate::serve`]: the fault-injection harness
//! (`fencelock-chaos serve`) passes a clock whose rate and jumps it controls. The
//! server itself never picks a source from the environment.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fencelock_core::Millis;

/// Where a [`Clock`]'s readings come from.
///
/// Contract: [`TimeSource::now`] never goes back; [`TimeSource::instant_at`] is
/// the real [`Instant`] at which `now` will read `at` (now, for a reading already
/// passed), for timers.
pub trait TimeSource: Send + Sync + std::fmt::Debug {
    /// Milliseconds since this source's base.
    fn now(&self) -> Millis;
    /// The real instant at which [`TimeSource::now`] reads `at`.
    fn instant_at(&self, at: Millis) -> Instant;
}

/// The real monotonic clock, counting from when it was made.
#[derive(Debug, Clone, Copy)]
pub struct Monotonic {
    base: Instant,
}

impl Default for Monotonic {
    fn default() -> Self {
        Self::new()
    }
}

impl Monotonic {
    #[allow(clippy::disallowed_methods)] // the one place that reads the monotonic clock
    pub fn new() -> Self {
        Monotonic { base: Instant::now() }
    }

    /// The instant this clock reads 0 at.
    pub fn base(&self) -> Instant {
        self.base
    }
}

impl TimeSource for Monotonic {
    #[allow(clippy::disallowed_methods)] // the one place that reads the monotonic clock
    fn now(&self) -> Millis {
        Instant::now().saturating_duration_since(self.base).as_millis() as Millis
    }

    fn instant_at(&self, at: Millis) -> Instant {
        self.base + Duration::from_millis(at)
    }
}

/// Monotonic clock in milliseconds from a fixed base. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Clock {
    source: Arc<dyn TimeSource>,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// The real monotonic clock ([`Monotonic`]), from now.
    pub fn new() -> Self {
        Self::with_source(Arc::new(Monotonic::new()))
    }

    /// A clock that reads `source`.
    pub fn with_source(source: Arc<dyn TimeSource>) -> Self {
        Clock { source }
    }

    /// Milliseconds since the base (monotonic, never goes back).
    pub fn now(&self) -> Millis {
        self.source.now()
    }

    /// The monotonic instant now, for what is measured in real time and
    /// never decides a lease: request rates, caches.
    #[allow(clippy::disallowed_methods)] // the clock module reads the monotonic clock
    pub fn instant(&self) -> Instant {
        Instant::now()
    }

    /// The token floor for a `LeaderStart` now: [`fencelock_core::token_floor`]
    /// of the wall-clock seconds (0 if the wall clock is before 1970). Real wall
    /// time whatever the source: the floor is about other groups on this
    /// machine, not about this group's leases.
    #[allow(clippy::disallowed_methods)] // the one place that reads the wall clock
    pub fn token_floor(&self) -> u64 {
        let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
        fencelock_core::token_floor(since_epoch.map_or(0, |d| d.as_secs()))
    }

    /// The `Instant` at which this clock reads `at`.
    pub fn instant_at(&self, at: Millis) -> Instant {
        self.source.instant_at(at)
    }
}

/// Tokio's monotonic instant now, for connection timers only (the handshake
/// deadline, the idle timeout, the rate of new connections per source): never
/// for a lease, whose time is [`Clock::now`]. Tokio's, not `std`'s, so that it
/// agrees with `tokio::time::sleep_until` and follows tokio's paused test
/// clock.
#[allow(clippy::disallowed_methods)] // the clock module reads the monotonic clock
pub(crate) fn mono_now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// A source that reads what a test sets: for the crate's tests only.
#[cfg(test)]
#[derive(Debug, Default)]
pub(crate) struct SetClock(std::sync::atomic::AtomicU64);

#[cfg(test)]
impl SetClock {
    /// From now on the source reads `now`.
    pub(crate) fn set(&self, now: Millis) {
        self.0.store(now, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
impl TimeSource for SetClock {
    fn now(&self) -> Millis {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
    fn instant_at(&self, _at: Millis) -> Instant {
        Monotonic::new().base()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clock_reads_its_source() {
        let source = Arc::new(SetClock::default());
        let clock = Clock::with_source(source.clone());
        assert_eq!(clock.now(), 0);
        source.set(5_000);
        assert_eq!(clock.now(), 5_000);
    }

    #[test]
    fn the_monotonic_source_maps_readings_to_instants_from_its_base() {
        let m = Monotonic::new();
        assert_eq!(m.instant_at(250), m.base() + Duration::from_millis(250));
        let (a, b) = (m.now(), m.now());
        assert!(a <= b);
    }
}
