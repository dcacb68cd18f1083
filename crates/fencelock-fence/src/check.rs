//! [`CheckValidator`]: for a resource that cannot store a token (a legacy
//! API, an e-mail gateway, a device), ask the lock server whether the token
//! is still current just before acting.
//!
//! # This is weaker than a fence — by how much
//!
//! A [`crate::Fence`] decides *at the resource, atomically with the act*. A
//! check decides *before* the act, somewhere else: a window remains between
//! the lock server's "yes" and the moment the act takes effect. If the holder
//! is paused in that window (GC, SIGSTOP, a slow network carrying the act)
//! for longer than the rest of its lease, another holder can be granted the
//! lock and act too, and both acts land. The check narrows the window from
//! "the whole time since the lock was acquired" to "one round trip plus the
//! act"; it does not close it. Use it only where that is acceptable, keep the
//! lease TTL much longer than the window, and prefer a real fence whenever
//! the resource can store one number per key.
//!
//! The types say so: a check answers [`Checked`], not [`crate::Fenced`].

use std::future::Future;

use async_trait::async_trait;

use crate::fence::{check_input, BoxError, FenceError};

/// Asks the lock service whether a token is current. The fencelock client
/// library implements it; tests implement it with a map.
#[async_trait]
pub trait TokenChecker: Send + Sync {
    /// `true` if `token` is the token of the grant that currently holds
    /// `lock` (held, not released, lease not expired); `false` otherwise.
    async fn check(&self, lock: &str, token: u64) -> Result<bool, BoxError>;
}

#[async_trait]
impl<C: TokenChecker + ?Sized> TokenChecker for std::sync::Arc<C> {
    async fn check(&self, lock: &str, token: u64) -> Result<bool, BoxError> {
        (**self).check(lock, token).await
    }
}

/// The fencelock client asks the server's `Check` RPC (linearizable: the
/// leader confirms its leadership before answering).
#[cfg(feature = "client")]
#[async_trait]
impl TokenChecker for fencelock::Client {
    async fn check(&self, lock: &str, token: u64) -> Result<bool, BoxError> {
        Ok(fencelock::Client::check(self, lock, token).await?.current)
    }
}

/// The outcome of a checked act.
#[must_use = "an act refused by the check did not happen"]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked<T = ()> {
    /// The token was current when checked, and the act ran: `T` is its result.
    Current(T),
    /// The token was not current; the act did not run.
    NotCurrent {
        /// The lock that was asked about.
        lock: String,
        /// The token that was refused.
        token: u64,
    },
}

impl<T> Checked<T> {
    /// Whether the check passed and the act ran.
    pub fn is_current(&self) -> bool {
        matches!(self, Checked::Current(_))
    }
}

/// Checks a token with a [`TokenChecker`] right before an act. See the
/// module docs for the window this leaves open.
#[derive(Debug, Clone)]
pub struct CheckValidator<C> {
    checker: C,
}

impl<C: TokenChecker> CheckValidator<C> {
    /// Validate with `checker`.
    pub fn new(checker: C) -> Self {
        Self { checker }
    }

    /// Whether `token` is current for `lock` now. A checker failure is an
    /// error ([`FenceError::Checker`]): do not act on it.
    pub async fn validate(&self, lock: &str, token: u64) -> Result<bool, FenceError> {
        check_input(lock, token)?;
        self.checker.check(lock, token).await.map_err(FenceError::Checker)
    }

    /// Check, then run `act` only if the token is current. Keep `act` short:
    /// everything it does before its effect lands is inside the window.
    pub async fn run<T, Fut>(&self, lock: &str, token: u64, act: impl FnOnce() -> Fut) -> Result<Checked<T>, FenceError>
    where
        Fut: Future<Output = T>,
    {
        if !self.validate(lock, token).await? {
            return Ok(Checked::NotCurrent { lock: lock.to_owned(), token });
        }
        Ok(Checked::Current(act().await))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::Mutex;

    /// The lock server, reduced to "the current token of each lock".
    #[derive(Default)]
    struct Current(Mutex<HashMap<String, u64>>);

    #[async_trait]
    impl TokenChecker for Current {
        async fn check(&self, lock: &str, token: u64) -> Result<bool, BoxError> {
            Ok(self.0.lock().unwrap().get(lock) == Some(&token))
        }
    }

    struct Down;

    #[async_trait]
    impl TokenChecker for Down {
        async fn check(&self, _: &str, _: u64) -> Result<bool, BoxError> {
            Err("connection refused".into())
        }
    }

    #[tokio::test]
    async fn acts_only_with_the_current_token() {
        let server = std::sync::Arc::new(Current::default());
        server.0.lock().unwrap().insert("mailer".into(), 7);
        let validator = CheckValidator::new(server.clone());
        assert_eq!(validator.run("mailer", 7, || async { "sent" }).await.unwrap(), Checked::Current("sent"));
        server.0.lock().unwrap().insert("mailer".into(), 8); // lease expired, 8 granted
        let ran = AtomicBool::new(false);
        let outcome = validator.run("mailer", 7, || async { ran.store(true, SeqCst) }).await.unwrap();
        assert_eq!(outcome, Checked::NotCurrent { lock: "mailer".into(), token: 7 });
        assert!(!ran.load(SeqCst));
    }

    #[tokio::test]
    async fn a_failed_check_is_an_error_and_nothing_runs() {
        let validator = CheckValidator::new(Down);
        let ran = AtomicBool::new(false);
        let result = validator.run("mailer", 7, || async { ran.store(true, SeqCst) }).await;
        assert!(matches!(result, Err(FenceError::Checker(_))));
        assert!(!ran.load(SeqCst));
        assert!(matches!(validator.validate("mailer", 0).await, Err(FenceError::InvalidToken(0))));
    }
}
