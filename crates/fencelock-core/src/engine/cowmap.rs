//! [`CowMap`] and [`CowSet`]: an ordered map and set whose copy costs a
//! handle per few hundred entries, for the engine's collections that grow with
//! the number of leases (leases, locks, grant requests, owners, timers).
//!
//! Where it sits: a snapshot is built from a copy of the [`super::Engine`],
//! taken between two applies, so grants wait while it is taken
//! (fencelock-server's `raft/state_machine.rs`). With `BTreeMap`s the copy
//! walked every entry: 0.26 s at a million leases, longer than an election
//! timeout (issue 19 §4). A `CowMap` keeps its entries in sorted chunks of at
//! most `N` entries, each behind an `Arc`: a copy clones the chunks' handles,
//! and a chunk still shared is copied when it is next changed
//! (`Arc::make_mut`). The engine then pays for the copy one chunk at a time,
//! and only for the chunks it changes while the copy lives.
//!
//! A chunk is two vectors of the same length: its keys, sorted, and their
//! values in the same order (binary search of the keys; an insert or a
//! removal moves at most `N` keys and `N` values). A lookup's search reads
//! only the keys, side by side, and then the one value it finds: with each
//! key beside its value, the search's probes also stepped over the values'
//! bytes, so more of them fell on cache lines (and pages) of their own, and
//! lookups in the maps of a million leases were mostly cache misses (in a
//! map of 1M `u64` keys, a random `contains_key` went from ~480 to ~290 ns
//! with 8-byte values, and from ~850 to ~235 ns with 256-byte ones, on a
//! shared 2-core machine). An entry costs its own size, 16 bytes for an id
//! and a pointer (no padding between a key and its value), where the nodes
//! of a `BTreeMap` per chunk averaged about twice that (issue 38 §3); a
//! chunk adds the second vector's 24 bytes, and a set's values (`()`) take
//! no memory. Both vectors grow together, to the same capacity
//! (`room_for_one`). Each chunk is filed under a key no greater than
//! any of its entries and greater than every entry of the chunk before it; an
//! entry is looked up in the last chunk filed at or below its key (a search
//! of the index, then of the chunk). Chunks are never empty; a chunk that
//! fills is split, or, when the new key is above all of its entries (ids and
//! instants that only grow), a new chunk is started so the full one stays
//! full.
//!
//! Both iterate, serialize and compare as the `BTreeMap` and `BTreeSet` they
//! replace (a map, or a sequence, by key), so snapshots of either read as the
//! other and every outcome that follows an iteration order is unchanged.

use std::borrow::Borrow;
use std::collections::btree_map::{self, BTreeMap};
use std::fmt;
use std::marker::PhantomData;
use std::ops::Bound::{Included, Unbounded};
use std::ops::Index;
use std::slice;
use std::sync::Arc;

use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most entries a chunk holds: a snapshot's copy clones one handle per
/// 128-256 entries, and the first change to a shared chunk copies up to this
/// many keys and values (a few microseconds for ids and `Arc`s; some ten for
/// a chunk of lease records, which the engine keeps in place).
pub(crate) const CHUNK: usize = 256;

/// Entries sorted by key, without duplicate keys, never empty (once filed):
/// the keys apart from the values, so that a search reads keys only. Both
/// vectors have the same length and the same capacity; the value of
/// `keys[i]` is `vals[i]`. Crate-visible only as [`Iter`] names it; its
/// fields are this module's.
#[derive(Clone)]
pub(crate) struct Chunk<K, V> {
    keys: Vec<K>,
    vals: Vec<V>,
}

/// A chunk behind the handle a copy of the map clones.
type Shared<K, V> = Arc<Chunk<K, V>>;

/// The entries of one chunk, by key.
type Entries<'a, K, V> = std::iter::Zip<slice::Iter<'a, K>, slice::Iter<'a, V>>;

