//! Requests to the fenced storage server and the lock server's admin port,
//! through the workspace's one HTTP client ([`fencelock_http::Client`]:
//! one request per connection, so a proxy that holds a connection holds
//! exactly one request). An address registered with [`use_tls`] (a lock
//! server run with TLS and an auth file) is spoken to over TLS, with its
//! bearer token on every request.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

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

pub use fencelock_http::Response;
use fencelock_http::{Client, Request};

/// Sends one request and reads the whole answer, within `timeout`; over TLS
/// with the bearer token for an address registered with [`use_tls`].
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
    timeout: Duration,
) -> anyhow::Result<Response> {
    let tls = tls_addrs().lock().expect("tls registry").get(&addr).cloned();
    let mut client = Client::new(addr).timeout(timeout);
    if let Some(tls) = tls {
        client = client.tls(Some(tls.config)).bearer(&tls.token)?;
    }
    Ok(client.send(Request { method, path, headers, body }).await?)
}
