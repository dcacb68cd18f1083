//! The fencelock server's HTTP/JSON API as a backend
//! (`fencelock+json://host:7071`, `fencelock+json+tls://host:7071?ca=…&token=…`):
//! the recipe an HTTP client in any language runs (`docs/http-api.md`), in
//! Rust, so that the conformance suite, the chaos suite and the benchmark
//! judge it as they judge every other backend.
//!
//! Where it sits: [`super::connect`] calls [`JsonBackend::connect`] for the
//! `fencelock+json` schemes; `conn` holds the HTTP connections.
//!
//! # The recipe
//! * Acquire: one `POST /v1/locks/{name}/acquire` with `ttl_ms` (a lease the
//!   call grants, which the server keeps alive while the request waits and
//!   renews at the grant) and `wait_ms` (a long-poll in the lock's FIFO queue).
//!   The lease is confirmed from the send time plus the `waited_ms` the server
//!   reports: the server renewed it no earlier than that.
//! * Renewal: `POST /v1/leases/{id}/keepalive` every TTL/3 (the watchdog every backend has);
//!   404 is a lost lease.
//! * Release: `DELETE /v1/leases/{id}`: the lease was made for this grant
//!   alone, so ending it releases the grant (and nothing else) in one call;
//!   404 means it was gone already.
//! * New value, downgrade, completed slot: `PUT …/value`, `POST …/downgrade`,
//!   `POST …/complete` with the lease and token (409 `not_holder`: not held).
//! * Check: `GET /v1/locks/{name}/check?token=`.
//!
//! # Guarantees and limits
//! The server's, as the native client has them (global durable tokens, FIFO,
//! push hand-off, server-side TTL), with one host: a follower answers 503
//! `not_leader` ([`Error::Unavailable`]) and this backend does not move to the
//! leader. No elections or multi-locks here (the native client has them).

mod conn;

use std::sync::{Arc, Weak};
use std::time::Duration;

use fencelock_core::b64;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{
    BackendUrl, BoxFuture, Capabilities, Fencing, Guard, Held, KeptLease, LockBackend, Outcome, Renew, Renewed,
};
use crate::backend::tls::{client_config, TlsFiles, Verify};
use crate::error::Error;
use crate::types::{CheckResult, LockMode, LockOptions};
use conn::{id, refusal, Conn};

/// The backend's name in guards and errors.
const KIND: &str = "fencelock-json";
/// Bound of a call that does not wait.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Locks through a fencelock node's HTTP API. See the [module docs](self).
pub struct JsonBackend {
    conn: Arc<Conn>,
}

impl std::fmt::Debug for JsonBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonBackend").field("addr", &self.conn.addr()).finish_non_exhaustive()
    }
}

impl JsonBackend {
    /// Connects to the one host of `url` and checks that it serves the API
    /// (`GET /v1/openapi.json`). [`Error::InvalidArgument`] for several hosts,
    /// [`Error::Connect`] if it does not answer.
    pub async fn connect(url: &BackendUrl) -> Result<Self, Error> {
        let [(host, port)] = url.hosts.as_slice() else {
            return Err(Error::InvalidArgument(format!("{url}: the fencelock+json backend takes one host")));
        };
        let tls = match TlsFiles::from_url(url)? {
            Some(files) => Some(Arc::new(client_config(&files, Verify::Full)?)),
            None => None,
        };
        let conn = Conn::new(host.clone(), *port, tls, url.auth_token())?;
        match conn.call("GET", "/v1/openapi.json", None, CALL_TIMEOUT).await {
            Ok((200, _)) => Ok(JsonBackend { conn: Arc::new(conn) }),
            Ok((status, v)) => Err(Error::connect(format!("{url}: GET /v1/openapi.json answered {status}: {v}"))),
            Err(Error::Security { message, source }) => Err(Error::Security { message, source }),
            Err(e) => Err(Error::connect_caused(format!("{url}: the HTTP API does not answer"), e)),
        }
    }