/// The entries of a [`CowMap`], by key.
pub(crate) type Iter<'a, K, V> = std::iter::FlatMap<
    btree_map::Values<'a, K, Shared<K, V>>,
    Entries<'a, K, V>,
    fn(&'a Shared<K, V>) -> Entries<'a, K, V>,
>;

fn entries<'a, K, V>(chunk: &'a Shared<K, V>) -> Entries<'a, K, V> {
    chunk.entries_from(0)
}

impl<K, V> Default for Chunk<K, V> {
    fn default() -> Self {
        Self { keys: Vec::new(), vals: Vec::new() }
    }
}

impl<K, V> Chunk<K, V> {
    fn len(&self) -> usize {
        self.keys.len()
    }

    fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Where `key` is among the keys, or where it would go.
    fn position<Q>(&self, key: &Q) -> Result<usize, usize>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.keys.binary_search_by(|k| Borrow::<Q>::borrow(k).cmp(key))
    }

    /// The `i`th entry, if there is one.
    fn entry(&self, i: usize) -> Option<(&K, &V)> {
        Some((self.keys.get(i)?, self.vals.get(i)?))
    }

    /// The entries from the `at`th on.
    fn entries_from(&self, at: usize) -> Entries<'_, K, V> {
        self.keys[at..].iter().zip(&self.vals[at..])
    }

    /// Puts `key` and its value at `i`, with room for them as
    /// [`room_for_one`] says.
    fn insert<const N: usize>(&mut self, i: usize, key: K, value: V) {
        room_for_one::<_, N>(&mut self.keys);
        room_for_one::<_, N>(&mut self.vals);
        self.keys.insert(i, key);
        self.vals.insert(i, value);
    }

    /// Takes out the `i`th entry.
    fn remove(&mut self, i: usize) -> (K, V) {
        (self.keys.remove(i), self.vals.remove(i))
    }

    /// The entries from `at` on, taken out; both halves keep no spare room.
    fn split_off(&mut self, at: usize) -> Self {
        let upper = Self { keys: self.keys.split_off(at), vals: self.vals.split_off(at) };
        self.keys.shrink_to_fit();
        self.vals.shrink_to_fit();
        upper
    }
}

/// An ordered map in shared chunks; see the module docs.
#[derive(Clone)]
pub(crate) struct CowMap<K, V, const N: usize = CHUNK> {
    chunks: BTreeMap<K, Shared<K, V>>,
    len: usize,
}

impl<K, V, const N: usize> Default for CowMap<K, V, N> {
    fn default() -> Self {
        Self { chunks: BTreeMap::new(), len: 0 }
    }
}

