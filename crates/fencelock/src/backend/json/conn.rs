//! The connections of the JSON backend: HTTP/1.1 with keep-alive (hyper's
//! client connection), plain or over rustls, pooled (an idle connection is
//! reused; a long-poll holds its own); one request each: JSON in, status and
//! JSON out; and the server's error shape as an [`Error`].
//!
//! Where it sits: under [`super::JsonBackend`]; every call of the backend
//! goes through [`Conn::call`].

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use rustls::pki_types::ServerName;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::error::Error;

/// Bound of a connection attempt.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest answer read.
const MAX_ANSWER: usize = 1 << 20;
/// At most this many idle connections are kept.
const MAX_IDLE: usize = 64;

type Sender = SendRequest<Full<Bytes>>;

/// Where and how to reach the node's HTTP port.
pub(super) struct Conn {
    host: String,
    port: u16,
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    /// `Bearer <token>`, if the URL gives one.
    authorization: Option<String>,
    idle: Mutex<Vec<Sender>>,
}

impl Conn {
    pub(super) fn new(
        host: String,
        port: u16,
        tls: Option<Arc<rustls::ClientConfig>>,
        token: Option<String>,
    ) -> Result<Conn, Error> {
        let tls = match tls {
            Some(config) => {
                let name = ServerName::try_from(host.clone())
                    .map_err(|e| Error::InvalidArgument(format!("{host} is not a host name for TLS: {e}")))?;
                Some((tokio_rustls::TlsConnector::from(config), name))
            }
            None => None,
        };
        let authorization = token.map(|t| format!("Bearer {t}"));
        Ok(Conn { host, port, tls, authorization, idle: Mutex::new(Vec::new()) })
    }

    /// `host:port`, for messages.
    pub(super) fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// `method path` with `body` as JSON, answered within `timeout`: the
    /// status and the JSON answer. A transport failure is [`Error::Backend`]
    /// (the outcome unknown) or [`Error::Timeout`].
    pub(super) async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<(u16, Value), Error> {
        tokio::time::timeout(timeout, self.exchange(method, path, body)).await.map_err(|_| Error::Timeout)?
    }

    async fn exchange(&self, method: &str, path: &str, body: Option<&Value>) -> Result<(u16, Value), Error> {
        let mut sender = match self.take_idle() {
            Some(s) => s,
            None => self.open().await?,
        };
        let bytes = body.map(|b| b.to_string().into_bytes()).unwrap_or_default();
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", self.addr())
            .header("content-type", "application/json");
        if let Some(a) = &self.authorization {
            req = req.header("authorization", a);
        }
        let req = req.body(Full::new(Bytes::from(bytes))).map_err(|e| fail("build the request", e))?;
        let resp = sender.send_request(req).await.map_err(|e| fail(&format!("{method} {path}"), e))?;
        let status = resp.status().as_u16();
        let collected = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| Error::backend(super::KIND, format!("read the answer to {method} {path}: {e}")))?;
        self.put_idle(sender);
        let text = collected.to_bytes();
        let v = serde_json::from_slice(&text).map_err(|_| {
            Error::Protocol(format!(
                "{method} {path}: {status} with a body that is not JSON: {}",
                String::from_utf8_lossy(&text)
            ))
        })?;
        Ok((status, v))
    }

    fn take_idle(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        while let Some(s) = idle.pop() {
            if s.is_ready() {
                return Some(s);
            }
        }
        None
    }

    fn put_idle(&self, sender: Sender) {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if sender.is_ready() && idle.len() < MAX_IDLE {
            idle.push(sender);
        }
    }

    /// A new connection, its driver spawned.
    async fn open(&self) -> Result<Sender, Error> {
        let addr = self.addr();
        let connect = TcpStream::connect((self.host.as_str(), self.port));
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| Error::backend(super::KIND, format!("{addr}: no connection within 5 s")))?
            .map_err(|e| fail(&format!("connect to {addr}"), e))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            None => handshake(tcp).await,
            Some((connector, name)) => {
                let stream = connector
                    .connect(name.clone(), tcp)
                    .await
                    .map_err(|e| Error::security(format!("fencelock-json {addr}: TLS handshake failed"), e))?;
                handshake(stream).await
            }
        }
    }
}

async fn handshake<S>(stream: S) -> Result<Sender, Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let io = hyper_util::rt::TokioIo::new(stream);
    let (sender, conn) = hyper::client::conn::http1::handshake(io).await.map_err(|e| fail("HTTP handshake", e))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// [`Error::Backend`] for `what`, caused by `e`.
fn fail(what: &str, e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::backend_caused(super::KIND, what, e)
}

/// A refusal in the server's error shape (`{"error": {"code", "message", …}}`)
/// as the [`Error`] the native client gives for the same case.
pub(super) fn refusal(status: u16, v: &Value) -> Error {
    let code = v["error"]["code"].as_str().unwrap_or("");
    let message = v["error"]["message"].as_str().unwrap_or("").to_string();
    match code {
        "invalid_argument" | "payload_too_large" => Error::InvalidArgument(message),
        "lease_not_found" => Error::LeaseNotFound(message),
        "slot_done" => Error::SlotDone {
            token: id(&v["error"]["token"]).unwrap_or(0),
            identity: v["error"]["identity"].as_str().unwrap_or("").to_string(),
            exit_code: v["error"]["exit_code"].as_i64().and_then(|c| i32::try_from(c).ok()).unwrap_or(0),
        },
        "unauthenticated" => Error::Unauthenticated(message),
        "permission_denied" => Error::PermissionDenied(message),
        "limit_reached" => Error::LimitReached(message),
        "not_leader" | "unavailable" => Error::Unavailable(message),
        "" => Error::Protocol(format!("{status} without an error code: {v}")),
        code => Error::Server(format!("{code}: {message}")),
    }
}

/// An id or token: a decimal string (a number from an older node).
pub(super) fn id(v: &Value) -> Option<u64> {
    v.as_str().and_then(|s| s.parse().ok()).or_else(|| v.as_u64())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The HTTP API's error codes give the errors the gRPC client gives for
    /// the same refusals (one `Error` per case, whatever the transport).
    #[test]
    fn refusals_map_to_the_native_clients_errors() {
        let e = |code: &str| refusal(400, &serde_json::json!({"error": {"code": code, "message": "m"}}));
        assert_eq!(e("invalid_argument"), Error::InvalidArgument("m".into()));
        assert_eq!(e("lease_not_found"), Error::LeaseNotFound("m".into()));
        assert_eq!(e("unauthenticated"), Error::Unauthenticated("m".into()));
        assert_eq!(e("permission_denied"), Error::PermissionDenied("m".into()));
        assert_eq!(e("limit_reached"), Error::LimitReached("m".into()));
        assert_eq!(e("unavailable"), Error::Unavailable("m".into()));
        assert_eq!(e("internal"), Error::Server("internal: m".into()));
        assert!(matches!(refusal(502, &serde_json::json!({})), Error::Protocol(_)));
    }
}