    fn path(name: &str, op: &str) -> String {
        format!("/v1/locks/{}/{op}", encode(name))
    }
}

/// `name` as one path segment: every byte but `[A-Za-z0-9._~-]` percent-encoded.
fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl LockBackend for JsonBackend {
    fn kind(&self) -> &'static str {
        KIND
    }

    /// The server's guarantees (see the module docs); one host, so no
    /// fail-over; no elections or multi-locks through this backend.
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fencing: Fencing::Global,
            durable_tokens: true,
            fifo: true,
            push_wakeup: true,
            server_ttl: true,
            survives_failover: false,
            lock_delay: true,
            holder_identity: true,
            election: false,
            shared: true,
            semaphores: true,
            hold_at_least: true,
            once_per: true,
            multi_lock: false,
            min_ttl: Duration::from_millis(fencelock_core::MIN_TTL_MS),
        }
    }

    fn acquire<'a>(&'a self, name: &'a str, opts: &'a LockOptions) -> BoxFuture<'a, Result<Outcome<Guard>, Error>> {
        Box::pin(self.acquire_one(name, opts))
    }

    fn check<'a>(&'a self, name: &'a str, token: u64) -> BoxFuture<'a, Result<CheckResult, Error>> {
        Box::pin(async move {
            let path = format!("{}?token={token}", Self::path(name, "check"));
            match self.conn.call("GET", &path, None, CALL_TIMEOUT).await? {
                (200, v) => Ok(CheckResult {
                    current: v["current"].as_bool().unwrap_or(false),
                    current_token: id(&v["current_token"]),
                }),
                (status, v) => Err(refusal(status, &v)),
            }
        })
    }
}

impl JsonBackend {
    async fn acquire_one(&self, name: &str, opts: &LockOptions) -> Result<Outcome<Guard>, Error> {
        let body = json!({
            "ttl_ms": opts.ttl.as_millis() as u64,
            "wait_ms": opts.wait.as_millis() as u64,
            "lock_delay_ms": opts.lock_delay.as_millis() as u64,
            "identity": opts.identity.clone().unwrap_or_default(),
            "value_base64": b64::encode(&opts.value),
            "mode": match opts.mode {
                LockMode::Shared => "shared",
                _ => "exclusive",
            },
            "permits": opts.permits,
            "weight": opts.weight,
            "hold_at_least_ms": opts.hold_at_least.as_millis() as u64,
            "once_per": opts.once_per,
        });
        let sent = crate::clock::now();
        let (status, v) =
            self.conn.call("POST", &Self::path(name, "acquire"), Some(&body), opts.wait + CALL_TIMEOUT).await?;
        match (status, v["error"]["code"].as_str()) {
            (200, _) => self.grant(name, opts, &v, sent),
            (409, Some("busy")) => Ok(Outcome::Busy {
                holder_lease: id(&v["error"]["holder"]["lease_id"]),
                holder_token: id(&v["error"]["holder"]["token"]),
                reopens_in: v["error"]["reopens_in_ms"].as_u64().map(Duration::from_millis),
                waiters: v["error"]["waiters"].as_u64().and_then(|w| u32::try_from(w).ok()).unwrap_or(0),
            }),
            (409, Some("timed_out")) => Ok(Outcome::TimedOut),
            _ => Err(refusal(status, &v)),
        }
    }

    /// The guard of the grant `v` (the acquire's answer), sent at `sent`.
    fn grant(&self, name: &str, opts: &LockOptions, v: &Value, sent: Instant) -> Result<Outcome<Guard>, Error> {
        let missing = |f: &str| Error::Protocol(format!("the acquire's answer has no {f}: {v}"));
        let lease = id(&v["lease_id"]).ok_or_else(|| missing("lease_id"))?;
        let token = id(&v["token"]).ok_or_else(|| missing("token"))?;
        let ttl = v["ttl_ms"].as_u64().map_or(opts.ttl, Duration::from_millis);
        // The server renewed the lease at the grant, no earlier than the
        // request's wait after its arrival.
        let confirmed = sent + Duration::from_millis(v["waited_ms"].as_u64().unwrap_or(0));
        let renew = Arc::new(KeepAlive { conn: Arc::downgrade(&self.conn), lease });
        let kept = Arc::new(KeptLease::start(lease, ttl, confirmed, renew));
        let watch = kept.watch();
        let held = JsonHeld { conn: self.conn.clone(), name: name.to_string(), lease, token, _kept: kept };
        Ok(Outcome::Acquired(Guard::new(name.to_string(), Some(token), KIND, watch, Box::new(held))))
    }
}

