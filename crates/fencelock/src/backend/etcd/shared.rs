//! Read-write locks and semaphores on etcd, in the style of etcd's
//! concurrency package: keys under the lock's prefix, each attached to its
//! acquire's lease, ordered by create revision.
//!
//! Where it sits: under [`super::EtcdBackend`]. A writer is the exclusive
//! lock's key and recipe unchanged; this module adds readers and semaphore
//! permits, whose keys sit in the same prefix, and the one rule of which key
//! holds ([`granted`]), used by the waits and by `check`. A key's kind
//! ([`Kind`]) and the refusal of a permits mismatch are in `keys`.
//!
//! # Keys
//! The key of an acquire is `P/N/{lease id in 16 hex digits}` followed by
//! its kind: nothing for a writer (the exclusive lock), `r` for a reader,
//! `s{k}.{n}` for k permits of a semaphore of n.
//!
//! # The recipe
//! Oldest key first (lowest create revision):
//! * a writer holds when it is first; it waits for the key just before it;
//! * a reader holds when no key before it is another kind than a reader; it
//!   waits for the last such key before it (etcd's removed `recipes/rwmutex`:
//!   a reader waits for the last writer with a lower revision). So a queued
//!   writer blocks every later reader (strict FIFO across modes);
//! * k permits hold when every key before is a permit and their weights plus
//!   k are at most n: the holders are the lowest create revisions that fit,
//!   so the grant is whole and no later, smaller request overtakes it. A
//!   permit waits on a watch of deletions under the lock's prefix (etcd
//!   cannot watch "the keys older than mine"), then reads the keys again.
//!
//! A lock's n is the first key's (0 for a writer or a reader): an acquire
//! that asks another fails with [`Error::InvalidArgument`] naming both, and
//! so does an exclusive or shared acquire of a semaphore's name. n is
//! forgotten when the lock has no keys. The token is the key's create
//! revision, as for the exclusive lock: a writer's key is younger than every
//! reader's granted before it, so its token is above theirs.
//!
//! # Not guaranteed
//! * No downgrade ([`crate::Guard::downgrade`] fails with
//!   [`Error::Unsupported`]: a key's kind is its name).
//! * A semaphore's waiters are all woken by any deletion under the lock (a
//!   herd among them), not only the next one.
//! * Two first acquires with different n racing each other: the younger key
//!   finds the older one's n and fails; the first key's n wins.

use std::time::Duration;

use fencelock_proto::etcd::mvccpb::KeyValue;

use super::keys::{mismatch, Kind};
use super::{EtcdBackend, Mine, Purpose, Turn};
use crate::error::Error;

/// Which of the keys of kinds `kinds` (oldest first) hold the lock (see the
/// module docs).
pub(super) fn granted(kinds: &[Kind]) -> Vec<bool> {
    let (mut others_before, mut non_permits_before, mut weights) = (false, false, 0u64);
    let mut out = Vec::with_capacity(kinds.len());
    for (i, kind) in kinds.iter().enumerate() {
        out.push(match *kind {
            Kind::Writer => i == 0,
            Kind::Reader => !others_before,
            Kind::Permits { weight, of } => !non_permits_before && weights + u64::from(weight) <= u64::from(of),
        });
        match *kind {
            Kind::Reader => non_permits_before = true,
            Kind::Writer => (others_before, non_permits_before) = (true, true),
            Kind::Permits { weight, .. } => {
                others_before = true;
                weights += u64::from(weight);
            }
        }
    }
    out
}

/// The keys of a lock, oldest first, with their kinds.
struct Keys {
    kvs: Vec<KeyValue>,
    kinds: Vec<Kind>,
}

impl EtcdBackend {
    /// Reads the keys of `lock`.
    async fn keys(&self, lock: &[u8]) -> Result<Keys, Error> {
        let (kvs, _) = self.etcd.all_created(lock, self.etcd.deadline()).await?;
        let kinds = kvs.iter().map(|kv| Kind::of_key(lock, &kv.key)).collect();
        Ok(Keys { kvs, kinds })
    }

    /// The create revisions of the keys that hold `lock` now.
    pub(super) async fn holder_revisions(&self, lock: &[u8]) -> Result<Vec<i64>, Error> {
        let keys = self.keys(lock).await?;
        let held = granted(&keys.kinds);
        Ok(keys.kvs.iter().zip(held).filter(|(_, g)| *g).map(|(kv, _)| kv.create_revision).collect())
    }

    /// A shared acquire's turn (`kind` a reader or permits): granted, or
    /// busy with no `recheck`; with one, waits until granted, looking again
    /// at least every `recheck` (a watch that stays silent that long is not
    /// trusted: see [`super::recipe::RECHECK`]).
    pub(super) async fn shared_turn(
        &self,
        lock: &[u8],
        mine: &Mine,
        kind: Kind,
        recheck: Option<Duration>,
        purpose: Purpose,
    ) -> Result<Turn, Error> {
        loop {
            // Watching before the read: no deletion falls between them.
            let mut deletions = match kind {
                Kind::Permits { .. } if recheck.is_some() => {
                    Some(self.etcd.watch_deletions_under(lock, self.etcd.deadline()).await?)
                }
                _ => None,
            };
            let keys = self.keys(lock).await?;
            let Some(pos) = keys.kvs.iter().position(|kv| kv.create_revision == mine.rev) else {
                return Err(purpose.lost(format!("the key of a waiting acquire (lease {}) was deleted", mine.lease_id)));
            };
            let kept = keys.kinds[0].permits();
            if kept != kind.permits() {
                return Err(mismatch(kept, kind.permits()));
            }
            if granted(&keys.kinds)[pos] {
                return Ok(Turn::Granted);
            }
            let Some(recheck) = recheck else {
                let count = i64::try_from(keys.kvs.len()).unwrap_or(i64::MAX);
                return Ok(Turn::Busy { owner: keys.kvs[0].clone(), keys: count });
            };
            // Either way the next round reads the keys again.
            match deletions.as_mut() {
                Some(watcher) => {
                    self.etcd.deleted(watcher, crate::clock::now() + recheck).await?;
                }
                None => {
                    let last_other = keys.kinds[..pos].iter().rposition(|k| *k != Kind::Reader);
                    // Some key before is not granted-compatible, so one exists.
                    let blocker = &keys.kvs[last_other.unwrap_or(pos - 1)];
                    self.wait_gone(blocker, recheck).await?;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const R: Kind = Kind::Reader;
    const W: Kind = Kind::Writer;

    fn p(weight: u32) -> Kind {
        Kind::Permits { weight, of: 3 }
    }

    /// INV-15 and INV-16: readers share until a writer, a writer holds only
    /// first, and a reader behind a queued writer waits; permits hold in
    /// create order while their weights fit, and none overtakes a waiting one.
    #[test]
    fn the_oldest_keys_that_fit_hold() {
        assert_eq!(granted(&[R, R, W, R]), [true, true, false, false]);
        assert_eq!(granted(&[W, R, R]), [true, false, false]);
        assert_eq!(granted(&[p(2), p(2), p(1)]), [true, false, false], "no barging by a smaller request");
        assert_eq!(granted(&[p(1), p(2), p(1)]), [true, true, false]);
        assert!(granted(&[]).is_empty());
    }
}