impl<K: Ord + Clone, V: Clone, const N: usize> CowMap<K, V, N> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The chunk that holds `key` if the map does.
    fn chunk_of<Q>(&self, key: &Q) -> Option<&Chunk<K, V>>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunks.range::<Q, _>((Unbounded, Included(key))).next_back().map(|(_, c)| &**c)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.get_key_value(key).map(|(_, v)| v)
    }

    pub fn get_key_value<Q>(&self, key: &Q) -> Option<(&K, &V)>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let chunk = self.chunk_of(key)?;
        chunk.entry(chunk.position(key).ok()?)
    }

    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.chunk_of(key).is_some_and(|c| c.position(key).is_ok())
    }

    /// The value of `key`, its chunk made the map's own (a miss copies nothing).
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let (_, chunk) = self.chunks.range_mut::<Q, _>((Unbounded, Included(key))).next_back()?;
        let i = chunk.position(key).ok()?;
        Arc::make_mut(chunk).vals.get_mut(i)
    }

    /// Sets `key` to `value`; the value it replaces, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        let chunk = chunk_for::<K, V, N>(&mut self.chunks, &key);
        match chunk.position(&key) {
            Ok(i) => Some(std::mem::replace(&mut chunk.vals[i], value)),
            Err(i) => {
                chunk.insert::<N>(i, key, value);
                self.len += 1;
                None
            }
        }
    }

    /// Inserts `key` with `value` if the map has no entry for it, with one
    /// search (where `contains_key` and then `insert` search twice); `value`
    /// back if it has one, which is left as it was.
    pub fn try_insert(&mut self, key: K, value: V) -> Result<(), V> {
        let chunk = chunk_for::<K, V, N>(&mut self.chunks, &key);
        match chunk.position(&key) {
            Ok(_) => Err(value),
            Err(i) => {
                chunk.insert::<N>(i, key, value);
                self.len += 1;
                Ok(())
            }
        }
    }

    /// The map's own copy of `key` and its value, inserted from `value` if
    /// absent (the key is returned so that callers can share it).
    pub fn get_or_insert_with(&mut self, key: K, value: impl FnOnce() -> V) -> (K, &mut V) {
        let chunk = chunk_for::<K, V, N>(&mut self.chunks, &key);
        let i = match chunk.position(&key) {
            Ok(i) => i,
            Err(i) => {
                chunk.insert::<N>(i, key, value());
                self.len += 1;
                i
            }
        };
        (chunk.keys[i].clone(), &mut chunk.vals[i])
    }

    pub fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let (filed, chunk) = self.chunks.range_mut::<Q, _>((Unbounded, Included(key))).next_back()?;
        let i = chunk.position(key).ok()?;
        let chunk = Arc::make_mut(chunk);
        let (_, value) = chunk.remove(i);
        self.len -= 1;
        if chunk.is_empty() {
            // Its range falls to the chunk before it (or below every chunk).
            let filed = filed.clone();
            self.chunks.remove::<K>(&filed);
        }
        Some(value)
    }

    /// Removes `key` if its value passes `unused`.
    pub fn remove_if<Q>(&mut self, key: &Q, unused: impl FnOnce(&V) -> bool) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        match self.get(key).is_some_and(unused) {
            true => self.remove(key),
            false => None,
        }
    }

    pub fn first_key_value(&self) -> Option<(&K, &V)> {
        self.chunks.values().next()?.entry(0)
    }

    pub fn pop_first(&mut self) -> Option<(K, V)> {
        let mut first = self.chunks.first_entry()?;
        let chunk = Arc::make_mut(first.get_mut());
        let popped = (!chunk.is_empty()).then(|| chunk.remove(0));
        if chunk.is_empty() {
            first.remove();
        }
        self.len -= usize::from(popped.is_some());
        popped
    }

    pub fn iter(&self) -> Iter<'_, K, V> {
        self.chunks.values().flat_map(entries as fn(&Shared<K, V>) -> Entries<'_, K, V>)
    }

    pub fn keys(&self) -> impl Iterator<Item = &K> + '_ {
        self.chunks.values().flat_map(|c| c.keys.iter())
    }

    pub fn values(&self) -> impl Iterator<Item = &V> + '_ {
        self.chunks.values().flat_map(|c| c.vals.iter())
    }

    /// Every value, each chunk made the map's own.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.chunks.values_mut().flat_map(|c| Arc::make_mut(c).vals.iter_mut())
    }

    /// The entries from `from` on, by key.
    pub fn range_from<'a, Q>(&'a self, from: &'a Q) -> impl Iterator<Item = (&'a K, &'a V)> + 'a
    where
        K: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        let start = self.chunks.range::<Q, _>((Unbounded, Included(from))).next_back().map(|(k, _)| k);
        let chunks = match start {
            Some(k) => self.chunks.range::<K, _>((Included(k), Unbounded)),
            None => self.chunks.range::<K, _>(..),
        };
        chunks.flat_map(move |(_, c)| c.entries_from(c.position(from).unwrap_or_else(|i| i)))
    }

    /// How many chunks hold the entries (what a copy clones).
    #[cfg(test)]
    fn chunk_count(&self) -> usize {
        self.chunks.len()
    }
}

