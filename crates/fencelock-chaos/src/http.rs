//! A minimal HTTP/1.1 client for the fenced storage server and the lock
//! server's admin port: one request per connection (`Connection: close`), so
//! a proxy that holds a connection holds exactly one request. An address
//! registered with [`use_tls`] (a lock server run with TLS and an auth file)
//! is spoken to over TLS, with its bearer token on every request.

use std::net::SocketAddr;
use std::time::Duration;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{anyhow, bail, Context};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// How an address registered with [`use_tls`] is reached.
#[derive(Clone)]
struct Tls {
    config: Arc<rustls::ClientConfig>,
    token: String,
}

fn tls_addrs() -> &'static Mutex<HashMap<SocketAddr, Tls>> {
    static ADDRS: OnceLock<Mutex<HashMap<SocketAddr, Tls>>> = OnceLock::new();
    ADDRS.get_or_init(Default::default)
}

/// From now on, requests to `addr` go over TLS (`config`) and carry
/// `Authorization: Bearer <token>`.
pub fn use_tls(addr: SocketAddr, config: Arc<rustls::ClientConfig>, token: String) {
    tls_addrs().lock().expect("tls registry").insert(addr, Tls { config, token });
}

/// A response: status, body, and the server's `Date` header (its wall clock).
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
    pub date: Option<String>,
}

impl Response {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request and reads the whole answer, within `timeout`.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
    timeout: Duration,
) -> anyhow::Result<Response> {
    tokio::time::timeout(timeout, exchange(addr, method, path, headers, body))
        .await
        .map_err(|_| anyhow!("{method} {path}: no answer within {} ms", timeout.as_millis()))?
}

async fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let s = TcpStream::connect(addr).await.with_context(|| format!("connect {addr}"))?;
    let _ = s.set_nodelay(true);
    let tls = tls_addrs().lock().expect("tls registry").get(&addr).cloned();
    let Some(tls) = tls else { return talk(s, addr, method, path, headers, body).await };
    let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
    let s = tokio_rustls::TlsConnector::from(tls.config)
        .connect(name, s)
        .await
        .with_context(|| format!("TLS to {addr}"))?;
    let mut headers = headers.to_vec();
    headers.push(("Authorization", format!("Bearer {}", tls.token)));
    talk(s, addr, method, path, &headers, body).await
}

async fn talk(
    mut s: impl AsyncRead + AsyncWrite + Unpin,
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> anyhow::Result<Response> {
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut msg = head.into_bytes();
    msg.extend_from_slice(body);
    s.write_all(&msg).await.context("send request")?;
    // Read until the answer is complete by its Content-Length, not to EOF: a
    // proxy in between may end the connection with a reset, which can discard
    // bytes not yet read.
    let mut raw = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(r) = complete(&raw) {
            return r;
        }
        let n = s.read(&mut buf).await.context("read answer")?;
        if n == 0 {
            return parse(&raw);
        }
        raw.extend_from_slice(&buf[..n]);
    }
}

/// The parsed answer once `raw` holds its head and its whole body.
fn complete(raw: &[u8]) -> Option<anyhow::Result<Response>> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let len = content_length(head)?;
    (raw.len() >= end + 4 + len).then(|| parse(raw))
}

fn content_length(head: &str) -> Option<usize> {
    header(head, "content-length")?.parse().ok()
}

fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn parse(raw: &[u8]) -> anyhow::Result<Response> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| anyhow!("truncated answer"))?;
    let head = std::str::from_utf8(&raw[..end]).context("answer head is not UTF-8")?;
    let status_line = head.lines().next().unwrap_or_default();
    let status: u16 = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("bad status line {status_line:?}"))?;
    let mut body = raw[end + 4..].to_vec();
    if let Some(len) = content_length(head) {
        if body.len() < len {
            bail!("answer body cut short ({} of {len} bytes)", body.len());
        }
        body.truncate(len);
    }
    Ok(Response { status, body, date: header(head, "date").map(str::to_string) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer is split at its blank line and cut to its Content-Length.
    #[test]
    fn parses_status_and_body() {
        let r = parse(b"HTTP/1.1 409 Conflict\r\ncontent-length: 2\r\ndate: Sun, 22 Nov 2026 10:00:00 GMT\r\n\r\nokXX")
            .unwrap();
        assert_eq!(r.status, 409);
        assert_eq!(r.body, b"ok");
        assert_eq!(r.date.as_deref(), Some("Sun, 22 Nov 2026 10:00:00 GMT"));
        assert!(parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nok").is_err());
        assert!(parse(b"HTTP/1.1 200").is_err());
    }
}
