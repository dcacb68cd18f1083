//! The log's entries in memory: every entry not purged, the newest decoded
//! and all of them as the bytes written to disk.
//!
//! Where it sits: inside [`super::Wal`], which reads and changes it under its
//! lock. Reads never touch the disk after start-up; openraft reads what it
//! just appended (to apply it, to send it to a follower), so the newest
//! entries are kept decoded and a read of them is a clone. Older entries are
//! needed only by a follower far behind; they are kept as their encoded
//! bytes (the codec's protobuf, what the segment holds) and decoded when read.
//!
//! Why (issue 38 §3): a log of batched entries holds many commands per
//! entry, and a snapshot is taken only after half as many entries as the
//! state has records. W3's million creates were 1,121 entries of two million
//! commands, all decoded in memory: about 250 bytes a command, half of the
//! node's 885 bytes per lease. Encoded, a command is about 30 bytes.
//!
//! The decoded tail is bounded by the encoded size of what it holds
//! ([`DECODED_BYTES`]); the last entry stays decoded whatever its size (its
//! log id is the log's last).

use std::collections::BTreeMap;

use bytes::Bytes;

use openraft::{Entry, LogId};

use super::segments::Rec;
use super::{NodeId, TypeConfig, WalError};
use crate::raft::codec;

/// The most encoded bytes of entries kept decoded as well: 1 MiB, about
/// 35,000 commands (some 8 MB decoded), far more than openraft has in
/// flight. W3 counts what is kept decoded as memory per lease: 4 MiB was
/// about 30 MB.
pub const DECODED_BYTES: usize = 1 << 20;

/// One entry: its bytes, and the entry itself while it is among the newest
/// (boxed: an `Entry` is some hundred bytes even when its payload is not,
/// and most slots hold none).
#[derive(Debug)]
struct Slot {
    /// What the log thread writes, shared with it.
    bytes: Bytes,
    entry: Option<Box<Entry<TypeConfig>>>,
}

/// The entries by index.
#[derive(Debug)]
pub struct Mem {
    slots: BTreeMap<u64, Slot>,
    /// The encoded bytes of the slots kept decoded.
    decoded: usize,
    /// The bound on `decoded` (see [`DECODED_BYTES`]).
    budget: usize,
    /// No slot below this index is decoded: where [`Mem::encode_oldest`]
    /// starts, so that it does not walk the encoded ones again.
    oldest_decoded: u64,
}

impl Default for Mem {
    fn default() -> Self {
        Self::with_budget(DECODED_BYTES)
    }
}

impl Mem {
    /// A log that keeps decoded at most `budget` encoded bytes of entries
    /// (and always the last one).
    pub fn with_budget(budget: usize) -> Self {
        Self { slots: BTreeMap::new(), decoded: 0, budget, oldest_decoded: 0 }
    }

    /// The log of `entries`, as read from the segments at start-up (encoded
    /// again with the current codec: a segment may hold an older one). A
    /// thousand at a time, so that those beyond the budget do not all wait
    /// decoded for the rest.
    pub fn read_back(entries: Vec<Entry<TypeConfig>>) -> Result<Self, WalError> {
        let mut mem = Self::default();
        let mut entries = entries.into_iter().peekable();
        while entries.peek().is_some() {
            let some: Vec<_> = entries.by_ref().take(1000).collect();
            let recs: Vec<_> = some.iter().map(Rec::encode).collect::<Result<_, _>>()?;
            mem.extend(some, &recs);
        }
        Ok(mem)
    }

    /// Adds `entries` (decoded) with `recs`, their encoded records, in order.
    pub fn extend(&mut self, entries: Vec<Entry<TypeConfig>>, recs: &[Rec]) {
        for (entry, rec) in entries.into_iter().zip(recs) {
            self.decoded += rec.payload.len();
            self.oldest_decoded = self.oldest_decoded.min(rec.index);
            let slot = Slot { bytes: rec.payload.clone(), entry: Some(Box::new(entry)) };
            if let Some(old) = self.slots.insert(rec.index, slot) {
                self.forget(&old);
            }
        }
        self.encode_oldest();
    }

    /// Drops the decoded form of the oldest decoded entries while more than
    /// the budget is decoded, but never the last entry's.
    fn encode_oldest(&mut self) {
        let last = self.slots.keys().next_back().copied();
        for (&index, slot) in self.slots.range_mut(self.oldest_decoded..) {
            if self.decoded <= self.budget || Some(index) == last {
                break;
            }
            if slot.entry.take().is_some() {
                self.decoded -= slot.bytes.len();
            }
            self.oldest_decoded = index + 1;
        }
    }

    /// Removes the entries at `since` and after. The entry now last is
    /// decoded if it was not (its log id is the log's last): `Err` only if
    /// it does not decode.
    pub fn truncate(&mut self, since: u64) -> Result<(), WalError> {
        let removed = self.slots.split_off(&since);
        removed.values().for_each(|s| self.forget(s));
        self.decode_last()
    }

    /// Decodes the last entry if it is kept as bytes only.
    fn decode_last(&mut self) -> Result<(), WalError> {
        let Some((&index, slot)) = self.slots.iter_mut().next_back() else { return Ok(()) };
        if slot.entry.is_none() {
            slot.entry = Some(Box::new(decode(index, &slot.bytes)?));
            self.decoded += slot.bytes.len();
            self.oldest_decoded = self.oldest_decoded.min(index);
        }
        Ok(())
    }