/// The chunk `key` goes into, made the map's own, with room for it if absent
/// (a free function so that the caller may update the length while it holds
/// the chunk).
fn chunk_for<'a, K: Ord + Clone, V: Clone, const N: usize>(
    chunks: &'a mut BTreeMap<K, Shared<K, V>>,
    key: &K,
) -> &'a mut Chunk<K, V> {
    // One search of the index finds the chunk and whether it is full.
    let (filed, full) = match chunks.range(..=key).next_back() {
        Some((filed, c)) => (filed.clone(), c.len() >= N && c.position(key).is_err()),
        None => {
            // Below every chunk: the first one (or a new one) is filed under
            // `key`, which is below all of its entries.
            let first = chunks.pop_first().map(|(_, c)| c).unwrap_or_default();
            let full = first.len() >= N;
            chunks.insert(key.clone(), first);
            (key.clone(), full)
        }
    };
    let filed = if full { split::<K, V>(chunks, filed, key) } else { filed };
    let chunk = chunks.entry(filed).or_default();
    Arc::make_mut(chunk)
}

/// Room in one of a chunk's vectors for one more entry: it doubles (from
/// four) up to an eighth of `N` slots, then grows by an eighth, never beyond
/// `N`. A chunk of keys that come in no order (lock names) is split at half
/// of `N` and holds three quarters of it on average, so a `Vec`'s doubling
/// would leave a quarter of its slots spare; this leaves less than an eighth
/// of `N`. The room depends on the length and the capacity only, so a
/// chunk's keys and values, of one length, grow to one capacity (a `Vec<()>`
/// always has room, without allocating).
fn room_for_one<T, const N: usize>(chunk: &mut Vec<T>) {
    if chunk.len() == chunk.capacity() {
        let step = chunk.capacity().max(4).min(N / 8).max(1);
        let left = N.saturating_sub(chunk.len()).max(1);
        chunk.reserve_exact(step.min(left));
    }
}

/// Makes room for `key` in the full chunk filed under `filed`; the key of the
/// chunk it now goes into.
fn split<K: Ord + Clone, V: Clone>(chunks: &mut BTreeMap<K, Shared<K, V>>, filed: K, key: &K) -> K {
    let Some(full) = chunks.get_mut(&filed) else { return filed };
    if full.keys.last().is_some_and(|last| last < key) {
        // Appending: a new chunk (filled by the caller), the full one left full.
        chunks.insert(key.clone(), Arc::default());
        return key.clone();
    }
    let full = Arc::make_mut(full);
    let upper = full.split_off(full.len() / 2); // each half grows again as `room_for_one` says
    let Some(middle) = upper.keys.first().cloned() else { return filed };
    chunks.insert(middle.clone(), Arc::new(upper));
    match *key >= middle {
        true => middle,
        false => filed,
    }
}

impl<'a, K: Ord + Clone, V: Clone, const N: usize> IntoIterator for &'a CowMap<K, V, N> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K: Ord + Clone, V: Clone + PartialEq, const N: usize> PartialEq for CowMap<K, V, N> {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

impl<K: Ord + Clone, V: Clone + Eq, const N: usize> Eq for CowMap<K, V, N> {}

impl<K: Ord + Clone + fmt::Debug, V: Clone + fmt::Debug, const N: usize> fmt::Debug for CowMap<K, V, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<K: Ord + Clone, V: Clone, Q: Ord + ?Sized, const N: usize> Index<&Q> for CowMap<K, V, N>
where
    K: Borrow<Q>,
{
    type Output = V;

    fn index(&self, key: &Q) -> &V {
        self.get(key).expect("no entry for the key")
    }
}

impl<K: Ord + Clone, V: Clone, const N: usize> CowMap<K, V, N> {
    /// The map of `entries`, given in ascending order of their keys, each key
    /// once: filled chunk by chunk, `N` entries each, with no search (a
    /// rebuild of a few million entries; `insert` would search the index and
    /// the chunk for each). Out of order, it sorts them first.
    pub fn from_sorted(entries: Vec<(K, V)>) -> Self {
        let mut entries = entries;
        if !entries.windows(2).all(|w| w[0].0 < w[1].0) {
            entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            entries.dedup_by(|b, a| a.0 == b.0);
        }
        let mut map = Self::default();
        let mut chunk = Chunk::default();
        for (k, v) in entries {
            if chunk.len() == N {
                map.file(std::mem::take(&mut chunk));
            }
            if chunk.is_empty() {
                chunk = Chunk { keys: Vec::with_capacity(N), vals: Vec::with_capacity(N) };
            }
            chunk.keys.push(k);
            chunk.vals.push(v);
        }
        if !chunk.is_empty() {
            chunk.keys.shrink_to_fit();
            chunk.vals.shrink_to_fit();
            map.file(chunk);
        }
        map
    }

