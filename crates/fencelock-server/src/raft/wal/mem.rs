//! The log's entries in memory: the newest decoded, and the log id of every
//! entry not purged.
//!
//! Where it sits: inside [`super::Wal`], which reads and changes it under its
//! lock. openraft reads what it just appended (to apply it, to send it to a
//! follower), so the newest entries are kept decoded and a read of them is a
//! clone. Older entries are needed only by a follower far behind, or to apply
//! the log again after a start: [`Mem::entries`] names those as a range for
//! `Wal::entries` to read back from the segments (through the log thread).
//! The decoded entries are always the newest (a suffix of the log).
//!
//! Why (issue 38 §3): a log of batched entries holds many commands per
//! entry, and a snapshot is taken only after half as many entries as the
//! state has records. W3's million creates were 1,121 entries of two million
//! commands: decoded, about 250 bytes a command, half of the node's 885 bytes
//! per lease; kept as the bytes written, 27 bytes a command (54 a lease). Read
//! back from the segments when asked for, they cost no memory.
//!
//! The decoded tail is bounded by the encoded size of what it holds
//! ([`DECODED_BYTES`]); the entry appended last stays decoded whatever its
//! size.

use std::collections::BTreeMap;
use std::ops::Range;

use openraft::{Entry, LogId};

use super::segments::{Loaded, Rec};
use super::{NodeId, TypeConfig};

/// The most encoded bytes of entries kept decoded: 1 MiB, about 35,000
/// commands (some 8 MB decoded, and the 1 MiB of bytes each input keeps,
/// `LogInput`), far more than openraft has in flight. W3
/// counts what is kept decoded as memory per lease: 4 MiB was about 30 MB.
pub const DECODED_BYTES: usize = 1 << 20;

/// One entry: its log id, its record's payload length, and the entry itself
/// while it is among the newest (boxed: an `Entry` is some hundred bytes even
/// when its payload is not, and most slots hold none).
#[derive(Debug)]
struct Slot {
    log_id: LogId<NodeId>,
    len: usize,
    decoded: Option<Box<Entry<TypeConfig>>>,
}

/// The entries by index.
#[derive(Debug)]
pub struct Mem {
    slots: BTreeMap<u64, Slot>,
    /// The encoded bytes of the slots kept decoded.
    decoded: usize,
    /// The bound on `decoded` (see [`DECODED_BYTES`]).
    budget: usize,
    /// Every slot at or after this index is decoded, none before it.
    first_decoded: u64,
}

/// What a read finds in memory: the older entries as a range to read back
/// from the segments (empty if none), then the decoded ones.
#[derive(Debug)]
pub struct Found {
    pub on_disk: Range<u64>,
    pub decoded: Vec<Entry<TypeConfig>>,
}

impl Mem {
    /// A log that keeps decoded at most `budget` encoded bytes of entries
    /// (and always the one appended last).
    pub fn with_budget(budget: usize) -> Self {
        Self { slots: BTreeMap::new(), decoded: 0, budget, first_decoded: 0 }
    }

    /// The log `loaded` by a start-up scan: the newest entries within
    /// `budget` stay decoded, the others are dropped, to be read back when
    /// asked for.
    pub fn read_back(loaded: Loaded, budget: usize) -> Self {
        let mut mem = Self::with_budget(budget);
        let Loaded { entries, sizes } = loaded;
        let mut kept = 0;
        for &len in sizes.iter().rev() {
            if kept > 0 && mem.decoded + len > mem.budget {
                break;
            }
            mem.decoded += len;
            kept += 1;
        }
        let older = entries.len() - kept;
        mem.first_decoded = entries.get(older).map_or(0, |e| e.log_id.index);
        for (i, (entry, len)) in entries.into_iter().zip(sizes).enumerate() {
            let log_id = entry.log_id;
            let decoded = (i >= older).then(|| Box::new(entry));
            mem.slots.insert(log_id.index, Slot { log_id, len, decoded });
        }
        mem
    }

    /// Adds `entries` (decoded, following on from the log) with `recs`, their
    /// encoded records, in order.
    pub fn extend(&mut self, entries: Vec<Entry<TypeConfig>>, recs: &[Rec]) {
        for (entry, rec) in entries.into_iter().zip(recs) {
            let len = rec.payload.len();
            self.decoded += len;
            let slot = Slot { log_id: entry.log_id, len, decoded: Some(Box::new(entry)) };
            if let Some(old) = self.slots.insert(rec.index, slot) {
                self.forget(&old);
            }
        }
        self.drop_oldest();
    }

