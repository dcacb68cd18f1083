//! Which tokens the storage server takes at all: a fenced request whose token
//! could not have been issued is refused before it reaches the fence, since
//! once admitted an absurd token raises the key's mark for good (a mark never
//! goes down, except by `fencelock storage reset-mark`).
//!
//! Two bounds, both checked before the key's lock is taken:
//!
//! * a configured maximum ([`super::Config::max_token`], default
//!   [`DEFAULT_MAX_TOKEN`]);
//! * with a lock service configured ([`super::Config::lock_server`]), the
//!   highest token it has issued plus a margin. The server keeps the last
//!   count it fetched and fetches again when a token above `count + margin`
//!   arrives, so a token issued since the last fetch is never refused for
//!   being fresh: it is refused only if the lock service, asked after the
//!   token arrived, has still not issued it (less the margin, which covers a
//!   lock-service node whose applied state lags its leader). If the lock
//!   service cannot be asked, such a token is refused with `503` (fail
//!   closed); tokens at or below the known count need no fetch.
//!
//! The highest token issued is the `fencelock_token_counter` gauge of the lock
//! service's admin HTTP `/metrics` (not `fencelock_tokens_issued`, which counts
//! grants: tokens jump with each leader's floor); concurrent fetches are merged
//! into one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// The default largest token: 9×10^18, below [`crate::MAX_TOKEN`] (2^63−1 ≈
/// 9.22×10^18). No counting lock service comes near it (a group whose
/// counter starts at its creation time in seconds × 2^32 stays below it
/// until 2036), and it refuses 2^63−1 and the values next to it that
/// garbage, overflow and "largest possible" guesses produce.
pub const DEFAULT_MAX_TOKEN: u64 = 9_000_000_000_000_000_000;

/// The default margin over the lock service's count: 1000 tokens.
pub const DEFAULT_TOKEN_MARGIN: u64 = 1000;

/// The gauge read from the lock service's `/metrics`.
const GAUGE: &str = "fencelock_token_counter";
/// How long one fetch of the count may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest `/metrics` answer read.
const MAX_METRICS_BYTES: usize = 1024 * 1024;

/// Why a token is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenRefused {
    #[error("Fencing-Token {token} is above this server's maximum token {max} (--max-token)")]
    AboveMax { token: u64, max: u64 },
    #[error(
        "Fencing-Token {token} was never issued: the lock service has issued tokens up to {issued} \
         and this server accepts at most {limit} (its count plus a margin of {margin})"
    )]
    NeverIssued {
        token: u64,
        issued: u64,
        margin: u64,
        limit: u64,
    },
    #[error("cannot check Fencing-Token {token} against the lock service at {url}: {reason}")]
    Unreachable {
        token: u64,
        url: String,
        reason: String,
    },
}

impl TokenRefused {
    /// The largest token accepted now, when that is what refused it.
    pub(crate) fn limit(&self) -> Option<u64> {
        match self {
            TokenRefused::AboveMax { max, .. } => Some(*max),
            TokenRefused::NeverIssued { limit, .. } => Some(*limit),
            TokenRefused::Unreachable { .. } => None,
        }
    }
}

/// The bounds of [`self`](self).
pub(crate) struct TokenLimit {
    max: u64,
    issued: Option<Issued>,
}

/// The lock service's count, as last fetched.
struct Issued {
    /// `http://host:port/metrics` of the lock service's admin HTTP.
    url: hyper::Uri,
    margin: u64,
    known: AtomicU64,
    /// How many fetches were started; fetch `n` is the `n`th.
    started: AtomicU64,
    /// Held across a fetch; holds the number of the last fetch that
    /// succeeded, so a waiter can tell whether it began after its token
    /// arrived (then it counts as this token's refresh).
    fetching: tokio::sync::Mutex<u64>,
    client: Client<HttpConnector, Empty<Bytes>>,
}

impl TokenLimit {
    /// `lock_server` is the base URL of the lock service's admin HTTP
    /// (`http://host:port`).
    pub(crate) fn new(max: u64, lock_server: Option<&str>, margin: u64) -> Result<Self, String> {
        let issued = match lock_server {
            None => None,
            Some(base) => Some(Issued {
                url: metrics_url(base)?,
                margin,
                known: AtomicU64::new(0),
                started: AtomicU64::new(0),
                fetching: tokio::sync::Mutex::new(0),
                client: Client::builder(TokioExecutor::new()).build_http(),
            }),
        };
        Ok(Self { max, issued })
    }

