//! [`Dedup`]: a lease's memory of the final outcomes of its last
//! [`DEDUP_PER_LEASE`] requests, oldest first, for retries (INV-6), and
//! what it remembers of each: an [`Outcome`], its reply kept as an [`Answer`].
//!
//! Where it sits: `state.rs`'s `Lease` keeps one; the engine's
//! `record` and `recorded_reply` (`engine.rs`) fill and read it. Most leases
//! remember one outcome (an idle lease: the acquire of the lock it holds), so
//! the first is kept in place, in the lease's record, and the memory moves to
//! `VecDeque`s when a second comes (growing one slot at a time for the first
//! few): one outcome costs 48 bytes in the record where a `VecDeque` cost 32
//! and an allocation of 48 (issue 38 §3). It serializes, compares and reads
//! back as the `VecDeque` of `(RequestId, Outcome)` it replaces, so snapshots
//! read and are written as before.
//!
//! From the second outcome on, the request ids are kept apart from the
//! outcomes ([`Many`]: two `VecDeque`s of the same length, in the same
//! order). Every new request of a lease looks its id up here and misses, and
//! a miss scans every entry: apart, it scans the 8-byte ids only (2 KB for a
//! full memory) instead of ids with their 40-byte outcomes (12 KB), and a hit
//! touches one outcome. The two are boxed, so that the record keeps its 48
//! bytes (in place they would make it 64).

use std::collections::VecDeque;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::small::grows_by_one;
use crate::{Grant, LeaseId, LockName, Reply, RequestId, DEDUP_PER_LEASE};

type Entry = (RequestId, Outcome);

/// The remembered outcomes, oldest first.
#[derive(Debug, Clone)]
enum Entries {
    /// None, or one.
    One(Option<Entry>),
    /// Two or more (or fewer, after a `forget`).
    Many(Box<Many>),
}

/// Two or more entries, their ids apart from their outcomes (see the module
/// docs): the same length, in the same order, oldest first.
#[derive(Debug, Clone)]
struct Many {
    reqs: VecDeque<RequestId>,
    outcomes: VecDeque<Outcome>,
}

impl Many {
    /// The two entries, in this order.
    fn two(first: Entry, second: Entry) -> Self {
        let mut many = Many { reqs: VecDeque::with_capacity(2), outcomes: VecDeque::with_capacity(2) };
        many.push_back(first);
        many.push_back(second);
        many
    }

    /// Where `req`'s entry is, newest first: a scan of the ids only.
    fn position(&self, req: RequestId) -> Option<usize> {
        let (front, back) = self.reqs.as_slices();
        match rfind(back, req) {
            Some(i) => Some(front.len() + i),
            None => rfind(front, req),
        }
    }

    /// Appends `entry`, both deques growing as one (see [`grows_by_one`]).
    fn push_back(&mut self, (req, outcome): Entry) {
        if grows_by_one(self.reqs.len(), self.reqs.capacity()) {
            self.reqs.reserve_exact(1);
        }
        if grows_by_one(self.outcomes.len(), self.outcomes.capacity()) {
            self.outcomes.reserve_exact(1);
        }
        self.reqs.push_back(req);
        self.outcomes.push_back(outcome);
    }

    fn pop_front(&mut self) {
        self.reqs.pop_front();
        drop(self.outcomes.pop_front());
    }

    fn remove(&mut self, i: usize) {
        self.reqs.remove(i);
        drop(self.outcomes.remove(i));
    }
}

/// Ids compared at once by [`rfind`].
const LANES: usize = 8;

/// The last place of `req` in `ids`. Every new request of a lease misses, so
/// the scan is made for the miss: each block of [`LANES`] ids, newest first,
/// is compared whole, without a branch per id (which the compiler turns into
/// vector compares), and only a block that holds `req` is searched one by one.
fn rfind(ids: &[RequestId], req: RequestId) -> Option<usize> {
    let mut blocks = ids.rchunks_exact(LANES);
    let mut end = ids.len();
    for block in &mut blocks {
        end -= LANES;
        if block.iter().fold(false, |hit, r| hit | (r.0 == req.0)) {
            return block.iter().rposition(|r| *r == req).map(|i| end + i);
        }
    }
    blocks.remainder().iter().rposition(|r| *r == req)
}