    /// Drops the decoded form of the oldest decoded entries while more than
    /// the budget is decoded, but never the last entry's.
    fn drop_oldest(&mut self) {
        let last = self.slots.keys().next_back().copied();
        for (&index, slot) in self.slots.range_mut(self.first_decoded..) {
            if self.decoded <= self.budget || Some(index) == last {
                break;
            }
            if slot.decoded.take().is_some() {
                self.decoded -= slot.len;
            }
            self.first_decoded = index + 1;
        }
    }

    /// Removes the entries at `since` and after.
    pub fn truncate(&mut self, since: u64) {
        let removed = self.slots.split_off(&since);
        removed.values().for_each(|s| self.forget(s));
        self.first_decoded = self.first_decoded.min(since);
    }

    /// Removes the entries up to `upto`.
    pub fn purge(&mut self, upto: u64) {
        let kept = self.slots.split_off(&upto.saturating_add(1));
        let purged = std::mem::replace(&mut self.slots, kept);
        purged.values().for_each(|s| self.forget(s));
        self.first_decoded = self.first_decoded.max(upto.saturating_add(1));
    }

    fn forget(&mut self, slot: &Slot) {
        if slot.decoded.is_some() {
            self.decoded -= slot.len;
        }
    }

    /// The entries with indexes in `lo..hi` (`hi`: `None` for no end), as
    /// many from the first as fit in `max_bytes` of records (at least one):
    /// the decoded ones, and the range of the others.
    pub fn entries(&self, lo: u64, hi: Option<u64>, max_bytes: usize) -> Found {
        let mut found = Found { on_disk: 0..0, decoded: Vec::new() };
        let end = hi.unwrap_or(u64::MAX);
        if end <= lo {
            return found;
        }
        let mut bytes = 0usize;
        for (&index, slot) in self.slots.range(lo..end) {
            bytes = bytes.saturating_add(slot.len);
            if bytes > max_bytes && index > lo {
                break;
            }
            match &slot.decoded {
                Some(entry) => found.decoded.push(Entry::clone(entry)),
                None if found.on_disk.is_empty() => found.on_disk = index..index + 1,
                None => found.on_disk.end = index + 1,
            }
        }
        found
    }

    /// The log id of the last entry, if any.
    pub fn last_log_id(&self) -> Option<LogId<NodeId>> {
        self.slots.last_key_value().map(|(_, s)| s.log_id)
    }

    /// How many entries are kept decoded (for tests).
    #[cfg(test)]
    pub fn decoded_count(&self) -> usize {
        self.slots.values().filter(|s| s.decoded.is_some()).count()
    }
}

#[cfg(test)]
mod tests {
    use fencelock_core::{Command, Input};

    use super::*;
    use crate::raft::tests::{grant, normal};

    /// Entries `lo..hi`, each a batch of `commands` lease grants.
    fn batches(lo: u64, hi: u64, commands: u64) -> (Vec<Entry<TypeConfig>>, Vec<Rec>) {
        let mut entries: Vec<_> = (lo..hi)
            .map(|i| {
                let cmds: Vec<Command> = (0..commands).map(|c| grant(i * 1000 + c, 5_000)).collect();
                normal(1, i, Input::Batch { now: i, cmds })
            })
            .collect();
        let recs = entries.iter_mut().map(|e| Rec::encode(e).unwrap()).collect();
        (entries, recs)
    }

    /// The encoded bytes of entries `lo..hi`.
    fn size(lo: u64, hi: u64) -> usize {
        batches(lo, hi, 20).1.iter().map(|r| r.payload.len()).sum()
    }

    fn add(mem: &mut Mem, lo: u64, hi: u64) -> Vec<Entry<TypeConfig>> {
        let (entries, recs) = batches(lo, hi, 20);
        mem.extend(entries.clone(), &recs);
        entries
    }

    /// What a read of `lo..hi` finds: the range left to the segments, and
    /// the entries found decoded.
    fn found(mem: &Mem, lo: u64, hi: Option<u64>) -> (Range<u64>, Vec<Entry<TypeConfig>>) {
        let f = mem.entries(lo, hi, usize::MAX);
        (f.on_disk, f.decoded)
    }

    /// What a start-up scan of `entries` loads.
    fn loaded(entries: &[Entry<TypeConfig>]) -> Loaded {
        let sizes = entries.iter().map(|e| Rec::encode(&mut e.clone()).unwrap().payload.len()).collect();
        Loaded { entries: entries.to_vec(), sizes }
    }

