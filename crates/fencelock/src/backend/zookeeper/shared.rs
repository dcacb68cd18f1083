//! Read-write locks and semaphores on ZooKeeper, Curator's recipes
//! (`InterProcessReadWriteLock`, `InterProcessSemaphoreV2`) written over the
//! lock's own queue and sessions.
//!
//! Where it sits: under [`super::ZkBackend`]. The read-write lock is the
//! exclusive lock's queue with readers in it; the names of its nodes and the
//! one rule of whom a node waits for (`queue_stem`, `blocker`, `holders`)
//! are part of the node layout, in `keys`, used by `ZkBackend::wait_turn` and
//! by `check`. The semaphore is [`ZkBackend::semaphore`], beside the queue
//! under the same lock node.
//!
//! # Read-write lock
//! A reader's node is named `lock-{nonce}-__READ__-{sequence}` (Curator's
//! `__READ__` mark); every other node of the queue, the exclusive lock's
//! included, is a writer. A writer is granted when it is first and waits for
//! the node just before it, as the exclusive lock does; a reader is granted
//! when no writer is before it and waits for the last writer before it. So
//! readers share, a writer is alone, and the order is strict FIFO across
//! modes: a queued writer blocks every later reader. Each node watches one
//! node only. The token is the own node's czxid, as for the exclusive lock: a
//! writer's node comes after every reader granted before it, so its token is
//! above theirs.
//!
//! # Semaphore
//! A semaphore of N permits named `name` keeps its permits as ephemeral
//! sequential nodes `lease-{nonce}-{weight}-{sequence}` under
//! `{lock node}/leases`, a container whose data is N (decimal). An acquire
//! first takes an internal lock, the exclusive recipe on `{lock node}/locks`
//! (so acquires are served in arrival order and none barges), then reads N
//! (another N is refused with [`Error::InvalidArgument`] naming both), creates
//! its lease node and waits, watching the leases' children, until the weights
//! of all lease nodes (its own included) are at most N; then it releases the
//! internal lock. A weight k is one node of weight k, so it is taken all at
//! once or not at all, and the acquires behind it wait on the internal lock.
//! The token is the lease node's czxid (the internal lock orders the creates,
//! so tokens increase in grant order). A permit is a node of its session: it
//! returns when the guard releases it or when the session ends.
//!
//! # Not guaranteed
//! * No downgrade: a node's mode is its name, and a new reader node would
//!   queue behind the waiting writers. [`crate::Guard::downgrade`] fails with
//!   [`Error::Unsupported`]; release and acquire shared instead.
//! * A name used as a semaphore and as a lock are two queues that do not
//!   exclude each other (the fencelock server refuses the second kind).
//! * N is kept while the `leases` container lives: the server deletes it some
//!   time after the last permit is gone (its container check interval), and
//!   the next acquire then sets N again.
//! * A try (zero wait) while another acquire holds the internal lock (waiting
//!   for permits, or about to take one) answers busy.

use std::sync::Arc;

use tokio::time::Instant;
use zookeeper_client as zk;

use super::keys::holders;
use super::{
    encode_holder, ensure_containers, fail, list_queue, request, Entry, Purpose, Session, Turn, ZkBackend, NODE_PREFIX,
};
use crate::backend::{Guard, Outcome};
use crate::error::Error;
use crate::types::LockOptions;

/// Name prefix of a semaphore's lease nodes.
const LEASE_PREFIX: &str = "lease-";
/// The container of a semaphore's lease nodes, under the lock node.
const LEASES: &str = "leases";
/// The container of a semaphore's internal lock, under the lock node.
const LOCKS: &str = "locks";

/// The weight of the lease node `child` (`lease-{nonce}-{weight}-{sequence}`);
/// `None` for any other name.
fn lease_weight(child: &str) -> Option<u32> {
    let mut parts = child.strip_prefix(LEASE_PREFIX)?.split('-');
    let (_nonce, weight, sequence) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || sequence.is_empty() || !sequence.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    weight.parse().ok()
}

/// The permits taken by the lease nodes among `children`.
fn used(children: &[String]) -> u64 {
    children.iter().filter_map(|c| lease_weight(c)).map(u64::from).sum()
}

impl ZkBackend {
    /// A permit of the semaphore `name` (see the module docs) on `session`.
    pub(super) async fn semaphore(
        &self,
        name: &str,
        opts: &LockOptions,
        session: Arc<Session>,
    ) -> Result<Outcome<Guard>, Error> {
        let wait_end = crate::clock::now() + opts.wait;
        let root = self.lock_path(name);
        let mut mutex = Entry::new(session.clone(), vec![root.clone(), format!("{root}/{LOCKS}")], (NODE_PREFIX, ""));
        let (mutex_path, _) = mutex.create(&self.base, &[], &[]).await?;
        match self.wait_turn(&mut mutex, &mutex_path, opts.wait, wait_end, Purpose::Lock).await? {
            Turn::Granted(_) => {}
            Turn::NotGranted(Outcome::Busy { waiters, .. }) => return Ok(busy(waiters)),
            Turn::NotGranted(outcome) => return Ok(outcome),
        }
        let got = self.take_permits(name, opts, &session, &root, wait_end).await;
        mutex.withdraw().await;
        got
    }

