//! The server's only clock: monotonic milliseconds since the process started.
//!
//! The engine never reads a clock; the driver reads this one and passes `now` in
//! every input. Wall-clock time is never used for an expiry (a jump of the system
//! clock changes nothing). `clippy.toml` bans `Instant::now` elsewhere.

use std::time::{Duration, Instant};

use fencelock_core::Millis;

/// Monotonic clock in milliseconds from a fixed base.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    base: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    #[allow(clippy::disallowed_methods)] // the one place that reads the monotonic clock
    pub fn new() -> Self {
        Self { base: Instant::now() }
    }

    /// Milliseconds since the base (monotonic, never goes back).
    #[allow(clippy::disallowed_methods)]
    pub fn now(&self) -> Millis {
        Instant::now().saturating_duration_since(self.base).as_millis() as Millis
    }

    /// The `Instant` at which this clock reads `at`.
    pub fn instant_at(&self, at: Millis) -> Instant {
        self.base + Duration::from_millis(at)
    }
}
