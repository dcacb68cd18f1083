//! The held lock: the guard of a grant (its own node on a shared session),
//! its renewal (a stat read of the node, run by the watchdog of
//! [`KeptLease`]), its release and its new value.
//!
//! Where it sits: under [`super::recipe`] and [`super::shared`], which make
//! a guard for each grant.

use std::sync::{Arc, Weak};

use tokio::time::Instant;
use zookeeper_client as zk;

use super::entry::{delete_node, delete_with_retries};
use super::session::{fail, request, session_ended, Session};
use super::ZkBackend;
use crate::backend::election::encode_holder_parts;
use crate::backend::{BoxFuture, Guard, Held, KeptLease, LockBackend, Renew, Renewed};
use crate::error::Error;
use crate::types::LockOptions;

impl ZkBackend {
    /// The guard of a grant of `opts`: node `path` with `czxid`, confirmed by a
    /// request sent at `sent`.
    pub(super) fn grant(
        &self,
        name: &str,
        opts: &LockOptions,
        session: Arc<Session>,
        path: String,
        czxid: u64,
        sent: Instant,
    ) -> Guard {
        let renew = Arc::new(NodeCheck { session: Arc::downgrade(&session), path: path.clone() });
        let lease = Arc::new(KeptLease::start(session.id, session.timeout, sent, renew));
        session.register(&lease);
        let watch = lease.watch();
        let held = ZkHeld { session, path, identity: opts.identity.clone(), _lease: lease, pending: true };
        Guard::new(name.to_string(), Some(czxid), self.kind(), watch, Box::new(held))
    }
}

/// The held lock: the own node on a session, kept by a watchdog.
struct ZkHeld {
    session: Arc<Session>,
    path: String,
    /// The request's identity, stored again with each new value.
    identity: Option<String>,
    /// Renewed while this lives; the session's state watcher holds it weakly, to
    /// lose it when the session ends.
    _lease: Arc<KeptLease>,
    /// Whether the node may still be there: dropped so, the held lock
    /// deletes it in the background.
    pending: bool,
}

impl Drop for ZkHeld {
    fn drop(&mut self) {
        if !self.pending || !self.session.is_live() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (session, path) = (self.session.clone(), std::mem::take(&mut self.path));
            runtime.spawn(async move { delete_with_retries(&session, &path).await });
        }
    }
}

impl Held for ZkHeld {
    /// A delete whose outcome is unknown (the connection dropped), or that
    /// is not waited for to the end (the future dropped), is retried in the
    /// background by the drop of `self`; the error is answered. Left alone,
    /// the node would stay first in its queue for as long as the shared
    /// session lives, and a session that reconnects lives on (chaos K4 once
    /// saw every worker wait behind such a node after a restart of ZooKeeper).
    fn release(mut self: Box<Self>) -> BoxFuture<'static, Result<bool, Error>> {
        Box::pin(async move {
            let deleted = delete_node(&self.session, &self.path).await;
            self.pending = deleted.is_err();
            deleted
        })
    }

    fn release_in_background(self: Box<Self>) {
        // Dropped with its delete pending.
    }

    fn set_value(&self, value: Vec<u8>) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        let data = encode_holder_parts(self.identity.as_deref(), &value);
        Some(Box::pin(async move {
            match request(self.session.client.set_data(&self.path, &data, None)).await {
                Ok(_) => Ok(true),
                Err(zk::Error::NoNode) => Ok(false),
                Err(e) if session_ended(&e) => Ok(false),
                Err(e) => Err(fail("set the lock node's data", e)),
            }
        }))
    }

    /// A node's mode is in its name: see `zookeeper/shared.rs`.
    fn downgrade(&self) -> Option<BoxFuture<'_, Result<bool, Error>>> {
        Some(Box::pin(async {
            Err(Error::Unsupported(
                "zk cannot downgrade a writer (its mode is its node's name); release and acquire shared".into(),
            ))
        }))
    }
}

/// One renewal: read the own node's stat. Present and ours → confirmed for the
/// negotiated timeout; gone, or the session ended → `Renewed::Gone`.
struct NodeCheck {
    /// Weak: the guard keeps the session, not its watchdog.
    session: Weak<Session>,
    path: String,
}

impl Renew for NodeCheck {
    fn renew(&self, round_end: Instant) -> BoxFuture<'_, Result<Renewed, Error>> {
        Box::pin(async move {
            let Some(session) = self.session.upgrade() else {
                return Ok(Renewed::Gone);
            };
            let read = tokio::time::timeout_at(round_end, session.client.check_stat(&self.path)).await;
            match read {
                Err(_) => Err(Error::backend("zk", "renewal round timed out")),
                Ok(Ok(Some(stat))) if stat.ephemeral_owner as u64 == session.id => {
                    Ok(Renewed::Confirmed(Some(session.timeout)))
                }
                Ok(Ok(_)) => Ok(Renewed::Gone),
                Ok(Err(e)) if session_ended(&e) => Ok(Renewed::Gone),
                Ok(Err(e)) => Err(fail("renew", e)),
            }
        })
    }
}