    /// Under the internal lock: checks N, creates the lease node and waits
    /// until its weight fits (until `wait_end`).
    async fn take_permits(
        &self,
        name: &str,
        opts: &LockOptions,
        session: &Arc<Session>,
        root: &str,
        wait_end: Instant,
    ) -> Result<Outcome<Guard>, Error> {
        let leases = format!("{root}/{LEASES}");
        let containers = vec![root.to_string(), leases.clone()];
        let permits = opts.permits.to_string();
        ensure_containers(session, &self.base, &containers, permits.as_bytes()).await?;
        check_permits(session, &leases, opts.permits).await?;
        let weight = format!("{}-", opts.weight);
        let mut lease = Entry::new(session.clone(), containers, (LEASE_PREFIX, &weight));
        let (path, czxid) = lease.create(&self.base, &encode_holder(opts), permits.as_bytes()).await?;
        let own = path.rsplit('/').next().unwrap_or_default().to_string();
        loop {
            let sent = crate::clock::now();
            let (children, watcher) = request(session.client.list_and_watch_children(&leases))
                .await
                .map_err(|e| fail("list the semaphore's leases", e))?;
            if !children.contains(&own) {
                let why = format!("lease node {path} vanished while waiting (session {:#x} expired?)", session.id);
                return Err(Error::backend("zk", why));
            }
            if used(&children) <= u64::from(opts.permits) {
                lease.disarm();
                return Ok(Outcome::Acquired(self.grant(name, opts, session.clone(), path, czxid, sent)));
            }
            if opts.wait.is_zero() {
                lease.withdraw().await;
                return Ok(busy(0));
            }
            tokio::select! {
                _ = watcher.changed() => {}
                _ = tokio::time::sleep_until(wait_end) => {
                    lease.withdraw().await;
                    return Ok(Outcome::TimedOut);
                }
            }
        }
    }

    /// The tokens of the grants that hold `name` now: the czxids of the
    /// queue's holders and of the semaphore's lease nodes.
    pub(super) async fn holder_tokens(&self, session: &Session, name: &str) -> Result<Vec<u64>, Error> {
        let parent = self.lock_path(name);
        let queue = list_queue(session, &parent).await?;
        let mut nodes: Vec<String> = holders(&queue).iter().map(|c| format!("{parent}/{c}")).collect();
        let leases = format!("{parent}/{LEASES}");
        match request(session.client.list_children(&leases)).await {
            Ok(children) => {
                nodes.extend(children.iter().filter(|c| lease_weight(c).is_some()).map(|c| format!("{leases}/{c}")))
            }
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(fail("list the semaphore's leases", e)),
        }
        let mut tokens = Vec::with_capacity(nodes.len());
        for node in nodes {
            let stat = request(session.client.check_stat(&node)).await.map_err(|e| fail("read a holder's node", e))?;
            tokens.extend(stat.and_then(|s| u64::try_from(s.czxid).ok()));
        }
        Ok(tokens)
    }
}

/// Refuses a semaphore of `permits` where `leases` keeps another N.
async fn check_permits(session: &Session, leases: &str, permits: u32) -> Result<(), Error> {
    let data = match request(session.client.get_data(leases)).await {
        Ok((data, _)) => data,
        // Gone since it was made: the lease's create makes it again with N.
        Err(zk::Error::NoNode) => return Ok(()),
        Err(e) => return Err(fail("read the semaphore's permits", e)),
    };
    match std::str::from_utf8(&data).ok().and_then(|s| s.parse::<u32>().ok()) {
        Some(has) if has != permits => Err(Error::InvalidArgument(format!(
            "permits mismatch: the semaphore has {has} permits, the acquire asked for {permits}"
        ))),
        _ => Ok(()),
    }
}

/// A semaphore's busy answer: no single holder to name.
fn busy(waiters: u32) -> Outcome<Guard> {
    Outcome::Busy { holder_lease: None, holder_token: None, reopens_in: None, waiters }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn lease_nodes_carry_their_weight() {
        assert_eq!(lease_weight("lease-0123abcd-3-0000000007"), Some(3));
        assert_eq!(lease_weight("lease-0123abcd-3-"), None);
        assert_eq!(lease_weight("lock-0123abcd-0000000007"), None);
        assert_eq!(used(&nodes(&["lease-a-2-01", "lease-b-1-02", "other"])), 3);
    }
}
