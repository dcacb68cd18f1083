//! The nodes and the rounds on them: one call on every node at once, each
//! by its deadline, counted into a [`Tally`] (a majority, or not); the undo
//! of a refused attempt; the error of a round without a majority (the first
//! failed node's error its source).
//!
//! Where it sits: under [`super::RedlockBackend`]; each node is a Redis
//! [`Conn`] of [`crate::backend::redis`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use redis::Value;
use tokio::time::Instant;

use super::node_timeout;
use crate::backend::redis::{millis, Conn, Retry, OP_TIMEOUT, RENEW};
use crate::backend::BoxFuture;
use crate::error::Error;

/// `unlock.lua`: compare-and-delete on one node.
static UNLOCK: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../redis/unlock.lua")));

/// The nodes, shared by the backend, its guards and background tasks.
pub(super) struct Nodes {
    pub(super) conns: Vec<Conn>,
    /// The prefix with its `:`.
    pub(super) prefix: String,
}

/// What the nodes answered to one round.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Did what was asked (set, renewed, deleted).
    pub(super) yes: usize,
    /// Answered no (held by another, not ours).
    pub(super) no: usize,
    /// Failed or did not answer in time (each node's error, its driver's
    /// error as its source).
    pub(super) errors: Vec<Error>,
}

impl Tally {
    fn new(answers: Vec<Result<bool, Error>>) -> Tally {
        let mut tally = Tally::default();
        for answer in answers {
            match answer {
                Ok(true) => tally.yes += 1,
                Ok(false) => tally.no += 1,
                Err(e) => tally.errors.push(e),
            }
        }
        tally
    }

    /// True if the nodes that did not fail are fewer than `quorum`.
    pub(super) fn cannot_reach_quorum(&self, quorum: usize) -> bool {
        self.yes + self.no < quorum
    }
}

impl Nodes {
    /// The error of a round in which too many nodes failed for a majority.
    pub(super) fn failure(&self, tally: &Tally) -> Error {
        let (quorum, n, failed) = (self.quorum(), self.conns.len(), tally.errors.len());
        majority_failed(format!("a majority ({quorum}) of {n} nodes is needed and {failed} failed"), &tally.errors)
    }

    /// A majority: N/2 + 1.
    pub(super) fn quorum(&self) -> usize {
        self.conns.len() / 2 + 1
    }

    pub(super) fn key(&self, name: &str) -> String {
        format!("{}lock:{name}", self.prefix)
    }

    /// `SET key owner NX PX ttl` on every node in parallel.
    pub(super) async fn set_all(&self, key: &str, owner: &str, ttl: Duration) -> Tally {
        let deadline = crate::clock::now() + node_timeout(ttl);
        let ttl_ms = millis(ttl);
        self.each(deadline, |mut c| async move {
            let mut set = redis::cmd("SET");
            set.arg(key).arg(owner).arg("NX").arg("PX").arg(ttl_ms);
            Ok(matches!(set.query_async::<Value>(&mut c).await?, Value::Okay))
        })
        .await
    }

    /// Compare-and-delete on every node in parallel, by `deadline`.
    pub(super) async fn unlock_all(&self, key: &str, owner: &str, deadline: Instant) -> Tally {
        self.each(deadline, |mut c| async move {
            let mut call = UNLOCK.prepare_invoke();
            call.key(key).arg(owner);
            Ok(call.invoke_async::<i64>(&mut c).await? == 1)
        })
        .await
    }

    /// `PEXPIRE`-if-ours on every node in parallel.
    pub(super) async fn renew_all(&self, key: &str, owner: &str, ttl: Duration, deadline: Instant) -> Tally {
        let ttl_ms = millis(ttl);
        self.each(deadline, |mut c| async move {
            let mut call = RENEW.prepare_invoke();
            call.key(key).arg(owner).arg(ttl_ms);
            Ok(call.invoke_async::<i64>(&mut c).await? == 1)
        })
        .await
    }

    /// Runs `op` on every node in parallel (an idempotent call: a node whose
    /// connection turned out broken gets it once more), each by `deadline`.
    async fn each<F, Fut>(&self, deadline: Instant, op: F) -> Tally
    where
        F: Fn(redis::aio::MultiplexedConnection) -> Fut + Sync,
        Fut: Future<Output = redis::RedisResult<bool>> + Send,
    {
        let op = &op;
        let calls = self.conns.iter().map(|c| Box::pin(c.run(deadline, Retry::Once, op)) as BoxFuture<'_, _>);
        Tally::new(join_all(calls).await)
    }
}

/// Polls every future in place until all are done; their outputs in order.
/// (Dropping it drops the calls still out.)
pub(super) async fn join_all<'a, T>(futures: impl Iterator<Item = BoxFuture<'a, T>>) -> Vec<T> {
    let mut futures: Vec<BoxFuture<'a, T>> = futures.collect();
    let mut outputs: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, output) in futures.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match Pin::as_mut(future).poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

/// Drop guard of one acquire attempt: unless disarmed, deletes the attempt's
/// value from every node ([`Undo::now`] at once, within the attempt's node
/// timeout; on drop in the background).
pub(super) struct Undo {
    pub(super) nodes: Option<Arc<Nodes>>,
    pub(super) key: String,
    pub(super) owner: String,
    /// How long each node may take.
    pub(super) timeout: Duration,
}

impl Undo {
    pub(super) fn disarm(&mut self) {
        self.nodes = None;
    }

    /// Deletes the attempt's value now (a refused attempt); errors are left to
    /// the TTL.
    pub(super) async fn now(&mut self) {
        if let Some(nodes) = self.nodes.take() {
            nodes.unlock_all(&self.key, &self.owner, crate::clock::now() + self.timeout).await;
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        let Some(nodes) = self.nodes.take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (key, owner) = (std::mem::take(&mut self.key), std::mem::take(&mut self.owner));
            runtime.spawn(async move {
                nodes.unlock_all(&key, &owner, crate::clock::now() + OP_TIMEOUT).await;
            });
        }
    }
}

/// [`Error::Backend`] of a round without a majority: `why`, then what each
/// failed node said; the first node's error is the source (with its driver's
/// error as its own source).
pub(super) fn majority_failed(why: String, errors: &[Error]) -> Error {
    let texts: Vec<String> = errors.iter().map(Error::to_string).collect();
    let message = format!("{why}; failures: {}", texts.join("; "));
    match errors.first() {
        Some(first) => Error::backend_caused("redlock", message, first.clone()),
        None => Error::backend("redlock", message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tally(yes: usize, no: usize, errors: usize) -> Tally {
        Tally { yes, no, errors: vec![Error::backend("redis", "down"); errors] }
    }

    #[test]
    fn too_many_failures_cannot_reach_a_majority() {
        assert!(!tally(1, 1, 1).cannot_reach_quorum(2));
        assert!(tally(1, 0, 2).cannot_reach_quorum(2));
        assert!(!tally(0, 1, 0).cannot_reach_quorum(1));
    }

    #[tokio::test]
    async fn join_all_keeps_the_order() {
        let futures = (0..4u64).map(|i| {
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(4 - i)).await;
                i
            }) as BoxFuture<'static, u64>
        });
        assert_eq!(join_all(futures).await, vec![0, 1, 2, 3]);
    }
}