    /// Files `chunk` (not empty, above every chunk filed) under its first key.
    fn file(&mut self, chunk: Chunk<K, V>) {
        self.len += chunk.len();
        self.chunks.insert(chunk.keys[0].clone(), Arc::new(chunk));
    }
}

impl<K: Ord + Clone, V: Clone, const N: usize> FromIterator<(K, V)> for CowMap<K, V, N> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        let mut map = Self::default();
        for (k, v) in iter {
            map.insert(k, v);
        }
        map
    }
}

impl<K: Ord + Clone + Serialize, V: Clone + Serialize, const N: usize> Serialize for CowMap<K, V, N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

impl<'de, K, V, const N: usize> Deserialize<'de> for CowMap<K, V, N>
where
    K: Ord + Clone + Deserialize<'de>,
    V: Clone + Deserialize<'de>,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries<K, V, const N: usize>(PhantomData<(K, V)>);

        impl<'de, K, V, const N: usize> Visitor<'de> for Entries<K, V, N>
        where
            K: Ord + Clone + Deserialize<'de>,
            V: Clone + Deserialize<'de>,
        {
            type Value = CowMap<K, V, N>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a map")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut entries: A) -> Result<Self::Value, A::Error> {
                let mut map = CowMap::default();
                while let Some((k, v)) = entries.next_entry()? {
                    map.insert(k, v);
                }
                Ok(map)
            }
        }

        d.deserialize_map(Entries::<K, V, N>(PhantomData))
    }
}

/// An ordered set in shared chunks (a [`CowMap`] to `()`).
#[derive(Clone)]
pub(crate) struct CowSet<T, const N: usize = CHUNK>(CowMap<T, (), N>);

impl<T: Ord + Clone, const N: usize> PartialEq for CowSet<T, N> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<T: Ord + Clone, const N: usize> Eq for CowSet<T, N> {}

impl<T, const N: usize> Default for CowSet<T, N> {
    fn default() -> Self {
        Self(CowMap::default())
    }
}

impl<T: Ord + Clone, const N: usize> CowSet<T, N> {
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `value` was new.
    pub fn insert(&mut self, value: T) -> bool {
        self.0.insert(value, ()).is_none()
    }

    /// Whether `value` was there.
    pub fn remove(&mut self, value: &T) -> bool {
        self.0.remove(value).is_some()
    }

    pub fn first(&self) -> Option<&T> {
        self.0.first_key_value().map(|(k, _)| k)
    }

    pub fn pop_first(&mut self) -> Option<T> {
        self.0.pop_first().map(|(k, _)| k)
    }

    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.0.keys()
    }

    /// The set of `values` (see [`CowMap::from_sorted`]).
    pub fn from_sorted(values: Vec<T>) -> Self {
        Self(CowMap::from_sorted(values.into_iter().map(|v| (v, ())).collect()))
    }
}

