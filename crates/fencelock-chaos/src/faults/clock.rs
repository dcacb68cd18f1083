//! The fault clock (scenario K3): a [`TimeSource`] for the server whose rate and
//! forward jumps follow a setting file the nemesis rewrites.
//!
//! `fencelock-chaos serve` plugs it in when `FENCELOCK_FAULT_CLOCK=<file>` is set
//! (see [`super`]). The file holds one line `rate=<f64> jump_ms=<u64>`. `rate`
//! (> 0) is the speed of this clock relative to real time; `jump_ms` is the total
//! forward jump so far (it only grows; a smaller value is ignored). The file is
//! re-read at most every 20 ms of real time; a missing or garbled file keeps the
//! last setting (rate 1, no jump at first) and is logged once. The clock's time is
//! piecewise linear: a rate change continues from the current value, a jump adds
//! to it, and it never goes back; it starts at the file's `jump_ms` (the jumps so
//! far). [`TimeSource::instant_at`] maps a reading back to a real `Instant` with
//! the current rate (a reading already passed maps to now).
#![allow(clippy::disallowed_methods)] // a clock: it reads the monotonic clock

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use fencelock_core::Millis;
use fencelock_server::clock::TimeSource;

/// The file is read again at most this often (real time).
const REREAD: Duration = Duration::from_millis(20);
/// `instant_at` never looks further ahead than this (a tiny rate would).
const MAX_AHEAD: Duration = Duration::from_secs(24 * 3600);

/// The real monotonic time source (injectable for tests).
pub type RealTime = Box<dyn Fn() -> Instant + Send + Sync>;

/// One line of the fault file.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting {
    pub rate: f64,
    pub jump_ms: u64,
}

impl Setting {
    /// `rate=<f64> jump_ms=<u64>`, in any order, both required.
    pub fn parse(s: &str) -> Result<Setting, String> {
        let (mut rate, mut jump_ms) = (None, None);
        for part in s.split_whitespace() {
            let bad = |e: &dyn std::fmt::Display| format!("{part:?}: {e}");
            match part.split_once('=') {
                Some(("rate", v)) => rate = Some(v.parse::<f64>().map_err(|e| bad(&e))?),
                Some(("jump_ms", v)) => jump_ms = Some(v.parse::<u64>().map_err(|e| bad(&e))?),
                _ => return Err(format!("unexpected {part:?}")),
            }
        }
        let (Some(rate), Some(jump_ms)) = (rate, jump_ms) else {
            return Err(format!("expected `rate=<f64> jump_ms=<u64>`, got {s:?}"));
        };
        if !(rate.is_finite() && rate > 0.0) {
            return Err(format!("rate must be finite and > 0, got {rate}"));
        }
        Ok(Setting { rate, jump_ms })
    }
}

/// A clock that runs at `rate` times real time plus the jumps, re-reading its
/// setting from `path`.
pub struct FaultClock {
    path: PathBuf,
    real: RealTime,
    state: Mutex<State>,
}

impl std::fmt::Debug for FaultClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultClock").field("path", &self.path).finish_non_exhaustive()
    }
}

/// The piecewise linear map from real to virtual time.
struct State {
    /// Virtual time (ms) was `anchor_virt` at real `anchor_real`; it runs at `rate`.
    anchor_real: Instant,
    anchor_virt: f64,
    rate: f64,
    /// Jumps applied so far.
    jump_ms: u64,
    last_read: Instant,
    /// The largest reading handed out (the clock never goes back).
    last_out: Millis,
    complained: bool,
}

impl State {
    fn virt_at(&self, real: Instant) -> f64 {
        let elapsed = real.saturating_duration_since(self.anchor_real).as_secs_f64() * 1000.0;
        (self.anchor_virt + elapsed * self.rate).max(self.last_out as f64)
    }

