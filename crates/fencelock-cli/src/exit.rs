//! Exit codes of `fencelock`. Stable: scripts depend on them.

use std::process::ExitCode;

/// Success (for `run`: the child's own exit code is passed through instead).
pub const OK: u8 = 0;
/// `check`: the token is not the current grant. `release`: not the holder.
pub const NO: u8 = 1;
/// Usage error (bad flag or argument), from clap.
#[allow(dead_code)]
pub const USAGE: u8 = 2;
/// Any other error: cannot connect, invalid argument, server error.
pub const ERROR: u8 = 70;
/// The lock is held by someone else (with `--wait 0s`).
pub const BUSY: u8 = 73;
/// `--wait` ran out before the lock was granted.
pub const TIMED_OUT: u8 = 74;
/// The lease was lost while `run`'s child was running; the child was stopped.
pub const LEASE_LOST: u8 = 75;

/// Shown at the end of `fencelock --help`.
pub const HELP: &str = "\
Exit codes:
  0   success (run: the child's exit code; 128+N if it died of signal N)
  1   check: token is not current; release: not the holder
  2   usage error
  70  error (cannot connect, invalid argument, server error)
  73  lock busy (--wait 0s)
  74  wait timed out
  75  lease lost while running the child (child stopped)";

/// Print `e` and return [`ERROR`].
pub fn error(e: anyhow::Error) -> ExitCode {
    eprintln!("fencelock: error: {e:#}");
    ExitCode::from(ERROR)
}
