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
//! into one. Each fetch is one request on a connection of its own, over TLS
//! for an `https://` lock service, with its bearer token if one is given.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::header::{HeaderValue, AUTHORIZATION, HOST};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
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
    #[error("cannot check Fencing-Token {token} against the lock service at {url}: {reason}")]
    Unreachable { token: u64, url: String, reason: String },
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
    url: hyper::Uri,
    /// `host:port` of `url` (the port given, or the scheme's), to connect to.
    addr: String,
    /// `url`'s authority, for `Host:`.
    authority: String,
    /// With an `https://` URL: the connector and the name the certificate
    /// must have.
    tls: Option<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>)>,
    authorization: Option<HeaderValue>,
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
        let authority = url.authority().map(|a| a.to_string()).unwrap_or_default();
        let https = url.scheme_str() == Some("https");
        let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
        let addr = format!("{}:{port}", url.host().unwrap_or_default());
        let tls = match (url.scheme_str(), server.tls) {
            (Some("https"), Some(config)) => {
                let host = url.host().unwrap_or_default();
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                    .map_err(|e| format!("lock server URL {base:?}: host {host:?}: {e}"))?;
                Some((tokio_rustls::TlsConnector::from(config), name))
            }
            (Some("https"), None) => {
                return Err(format!("lock server URL {base:?}: https:// needs the lock service's CA"))
            }
            (_, Some(_)) => return Err(format!("lock server URL {base:?}: TLS settings are given, so use https://")),
            (_, None) => None,
        };
        let authorization = match server.token {
            None => None,
            Some(t) => {
                let mut v = HeaderValue::from_str(&format!("Bearer {t}"))
                    .ok()
                    .filter(|_| !t.is_empty() && !t.contains(char::is_whitespace))
                    .ok_or("the lock server token is not a valid bearer token (empty, spaces or control characters)")?;
                v.set_sensitive(true);
                Some(v)
            }
        };
        Ok(Issued {
            url,
            addr,
            authority,
            tls,
            authorization,
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
            let count = self.fetch().await.map_err(|reason| TokenRefused::Unreachable {
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
        Err(TokenRefused::NeverIssued { token, issued, margin: self.margin, limit: issued.saturating_add(self.margin) })
    }

    async fn fetch(&self) -> Result<u64, String> {
        let response = tokio::time::timeout(FETCH_TIMEOUT, self.get())
            .await
            .map_err(|_| format!("no answer in {FETCH_TIMEOUT:?}"))??;
        let status = response.status();
        if status == hyper::StatusCode::UNAUTHORIZED || status == hyper::StatusCode::FORBIDDEN {
            return Err(format!(
                "/metrics answered {status}: the lock service wants credentials for it \
                 (a token with --lock-server-token, or a client certificate)"
            ));
        }
        if !status.is_success() {
            return Err(format!("/metrics answered {status}"));
        }
        let body = tokio::time::timeout(FETCH_TIMEOUT, Limited::new(response.into_body(), MAX_METRICS_BYTES).collect())
            .await
            .map_err(|_| format!("/metrics body not read in {FETCH_TIMEOUT:?}"))?
            .map_err(|e| e.to_string())?
            .to_bytes();
        tokens_issued(&String::from_utf8_lossy(&body)).ok_or_else(|| format!("no {GAUGE} gauge in /metrics"))
    }

    /// `GET /metrics` on a connection of its own (over TLS for `https://`).
    async fn get(&self) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let tcp = TcpStream::connect(&self.addr).await.map_err(|e| format!("cannot connect: {e}"))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => self.get_on(tcp).await,
            Some((connector, name)) => {
                let tls = connector.connect(name.clone(), tcp).await.map_err(|e| format!("TLS handshake: {e}"))?;
                self.get_on(tls).await
            }
        }
    }

    async fn get_on<S>(&self, io: S) -> Result<hyper::Response<hyper::body::Incoming>, String>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(io)).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "lock server connection ended with an error");
            }
        });
        let mut request = hyper::Request::get("/metrics")
            .header(HOST, self.authority.as_str())
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        if let Some(auth) = &self.authorization {
            request.headers_mut().insert(AUTHORIZATION, auth.clone());
        }
        sender.send_request(request).await.map_err(|e| e.to_string())
    }
}

/// `base` + `/metrics`, for an `http://host:port` or `https://host:port` base.
fn metrics_url(base: &str) -> Result<hyper::Uri, String> {
    let base = base.trim_end_matches('/');
    let uri: hyper::Uri = format!("{base}/metrics").parse().map_err(|e| format!("lock server URL {base:?}: {e}"))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.host().is_none() || uri.path() != "/metrics" {
        return Err(format!(
            "lock server URL {base:?}: expected http://host:port or https://host:port (the lock service's admin HTTP)"
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