    fn apply(&mut self, s: Setting, real: Instant) {
        if s.rate != self.rate {
            self.anchor_virt = self.virt_at(real);
            self.anchor_real = real;
            self.rate = s.rate;
        }
        if s.jump_ms > self.jump_ms {
            self.anchor_virt += (s.jump_ms - self.jump_ms) as f64;
            self.jump_ms = s.jump_ms;
        }
    }
}

impl FaultClock {
    /// A fault clock following `path`, on the real monotonic clock, from now.
    #[allow(clippy::disallowed_methods)] // a clock reads the monotonic clock
    pub fn real(path: PathBuf) -> FaultClock {
        FaultClock::new(path, Instant::now(), Box::new(Instant::now))
    }

    /// A fault clock reading `jump_ms` of the file (0 if unreadable) at `base`.
    pub fn new(path: PathBuf, base: Instant, real: RealTime) -> FaultClock {
        let state = State {
            anchor_real: base,
            anchor_virt: 0.0,
            rate: 1.0,
            jump_ms: 0,
            last_read: base,
            last_out: 0,
            complained: false,
        };
        let clock = FaultClock { path, real, state: Mutex::new(state) };
        {
            let mut st = clock.lock();
            clock.reread(&mut st, base);
        }
        clock
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reread(&self, st: &mut State, real: Instant) {
        st.last_read = real;
        let setting = std::fs::read_to_string(&self.path).map_err(|e| e.to_string()).and_then(|s| Setting::parse(&s));
        match setting {
            Ok(s) => st.apply(s, real),
            Err(e) if !st.complained => {
                st.complained = true;
                let path = self.path.display();
                let what = "fault clock: bad setting file, keeping the last setting (logged once)";
                tracing::warn!(%path, error = %e, "{what}");
            }
            Err(_) => {}
        }
    }

    /// Real now and the virtual reading then, re-reading the file if due.
    fn sample(&self, st: &mut State) -> (Instant, f64) {
        let real = (self.real)();
        if real.saturating_duration_since(st.last_read) >= REREAD {
            self.reread(st, real);
        }
        (real, st.virt_at(real))
    }

    fn read_now(&self) -> Millis {
        let mut st = self.lock();
        let (_, virt) = self.sample(&mut st);
        st.last_out = st.last_out.max(virt as Millis);
        st.last_out
    }

    /// The real instant at which this clock will read `at`, at the current
    /// rate; now for a reading already passed.
    fn read_instant_at(&self, at: Millis) -> Instant {
        let mut st = self.lock();
        let (real, virt) = self.sample(&mut st);
        let ahead_ms = at as f64 - virt;
        if ahead_ms <= 0.0 {
            return real;
        }
        let ahead = Duration::try_from_secs_f64(ahead_ms / st.rate / 1000.0).unwrap_or(MAX_AHEAD);
        real + ahead.min(MAX_AHEAD)
    }
}

impl TimeSource for FaultClock {
    fn now(&self) -> Millis {
        self.read_now()
    }

    fn instant_at(&self, at: Millis) -> Instant {
        self.read_instant_at(at)
    }
}

#[cfg(test)]
mod tests {
    //! The fault clock driven by a fake real-time source, so nothing depends on
    //! the machine's timing.

    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A fault clock over `file` whose real time advances only through the
    /// returned handle.
    fn clock(file: &Path) -> (FaultClock, Arc<Mutex<Instant>>) {
        #[allow(clippy::disallowed_methods)]
        let base = Instant::now();
        let real = Arc::new(Mutex::new(base));
        let src = real.clone();
        let c = FaultClock::new(file.to_path_buf(), base, Box::new(move || *src.lock().unwrap()));
        (c, real)
    }

    /// Advance real time by `ms`, in 10 ms steps, reading the clock at each step
    /// (so the file is re-read as it would be); returns the readings.
    fn run(c: &FaultClock, real: &Mutex<Instant>, ms: u64) -> Vec<Millis> {
        (0..ms / 10)
            .map(|_| {
                *real.lock().unwrap() += Duration::from_millis(10);
                c.now()
            })
            .collect()
    }

