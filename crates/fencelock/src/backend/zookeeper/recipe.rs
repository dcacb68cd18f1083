//! The recipe (see the [module docs](super)): queue an ephemeral sequential
//! node, hold when first in line, otherwise watch the predecessor only and
//! look again; and `check`, which reads the holders' czxids.
//!
//! Where it sits: under [`super::ZkBackend`]'s acquire and campaign; a
//! request's node is an [`Entry`], a grant's guard is made in [`super::held`],
//! semaphores are in [`super::shared`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client as zk;

use super::entry::Entry;
use super::keys::{blocker, queue_order, queue_stem};
use super::session::{ended, fail, request, Session};
use super::ZkBackend;
use crate::backend::election::encode_holder;
use crate::backend::{check_name, Guard, LockBackend, Outcome};
use crate::error::Error;
use crate::types::{CheckResult, LockMode, LockOptions};

impl ZkBackend {
    /// The recipe (see the module docs), for a lock or a campaign (`purpose`).
    pub(super) async fn lock(&self, name: &str, opts: &LockOptions, purpose: Purpose) -> Result<Outcome<Guard>, Error> {
        self.capabilities().admit(self.kind(), name, opts)?;
        if purpose == Purpose::Campaign && (opts.permits > 0 || opts.mode == LockMode::Shared) {
            return Err(Error::InvalidArgument("a campaign is exclusive: no shared mode, no permits".into()));
        }
        let session = self.session(opts.ttl).await?;
        if opts.permits > 0 {
            return self.semaphore(name, opts, session).await;
        }
        let queued = self.queue(name, opts, session.clone(), purpose);
        let result = match purpose {
            Purpose::Lock => queued.await,
            Purpose::Campaign => tokio::select! {
                biased;
                () = ended(&session) => Err(purpose.lost(format!("session {:#x} ended while waiting", session.id))),
                result = queued => result,
            },
        };
        match result {
            Err(e) if purpose == Purpose::Campaign && !session.is_live() => {
                Err(purpose.lost(format!("session {:#x} ended while waiting: {e}", session.id)))
            }
            other => other,
        }
    }

    /// Steps 1 to 3 of the recipe on `session`.
    async fn queue(
        &self,
        name: &str,
        opts: &LockOptions,
        session: Arc<Session>,
        purpose: Purpose,
    ) -> Result<Outcome<Guard>, Error> {
        let wait_end = crate::clock::now() + opts.wait;
        let stem = queue_stem(opts.mode == LockMode::Shared);
        let mut entry = Entry::new(session.clone(), vec![self.lock_path(name)], stem);
        let (path, czxid) = entry.create(&self.base, &encode_holder(opts), &[]).await?;
        match self.wait_turn(&mut entry, &path, opts.wait, wait_end, purpose).await? {
            Turn::Granted(sent) => {
                entry.disarm();
                Ok(Outcome::Acquired(self.grant(name, opts, session, path, czxid, sent)))
            }
            Turn::NotGranted(outcome) => Ok(outcome),
        }
    }

    /// Steps 2 and 3 for the node `path` of `entry`: granted (with the time the
    /// confirming read was sent), or busy or timed out (the node withdrawn).
    pub(super) async fn wait_turn(
        &self,
        entry: &mut Entry,
        path: &str,
        wait: Duration,
        wait_end: Instant,
        purpose: Purpose,
    ) -> Result<Turn, Error> {
        let session = entry.session.clone();
        let own = path.rsplit('/').next().unwrap_or_default().to_string();
        loop {
            let sent = crate::clock::now();
            let queue = list_queue(&session, &entry.parent).await?;
            let Some(pos) = queue.iter().position(|child| *child == own) else {
                return Err(purpose
                    .lost(format!("lock node {path} vanished while queued (session {:#x} expired?)", session.id)));
            };
            let Some(ahead) = blocker(&queue, pos) else {
                return Ok(Turn::Granted(sent));
            };
            if wait.is_zero() {
                let busy = busy(&session, &entry.parent, &queue).await;
                entry.withdraw().await;
                return Ok(Turn::NotGranted(busy));
            }
            let predecessor = format!("{}/{}", entry.parent, queue[ahead]);
            if !wait_for_deletion(&session, &predecessor, wait_end).await? {
                entry.withdraw().await;
                return Ok(Turn::NotGranted(Outcome::TimedOut));
            }
        }
    }

    /// Reads who holds `name` (the queue's holders, the semaphore's lease
    /// nodes), and whether `token` is one of their czxids.
    pub(super) async fn check_token(&self, name: &str, token: u64) -> Result<CheckResult, Error> {
        check_name(name)?;
        let session = self.any_session().await?;
        let tokens = self.holder_tokens(&session, name).await?;
        let current = tokens.contains(&token);
        let current_token = if current { Some(token) } else { tokens.into_iter().max() };
        Ok(CheckResult { current, current_token })
    }
}

/// Where a queued node's wait ended.
pub(super) enum Turn {
    /// First in line for its mode; the confirming read was sent at this instant.
    Granted(Instant),
    /// Busy or timed out; the node is withdrawn.
    NotGranted(Outcome<Guard>),
}

/// What a request is for, which decides what losing its place means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Purpose {
    /// A lock: the acquire fails ([`Error::Backend`]).
    Lock,
    /// A campaign: a candidate whose session ended is told so
    /// ([`Error::LeaseNotFound`]), as every backend's campaign does.
    Campaign,
}

impl Purpose {
    /// The error of a request that lost its session or node while waiting.
    pub(super) fn lost(self, why: String) -> Error {
        match self {
            Purpose::Lock => Error::backend("zk", why),
            Purpose::Campaign => Error::LeaseNotFound(format!("zk: {why}")),
        }
    }
}

/// The contender nodes under `parent`, first in line first (an absent parent has
/// none).
pub(super) async fn list_queue(session: &Session, parent: &str) -> Result<Vec<String>, Error> {
    match request(session.client.list_children(parent)).await {
        Ok(children) => Ok(queue_order(children)),
        Err(zk::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(fail("list the lock's queue", e)),
    }
}

/// [`Outcome::Busy`] for a queue whose first node is the holder: its session and
/// czxid if it can still be read, and the others but us as waiters.
async fn busy(session: &Session, parent: &str, queue: &[String]) -> Outcome<Guard> {
    let holder = match queue.first() {
        Some(first) => request(session.client.check_stat(&format!("{parent}/{first}"))).await.ok().flatten(),
        None => None,
    };
    Outcome::Busy {
        holder_lease: holder.map(|s| s.ephemeral_owner as u64),
        holder_token: holder.and_then(|s| u64::try_from(s.czxid).ok()),
        reopens_in: None,
        waiters: u32::try_from(queue.len().saturating_sub(2)).unwrap_or(u32::MAX),
    }
}

/// Waits until node `path` is deleted (`true`, also when it is gone already or
/// the watch ends for another reason: the caller re-reads the queue) or until
/// `until` (`false`).
async fn wait_for_deletion(session: &Session, path: &str, until: Instant) -> Result<bool, Error> {
    let (stat, watcher) =
        request(session.client.check_and_watch_stat(path)).await.map_err(|e| fail("watch the predecessor", e))?;
    if stat.is_none() {
        return Ok(true);
    }
    tokio::select! {
        _ = watcher.changed() => Ok(true),
        _ = tokio::time::sleep_until(until) => Ok(false),
    }
}