    /// Issue 38 §3: entries beyond the decoded budget are left to the
    /// segments; the newest stay decoded and read back equal to what was
    /// appended, the last one always, and the decoded bytes stay within the
    /// budget. A read names exactly the older entries it did not find.
    #[test]
    fn entries_past_the_budget_are_left_to_the_segments() {
        let mut mem = Mem::with_budget(size(18, 21));
        let all = add(&mut mem, 1, 21);
        assert_eq!(mem.decoded_count(), 3, "the newest three, as the budget allows");
        assert!(mem.decoded <= mem.budget);
        assert_eq!(found(&mem, 0, None), (1..18, all[17..].to_vec()));
        assert_eq!(found(&mem, 5, Some(9)), (5..9, vec![]));
        assert_eq!(found(&mem, 17, Some(20)), (17..18, all[17..19].to_vec()));
        assert_eq!(found(&mem, 19, Some(19)), (0..0, vec![]));
        assert_eq!(mem.last_log_id(), Some(all[19].log_id));

        let mut tiny = Mem::with_budget(1);
        let one_entry = add(&mut tiny, 1, 2);
        assert_eq!(tiny.decoded_count(), 1, "the last entry stays decoded, whatever the budget");
        assert_eq!(tiny.last_log_id(), Some(one_entry[0].log_id));
    }

    /// A truncation and a purge keep the count of decoded bytes and the
    /// decoded entries a suffix of the log: a truncation below the decoded
    /// tail leaves only entries on disk (the last log id is still known),
    /// entries appended after it are decoded, then dropped in their turn.
    #[test]
    fn truncations_and_purges_keep_the_decoded_tail_within_the_budget() {
        let mut mem = Mem::with_budget(size(9, 13));
        let mut all = add(&mut mem, 1, 11);
        mem.truncate(3);
        all.truncate(2);
        assert_eq!(mem.last_log_id(), Some(all[1].log_id), "the entry now last is the log's last");
        assert_eq!((mem.decoded, mem.decoded_count()), (0, 0), "entries 1-2 were on disk");
        assert_eq!(found(&mem, 0, None), (1..3, vec![]));
        all.extend(add(&mut mem, 3, 13));
        assert_eq!(mem.decoded_count(), 4);
        assert!(mem.decoded <= mem.budget);
        assert_eq!(found(&mem, 0, None), (1..9, all[8..].to_vec()));

        mem.purge(10);
        assert_eq!(found(&mem, 0, None), (0..0, all[10..].to_vec()));
        assert_eq!(mem.decoded_count(), 2);
        assert_eq!(mem.decoded, size(11, 13));
        mem.purge(12);
        assert_eq!((mem.decoded, mem.last_log_id()), (0, None));
        all = add(&mut mem, 13, 14);
        assert_eq!(found(&mem, 0, None), (0..0, all), "appended after a purge of everything: decoded");
    }

    /// A start keeps decoded only the newest entries within the budget (the
    /// last always), and names the rest as on disk.
    #[test]
    fn a_start_keeps_the_newest_decoded_and_leaves_the_rest_on_disk() {
        let (entries, _) = batches(1, 21, 20);
        let mem = Mem::read_back(loaded(&entries), DECODED_BYTES);
        assert_eq!(found(&mem, 0, None), (0..0, entries.clone()), "all within the default budget");

        let mem = Mem::read_back(loaded(&entries), size(18, 21));
        assert_eq!((mem.decoded, mem.decoded_count()), (size(18, 21), 3));
        assert_eq!(found(&mem, 0, None), (1..18, entries[17..].to_vec()));
        assert_eq!(mem.last_log_id(), Some(entries[19].log_id));
        let tiny = Mem::read_back(loaded(&entries), 0);
        assert_eq!(found(&tiny, 0, None), (1..20, entries[19..].to_vec()), "the last one always");
        assert_eq!(Mem::read_back(loaded(&[]), DECODED_BYTES).last_log_id(), None);
    }

    /// Issue 38: a read for replication holds as many entries from its
    /// first as fit in its bound of record bytes, decoded or on disk alike,
    /// and never none: a follower far behind is sent the log in pieces that
    /// each fit in one AppendEntries' deadline.
    #[test]
    fn a_bounded_read_holds_the_first_entries_that_fit_and_at_least_one() {
        let mut mem = Mem::with_budget(size(18, 21));
        let all = add(&mut mem, 1, 21);
        let bounded = |lo, hi, max| {
            let f = mem.entries(lo, hi, max);
            (f.on_disk, f.decoded)
        };
        assert_eq!(bounded(1, None, size(1, 5)), (1..5, vec![]), "four entries fit exactly");
        assert_eq!(bounded(1, None, size(1, 5) - 1), (1..4, vec![]));
        assert_eq!(bounded(3, Some(4), size(1, 5)), (3..4, vec![]), "the range's end bounds it first");
        assert_eq!(bounded(16, None, size(16, 20)), (16..18, all[17..19].to_vec()), "across the decoded tail");
        assert_eq!(bounded(19, None, 0), (0..0, all[18..19].to_vec()), "one entry, whatever the bound");
        assert_eq!(bounded(2, None, 1), (2..3, vec![]));
        assert_eq!(bounded(0, None, usize::MAX), (1..18, all[17..].to_vec()));
    }
}
