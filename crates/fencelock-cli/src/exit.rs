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
/// `run --once-per`: the slot already ran (the server recorded its
/// completion before this run asked, or while it waited); the command was
/// not started. (sysexits' `EX_PROTOCOL` is
/// not used otherwise.)
pub const SLOT_DONE: u8 = 76;
/// The server refused the auth token: none or a bad one (UNAUTHENTICATED,
/// HTTP 401), or one without the right to do this (PERMISSION_DENIED, 403).
/// Retrying will not help; a token will. (sysexits' `EX_NOPERM`, as the other
/// codes above 70 follow sysexits.)
pub const AUTH: u8 = 77;

/// Shown at the end of `fencelock --help`.
pub const HELP: &str = "\
Exit codes:
  0   success (run: the child's exit code; 128+N if it died of signal N)
  1   check: token is not current; release: not the holder
  2   usage error
  70  error (cannot connect, invalid argument, server error)
  73  lock busy (--wait 0s)
  74  wait timed out
  75  lease lost while running the child (child stopped)
  76  run --once-per: the slot already ran (the command was not started)
  77  not authenticated or permission denied (--auth-token, FENCELOCK_AUTH_TOKEN)";

/// Print `e` and return its code: [`AUTH`] if the server refused the auth
/// token, else [`ERROR`].
pub fn error(e: anyhow::Error) -> ExitCode {
    eprintln!("fencelock: error: {}", message(&e));
    ExitCode::from(code(&e))
}

/// `e` and its causes, joined by ": ", each said once: a cause whose text
/// the one before already quotes (a library error that names its reason, a
/// transport error wrapped twice alike) is left out.
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    let mut last = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !last.is_empty() && last.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
        last = text;
    }
    out
}

/// The exit code of an error.
fn code(e: &anyhow::Error) -> u8 {
    let refused = e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<fencelock::Error>(),
            Some(fencelock::Error::Unauthenticated(_) | fencelock::Error::PermissionDenied(_))
        )
    });
    if refused {
        AUTH
    } else {
        ERROR
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rule: an auth refusal, however deep in the error's context, exits with
    /// AUTH (77); any other error with ERROR (70).
    #[test]
    fn auth_refusals_have_their_own_exit_code() {
        let unauth = anyhow::Error::new(fencelock::Error::Unauthenticated("no token".into())).context("connecting");
        let denied = anyhow::Error::new(fencelock::Error::PermissionDenied("reader".into())).context("a").context("b");
        assert_eq!(code(&unauth), AUTH);
        assert_eq!(code(&denied), AUTH);
        assert_eq!(format!("{unauth:#}"), "connecting: not authenticated: no token");
        let other = anyhow::Error::new(fencelock::Error::Unavailable("down".into())).context("connecting");
        assert_eq!(code(&other), ERROR);
        assert_eq!(code(&anyhow::anyhow!("plain")), ERROR);
        assert!(HELP.contains("77  not authenticated or permission denied"));
    }

    /// Clear errors: each cause is said once. A cause the error before it
    /// already quotes, or that repeats it, is left out; every other cause is
    /// kept, in order.
    #[test]
    fn each_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let quoted = anyhow::Error::new(io).context("cannot connect: host:1: Connection refused").context("connecting");
        assert_eq!(message(&quoted), "connecting: cannot connect: host:1: Connection refused");
        let twice = anyhow::anyhow!("refused").context("tcp connect error").context("tcp connect error");
        assert_eq!(message(&twice), "tcp connect error: refused");
        let distinct = anyhow::anyhow!("disk full").context("writing the log").context("granting");
        assert_eq!(message(&distinct), "granting: writing the log: disk full");
    }
}
