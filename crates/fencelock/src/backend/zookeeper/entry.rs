//! One request's node in a lock's queue ([`Entry`]): its create (with the
//! containers it needs), its withdrawal, and the drop guard that deletes it
//! in the background; and compare-and-delete of a node of ours.
//!
//! Where it sits: under [`super::recipe`] (a lock's or a reader's node) and
//! [`super::shared`] (a semaphore's lease node and its internal lock).

use std::sync::Arc;
use std::time::Duration;

use zookeeper_client as zk;

use super::keys::{base_node, lock_node, own_node};
use super::session::{fail, refused, request, session_ended, Session};
use crate::backoff::Backoff;
use crate::error::Error;

/// One acquire's place in a lock's queue, and its drop guard: dropped while it
/// still owns (or may own) a node, it deletes that node in the background.
pub(super) struct Entry {
    pub(super) session: Arc<Session>,
    /// The containers the node lives in, outermost first, created on demand.
    pub(super) containers: Vec<String>,
    /// The lock's parent node (the last of `containers`).
    pub(super) parent: String,
    /// `lock-{nonce}-`: the own node's name before its sequence number.
    pub(super) stem: String,
    own: Own,
}

/// What an [`Entry`] owns on the server.
#[derive(Debug, Default)]
enum Own {
    #[default]
    Nothing,
    /// A create was sent and not answered (yet, or its answer was lost): a node
    /// with the stem may exist.
    Unknown,
    /// This node.
    Node(String),
}

impl Entry {
    /// An entry under the last of `containers`, named `{prefix}{nonce}-{mark}`
    /// (`stem` is `(prefix, mark)`).
    pub(super) fn new(session: Arc<Session>, containers: Vec<String>, stem: (&str, &str)) -> Entry {
        let parent = containers.last().cloned().unwrap_or_default();
        let stem = format!("{}{:016x}-{}", stem.0, crate::unique::u64(), stem.1);
        Entry { session, containers, parent, stem, own: Own::Nothing }
    }

    /// Creates the own node with `data` (and the containers if missing, the
    /// parent with `parent_data`): its path and czxid.
    pub(super) async fn create(&mut self, base: &str, data: &[u8], parent_data: &[u8]) -> Result<(String, u64), Error> {
        let prefix = format!("{}/{}", self.parent, self.stem);
        // The parent may be missing, or deleted as an empty container between our
        // creating it and our node: a few tries.
        for _ in 0..3 {
            self.own = Own::Unknown;
            match request(self.session.client.create(&prefix, data, &own_node(&self.session.login))).await {
                Ok((stat, sequence)) => {
                    let path = format!("{prefix}{sequence}");
                    self.own = Own::Node(path.clone());
                    return match u64::try_from(stat.czxid) {
                        Ok(czxid) if czxid > 0 => Ok((path, czxid)),
                        _ => Err(Error::backend("zk", format!("create answered czxid {}", stat.czxid))),
                    };
                }
                Err(zk::Error::NoNode) => {
                    self.own = Own::Nothing;
                    ensure_containers(&self.session, base, &self.containers, parent_data).await?;
                }
                Err(e) => {
                    if refused(&e) || session_ended(&e) {
                        self.own = Own::Nothing;
                    }
                    return Err(fail("create the lock node", e));
                }
            }
        }
        Err(Error::backend("zk", format!("the lock node {} keeps disappearing", self.parent)))
    }

    /// The caller owns the node now: dropping the entry leaves it.
    pub(super) fn disarm(&mut self) {
        self.own = Own::Nothing;
    }