/// One renewal: a keep-alive of the lease.
struct KeepAlive {
    conn: Weak<Conn>,
    lease: u64,
}

impl Renew for KeepAlive {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let Some(conn) = self.conn.upgrade() else { return Ok(Renewed::Gone) };
            let timeout = round_end.saturating_duration_since(crate::clock::now());
            let path = format!("/v1/leases/{}/keepalive", self.lease);
            match conn.call("POST", &path, None, timeout).await? {
                (200, v) => Ok(Renewed::Confirmed(v["ttl_ms"].as_u64().map(Duration::from_millis))),
                (404, _) => Ok(Renewed::Gone),
                (status, v) => Err(refusal(status, &v)),
            }
        })
    }
}

/// A grant: its lease (made for it alone) and token.
struct JsonHeld {
    conn: Arc<Conn>,
    name: String,
    lease: u64,
    token: u64,
    /// Renewed while this lives.
    _kept: Arc<KeptLease>,
}

impl JsonHeld {
    /// Ends the lease, which releases the grant: `Ok(false)` if it was gone.
    async fn end(conn: &Conn, lease: u64) -> Result<bool, Error> {
        match conn.call("DELETE", &format!("/v1/leases/{lease}"), None, CALL_TIMEOUT).await? {
            (200, _) => Ok(true),
            (404, _) => Ok(false),
            (status, v) => Err(refusal(status, &v)),
        }
    }

    /// `POST`/`PUT` of `op` with the grant (and `extra`): `Ok(false)` on 409
    /// `not_holder`.
    fn on_grant(&self, method: &'static str, op: &'static str, extra: Value) -> BoxFuture<'_, Result<bool, Error>> {
        Box::pin(async move {
            let mut body = json!({ "lease_id": self.lease.to_string(), "token": self.token.to_string() });
            if let (Some(b), Value::Object(extra)) = (body.as_object_mut(), extra) {
                b.extend(extra);
            }
            match self.conn.call(method, &JsonBackend::path(&self.name, op), Some(&body), CALL_TIMEOUT).await? {
                (200, _) => Ok(true),
                (409, v) if v["error"]["code"] == "not_holder" => Ok(false),
                (status, v) => Err(refusal(status, &v)),
            }
        })
    }
}

impl Held for JsonHeld {
    fn release(self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move { JsonHeld::end(&self.conn, self.lease).await })
    }

    fn release_in_background(self: Box<Self>) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(e) = JsonHeld::end(&self.conn, self.lease).await {
                    tracing::debug!(lease = self.lease, error = %e, "fencelock-json: release failed; the lease expires");
                }
            });
        }
    }

    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(self.on_grant("PUT", "value", json!({ "value_base64": b64::encode(&value) })))
    }

    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(self.on_grant("POST", "downgrade", json!({})))
    }

    fn complete_slot(&self, slot: String, exit_code: i32) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(self.on_grant("POST", "complete", json!({ "slot": slot, "exit_code": exit_code })))
    }
}

#[cfg(test)]
mod tests {
    use super::encode;

    /// A name is one path segment whatever its bytes.
    #[test]
    fn names_are_one_path_segment() {
        assert_eq!(encode("jobs/nightly"), "jobs%2Fnightly");
        assert_eq!(encode("a b?c#d%"), "a%20b%3Fc%23d%25");
        assert_eq!(encode("plain-name_1.x~"), "plain-name_1.x~");
        assert_eq!(encode("é"), "%C3%A9");
    }
}
