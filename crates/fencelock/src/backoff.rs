//! Retry delays and jitter: pure arithmetic, no clock and no IO.
//!
//! Where it sits: [`crate::backend::native::rpc`] sleeps [`Backoff::delay`] between retries of one
//! request, and the lease watchdog in [`crate::lease`] renews every
//! [`renew_interval`]. Randomness comes in as an argument `r` in `[0, 1)`, so the
//! bounds are testable; callers pass `fastrand::f64()`.

use std::time::Duration;

/// Exponential backoff with "equal jitter": retry `n` (0-based) sleeps a uniformly
/// random time in `[c/2, c]`, where `c = min(max, initial * 2^n)`. Half of the
/// delay spreads retries of many clients apart; the other half guarantees that the
/// delay grows.
///
/// # Examples
///
/// Retries stop at the RPC's deadline, not after a number of attempts.
///
/// ```no_run
/// use std::time::Duration;
/// use fencelock::{Backoff, Client};
///
/// # async fn demo() -> Result<(), fencelock::Error> {
/// let backoff = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(5) };
/// assert_eq!(backoff.ceiling(3), Duration::from_millis(800)); // the 4th retry waits 400 to 800 ms
/// let client = Client::builder("fencelock://a:7070,b:7070,c:7070")
///     .backoff(backoff)
///     .rpc_timeout(Duration::from_secs(30))
///     .connect()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Ceiling of the first retry's delay.
    pub initial: Duration,
    /// Largest ceiling.
    pub max: Duration,
}

impl Default for Backoff {
    /// 50 ms doubling up to 2 s.
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(50), max: Duration::from_secs(2) }
    }
}

impl Backoff {
    /// The ceiling `min(max, initial * 2^n)` of retry `n`.
    pub fn ceiling(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// The delay before retry `n`, for a random `r` in `[0, 1)`: in `[c/2, c]`.
    pub fn delay(&self, n: u32, r: f64) -> Duration {
        let c = self.ceiling(n);
        c / 2 + (c / 2).mul_f64(r.clamp(0.0, 1.0))
    }
}

/// `base` spread by `±spread` (a fraction) for a random `r` in `[0, 1)`: the result
/// is in `[base * (1 - spread), base * (1 + spread)]`.
pub fn jitter(base: Duration, spread: f64, r: f64) -> Duration {
    let spread = spread.clamp(0.0, 1.0);
    base.mul_f64(1.0 - spread + 2.0 * spread * r.clamp(0.0, 1.0))
}

/// How long after sending the last confirmed keep-alive the watchdog sends the next
/// one: a third of the TTL, ±10 %. Two more tries fit before the lease would expire.
pub fn renew_interval(ttl: Duration, r: f64) -> Duration {
    jitter(ttl / 3, 0.10, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn ceiling_doubles_then_caps() {
        let b = Backoff { initial: 50 * MS, max: 2000 * MS };
        let got: Vec<_> = (0..8).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(got, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(b.ceiling(1000), 2000 * MS, "no overflow for huge n");
    }

    #[test]
    fn delay_is_between_half_and_full_ceiling() {
        let b = Backoff::default();
        for n in 0..10 {
            let c = b.ceiling(n);
            assert_eq!(b.delay(n, 0.0), c / 2);
            assert_eq!(b.delay(n, 1.0), c);
            for _ in 0..100 {
                let d = b.delay(n, fastrand::f64());
                assert!(d >= c / 2 && d <= c, "retry {n}: {d:?} outside [{:?}, {c:?}]", c / 2);
            }
        }
    }

    #[test]
    fn jitter_bounds() {
        assert_eq!(jitter(1000 * MS, 0.1, 0.0), 900 * MS);
        assert_eq!(jitter(1000 * MS, 0.1, 0.5), 1000 * MS);
        assert_eq!(jitter(1000 * MS, 0.1, 1.0), 1100 * MS);
        assert_eq!(jitter(1000 * MS, 0.1, 7.0), 1100 * MS, "r is clamped");
    }

    #[test]
    fn renewals_fit_three_times_in_a_ttl() {
        let ttl = Duration::from_secs(15);
        assert_eq!(renew_interval(ttl, 0.0), 4500 * MS);
        assert_eq!(renew_interval(ttl, 1.0), 5500 * MS);
        for _ in 0..100 {
            assert!(renew_interval(ttl, fastrand::f64()) * 2 < ttl);
        }
    }
}