impl FromIterator<Entry> for Many {
    fn from_iter<I: IntoIterator<Item = Entry>>(entries: I) -> Self {
        let (reqs, outcomes) = entries.into_iter().unzip();
        Many { reqs, outcomes }
    }
}

/// The last [`DEDUP_PER_LEASE`] outcomes of one lease, oldest first.
#[derive(Debug, Clone)]
pub(crate) struct Dedup(Entries);

impl Default for Dedup {
    fn default() -> Self {
        Dedup(Entries::One(None))
    }
}

impl Dedup {
    /// The outcome remembered for `req` (newest first: a retry is usually of a
    /// recent request).
    pub fn get(&self, req: RequestId) -> Option<&Outcome> {
        match &self.0 {
            Entries::One(one) => one.as_ref().filter(|(r, _)| *r == req).map(|(_, o)| o),
            Entries::Many(many) => many.position(req).map(|i| &many.outcomes[i]),
        }
    }

    /// Replaces the outcome remembered for `req` in place; `outcome` back if
    /// there is none.
    pub fn replace(&mut self, req: RequestId, outcome: Outcome) -> Option<Outcome> {
        let slot = match &mut self.0 {
            Entries::One(one) => one.as_mut().filter(|(r, _)| *r == req).map(|(_, o)| o),
            Entries::Many(many) => many.position(req).map(|i| &mut many.outcomes[i]),
        };
        match slot {
            Some(slot) => {
                *slot = outcome;
                None
            }
            None => Some(outcome),
        }
    }

    /// Remember `outcome` for `req`, known to have no entry (see
    /// `Engine::record`): appends without a scan. The caller first makes
    /// room for it ([`Dedup::make_room`]).
    pub fn push_new(&mut self, req: RequestId, outcome: Outcome) {
        debug_assert!(self.get(req).is_none(), "request {} is remembered already", req.0);
        let entry = (req, outcome);
        match &mut self.0 {
            Entries::One(one) => match one.take() {
                None => *one = Some(entry),
                Some(first) => self.0 = Entries::Many(Box::new(Many::two(first, entry))),
            },
            Entries::Many(many) => many.push_back(entry),
        }
    }

    /// Forgets the oldest entries while one more would exceed
    /// [`DEDUP_PER_LEASE`]. Room is made before the append, so that a full
    /// memory keeps its [`DEDUP_PER_LEASE`] slots instead of doubling them
    /// for a moment's extra entry.
    pub fn make_room(&mut self) {
        while self.len() >= DEDUP_PER_LEASE {
            match &mut self.0 {
                Entries::One(one) => *one = None,
                Entries::Many(many) => many.pop_front(),
            }
        }
    }

    pub fn len(&self) -> usize {
        match &self.0 {
            Entries::One(one) => usize::from(one.is_some()),
            Entries::Many(many) => many.reqs.len(),
        }
    }

