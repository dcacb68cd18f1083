//! A minimal HTTP/1.1 client for the tools that talk to a node's admin port
//! or to the fenced storage server: the CLI's admin commands and demo, the
//! chaos harness and the bench. The one such client of the workspace.
//!
//! One request per connection (`Connection: close`), so a proxy that holds a
//! connection holds exactly one request; over TLS when given a client
//! configuration. The answer is read until its `Content-Length` is complete,
//! not to the end of the stream: a proxy in between may end the connection
//! with a reset, which can discard bytes not yet read. A chunked answer is
//! read to the end and de-chunked.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls;

/// One request: method, path (with its query), extra headers and body.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub method: &'a str,
    pub path: &'a str,
    pub headers: &'a [(&'a str, String)],
    pub body: &'a [u8],
}

impl<'a> Request<'a> {
    /// `GET path`, no headers, no body.
    pub fn get(path: &'a str) -> Self {
        Request { method: "GET", path, headers: &[], body: b"" }
    }
}

/// An answer: status, body, and the server's `Date` header (its wall clock).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    pub date: Option<String>,
}

impl Response {
    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: SocketAddr, source: std::io::Error },
    #[error("TLS handshake with {addr}: {source}")]
    Tls { addr: SocketAddr, source: std::io::Error },
    #[error("{method} {path} to {addr}: {source}")]
    Io { addr: SocketAddr, method: String, path: String, source: std::io::Error },
    #[error("{method} {path} to {addr}: no answer within {} ms", timeout.as_millis())]
    Timeout { addr: SocketAddr, method: String, path: String, timeout: Duration },
    #[error("malformed answer from {addr}: {reason}")]
    Malformed { addr: SocketAddr, reason: String },
}

/// Sends `req` to `addr` (over TLS with `tls`) and reads the whole answer,
/// all within `timeout`.
pub async fn request(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    req: Request<'_>,
    timeout: Duration,
) -> Result<Response, HttpError> {
    let timed_out = || HttpError::Timeout { addr, method: req.method.into(), path: req.path.into(), timeout };
    tokio::time::timeout(timeout, exchange(addr, tls, req)).await.map_err(|_| timed_out())?
}

async fn exchange(
    addr: SocketAddr,
    tls: Option<&Arc<rustls::ClientConfig>>,
    req: Request<'_>,
) -> Result<Response, HttpError> {
    let tcp = TcpStream::connect(addr).await.map_err(|source| HttpError::Connect { addr, source })?;
    let _ = tcp.set_nodelay(true);
    let Some(config) = tls else { return talk(tcp, addr, req).await };
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let stream = tokio_rustls::TlsConnector::from(config.clone())
        .connect(name, tcp)
        .await
        .map_err(|source| HttpError::Tls { addr, source })?;
    talk(stream, addr, req).await
}

async fn talk(
    mut s: impl AsyncRead + AsyncWrite + Unpin,
    addr: SocketAddr,
    req: Request<'_>,
) -> Result<Response, HttpError> {
    let io = |source| HttpError::Io { addr, method: req.method.into(), path: req.path.into(), source };
    s.write_all(&head(addr, &req)).await.map_err(io)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(r) = complete(&raw) {
            return r.map_err(|reason| HttpError::Malformed { addr, reason });
        }
        let n = s.read(&mut buf).await.map_err(io)?;
        if n == 0 {
            return parse(&raw).map_err(|reason| HttpError::Malformed { addr, reason });
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// The request's bytes: head, then body.
fn head(addr: SocketAddr, req: &Request<'_>) -> Vec<u8> {
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        req.method,
        req.path,
        req.body.len()
    );
    for (k, v) in req.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut msg = head.into_bytes();
    msg.extend_from_slice(req.body);
    msg
}

/// The parsed answer once `raw` holds its head and its whole body (by its
/// `Content-Length`; a chunked answer is complete only at the end of the stream).
fn complete(raw: &[u8]) -> Option<Result<Response, String>> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let len = header(head, "content-length")?.parse::<usize>().ok()?;
    (raw.len() >= end + 4 + len).then(|| parse(raw))
}

fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn parse(raw: &[u8]) -> Result<Response, String> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or("the answer ends before its head does")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "the answer's head is not UTF-8".to_string())?;
    let status_line = head.lines().next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut body = raw[end + 4..].to_vec();
    if let Some(len) = header(head, "content-length").and_then(|l| l.parse::<usize>().ok()) {
        if body.len() < len {
            return Err(format!("the body is cut short ({} of {len} bytes)", body.len()));
        }
        body.truncate(len);
    } else if header(head, "transfer-encoding").is_some_and(|t| t.eq_ignore_ascii_case("chunked")) {
        body = dechunk(&body)?;
    }
    Ok(Response { status, body, date: header(head, "date").map(str::to_string) })
}

/// A chunked body's data; an error if it ends before its last chunk.
fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let line = rest.windows(2).position(|w| w == b"\r\n").ok_or("a chunked body is cut short")?;
        let size = std::str::from_utf8(&rest[..line]).unwrap_or("").split(';').next().unwrap_or("").trim();
        let n = usize::from_str_radix(size, 16).map_err(|_| format!("bad chunk size {size:?}"))?;
        rest = &rest[line + 2..];
        if n == 0 {
            return Ok(out);
        }
        if rest.len() < n + 2 {
            return Err("a chunked body is cut short".into());
        }
        out.extend_from_slice(&rest[..n]);
        rest = &rest[n + 2..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer is split at its blank line and cut to its Content-Length; a
    /// short one is an error, never a silently shorter body.
    #[test]
    fn parses_status_body_and_date() {
        let r = parse(b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\ndate: Sun, 22 Nov 2026 10:00:00 GMT\r\n\r\nokXX")
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (409, &b"ok"[..]));
        assert_eq!(r.date.as_deref(), Some("Sun, 22 Nov 2026 10:00:00 GMT"));
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nok").unwrap_err().contains("cut short"));
        assert!(parse(b"HTTP/1.1 200").unwrap_err().contains("ends before its head"));
        assert!(parse(b"HTTP/1.1 abc\r\n\r\n").unwrap_err().contains("bad status line"));
    }

    /// A chunked answer is de-chunked; one cut short is an error.
    #[test]
    fn dechunks_and_refuses_a_cut_chunked_body() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse(raw).unwrap().body, b"abcde");
        let cut = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nab";
        assert!(parse(cut).unwrap_err().contains("cut short"));
    }

    /// The request carries Host, Connection: close, its Content-Length and
    /// the extra headers, then the body.
    #[test]
    fn the_request_head_is_complete() {
        let addr: SocketAddr = "127.0.0.1:7071".parse().unwrap();
        let headers = [("Authorization", "Bearer t".to_string())];
        let req = Request { method: "POST", path: "/v1/auth", headers: &headers, body: b"{}" };
        let text = String::from_utf8(head(addr, &req)).unwrap();
        assert_eq!(
            text,
            "POST /v1/auth HTTP/1.1\r\nHost: 127.0.0.1:7071\r\nConnection: close\r\nContent-Length: 2\r\nAuthorization: Bearer t\r\n\r\n{}"
        );
    }

    /// Against a real socket: the answer is complete at its Content-Length
    /// even though the peer keeps the connection open; a listener that never
    /// answers runs into the timeout; a closed port is a connect error.
    #[tokio::test]
    async fn reads_to_the_content_length_and_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await.unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\npong").await.unwrap();
            let (_silent, _) = listener.accept().await.unwrap();
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let r = request(addr, None, Request::get("/ping"), Duration::from_secs(5)).await.unwrap();
        assert_eq!((r.status, r.text()), (200, "pong".to_string()));
        let err = request(addr, None, Request::get("/ping"), Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(err, HttpError::Timeout { .. }), "{err}");
        server.abort();
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap();
        let err = request(closed, None, Request::get("/"), Duration::from_secs(5)).await.unwrap_err();
        assert!(matches!(err, HttpError::Connect { .. }) && std::error::Error::source(&err).is_some(), "{err}");
    }
}
