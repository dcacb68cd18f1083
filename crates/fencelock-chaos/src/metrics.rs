//! Fetching the lock server's Prometheus text (`/metrics` on its admin port):
//! what the nemesis and the checks of P1 and S4 count with, reading values
//! with [`fencelock_http::prometheus::value`].

use std::time::Duration;

use crate::http;

/// The admin port's `/metrics` text, or `None` if it does not answer.
pub async fn metrics_text(admin: std::net::SocketAddr) -> Option<String> {
    http::request(admin, "GET", "/metrics", &[], b"", Duration::from_secs(5)).await.ok().map(|r| r.text())
}
