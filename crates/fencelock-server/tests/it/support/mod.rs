//! What the server's integration tests share: the raw gRPC client (with a
//! bearer token, too), request ids, a server started in this process on a temp
//! dir, and leases.
#![allow(dead_code)] // each test file uses its own part

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use fencelock_proto::v1::{self as pb, lock_client::LockClient};
use fencelock_server::{Config, Running};
use tonic::transport::Channel;

pub type Client = LockClient<Channel>;

/// A client whose calls carry a bearer token.
pub type Authed = LockClient<tonic::service::interceptor::InterceptedService<Channel, Bearer>>;

/// Puts `authorization: Bearer <token>` on every call, when it has a token.
#[derive(Clone)]
pub struct Bearer(pub Option<String>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = &self.0 {
            r.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        Ok(r)
    }
}

/// Appends a new token for `name` with `role` to the auth file text `text`;
/// the token.
pub fn add_token(text: &mut String, name: &str, role: &str) -> String {
    let t = fencelock_server::auth::new_token().unwrap();
    text.push_str(&format!(
        "\n[[tokens]]\nname = \"{name}\"\nid = \"{}\"\nhash = \"{}\"\nroles = [\"{role}\"]\n",
        t.id, t.hash
    ));
    t.token
}

pub fn request_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Start a server on `dir`. Right after an in-process shutdown the database may
/// still be held for a moment (openraft drops its storage from its own tasks), so
/// "already in use" is retried for a while.
pub async fn start(dir: &Path) -> (Running, Client) {
    start_config(&Config::for_test(dir.join("data"))).await
}

/// [`start`] with `config`.
pub async fn start_config(config: &Config) -> (Running, Client) {
    let running = try_start_config(config).await.unwrap_or_else(|e| panic!("server start: {e:?}"));
    let client = LockClient::connect(format!("http://{}", running.grpc_addr)).await.expect("connect");
    (running, client)
}

/// Starts a server on `config`, retrying "already in use" for a while (see
/// [`start`]); any other refusal is returned.
pub async fn try_start_config(config: &Config) -> Result<Running, fencelock_server::ServerError> {
    for _ in 0..100 {
        match fencelock_server::start(config.clone()).await {
            Err(e) if still_held(&e) => {}
            other => return other,
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fencelock_server::start(config.clone()).await
}

/// The test config on `dir/data` with the Raft log in `log`, snapshotting
/// every 100 entries (so that restarts replay a snapshot and a log).
pub fn on_log(dir: &Path, log: fencelock_server::LogEngine) -> Config {
    let mut c = Config::for_test(dir.join("data"));
    c.log = log;
    c.snapshot_every = 100;
    c
}

/// `e` and its sources, one after the other.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        out = format!("{out}: {s}");
        next = s.source();
    }
    out
}

/// A new lease, retried while the node is not serving yet (leader election and
/// `LeaderStart` after a start).
pub async fn lease(c: &mut Client, ttl_ms: u64) -> u64 {
    for _ in 0..200 {
        let req = pb::GrantLeaseRequest { request_id: request_id(), ttl_ms };
        if let Ok(r) = c.grant_lease(req).await {
            return r.into_inner().lease_id;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("no lease: the server did not become ready");
}

/// Whether the database of a start that failed is still held (by the server
/// just shut down in this process): said by the error or one of its sources.
fn still_held(e: &fencelock_server::ServerError) -> bool {
    let mut next: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = next {
        if err.to_string().contains("already in use") {
            return true;
        }
        next = err.source();
    }
    false
}

/// The node's last log index, as of now: openraft publishes its metrics at
/// the top of each turn of its core's loop, so a reply that came back (after
/// its entry was applied) may be seen before the metrics show its entry. One
/// round trip through the core first: the metrics are then published as of
/// every turn before it.
#[allow(dead_code)] // not every test binary that includes this module reads it
pub async fn last_log_index(running: &Running) -> Option<u64> {
    running.raft.with_raft_state(|_| ()).await.expect("the Raft core runs");
    running.raft.metrics().borrow().last_log_index
}