    fn write(file: &Path, s: &str) {
        std::fs::write(file, s).unwrap();
    }

    #[test]
    fn setting_parses_rate_and_jump_and_rejects_the_rest() {
        assert_eq!(Setting::parse("rate=2 jump_ms=5\n"), Ok(Setting { rate: 2.0, jump_ms: 5 }));
        assert_eq!(Setting::parse("jump_ms=0 rate=0.5"), Ok(Setting { rate: 0.5, jump_ms: 0 }));
        for bad in ["", "rate=1", "rate=0 jump_ms=0", "rate=-1 jump_ms=0", "rate=NaN jump_ms=0", "rate=1 jump_ms=-3"] {
            assert!(Setting::parse(bad).is_err(), "{bad:?}");
        }
        assert!(Setting::parse("rate=1 jump_ms=0 extra=1").is_err());
    }

    #[test]
    fn rate_2_runs_about_twice_as_fast_as_real_time() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("clock");
        write(&file, "rate=2 jump_ms=0");
        let (c, real) = clock(&file);
        assert_eq!(c.now(), 0);
        let t = *run(&c, &real, 1000).last().unwrap();
        assert!((1990..=2010).contains(&t), "2 x 1000 ms of real time read {t}");
        // 200 ms of this clock ahead is about 100 ms of real time.
        let now = *real.lock().unwrap();
        let d = c.instant_at(t + 200).duration_since(now);
        assert!(d >= Duration::from_millis(95) && d <= Duration::from_millis(105), "{d:?}");
    }

    #[test]
    fn a_rate_change_continues_from_the_current_value() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("clock");
        write(&file, "rate=1 jump_ms=0");
        let (c, real) = clock(&file);
        let t1 = *run(&c, &real, 1000).last().unwrap();
        write(&file, "rate=3 jump_ms=0");
        let t2 = *run(&c, &real, 1000).last().unwrap();
        assert!((990..=1010).contains(&t1), "{t1}");
        // The new rate is seen within 20 ms; 1000 ms later about 3000 more.
        assert!((3900..=4020).contains(&t2), "{t2}");
    }

    #[test]
    fn a_jump_moves_forward_once_and_a_smaller_jump_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("clock");
        write(&file, "rate=1 jump_ms=0");
        let (c, real) = clock(&file);
        run(&c, &real, 100);
        write(&file, "rate=1 jump_ms=5000");
        let t = *run(&c, &real, 100).last().unwrap();
        assert!((5190..=5210).contains(&t), "{t}");
        write(&file, "rate=1 jump_ms=1000");
        let t = *run(&c, &real, 100).last().unwrap();
        assert!((5290..=5310).contains(&t), "a smaller total jump changes nothing: {t}");
    }

    #[test]
    fn it_never_goes_backwards_and_keeps_the_last_setting_on_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("clock");
        write(&file, "rate=4 jump_ms=100");
        let (c, real) = clock(&file);
        let mut seen = run(&c, &real, 500);
        write(&file, "rate=0.001 jump_ms=0");
        seen.extend(run(&c, &real, 500));
        write(&file, "garbled");
        seen.extend(run(&c, &real, 200));
        std::fs::remove_file(&file).unwrap();
        seen.extend(run(&c, &real, 200));
        assert!(seen.windows(2).all(|w| w[0] <= w[1]), "went back: {seen:?}");
        let last = *seen.last().unwrap();
        assert!((2170..=2190).contains(&last), "rate 0.001 kept through a bad and a missing file: {last}");
    }

    #[test]
    fn a_missing_file_means_rate_1_and_a_past_reading_maps_to_now() {
        let dir = tempfile::tempdir().unwrap();
        let (c, real) = clock(&dir.path().join("missing"));
        let t = *run(&c, &real, 300).last().unwrap();
        assert!((290..=310).contains(&t), "{t}");
        let now = *real.lock().unwrap();
        assert_eq!(c.instant_at(0), now);
        assert_eq!(c.instant_at(t), now);
    }
}
