//! [`DedupIndex`]: which request ids a lease's memory of outcomes holds, for
//! the leases that remember many, so that a new request (a miss, the common
//! case) is known new without a scan of up to [`crate::DEDUP_PER_LEASE`]
//! outcomes (issue 19 §4).
//!
//! Where it sits: the engine's `record`, `recorded_reply`, `cancel_wait` and
//! `end_lease` keep it in step with each lease's [`Dedup`]. It is built for a
//! lease the first time a lookup finds [`INDEX_FROM`] outcomes or more (an
//! idle lease, which remembers one or two, costs nothing), kept exact from
//! then on, and dropped with the lease. It is not part of the state: never
//! serialized (an engine read from a snapshot builds it again as it looks
//! up), equal whatever it holds. It answers membership only; the outcome
//! itself, and every order, are the memory's.

use std::collections::BTreeMap;

use super::state::Dedup;
use crate::{LeaseId, RequestId};

/// From this many remembered outcomes a lease's lookups go through the index.
pub(crate) const INDEX_FROM: usize = 16;

/// The request ids remembered by each indexed lease, sorted.
#[derive(Debug, Default)]
pub(super) struct DedupIndex(BTreeMap<LeaseId, Vec<RequestId>>);

/// A copy starts empty and builds its index again as it looks up: the
/// engine's copy a snapshot is made from, taken while applies wait, never
/// looks up, and copying the index would cost up to 2 KB per busy lease.
impl Clone for DedupIndex {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl DedupIndex {
    /// Whether `dedup`, the memory of `lease`, may hold `req`: false only when
    /// it is known not to (the index is built here when the memory is large).
    pub fn may_hold(&mut self, lease: LeaseId, dedup: &Dedup, req: RequestId) -> bool {
        if dedup.len() < INDEX_FROM && !self.0.contains_key(&lease) {
            return true;
        }
        let reqs = self.0.entry(lease).or_insert_with(|| {
            let mut reqs: Vec<RequestId> = dedup.reqs().collect();
            reqs.sort_unstable();
            reqs
        });
        reqs.binary_search(&req).is_ok()
    }

    /// `req` was added to the memory of `lease`.
    pub fn added(&mut self, lease: LeaseId, req: RequestId) {
        if let Some(reqs) = self.0.get_mut(&lease) {
            if let Err(i) = reqs.binary_search(&req) {
                reqs.insert(i, req);
            }
        }
    }

    /// `req` left the memory of `lease` (forgotten, or the oldest beyond the bound).
    pub fn removed(&mut self, lease: LeaseId, req: RequestId) {
        if let Some(reqs) = self.0.get_mut(&lease) {
            if let Ok(i) = reqs.binary_search(&req) {
                reqs.remove(i);
            }
        }
    }

    /// The lease ended: its memory went with it.
    pub fn lease_ended(&mut self, lease: LeaseId) {
        self.0.remove(&lease);
    }
}

impl PartialEq for DedupIndex {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for DedupIndex {}

#[cfg(test)]
mod tests {
    use super::INDEX_FROM;
    use crate::{Acquire, Command, Engine, Input, LeaseId, Reply, RequestId, Token};

    fn step(e: &mut Engine, cmds: Vec<Command>) -> Vec<Reply> {
        e.step(&Input::Batch { now: 1, cmds }).replies
    }

    fn try_a(req: u64, lease: u64) -> Command {
        Command::Acquire(Acquire::exclusive(RequestId(req), LeaseId(lease), "a", 0))
    }

    /// INV-6 through the index: a lease that remembers more than
    /// [`INDEX_FROM`] outcomes answers a retry of each of them with its first
    /// outcome (`Busy`, though the lock is free by then), and a new request is
    /// applied (the lock is granted).
    #[test]
    fn inv6_a_lease_remembering_many_requests_answers_each_retry_the_same() {
        let mut e = Engine::new();
        let grant = |req| Command::GrantLease { req: RequestId(req), ttl_ms: 60_000, id: None };
        step(&mut e, vec![grant(1), grant(2), try_a(1, 1)]);
        let n = 2 * INDEX_FROM as u64;
        let busy = step(&mut e, (1..=n).map(|req| try_a(req, 2)).collect());
        assert!(busy.iter().all(|r| matches!(r, Reply::Busy(_))), "{busy:?}");
        let release = Command::Release { req: RequestId(2), lease: LeaseId(1), lock: "a".into(), token: Token(1) };
        assert_eq!(step(&mut e, vec![release]), [Reply::Released]);
        assert_eq!(step(&mut e, (1..=n).map(|req| try_a(req, 2)).collect()), busy);
        assert!(matches!(step(&mut e, vec![try_a(n + 1, 2)])[..], [Reply::Acquired(_)]));
    }
}
