//! Leader election on etcd, as etcd's own `concurrency` election does it: a
//! campaign is the lock recipe (the candidate's key carries its identity and
//! value), the leader is the lock's owner key (the lowest create revision)
//! and its term that key's create revision, the grant's token.
//!
//! Where it sits: under [`super::EtcdBackend`]'s `leader` and `observe`; the
//! campaign is `EtcdBackend::acquire_lock` for `Purpose::Campaign`,
//! and the rule that terms never go back is [`crate::backend::election`]'s.
//!
//! Observing without a gap: one Range reads every key of the lock and the
//! store revision `R` it saw; a watch of the lock's prefix from `R + 1` then
//! brings every later change, in revision order. The follower keeps the
//! lock's queue (its keys by create revision) up to date from those events
//! and, after each one, shows the owner: `Vacant` for the term that ended,
//! `Leader` for the new owner. A failed watch resumes from the last revision
//! applied, after a backoff; only if etcd compacted that revision away is
//! the queue read afresh, and leaders that came and went in the compacted
//! stretch are not shown (the term that ended still is).

use std::sync::Arc;

use fencelock_proto::etcd::mvccpb::event::EventType;
use fencelock_proto::etcd::mvccpb::{Event, KeyValue};

use super::rpc::{Etcd, WatchNews};
use super::EtcdBackend;
use crate::backend::election::decode_holder;
use crate::backend::{check_name, leader_stream, Leader, LeaderSink, LeaderStream};
use crate::backoff::Backoff;
use crate::error::Error;

impl EtcdBackend {
    /// The leader of the election `name`: its lock's owner key, decoded.
    pub(super) async fn leader_of(&self, name: &str) -> Result<Option<Leader>, Error> {
        check_name(name)?;
        let (owner, _) = self.etcd.first_created(&self.lock_prefix(name), self.etcd.deadline()).await?;
        owner.map(|kv| leader_of_key(name, &kv)).transpose()
    }

    /// The changes of the election `name` from now on, the current leader
    /// first. The first read happens here, so that its failure is this call's.
    pub(super) async fn observe_election(&self, name: &str) -> Result<LeaderStream, Error> {
        check_name(name)?;
        let prefix = self.lock_prefix(name);
        let (queue, revision) = self.etcd.all_created(&prefix, self.etcd.deadline()).await?;
        let name = name.to_string();
        let follower = Follower { etcd: self.etcd.clone(), name, prefix, queue, revision };
        Ok(leader_stream(move |sink| follower.run(sink)))
    }
}

/// The leader a lock's owner key shows.
fn leader_of_key(name: &str, kv: &KeyValue) -> Result<Leader, Error> {
    decode_holder(name, kv.create_revision as u64, &kv.value)
}

/// One observer's copy of a lock's queue, kept up to date by a watch.
struct Follower {
    etcd: Arc<Etcd>,
    name: String,
    /// The lock's key prefix.
    prefix: Vec<u8>,
    /// The lock's keys, oldest (the owner) first, as of `revision`.
    queue: Vec<KeyValue>,
    /// The store revision `queue` reflects: the watch resumes after it.
    revision: i64,
}

impl Follower {
    /// Follows until the reader is gone, or until an error no retry gets past
    /// (refused credentials or permission, keys fencelock did not write).
    async fn run(mut self, mut sink: LeaderSink) {
        let backoff = Backoff::default();
        let mut attempt = 0;
        loop {
            match self.follow(&mut sink).await {
                Ok(()) => return,
                Err(e) if is_final(&e) => return sink.fail(e).await,
                Err(e) => {
                    tracing::debug!(lock = %self.name, error = %e, "fencelock: etcd: election watch failed; resuming");
                    tokio::time::sleep(backoff.delay(attempt, fastrand::f64())).await;
                    attempt = attempt.saturating_add(1);
                }
            }
        }
    }

    /// Shows the owner, then every change from `revision + 1` on. `Ok` once
    /// the reader is gone; an error when the watch fails.
    async fn follow(&mut self, sink: &mut LeaderSink) -> Result<(), Error> {
        if !self.show(sink).await? {
            return Ok(());
        }
        let mut watcher = self.etcd.watch_prefix(&self.prefix, self.revision + 1, self.etcd.deadline()).await?;
        loop {
            match self.etcd.news(&mut watcher).await? {
                WatchNews::Events(events) => {
                    for event in events {
                        self.apply(event);
                        if !self.show(sink).await? {
                            return Ok(());
                        }
                    }
                }
                WatchNews::Compacted => {
                    let (queue, revision) = self.etcd.all_created(&self.prefix, self.etcd.deadline()).await?;
                    (self.queue, self.revision) = (queue, revision);
                    return Err(Error::backend("etcd", "election watch: history compacted; the lock was read again"));
                }
            }
        }
    }

    /// The queue after `event`: a put adds (or updates) a key in its create
    /// order, a delete removes it.
    fn apply(&mut self, event: Event) {
        let Some(kv) = event.kv else {
            return;
        };
        self.revision = self.revision.max(kv.mod_revision);
        self.queue.retain(|k| k.key != kv.key);
        if event.r#type == EventType::Put as i32 {
            let at = self.queue.partition_point(|k| k.create_revision < kv.create_revision);
            self.queue.insert(at, kv);
        }
    }

    /// Sends what the queue's owner means (see [`LeaderSink::show`]). `false`
    /// once the reader is gone.
    async fn show(&self, sink: &mut LeaderSink) -> Result<bool, Error> {
        let owner = self.queue.first().map(|kv| leader_of_key(&self.name, kv)).transpose()?;
        Ok(sink.show(owner).await)
    }
}

/// Errors a retry cannot get past.
fn is_final(e: &Error) -> bool {
    matches!(e, Error::Security { .. } | Error::Protocol(_) | Error::PermissionDenied(_) | Error::Unauthenticated(_))
}