    /// The requests it remembers, oldest first.
    #[cfg(test)]
    pub fn reqs(&self) -> impl Iterator<Item = RequestId> + '_ {
        self.iter().map(|(r, _)| r)
    }

    /// The lock names its outcomes keep (see `decode.rs`).
    pub fn names_mut(&mut self) -> impl Iterator<Item = &mut LockName> {
        let (one, many) = match &mut self.0 {
            Entries::One(one) => (one.as_mut().map(|(_, o)| o), None),
            Entries::Many(many) => (None, Some(many.outcomes.iter_mut())),
        };
        one.into_iter().chain(many.into_iter().flatten()).filter_map(Outcome::name_mut)
    }

    /// Frees the slots beyond its length (see `decode.rs`).
    pub fn shrink_to_fit(&mut self) {
        if let Entries::Many(many) = &mut self.0 {
            many.reqs.shrink_to_fit();
            many.outcomes.shrink_to_fit();
        }
    }

    pub fn forget(&mut self, req: RequestId) {
        match &mut self.0 {
            Entries::One(one) => {
                if one.as_ref().is_some_and(|(r, _)| *r == req) {
                    *one = None;
                }
            }
            Entries::Many(many) => {
                while let Some(i) = many.position(req) {
                    many.remove(i);
                }
            }
        }
    }

    /// The entries, oldest first.
    fn iter(&self) -> impl Iterator<Item = (RequestId, &Outcome)> {
        let (one, many) = match &self.0 {
            Entries::One(one) => (one.as_ref().map(|(r, o)| (*r, o)), None),
            Entries::Many(many) => (None, Some(many.reqs.iter().copied().zip(&many.outcomes))),
        };
        one.into_iter().chain(many.into_iter().flatten())
    }

    /// The slots it holds its entries in (its ids and its outcomes have as many).
    #[cfg(test)]
    fn capacity(&self) -> usize {
        match &self.0 {
            Entries::One(_) => 1,
            Entries::Many(many) => {
                assert_eq!(many.reqs.capacity(), many.outcomes.capacity());
                many.reqs.capacity()
            }
        }
    }
}

impl From<VecDeque<Entry>> for Dedup {
    fn from(mut entries: VecDeque<Entry>) -> Self {
        match entries.len() {
            0 | 1 => Dedup(Entries::One(entries.pop_front())),
            _ => Dedup(Entries::Many(Box::new(entries.into_iter().collect()))),
        }
    }
}

impl PartialEq for Dedup {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for Dedup {}

/// As the newtype of a `VecDeque` it was (`Dedup(VecDeque<…>)`, derived).
impl Serialize for Dedup {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_newtype_struct("Dedup", &InOrder(self))
    }
}

/// The entries of a [`Dedup`], serialized as a sequence, oldest first.
struct InOrder<'a>(&'a Dedup);

impl Serialize for InOrder<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

/// The form it was written in (and is read from).
#[derive(Deserialize)]
#[serde(rename = "Dedup")]
struct Written(VecDeque<Entry>);

impl<'de> Deserialize<'de> for Dedup {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Written::deserialize(d).map(|Written(entries)| Dedup::from(entries))
    }
}

/// The final outcome of a lease-bound request, as remembered for a retry.
/// A request still in a queue is not here: the queue itself answers for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Outcome {
    /// Answer the retry with this reply again.
    Replied(Answer),
    /// The acquire queued on this lock and its wait ran out: a retry is answered
    /// with the lock's *current* [`crate::Busy`] (it did not get the lock).
    TimedOut(LockName),
}

impl Outcome {
    /// Remember `reply` as the answer to a retry.
    pub fn replied(reply: Reply) -> Self {
        Outcome::Replied(Answer::from(reply))
    }
}

/// A remembered [`Reply`], compact: the replies most requests end with are
/// kept without their full `Reply` (a grant is its name, shared, its lease and
/// its token), every other one as a boxed `Reply`. It converts back to the
/// exact reply it was made from (INV-6), and it serializes as that `Reply`, so
/// snapshots written before it existed read, and are written, the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "Reply", into = "Reply")]
pub(crate) enum Answer {
    Acquired(Grant),
    LeaseKept { lease: LeaseId, ttl_ms: u64 },
    Released,
    ValueSet,
    Downgraded,
    SlotCompleted,
    Other(Box<Reply>),
}

impl From<Reply> for Answer {
    fn from(reply: Reply) -> Self {
        match reply {
            Reply::Acquired(grant) => Answer::Acquired(grant),
            Reply::LeaseKept { lease, ttl_ms } => Answer::LeaseKept { lease, ttl_ms },
            Reply::Released => Answer::Released,
            Reply::ValueSet => Answer::ValueSet,
            Reply::Downgraded => Answer::Downgraded,
            Reply::SlotCompleted => Answer::SlotCompleted,
            other => Answer::Other(Box::new(other)),
        }
    }
}

