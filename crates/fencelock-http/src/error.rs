//! Why a request got no answer: the errors of [`crate::Client`] and
//! [`crate::blocking`], each keeping the error it wraps as its
//! [`source`](std::error::Error::source).

use std::time::Duration;

use crate::url::Endpoint;

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HttpError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: Endpoint, source: std::io::Error },
    #[error("TLS handshake with {addr}: {source}")]
    Tls { addr: Endpoint, source: std::io::Error },
    /// The host cannot be a TLS server name.
    #[error("{addr} cannot be checked against a certificate: {source}")]
    ServerName { addr: Endpoint, source: rustls::pki_types::InvalidDnsNameError },
    #[error("{method} {path} to {addr}: {source}")]
    Io { addr: Endpoint, method: String, path: String, source: std::io::Error },
    #[error("{method} {path} to {addr}: no answer within {} ms", timeout.as_millis())]
    Timeout { addr: Endpoint, method: String, path: String, timeout: Duration },
    #[error("malformed answer from {addr}: {reason}")]
    Malformed { addr: Endpoint, reason: String },
    #[error("the answer from {addr} is larger than {limit} bytes")]
    TooLarge { addr: Endpoint, limit: usize },
    /// A header value with a control character, which could end its line
    /// and start another header (the value is not quoted: it may be a secret).
    #[error("the {name} header's value contains a control character")]
    BadHeader { name: String },
    /// A bearer token that cannot be sent as one (not quoted: it is a secret).
    #[error("not a valid bearer token (empty, spaces or control characters)")]
    BadToken,
}