    /// Refuse `token` if it could not have been issued.
    pub(crate) async fn check(&self, token: u64) -> Result<(), TokenRefused> {
        if token > self.max {
            return Err(TokenRefused::AboveMax {
                token,
                max: self.max,
            });
        }
        match &self.issued {
            None => Ok(()),
            Some(issued) => issued.check(token).await,
        }
    }
}

impl Issued {
    fn within(&self, token: u64) -> bool {
        token
            <= self
                .known
                .load(Ordering::SeqCst)
                .saturating_add(self.margin)
    }

    async fn check(&self, token: u64) -> Result<(), TokenRefused> {
        if self.within(token) {
            return Ok(());
        }
        let arrived = self.started.load(Ordering::SeqCst);
        let mut last_good = self.fetching.lock().await;
        if *last_good <= arrived {
            // No fetch began after this token arrived: refresh now.
            let n = self.started.fetch_add(1, Ordering::SeqCst) + 1;
            let count = self
                .fetch()
                .await
                .map_err(|reason| TokenRefused::Unreachable {
                    token,
                    url: self.url.to_string(),
                    reason,
                })?;
            self.known.fetch_max(count, Ordering::SeqCst);
            *last_good = n;
        }
        if self.within(token) {
            return Ok(());
        }
        let issued = self.known.load(Ordering::SeqCst);
        Err(TokenRefused::NeverIssued {
            token,
            issued,
            margin: self.margin,
            limit: issued.saturating_add(self.margin),
        })
    }

    async fn fetch(&self) -> Result<u64, String> {
        let request = self.client.get(self.url.clone());
        let response = tokio::time::timeout(FETCH_TIMEOUT, request)
            .await
            .map_err(|_| format!("no answer in {FETCH_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?;
        if !response.status().is_success() {
            return Err(format!("/metrics answered {}", response.status()));
        }
        let body = tokio::time::timeout(
            FETCH_TIMEOUT,
            Limited::new(response.into_body(), MAX_METRICS_BYTES).collect(),
        )
        .await
        .map_err(|_| format!("/metrics body not read in {FETCH_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?
        .to_bytes();
        tokens_issued(&String::from_utf8_lossy(&body))
            .ok_or_else(|| format!("no {GAUGE} gauge in /metrics"))
    }
}

/// `base` + `/metrics`, for an `http://host:port` base.
fn metrics_url(base: &str) -> Result<hyper::Uri, String> {
    let base = base.trim_end_matches('/');
    let uri: hyper::Uri = format!("{base}/metrics")
        .parse()
        .map_err(|e| format!("lock server URL {base:?}: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() || uri.path() != "/metrics" {
        return Err(format!(
            "lock server URL {base:?}: expected http://host:port (the lock service's admin HTTP)"
        ));
    }
    Ok(uri)
}

/// The value of the gauge in a Prometheus text answer, exactly: tokens are
/// near 2^62, where an `f64` would round them (the server prints integers).
fn tokens_issued(metrics: &str) -> Option<u64> {
    metrics.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == GAUGE).then(|| value.trim().parse::<u64>().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gauge_is_found() {
        let text = "# HELP fencelock_token_counter x\n# TYPE fencelock_token_counter gauge\nfencelock_token_counter_total 9\nfencelock_token_counter 42\n";
        assert_eq!(tokens_issued(text), Some(42));
        assert_eq!(tokens_issued("other 1\n"), None);
        // Tokens near 2^62 (a leader's wall-clock floor) are read exactly.
        assert_eq!(tokens_issued("fencelock_token_counter 3848290697216000001\n"), Some(3848290697216000001));
    }

    #[test]
    fn lock_server_urls() {
        assert_eq!(
            metrics_url("http://127.0.0.1:7071/").unwrap().to_string(),
            "http://127.0.0.1:7071/metrics"
        );
        assert!(metrics_url("https://h:1").is_err());
        assert!(metrics_url("127.0.0.1:7071").is_err());
        assert!(metrics_url("http://h:1/x").is_err());
    }

    /// Issue 14 finding: token 2^63−1 was admitted and poisoned its key.
    #[tokio::test]
    async fn the_configured_maximum_is_enforced() {
        let limit = TokenLimit::new(DEFAULT_MAX_TOKEN, None, 0).unwrap();
        assert!(limit.check(1).await.is_ok());
        assert!(limit.check(DEFAULT_MAX_TOKEN).await.is_ok());
        let refused = limit.check(crate::MAX_TOKEN).await.unwrap_err();
        assert_eq!(refused.limit(), Some(DEFAULT_MAX_TOKEN));
    }
}
