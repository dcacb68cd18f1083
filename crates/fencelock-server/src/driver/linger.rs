//! The driver's short wait for the callers it just answered (see
//! [`super::core`]'s docs, "Lingering"): a timer of microseconds, which
//! tokio's timer (millisecond ticks) cannot give. A `timerfd` on the
//! monotonic clock, read through the runtime's reactor: no thread, no spin.
//!
//! Where it sits: only the driver's loop uses it. Where a `timerfd` cannot
//! be made, [`Timer::start`] gives `None` and the driver never lingers.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;

/// A one-shot timer armed while the driver core holds a write back.
pub struct Timer {
    fd: AsyncFd<OwnedFd>,
    after: Duration,
    armed: bool,
}

impl Timer {
    /// A disarmed timer that runs `after` once armed; `None` if the system
    /// gives no `timerfd` (the driver then never lingers).
    pub fn start(after: Duration) -> Option<Timer> {
        // SAFETY: a plain syscall; a valid descriptor is owned from here on.
        let raw = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if raw < 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "no timerfd: the driver does not linger");
            return None;
        }
        // SAFETY: `raw` is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: the `OwnedFd` is moved in and stays open, the same
        // descriptor, until the `AsyncFd` is dropped.
        match unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) } {
            Ok(fd) => Some(Timer { fd, after, armed: false }),
            Err(e) => {
                tracing::warn!(error = %e, "timerfd not pollable: the driver does not linger");
                None
            }
        }
    }

    /// Arms the timer when the core starts holding a write back, and disarms
    /// it when it stops (a later hold gets the whole wait again).
    pub fn follow(&mut self, lingering: bool) {
        if lingering != self.armed {
            self.set(lingering.then_some(self.after));
            self.armed = lingering;
        }
    }

    /// Arms the timer to fire once after `d` (`None`: disarms it). Arming
    /// clears an expiry not read yet.
    fn set(&self, d: Option<Duration>) {
        let d = d.unwrap_or_default();
        let value = libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long };
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let spec = libc::itimerspec { it_interval: zero, it_value: value };
        // SAFETY: the descriptor is ours and `spec` outlives the call.
        let rc = unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
        if rc < 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "timerfd_settime failed");
        }
    }

    /// Waits until the armed timer fires.
    async fn wait(&self) {
        loop {
            let Ok(mut ready) = self.fd.readable().await else { return std::future::pending().await };
            let mut ticks = [0u8; 8];
            // SAFETY: reads at most 8 bytes into `ticks`.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), ticks.as_mut_ptr().cast(), ticks.len()) };
            if n == 8 {
                return;
            }
            ready.clear_ready();
        }
    }
}

/// Resolves when `timer` fires (never without a timer). Cancel-safe: an
/// expiry not read stays in the descriptor.
pub async fn fired(timer: &Option<Timer>) {
    match timer {
        Some(t) => t.wait().await,
        None => std::future::pending().await,
    }
}
