//! A native server's admin endpoint (`/healthz`, `/metrics`) as the bench
//! reads it: one GET, and the wait until the server is ready.
//!
//! Where it sits: below the engines ([`crate::engines`]) and the native
//! workloads ([`crate::scale`], [`crate::durability`]), which all ask it;
//! it asks none of them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// `GET path`: status and body, within 10 s.
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    http_get_within(addr, path, Duration::from_secs(10)).await
}

/// `GET path`: status and body, within `limit`.
pub async fn http_get_within(addr: &str, path: &str, limit: Duration) -> anyhow::Result<(u16, String)> {
    use fencelock_http::{Client, Request};
    let sock: SocketAddr = addr.parse().with_context(|| format!("{addr:?} is not an IP address and port"))?;
    let answer = Client::new(sock).timeout(limit).send(Request::get(path)).await?;
    Ok((answer.status, answer.text()))
}

/// Waits until the server's `/healthz` says it leads and serves.
pub async fn wait_ready(http_addr: &str, limit: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + limit;
    loop {
        let last = match http_get(http_addr, "/healthz").await {
            Ok((200, _)) => return Ok(()),
            Ok((status, body)) => format!("{status} {body}"),
            Err(e) => format!("{e:#}"),
        };
        if Instant::now() > end {
            bail!("the server at {http_addr} is not ready after {limit:?}: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
