//! Leader election on ZooKeeper, Curator's LeaderSelector way: a campaign is
//! the lock recipe (the candidate's node carries its identity and value as
//! its data), the leader is the lock's first node, and its term is that
//! node's czxid, the grant's token.
//!
//! Where it sits: under [`super::ZkBackend`]'s `leader` and `observe`; the
//! campaign is `ZkBackend::lock` for `Purpose::Campaign`, and the
//! rule that terms never go back is [`crate::backend::election`]'s.
//!
//! Observing: each observer has a session of its own. It lists the lock's
//! nodes with a children watch (an exists watch on the lock's node while it
//! does not exist), reads the first node's data with a data watch (a
//! `proclaim` is a setData on that node), shows it, and on the first fire of
//! either watch does it again. ZooKeeper's watches fire once, so a leader that
//! came and went between a fire and the next read is not shown (the term
//! that ended still is), and of values a leader set faster than the observer
//! reads, only the last is shown; a new session replaces one that ended.

use std::sync::Arc;

use zookeeper_client as zk;

use super::{fail, list_queue, request, Session, ZkBackend, PROBE_SESSION};
use crate::backend::election::decode_holder;
use crate::backend::{check_name, leader_stream, Leader, LeaderSink, LeaderStream};
use crate::backoff::Backoff;
use crate::error::Error;

/// Reads of a queue whose first node keeps going before it is read, before
/// the read is given up.
const READ_TRIES: usize = 10;

impl ZkBackend {
    /// The leader of the election `name`: the lock's first node, decoded.
    pub(super) async fn leader_of(&self, name: &str) -> Result<Option<Leader>, Error> {
        check_name(name)?;
        let session = self.any_session().await?;
        read_leader(&session, name, &self.lock_path(name)).await
    }

    /// The changes of the election `name` from now on, the current leader
    /// first. The first read happens here, so that its failure is this call's.
    pub(super) async fn observe_election(&self, name: &str) -> Result<LeaderStream, Error> {
        check_name(name)?;
        let session = Arc::new(Session::open(&self.login, PROBE_SESSION).await?);
        let parent = self.lock_path(name);
        let (current, watch) = watch_leader(&session, name, &parent).await?;
        let follower = Follower { session, name: name.to_string(), parent };
        Ok(leader_stream(move |sink| follower.run(current, watch, sink)))
    }
}

/// The leader of `name`, whose lock node is `parent`: the first node's data.
async fn read_leader(session: &Session, name: &str, parent: &str) -> Result<Option<Leader>, Error> {
    for _ in 0..READ_TRIES {
        let queue = list_queue(session, parent).await?;
        let Some(first) = queue.first() else {
            return Ok(None);
        };
        match first_node(session, name, &format!("{parent}/{first}")).await? {
            Some(leader) => return Ok(Some(leader)),
            // It went between the two reads: read the queue again.
            None => continue,
        }
    }
    Err(Error::backend("zk", format!("the leader of {name:?} kept changing while it was read")))
}

/// The leader node `path` shows, `None` if it is gone.
async fn first_node(session: &Session, name: &str, path: &str) -> Result<Option<Leader>, Error> {
    match request(session.client.get_data(path)).await {
        Ok((data, stat)) => decode_holder(name, stat.czxid as u64, &data).map(Some),
        Err(zk::Error::NoNode) => Ok(None),
        Err(e) => Err(fail("read the leader's node", e)),
    }
}

/// The leader of `name`, and the watches that fire when the lock's queue
/// changes (or the lock's node is created, while it does not exist) or the
/// leader's node changes.
async fn watch_leader(session: &Session, name: &str, parent: &str) -> Result<(Option<Leader>, Wake), Error> {
    for _ in 0..READ_TRIES {
        let (children, queue) = match request(session.client.list_and_watch_children(parent)).await {
            Ok(listed) => listed,
            Err(zk::Error::NoNode) => match request(session.client.check_and_watch_stat(parent)).await {
                Ok((None, queue)) => return Ok((None, Wake { queue, leader: None })),
                // Created meanwhile: list it.
                Ok((Some(_), _)) => continue,
                Err(e) => return Err(fail("watch the lock's node", e)),
            },
            Err(e) => return Err(fail("watch the lock's queue", e)),
        };
        let Some(first) = super::queue_order(children).into_iter().next() else {
            return Ok((None, Wake { queue, leader: None }));
        };
        let path = format!("{parent}/{first}");
        match request(session.client.get_and_watch_data(&path)).await {
            Ok((data, stat, leader)) => {
                let current = decode_holder(name, stat.czxid as u64, &data)?;
                return Ok((Some(current), Wake { queue, leader: Some(leader) }));
            }
            // It went between the two reads: read the queue again.
            Err(zk::Error::NoNode) => continue,
            Err(e) => return Err(fail("watch the leader's node", e)),
        }
    }
    Err(Error::backend("zk", format!("the leader of {name:?} kept changing while it was read")))
}

/// What wakes an observer: a change of the lock's queue, or of the leader's
/// node (its data, or its deletion).
struct Wake {
    queue: zk::OneshotWatcher,
    /// `None` while nobody leads.
    leader: Option<zk::OneshotWatcher>,
}

impl Wake {
    /// Resolves at the first fire of either watch (dropping the other).
    async fn changed(self) {
        match self.leader {
            Some(leader) => {
                tokio::select! {
                    _ = self.queue.changed() => {}
                    _ = leader.changed() => {}
                }
            }
            None => {
                self.queue.changed().await;
            }
        }
    }
}

/// One observer: its session and the lock it follows.
struct Follower {
    session: Arc<Session>,
    name: String,
    /// The lock's node.
    parent: String,
}

impl Follower {
    /// Shows `current`, then the leader after each fire of `watch`, until the
    /// reader is gone or an error no retry gets past (refused rights or
    /// login, data fencelock did not write).
    async fn run(mut self, mut current: Option<Leader>, mut watch: Wake, mut sink: LeaderSink) {
        let backoff = Backoff::default();
        let mut attempt = 0;
        loop {
            if !sink.show(current.take()).await {
                return;
            }
            watch.changed().await;
            loop {
                match self.read().await {
                    Ok((leader, next)) => {
                        (current, watch) = (leader, next);
                        break;
                    }
                    Err(e) if is_final(&e) => return sink.fail(e).await,
                    Err(e) => {
                        tracing::debug!(lock = %self.name, error = %e, "fencelock: zk: election watch failed; retrying");
                        tokio::time::sleep(backoff.delay(attempt, fastrand::f64())).await;
                        attempt = attempt.saturating_add(1);
                    }
                }
            }
        }
    }

    /// The leader and a new watch, on a new session if the last one ended.
    async fn read(&mut self) -> Result<(Option<Leader>, Wake), Error> {
        if !self.session.is_live() {
            self.session = Arc::new(Session::open(&self.session.login, PROBE_SESSION).await?);
        }
        watch_leader(&self.session, &self.name, &self.parent).await
    }
}

/// Errors a retry cannot get past.
fn is_final(e: &Error) -> bool {
    matches!(e, Error::Security { .. } | Error::Protocol(_))
}