    /// Deletes the own node now (one try, for at most a session timeout); if that
    /// fails, dropping the entry retries in the background.
    pub(super) async fn withdraw(&mut self) {
        if let Own::Node(path) = &self.own {
            let deleted = tokio::time::timeout(self.session.timeout, delete_node(&self.session, path)).await;
            if matches!(deleted, Ok(Ok(_))) {
                self.own = Own::Nothing;
            }
        }
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        let own = std::mem::take(&mut self.own);
        if matches!(own, Own::Nothing) {
            return;
        }
        // Without a runtime the node lives until its session closes, which
        // happens when the session's last user goes.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (session, parent, stem) = (self.session.clone(), self.parent.clone(), self.stem.clone());
            runtime.spawn(async move { remove(&session, &parent, &stem, own).await });
        }
    }
}

/// Deletes what an entry owns: its node, or any node with its stem if the create's
/// answer was lost. Retries on connection trouble until twice the session timeout;
/// gives up after (the node then goes with the session). A lost create's answer
/// marks the session as orphaning in any case: the server may apply the create
/// after the look for its node.
async fn remove(session: &Session, parent: &str, stem: &str, own: Own) {
    let path = match own {
        Own::Nothing => return,
        Own::Node(path) => path,
        Own::Unknown => {
            session.orphan();
            match find_by_stem(session, parent, stem).await {
                Some(path) => path,
                None => return,
            }
        }
    };
    delete_with_retries(session, &path).await;
}

/// The node under `parent` whose name starts with `stem`, if any (read errors: none).
async fn find_by_stem(session: &Session, parent: &str, stem: &str) -> Option<String> {
    let children = request(session.client.list_children(parent)).await.ok()?;
    children.into_iter().find(|c| c.starts_with(stem)).map(|c| format!("{parent}/{c}"))
}

/// [`delete_node`] until it answers, for at most twice the session timeout;
/// if it never does, the session is marked as orphaning the node (no new
/// acquire uses it, so it ends, and the node with it, once its users go).
pub(super) async fn delete_with_retries(session: &Session, path: &str) {
    let end = crate::clock::now() + (2 * session.timeout).max(Duration::from_secs(2));
    let backoff = Backoff::default();
    for attempt in 0.. {
        match delete_node(session, path).await {
            Ok(_) => return,
            Err(e) if crate::clock::now() >= end => {
                tracing::debug!(path, error = %e, "fencelock: zk node not deleted; it goes with its session");
                session.orphan();
                return;
            }
            Err(_) => tokio::time::sleep(backoff.delay(attempt, fastrand::f64())).await,
        }
    }
}

/// Compare-and-delete of a node of ours (by its path, which no other request
/// has; at any version, as a new value changes it): deleted → `true`; gone
/// (or its session ended, which deletes it) → `false`; [`Error::Backend`]
/// when the outcome is unknown.
pub(super) async fn delete_node(session: &Session, path: &str) -> Result<bool, Error> {
    match request(session.client.delete(path, None)).await {
        Ok(()) => Ok(true),
        Err(zk::Error::NoNode | zk::Error::BadVersion) => Ok(false),
        Err(e) if session_ended(&e) => Ok(false),
        Err(e) => Err(fail("delete the lock node", e)),
    }
}

/// Creates the containers `paths` (outermost first; the last with `data`)
/// where missing, and the base path if it is missing too.
pub(super) async fn ensure_containers(
    session: &Session,
    base: &str,
    paths: &[String],
    data: &[u8],
) -> Result<(), Error> {
    let client = &session.client;
    let (lock, base_options) = (lock_node(&session.login), base_node(&session.login));
    for _ in 0..3 {
        let mut missing = false;
        for (i, path) in paths.iter().enumerate() {
            let data = if i + 1 == paths.len() { data } else { &[] };
            match request(client.create(path, data, &lock)).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(zk::Error::NoNode) => {
                    missing = true;
                    break;
                }
                Err(e) => return Err(fail("create the lock's parent node", e)),
            }
        }
        if !missing {
            return Ok(());
        }
        request(client.mkdir(base, &base_options)).await.map_err(|e| fail("create the base path", e))?;
    }
    Err(Error::backend("zk", format!("the lock's parent nodes {paths:?} keep disappearing")))
}
