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
//! into one. Each fetch is one request on a connection of its own
//! ([`fencelock_http::Client`]), over TLS for an `https://` lock service,
//! with its bearer token if one is given.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fencelock_http::{prometheus, Client, HttpError, HttpUrl, Request, Scheme};
use tokio_rustls::rustls;

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
    NeverIssued { token: u64, issued: u64, margin: u64, limit: u64 },
    #[error("cannot check Fencing-Token {token} against the lock service at {url}: {source}")]
    Unreachable { token: u64, url: String, source: Box<FetchError> },
}

/// Why the lock service's count could not be fetched.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchError {
    #[error("{0}")]
    Http(#[from] HttpError),
    #[error(
        "/metrics answered {0}: the lock service wants credentials for it \
         (a token with --lock-server-token, or a client certificate)"
    )]
    Credentials(u16),
    #[error("/metrics answered {0}")]
    Status(u16),
    #[error("no {GAUGE} gauge in /metrics")]
    NoGauge,
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

/// Where the lock service's admin HTTP is, and how to reach it.
pub(crate) struct LockServer<'a> {
    /// `http://host:port` or `https://host:port`.
    pub url: &'a str,
    /// For `https://`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// `Authorization: Bearer` for a protected `/metrics`.
    pub token: Option<&'a str>,
}

/// The lock service's count, as last fetched.
struct Issued {
    /// `http(s)://host:port/metrics` of the lock service's admin HTTP.
    url: HttpUrl,
    /// To `url`'s host and port: over TLS for `https://`, with the bearer
    /// token, within [`FETCH_TIMEOUT`], at most [`MAX_METRICS_BYTES`].
    client: Client,
    margin: u64,
    known: AtomicU64,
    /// How many fetches were started; fetch `n` is the `n`th.
    started: AtomicU64,
    /// Held across a fetch; holds the number of the last fetch that
    /// succeeded, so a waiter can tell whether it began after its token
    /// arrived (then it counts as this token's refresh).
    fetching: tokio::sync::Mutex<u64>,
}

impl TokenLimit {
    /// `lock_server`: the lock service's admin HTTP, if any.
    pub(crate) fn new(max: u64, lock_server: Option<LockServer<'_>>, margin: u64) -> Result<Self, String> {
        let issued = match lock_server {
            None => None,
            Some(server) => Some(Issued::new(server, margin)?),
        };
        Ok(Self { max, issued })
    }

    /// Refuse `token` if it could not have been issued.
    pub(crate) async fn check(&self, token: u64) -> Result<(), TokenRefused> {
        if token > self.max {
            return Err(TokenRefused::AboveMax { token, max: self.max });
        }
        match &self.issued {
            None => Ok(()),
            Some(issued) => issued.check(token).await,
        }
    }
}

impl Issued {
    fn new(server: LockServer<'_>, margin: u64) -> Result<Self, String> {
        let url = metrics_url(server.url)?;
        let base = server.url.trim_end_matches('/');
        let tls = match (url.scheme, server.tls) {
            (Scheme::Https, Some(config)) => Some(config),
            (Scheme::Https, None) => {
                return Err(format!("lock server URL {base:?}: https:// needs the lock service's CA"))
            }
            (Scheme::Http, Some(_)) => {
                return Err(format!("lock server URL {base:?}: TLS settings are given, so use https://"))
            }
            (Scheme::Http, None) => None,
        };
        let mut client = Client::new(url.endpoint()).tls(tls).timeout(FETCH_TIMEOUT).max_answer(MAX_METRICS_BYTES);
        if let Some(token) = server.token {
            client = client.bearer(token).map_err(|_| {
                "the lock server token is not a valid bearer token (empty, spaces or control characters)"
            })?;
        }
        Ok(Issued {
            url,
            client,
            margin,
            known: AtomicU64::new(0),
            started: AtomicU64::new(0),
            fetching: tokio::sync::Mutex::new(0),
        })
    }

    fn within(&self, token: u64) -> bool {
        token <= self.known.load(Ordering::SeqCst).saturating_add(self.margin)
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
            let count = self.fetch().await.map_err(|source| TokenRefused::Unreachable {
                token,
                url: self.url.to_string(),
                source: Box::new(source),
            })?;
            self.known.fetch_max(count, Ordering::SeqCst);
            *last_good = n;
        }
        if self.within(token) {
            return Ok(());
        }
        let issued = self.known.load(Ordering::SeqCst);
        Err(TokenRefused::NeverIssued { token, issued, margin: self.margin, limit: issued.saturating_add(self.margin) })
    }

    /// `GET /metrics`, and the gauge in it.
    async fn fetch(&self) -> Result<u64, FetchError> {
        let answer = self.client.send(Request::get(&self.url.path)).await?;
        match answer.status {
            401 | 403 => Err(FetchError::Credentials(answer.status)),
            200..=299 => tokens_issued(&answer.text()).ok_or(FetchError::NoGauge),
            status => Err(FetchError::Status(status)),
        }
    }
}

/// `base` + `/metrics`, for an `http://host:port` or `https://host:port` base.
fn metrics_url(base: &str) -> Result<HttpUrl, String> {
    let base = base.trim_end_matches('/');
    let expected = "expected http://host:port or https://host:port (the lock service's admin HTTP)";
    let url = HttpUrl::parse(base).map_err(|e| format!("lock server URL {base:?}: {e}; {expected}"))?;
    if !url.is_base() {
        return Err(format!("lock server URL {base:?}: {expected}"));
    }
    Ok(url.with_path("/metrics"))
}

/// The value of the gauge in a Prometheus text answer, exactly: tokens are
/// near 2^62, where an `f64` would round them (the server prints integers).
fn tokens_issued(metrics: &str) -> Option<u64> {
    prometheus::value(metrics, GAUGE)
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
        assert_eq!(metrics_url("http://127.0.0.1:7071/").unwrap().to_string(), "http://127.0.0.1:7071/metrics");
        assert!(metrics_url("https://h:1").is_ok());
        assert!(metrics_url("ftp://h:1").is_err());
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