impl From<Answer> for Reply {
    fn from(answer: Answer) -> Self {
        match answer {
            Answer::Acquired(grant) => Reply::Acquired(grant),
            Answer::LeaseKept { lease, ttl_ms } => Reply::LeaseKept { lease, ttl_ms },
            Answer::Released => Reply::Released,
            Answer::ValueSet => Reply::ValueSet,
            Answer::Downgraded => Reply::Downgraded,
            Answer::SlotCompleted => Reply::SlotCompleted,
            Answer::Other(reply) => *reply,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Busy, EngineError, Token};

    fn released(r: u64) -> Entry {
        (RequestId(r), Outcome::replied(Reply::Released))
    }

    /// INV-6's lookup: the blocked scan finds what a plain scan from the end
    /// finds (the last place of an id, or none), for every length around the
    /// block size and every place, the id also put earlier as a decoy.
    #[test]
    fn the_blocked_scan_finds_the_last_place_of_an_id() {
        for len in 0..(3 * LANES + 2) {
            let ids: Vec<RequestId> = (0..len as u64).map(|i| RequestId(100 + i)).collect();
            assert_eq!(rfind(&ids, RequestId(7)), None, "len {len}: a miss");
            for at in 0..len {
                let mut ids = ids.clone();
                ids[at] = RequestId(7);
                if at > 0 {
                    ids[at / 2] = RequestId(7);
                }
                let plain = ids.iter().rposition(|r| *r == RequestId(7));
                assert_eq!(rfind(&ids, RequestId(7)), plain, "len {len}, at {at}");
                assert_eq!(plain, Some(at));
            }
        }
    }

    /// A full memory forgets its oldest outcome before it takes a new one
    /// (as `Engine::record` does it), so it keeps the last
    /// [`DEDUP_PER_LEASE`] outcomes in that many slots, not in twice as many.
    #[test]
    fn a_full_memory_keeps_its_bound_of_slots() {
        let mut d = Dedup::default();
        let n = DEDUP_PER_LEASE as u64 + 10;
        for r in 0..n {
            d.make_room();
            let (req, outcome) = released(r);
            d.push_new(req, outcome);
        }
        assert_eq!(d.reqs().collect::<Vec<_>>(), (10..n).map(RequestId).collect::<Vec<_>>());
        assert!(d.capacity() < 2 * DEDUP_PER_LEASE, "{} slots", d.capacity());
    }

    /// One outcome is kept in place; the memory answers, forgets and
    /// serializes as the `VecDeque` it replaces, with one entry or more.
    #[test]
    fn answers_and_serializes_as_a_vecdeque() {
        for n in 0..4u64 {
            let deque: VecDeque<Entry> = (1..=n).map(released).collect();
            let mut d = Dedup::default();
            deque.iter().cloned().for_each(|(req, outcome)| d.push_new(req, outcome));
            assert_eq!(matches!(d.0, Entries::One(_)), n <= 1);
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, serde_json::to_string(&deque).unwrap());
            assert_eq!(serde_json::from_str::<Dedup>(&json).unwrap(), d);
            assert_eq!((d.len(), d.get(RequestId(n)).is_some()), (deque.len(), n > 0));
            d.forget(RequestId(n));
            assert_eq!(d.reqs().collect::<Vec<_>>(), (1..n).map(RequestId).collect::<Vec<_>>());
        }
    }

    /// An outcome of its own for request `r`.
    fn kept(r: u64) -> Outcome {
        Outcome::replied(Reply::LeaseKept { lease: LeaseId(1), ttl_ms: r })
    }