impl<'a, T: Ord + Clone, const N: usize> IntoIterator for &'a CowSet<T, N> {
    type Item = &'a T;
    type IntoIter = Box<dyn Iterator<Item = &'a T> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<T: Ord + Clone + fmt::Debug, const N: usize> fmt::Debug for CowSet<T, N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

impl<T: Ord + Clone, const N: usize> FromIterator<T> for CowSet<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Self(iter.into_iter().map(|v| (v, ())).collect())
    }
}

impl<T: Ord + Clone + Serialize, const N: usize> Serialize for CowSet<T, N> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de, T: Ord + Clone + Deserialize<'de>, const N: usize> Deserialize<'de> for CowSet<T, N> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Values<T, const N: usize>(PhantomData<T>);

        impl<'de, T: Ord + Clone + Deserialize<'de>, const N: usize> Visitor<'de> for Values<T, N> {
            type Value = CowSet<T, N>;

            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut values: A) -> Result<Self::Value, A::Error> {
                let mut set = CowSet::default();
                while let Some(v) = values.next_element()? {
                    set.insert(v);
                }
                Ok(set)
            }
        }

        d.deserialize_seq(Values::<T, N>(PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{btree_map, BTreeMap, BTreeSet};

    use proptest::prelude::*;

    use super::{CowMap, CowSet};

    /// Chunks of 4, so that a few dozen keys split, start and empty chunks.
    type Small = CowMap<u16, u32, 4>;

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16, u32),
        /// Insert only if absent (what a proposed lease id does).
        TryInsert(u16, u32),
        GetOrInsert(u16, u32),
        Change(u16, u32),
        Remove(u16),
        RemoveIfOdd(u16),
        PopFirst,
        /// Copy the map; the copy must keep what it had while both change.
        Copy,
    }

    fn op() -> impl Strategy<Value = Op> {
        let key = 0u16..64;
        prop_oneof![
            3 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Insert(k, v)),
            1 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::GetOrInsert(k, v)),
            1 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::TryInsert(k, v)),
            1 => (key.clone(), any::<u32>()).prop_map(|(k, v)| Op::Change(k, v)),
            2 => key.clone().prop_map(Op::Remove),
            1 => key.prop_map(Op::RemoveIfOdd),
            1 => Just(Op::PopFirst),
            1 => Just(Op::Copy),
        ]
    }

    /// Applies `op` to the map and to its model, checking that both answer the same.
    fn apply(map: &mut Small, model: &mut BTreeMap<u16, u32>, op: &Op) {
        match *op {
            Op::Insert(k, v) => assert_eq!(map.insert(k, v), model.insert(k, v)),
            Op::TryInsert(k, v) => {
                let expected = match model.entry(k) {
                    btree_map::Entry::Vacant(e) => {
                        e.insert(v);
                        Ok(())
                    }
                    btree_map::Entry::Occupied(_) => Err(v),
                };
                assert_eq!(map.try_insert(k, v), expected, "an entry there is left as it was");
            }
            Op::GetOrInsert(k, v) => {
                let (key, got) = map.get_or_insert_with(k, || v);
                assert_eq!((key, *got), (k, *model.entry(k).or_insert(v)));
            }
            Op::Change(k, v) => {
                let got = map.get_mut(&k).map(|x| std::mem::replace(x, v));
                assert_eq!(got, model.get_mut(&k).map(|x| std::mem::replace(x, v)));
            }
            Op::Remove(k) => assert_eq!(map.remove(&k), model.remove(&k)),
            Op::RemoveIfOdd(k) => {
                let odd = model.get(&k).is_some_and(|v| *v % 2 == 1);
                let expected = if odd { model.remove(&k) } else { None };
                assert_eq!(map.remove_if(&k, |v| *v % 2 == 1), expected);
            }
            Op::PopFirst => assert_eq!(map.pop_first(), model.pop_first()),
            Op::Copy => {}
        }
    }

    /// Everything a reader sees of `map` is what it sees of `model`.
    fn same(map: &Small, model: &BTreeMap<u16, u32>) {
        assert_eq!(map.len(), model.len());
        assert!(map.iter().eq(model.iter()), "{map:?} != {model:?}");
        assert!(map.values().eq(model.values()));
        assert_eq!(map.first_key_value(), model.first_key_value());
        for k in 0..64 {
            assert_eq!(map.get(&k), model.get(&k), "key {k}");
            assert_eq!(map.contains_key(&k), model.contains_key(&k));
            assert!(map.range_from(&k).eq(model.range(k..)), "from {k}");
        }
        assert!(map.chunk_count() <= map.len(), "no empty chunk");
        for c in map.chunks.values() {
            assert!(c.keys.capacity() <= 4, "no chunk has room beyond its bound");
            assert_eq!((c.vals.len(), c.vals.capacity()), (c.keys.len(), c.keys.capacity()), "values as keys");
        }
    }

    proptest! {
        /// The map behaves as a `BTreeMap` under any sequence of changes, and
        /// a copy taken at any point keeps exactly what the map held then,
        /// however either changes afterwards (what a snapshot relies on).
        #[test]
        fn behaves_as_a_btreemap_and_a_copy_keeps_its_state(ops in prop::collection::vec(op(), 1..300)) {
            let (mut map, mut model) = (Small::default(), BTreeMap::new());
            let mut copies: Vec<(Small, BTreeMap<u16, u32>)> = Vec::new();
            for (i, op) in ops.iter().enumerate() {
                apply(&mut map, &mut model, op);
                if let Op::Copy = op {
                    copies.push((map.clone(), model.clone()));
                }
                // Copies change too, apart from the map.
                if let Some((copy, its_model)) = copies.first_mut() {
                    let k = (i * 7 % 64) as u16;
                    let change = if i % 2 == 0 { Op::Insert(k, i as u32) } else { Op::Remove(k) };
                    apply(copy, its_model, &change);
                }
                same(&map, &model);
            }
            for (copy, its_model) in &copies {
                same(copy, its_model);
            }
        }

        /// A map built in bulk (`from_sorted`, as a leader change rebuilds
        /// the timers), from its entries in order or shuffled, holds them as
        /// the `BTreeMap` of the same entries does, and goes on behaving as
        /// one under any changes.
        #[test]
        fn a_map_built_in_bulk_behaves_as_a_btreemap(
            (entries, given) in prop::collection::btree_map(0u16..64, any::<u32>(), 0..64).prop_flat_map(|m| {
                let sorted: Vec<(u16, u32)> = m.clone().into_iter().collect();
                (Just(m), prop_oneof![Just(sorted.clone()), Just(sorted).prop_shuffle()])
            }),
            ops in prop::collection::vec(op(), 0..100),
        ) {
            let (mut map, mut model) = (Small::from_sorted(given), entries);
            same(&map, &model);
            for op in &ops {
                apply(&mut map, &mut model, op);
                same(&map, &model);
            }
        }

        /// It serializes as the `BTreeMap` it replaces, and reads back equal.
        #[test]
        fn serializes_as_a_btreemap(entries in prop::collection::btree_map(0u16..1000, any::<u32>(), 0..200)) {
            let map: Small = entries.clone().into_iter().collect();
            let json = serde_json::to_string(&map).expect("serializes");
            prop_assert_eq!(&json, &serde_json::to_string(&entries).expect("serializes"));
            let back: Small = serde_json::from_str(&json).expect("reads back");
            prop_assert!(back == map);
        }

        /// The set serializes as a `BTreeSet` and keeps its order.
        #[test]
        fn the_set_serializes_as_a_btreeset(values in prop::collection::btree_set(0u16..1000, 0..200)) {
            let set: CowSet<u16, 4> = values.iter().copied().collect();
            prop_assert!(set.iter().eq(values.iter()));
            let json = serde_json::to_string(&set).expect("serializes");
            prop_assert_eq!(&json, &serde_json::to_string(&values).expect("serializes"));
            let back: CowSet<u16, 4> = serde_json::from_str(&json).expect("reads back");
            prop_assert!(back.iter().eq(values.iter()));
            let _: BTreeSet<u16> = serde_json::from_str(&json).expect("a BTreeSet reads it");
        }
    }

    /// A bulk build fills every chunk but the last, as growing keys do.
    #[test]
    fn a_bulk_build_fills_its_chunks() {
        let set: CowSet<u64> = CowSet::from_sorted((0..100_000).rev().collect());
        assert_eq!(set.0.chunk_count(), 100_000usize.div_ceil(super::CHUNK));
        assert!(set.iter().copied().eq(0..100_000));
    }

    /// Keys that only grow (lease ids, instants) fill each chunk: a million
    /// entries make a copy of about 4,000 handles.
    #[test]
    fn growing_keys_fill_their_chunks() {
        let map: CowMap<u64, ()> = (0..100_000).map(|k| (k, ())).collect();
        assert_eq!(map.chunk_count(), 100_000usize.div_ceil(super::CHUNK));
    }

    /// Splits (at the middle, or a new chunk above a full one) and removals
    /// keep each value beside its key, and both vectors at one capacity,
    /// within the bound of `room_for_one`.
    #[test]
    fn splits_and_removals_keep_values_with_their_keys() {
        let mut map: CowMap<u64, u64, 16> = CowMap::default();
        let keys = (0..200u64).map(|i| i * 7919 % 997).chain(1_000..1_100).chain((2_000..2_050).rev());
        for k in keys.clone() {
            map.insert(k, k * 3);
        }
        for k in keys.clone().step_by(3) {
            assert_eq!(map.remove(&k), Some(k * 3));
        }
        assert!(map.iter().all(|(k, v)| *v == k * 3));
        assert!(keys.clone().skip(1).step_by(3).all(|k| map.get(&k) == Some(&(k * 3))));
        for c in map.chunks.values() {
            assert!(!c.is_empty() && c.keys.capacity() <= 16);
            assert_eq!((c.vals.len(), c.vals.capacity()), (c.keys.len(), c.keys.capacity()));
        }
    }

    /// Keys that only grow fill each chunk to exactly `N` slots of keys and
    /// `N` of values; a set's values take none.
    #[test]
    fn full_chunks_have_no_spare_room_and_sets_no_values() {
        let map: CowMap<u64, u64> = (0..1_000).map(|k| (k, k)).collect();
        let full: Vec<_> = map.chunks.values().filter(|c| c.len() == super::CHUNK).collect();
        assert_eq!(full.len(), 1_000 / super::CHUNK);
        assert!(full.iter().all(|c| c.keys.capacity() == super::CHUNK && c.vals.capacity() == super::CHUNK));
        let set: CowSet<u64> = (0..1_000).collect();
        // A `Vec<()>` never allocates; its capacity is `usize::MAX`.
        assert!(set.0.chunks.values().all(|c| c.vals.len() == c.keys.len() && c.vals.capacity() == usize::MAX));
    }

    /// A copy shares every chunk until one changes: changing one entry of
    /// the map copies its chunk only, and the copy still reads the old value.
    #[test]
    fn a_change_copies_one_chunk() {
        let mut map: CowMap<u64, u64> = (0..10_000).map(|k| (k, k)).collect();
        let copy = map.clone();
        *map.get_mut(&5_000).expect("present") = 0;
        let shared = map.chunks.values().zip(copy.chunks.values()).filter(|(a, b)| std::sync::Arc::ptr_eq(a, b));
        assert_eq!(shared.count(), map.chunk_count() - 1);
        assert_eq!((copy[&5_000], map[&5_000]), (5_000, 0));
    }
}
