//! Reading the lock server's Prometheus text (`/metrics` on its admin port):
//! what the nemesis and the checks of P1 and S4 count with.

use std::time::Duration;

use crate::http;

/// The admin port's `/metrics` text, or `None` if it does not answer.
pub async fn metrics_text(admin: std::net::SocketAddr) -> Option<String> {
    http::request(admin, "GET", "/metrics", &[], b"", Duration::from_secs(5)).await.ok().map(|r| r.text())
}

/// The value of the counter `name` in the metrics `text`.
pub fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
}
