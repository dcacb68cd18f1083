//! libfaketime (Debian's `libfaketime`), preloaded into a process for K3: the
//! process's clocks lie, its code does not change.
//!
//! * [`wall_jumps`]: the lock server's wall clock follows an offset file that
//!   the nemesis rewrites (jumps of days, forwards and back); its monotonic
//!   clock is left alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`). The server must
//!   not notice: no expiry may depend on the wall clock.
//! * [`rate`]: a worker (a lock client) whose every clock, monotonic too, runs
//!   at `rate` × real time, sleeps and timers included. A slow client believes
//!   its lease valid after the server let it expire; only the fence saves the
//!   resource then.
//!
//! The histories never see the lie: [`crate::history::mono_ns`] reads the
//! kernel's clock by a raw system call, past the preloaded library.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// Where Debian puts the thread-safe variant; `FENCELOCK_LIBFAKETIME` overrides.
const CANDIDATES: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
];

/// The library to preload, or an error that says how to install it.
pub fn library() -> anyhow::Result<PathBuf> {
    if let Some(p) = std::env::var_os("FENCELOCK_LIBFAKETIME") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!("FENCELOCK_LIBFAKETIME={} is not a file", p.display());
    }
    match CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()) {
        Some(p) => Ok(p),
        None => bail!("K3 needs libfaketime (apt-get install libfaketime, or set FENCELOCK_LIBFAKETIME)"),
    }
}

/// Environment for a process whose wall clock follows the offset in `file`
/// (see [`offset`]), re-read at most once a second; monotonic time is real.
pub fn wall_jumps(file: &Path) -> anyhow::Result<Vec<(String, String)>> {
    std::fs::write(file, offset(0))?;
    Ok(vec![
        ("LD_PRELOAD".into(), library()?.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE".into(), file.display().to_string()),
        ("FAKETIME_CACHE_DURATION".into(), "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ])
}

/// Environment for a process all of whose clocks run at `rate` × real time.
pub fn rate(rate: f64) -> anyhow::Result<Vec<(String, String)>> {
    Ok(vec![("LD_PRELOAD".into(), library()?.display().to_string()), ("FAKETIME".into(), format!("+0 x{rate}"))])
}

/// The offset file's line for a wall clock `secs` seconds off real time.
pub fn offset(secs: i64) -> String {
    format!("{secs:+}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// libfaketime reads a signed number of seconds; `+0` is no offset.
    #[test]
    fn offsets_are_signed_seconds() {
        assert_eq!(offset(0), "+0\n");
        assert_eq!(offset(86_400), "+86400\n");
        assert_eq!(offset(-7_200), "-7200\n");
    }
}
