//! Requests for the demo's talk with the fenced storage server and for the
//! admin commands (`cluster`, `snapshot save`, `auth`), through the
//! workspace's one HTTP client ([`fencelock_http::Client`]), over TLS
//! when the node's admin port has it, with the auth token when one is given.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use clap::Args;
use fencelock_http::{Client, Request};
use tokio_rustls::rustls;

use crate::AuthToken;

/// TLS towards a node's admin port: the CA of its certificate, and a client
/// certificate if the node asks for one; and the auth token, if the node
/// requires one.
#[derive(Args, Debug, Clone, Default)]
pub struct AdminTlsArgs {
    /// The CA (PEM) of the nodes' certificates; turns TLS on.
    #[arg(long, env = "FENCELOCK_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// A client certificate (PEM), for nodes that ask for one.
    #[arg(long, env = "FENCELOCK_TLS_CERT", requires = "tls_key", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, env = "FENCELOCK_TLS_KEY", requires = "tls_cert", global = true)]
    pub tls_key: Option<PathBuf>,
    /// Bearer token for nodes that require one. Never printed. Prefer the
    /// environment variable: a flag is visible to other users in the process list.
    #[arg(long, env = "FENCELOCK_AUTH_TOKEN", hide_env_values = true, value_name = "TOKEN", global = true)]
    pub auth_token: Option<AuthToken>,
}

impl AdminTlsArgs {
    /// The client configuration, or `None` without `--tls-ca`.
    pub fn config(&self) -> anyhow::Result<Option<Arc<rustls::ClientConfig>>> {
        use fencelock::backend::tls::{client_config, read_certs, read_key, TlsFiles, Verify};
        let Some(ca) = &self.tls_ca else { return Ok(None) };
        let identity = match (&self.tls_cert, &self.tls_key) {
            (Some(c), Some(k)) => Some((read_certs(c)?, read_key(k)?)),
            _ => None,
        };
        let files = TlsFiles { ca_pem: read_certs(ca)?, identity };
        Ok(Some(Arc::new(client_config(&files, Verify::Full)?)))
    }

    /// The `Authorization: Bearer` header, or `None` without a token. A token
    /// that cannot be a header value (empty, whitespace, a line break that
    /// would end the header) is an error that does not quote it.
    pub fn auth_header(&self) -> anyhow::Result<Option<(&'static str, String)>> {
        let Some(token) = &self.auth_token else { return Ok(None) };
        fencelock::check_auth_token(token.secret())?;
        Ok(Some(("Authorization", format!("Bearer {}", token.secret()))))
    }
}

/// A 401 or 403 from `admin` as the client library's auth errors (so that
/// the exit code says what happened), else `None`.
pub fn auth_refusal(admin: SocketAddr, status: u16, message: &str) -> Option<anyhow::Error> {
    let e = fencelock::Error::from_http_refusal(status, message)?;
    Some(anyhow::Error::new(e).context(admin.to_string()))
}

/// How long one request may take, answer included: an admin port that
/// accepts and never answers fails the command instead of hanging it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Send one request and return (status, body); over TLS with `tls`.
pub async fn request_tls(
    tls: Option<&Arc<rustls::ClientConfig>>,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> anyhow::Result<(u16, String)> {
    let req = Request { method, path, headers, body };
    let answer = Client::new(addr).tls(tls.cloned()).timeout(REQUEST_TIMEOUT).send(req).await?;
    Ok((answer.status, answer.text()))
}

/// Sends one admin request to the first of `admins` that answers it: a member
/// that cannot be reached, or that answers 503 (it could reach no leader), is
/// skipped for the next. Returns the 200 answer's body; a 401 or 403 is the
/// client library's auth error (see [`auth_refusal`]), any other status an
/// error with the node's message.
pub async fn call_admin(
    admins: &[SocketAddr],
    args: &AdminTlsArgs,
    method: &str,
    path: &str,
    body: &[u8],
) -> anyhow::Result<String> {
    let mut headers = vec![("Content-Type", "application/json".to_string())];
    headers.extend(args.auth_header()?);
    let tls = args.config()?;
    let mut last = None;
    for admin in admins {
        match request_tls(tls.as_ref(), *admin, method, path, &headers, body).await {
            Ok((200, text)) => return Ok(text),
            Ok((code, text)) => {
                let msg = error_message(&text);
                if let Some(refused) = auth_refusal(*admin, code, &msg) {
                    return Err(refused);
                }
                if code != 503 {
                    anyhow::bail!("{admin}: {code}: {msg}");
                }
                last = Some(format!("{admin}: {code}: {msg}"));
            }
            Err(e) => last = Some(format!("{admin}: {e:#}")),
        }
    }
    anyhow::bail!("no member could answer ({})", last.unwrap_or_else(|| "no --admin address".into()))
}

/// The message of a JSON error body (`{"error": {"code", "message"}}`, or
/// the older `{"error": "…"}`), else the body.
pub fn error_message(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().or(v["error"].as_str()).map(str::to_string))
        .unwrap_or_else(|| body.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message of either error shape is shown, else the body.
    #[test]
    fn error_messages_of_both_shapes() {
        let new = r#"{"error": {"code": "invalid_argument", "message": "bad ttl", "field": "ttl_ms"}}"#;
        assert_eq!(error_message(new), "bad ttl");
        assert_eq!(error_message(r#"{"error": "old shape"}"#), "old shape");
        assert_eq!(error_message(" not json \n"), "not json");
    }

    fn with_token(t: &str) -> AdminTlsArgs {
        AdminTlsArgs { auth_token: Some(t.parse().unwrap()), ..AdminTlsArgs::default() }
    }

    /// Rule: the admin requests carry `Authorization: Bearer <token>` only
    /// when a token is given; a token that would break the header (empty,
    /// a space, a line break that could inject another header) is a clear
    /// error that does not quote it.
    #[test]
    fn the_auth_header_is_sent_only_when_given_and_only_if_valid() {
        assert_eq!(AdminTlsArgs::default().auth_header().unwrap(), None);
        let t = "flt_0123abcd_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
        assert_eq!(with_token(t).auth_header().unwrap(), Some(("Authorization", format!("Bearer {t}"))));
        for bad in ["", "sekrit sekrit", "sekrit\r\nX-Admin: yes"] {
            let err = format!("{:#}", with_token(bad).auth_header().unwrap_err());
            assert!(err.contains("invalid auth token") && !err.contains("sekrit"), "{err}");
        }
        let debug = format!("{:?}", with_token("sekrit"));
        assert!(!debug.contains("sekrit"), "{debug}");
    }

    /// Rule: 401 and 403 from the admin port become the library's
    /// Unauthenticated / PermissionDenied (which the exit code reads); other
    /// statuses are not auth refusals.
    #[test]
    fn admin_401_and_403_are_auth_refusals() {
        let addr: SocketAddr = "127.0.0.1:7071".parse().unwrap();
        let e = auth_refusal(addr, 401, "token missing").unwrap();
        assert_eq!(format!("{e:#}"), "127.0.0.1:7071: not authenticated: token missing");
        assert!(matches!(e.downcast_ref(), Some(fencelock::Error::Unauthenticated(_))));
        let e = auth_refusal(addr, 403, "role reader").unwrap();
        assert_eq!(format!("{e:#}"), "127.0.0.1:7071: permission denied: role reader");
        assert!(matches!(e.downcast_ref(), Some(fencelock::Error::PermissionDenied(_))));
        assert!(auth_refusal(addr, 503, "no leader").is_none());
        assert!(auth_refusal(addr, 200, "").is_none());
    }
}