    /// Removes the entries up to `upto`.
    pub fn purge(&mut self, upto: u64) {
        let kept = self.slots.split_off(&upto.saturating_add(1));
        let purged = std::mem::replace(&mut self.slots, kept);
        purged.values().for_each(|s| self.forget(s));
    }

    fn forget(&mut self, slot: &Slot) {
        if slot.entry.is_some() {
            self.decoded -= slot.bytes.len();
        }
    }

    /// The entries with indexes in `lo..hi` (`hi`: `None` for no end).
    pub fn entries(&self, lo: u64, hi: Option<u64>) -> Result<Vec<Entry<TypeConfig>>, WalError> {
        let range = match hi {
            Some(hi) if hi <= lo => return Ok(Vec::new()),
            Some(hi) => self.slots.range(lo..hi),
            None => self.slots.range(lo..),
        };
        range.map(|(&index, slot)| read(index, slot)).collect()
    }

    /// The log id of the last entry, if any.
    pub fn last_log_id(&self) -> Option<LogId<NodeId>> {
        let (_, last) = self.slots.last_key_value()?;
        last.entry.as_ref().map(|e| e.log_id)
    }

    /// How many entries are kept decoded (for tests).
    #[cfg(test)]
    pub fn decoded_count(&self) -> usize {
        self.slots.values().filter(|s| s.entry.is_some()).count()
    }
}

/// The entry `slot` holds at `index`.
fn read(index: u64, slot: &Slot) -> Result<Entry<TypeConfig>, WalError> {
    match &slot.entry {
        Some(entry) => Ok(Entry::clone(entry)),
        None => decode(index, &slot.bytes),
    }
}

/// The entry at `index` from the bytes kept of it.
fn decode(index: u64, bytes: &[u8]) -> Result<Entry<TypeConfig>, WalError> {
    let record = || format!("log entry {index} kept in memory");
    codec::decode_entry(&record, codec::CODEC_CURRENT, bytes).map_err(|e| WalError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use fencelock_core::{Command, Input};

    use super::*;
    use crate::raft::tests::{grant, normal};

    /// Entries `lo..hi`, each a batch of `commands` lease grants.
    fn batches(lo: u64, hi: u64, commands: u64) -> (Vec<Entry<TypeConfig>>, Vec<Rec>) {
        let entries: Vec<_> = (lo..hi)
            .map(|i| {
                let cmds: Vec<Command> = (0..commands).map(|c| grant(i * 1000 + c, 5_000)).collect();
                normal(1, i, Input::Batch { now: i, cmds })
            })
            .collect();
        let recs = entries.iter().map(|e| Rec::encode(e).unwrap()).collect();
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

    /// Issue 38 §3: entries beyond the decoded budget are kept as their
    /// bytes and read back equal to what was appended; the newest stay
    /// decoded, the last one always, and the decoded bytes stay within the
    /// budget.
    #[test]
    fn entries_past_the_budget_are_kept_encoded_and_read_back_equal() {
        let mut mem = Mem::with_budget(size(18, 21));
        let all = add(&mut mem, 1, 21);
        assert_eq!(mem.decoded_count(), 3, "the newest three, as the budget allows");
        assert!(mem.decoded <= mem.budget);
        assert_eq!(mem.entries(0, None).unwrap(), all);
        assert_eq!(mem.entries(5, Some(9)).unwrap(), all[4..8].to_vec());
        assert_eq!(mem.last_log_id(), Some(all[19].log_id));

        let mut tiny = Mem::with_budget(1);
        let one_entry = add(&mut tiny, 1, 2);
        assert_eq!(tiny.decoded_count(), 1, "the last entry stays decoded, whatever the budget");
        assert_eq!(tiny.last_log_id(), Some(one_entry[0].log_id));
    }

    /// A truncation and a purge keep the count of decoded bytes: a truncation
    /// below the decoded tail decodes the entry it leaves last (the log's
    /// last log id is read from it), entries appended again after it are
    /// encoded in their turn, and the log reads back as appended.
    #[test]
    fn truncations_and_purges_keep_the_decoded_tail_within_the_budget() {
        let mut mem = Mem::with_budget(size(9, 13));
        let mut all = add(&mut mem, 1, 11);
        mem.truncate(3).unwrap();
        all.truncate(2);
        assert_eq!(mem.last_log_id(), Some(all[1].log_id), "the entry now last is the log's last");
        assert_eq!(mem.decoded, size(2, 3), "entries 1-2 were encoded, the last is decoded again");
        assert_eq!(mem.entries(0, None).unwrap(), all);
        all.extend(add(&mut mem, 3, 13));
        assert_eq!(mem.decoded_count(), 4);
        assert!(mem.decoded <= mem.budget);
        assert_eq!(mem.entries(0, None).unwrap(), all);

        mem.purge(10);
        assert_eq!(mem.entries(0, None).unwrap(), all[10..].to_vec());
        assert_eq!(mem.decoded_count(), 2);
        assert_eq!(mem.decoded, size(11, 13));
        mem.purge(12);
        assert_eq!((mem.decoded, mem.last_log_id()), (0, None));
    }
}