    /// Checks `d` against `model`, the `VecDeque` it replaces: same entries,
    /// each id with its own outcome, same JSON, read back equal.
    fn assert_as(d: &Dedup, model: &VecDeque<Entry>) {
        assert_eq!(d.len(), model.len());
        assert!(d.iter().eq(model.iter().map(|(r, o)| (*r, o))));
        for (req, outcome) in model {
            assert_eq!(d.get(*req), Some(outcome));
        }
        let json = serde_json::to_string(d).unwrap();
        assert_eq!(json, serde_json::to_string(model).unwrap());
        assert_eq!(&serde_json::from_str::<Dedup>(&json).unwrap(), d);
    }

    /// Apart, each id keeps its own outcome through forgets (of a middle
    /// entry, of an unknown one), replacements, and the forgetting of the
    /// oldest when full.
    #[test]
    fn ids_and_outcomes_stay_paired() {
        let (mut d, mut model) = (Dedup::default(), VecDeque::new());
        let push = |d: &mut Dedup, model: &mut VecDeque<Entry>, r: u64| {
            d.make_room();
            d.push_new(RequestId(r), kept(r));
            if model.len() == DEDUP_PER_LEASE {
                model.pop_front();
            }
            model.push_back((RequestId(r), kept(r)));
        };
        (1..=10).for_each(|r| push(&mut d, &mut model, r));
        for r in [5, 1, 10, 99] {
            d.forget(RequestId(r));
            model.retain(|(q, _)| q.0 != r);
            assert_as(&d, &model);
        }
        assert_eq!(d.replace(RequestId(7), kept(70)), None);
        assert_eq!(d.replace(RequestId(99), kept(99)), Some(kept(99)));
        model.iter_mut().filter(|(q, _)| q.0 == 7).for_each(|e| e.1 = kept(70));
        assert_as(&d, &model);
        (11..DEDUP_PER_LEASE as u64 + 20).for_each(|r| push(&mut d, &mut model, r));
        d.forget(RequestId(100));
        model.retain(|(q, _)| q.0 != 100);
        assert_as(&d, &model);
        d.shrink_to_fit();
        assert_eq!(d.capacity(), model.len());
        assert_as(&d, &model);
    }

    /// The ids apart cost no byte in the lease's record (issue 38 §3).
    #[test]
    fn the_record_keeps_its_48_bytes() {
        assert_eq!(std::mem::size_of::<Dedup>(), 48);
    }

    fn replies() -> Vec<Reply> {
        let grant = Grant { lock: LockName::new("a").unwrap(), lease: LeaseId(3), token: Token(7) };
        let busy = Busy { holder: Some(grant.clone()), holders: 1, reopens_in_ms: None, waiters: 2 };
        vec![
            Reply::Acquired(grant.clone()),
            Reply::AcquiredAll(vec![grant]),
            Reply::LeaseKept { lease: LeaseId(3), ttl_ms: 500 },
            Reply::Released,
            Reply::ValueSet,
            Reply::Downgraded,
            Reply::SlotCompleted,
            Reply::SlotDone { token: Token(2), identity: "job".into(), exit_code: 1 },
            Reply::Busy(busy),
            Reply::Rejected(EngineError::LeaseNotFound(LeaseId(9))),
        ]
    }

    /// INV-6: a remembered reply converts back to exactly the reply it was made from.
    #[test]
    fn inv6_an_answer_gives_back_the_reply_it_remembers() {
        for reply in replies() {
            assert_eq!(Reply::from(Answer::from(reply.clone())), reply);
        }
    }

    /// A remembered outcome serializes as the full `Reply` did before answers
    /// were compact, and reads back from it (snapshot compatibility both ways).
    #[test]
    fn an_outcome_serializes_as_the_full_reply_did() {
        for reply in replies() {
            let old = serde_json::json!({ "Replied": &reply });
            let outcome = Outcome::replied(reply);
            assert_eq!(serde_json::to_value(&outcome).unwrap(), old);
            assert_eq!(serde_json::from_value::<Outcome>(old).unwrap(), outcome);
        }
    }
}
