//! [`VecMap`]: a small ordered map in one vector, for what a lease holds and
//! waits for (usually one entry, often none).
//!
//! Where it sits: `state.rs`'s [`super::state::Lease`] keeps its holds (by
//! token) and waits (by request id) in it. A `BTreeMap` allocates a whole node
//! (eleven slots) for its first entry; this keeps one entry in place (a
//! [`Small`]), allocates one slot at a time for the next few and nothing when
//! empty, and keeps the entries sorted by key, so iteration order, and every
//! outcome that follows it, is the same as the `BTreeMap`'s on every replica.
//! It serializes as the `BTreeMap` did (a map, by key), so snapshots of either
//! read as the other.

use std::{collections::BTreeMap, slice};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::small::Small;

/// An ordered map kept as a vector sorted by key, without duplicate keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VecMap<K, V>(Small<(K, V)>);

impl<K, V> Default for VecMap<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Ord, V> VecMap<K, V> {
    fn find(&self, key: &K) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.cmp(key))
    }

    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &K) -> bool {
        self.find(key).is_ok()
    }

    /// Sets `key` to `value`; the value it replaces, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        match self.find(&key) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.insert(i, (key, value));
                None
            }
        }
    }

    /// Removes `key`; its value, if it was there.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        let (_, value) = self.0.remove(self.find(key).ok()?);
        Some(value)
    }
}

impl<K, V> VecMap<K, V> {
    /// An empty map (no allocation).
    pub const fn new() -> Self {
        Self(Small::new())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The entries, by key.
    pub fn iter(&self) -> Iter<'_, K, V> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    /// The values, by key.
    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    /// The values, by key, to change in place (the keys, and so the order, stay).
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.0.iter_mut().map(|(_, v)| v)
    }

    #[cfg(test)]
    pub fn clear(&mut self) {
        self.0.clear();
    }
}

/// The iterator of [`VecMap::iter`].
pub(crate) type Iter<'a, K, V> = std::iter::Map<slice::Iter<'a, (K, V)>, fn(&'a (K, V)) -> (&'a K, &'a V)>;

impl<'a, K, V> IntoIterator for &'a VecMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = Iter<'a, K, V>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<K: Serialize, V: Serialize> Serialize for VecMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.iter())
    }
}

/// Read as the `BTreeMap` it was: sorted, a repeated key keeps its last value.
impl<'de, K: Ord + Deserialize<'de>, V: Deserialize<'de>> Deserialize<'de> for VecMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Self(BTreeMap::<K, V>::deserialize(d)?.into_iter().collect::<Vec<_>>().into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries stay sorted by key whatever the insertion order (the order the
    /// engine's outcomes follow), and insert/remove answer as a `BTreeMap`'s.
    #[test]
    fn keeps_keys_sorted_and_answers_as_a_btreemap() {
        let mut m = VecMap::default();
        let mut b = BTreeMap::new();
        for k in [5u64, 1, 9, 3, 7, 1, 12, 0] {
            assert_eq!(m.insert(k, k * 10), b.insert(k, k * 10));
        }
        for k in [3u64, 4, 12] {
            assert_eq!(m.remove(&k), b.remove(&k));
        }
        assert_eq!(m.iter().collect::<Vec<_>>(), b.iter().collect::<Vec<_>>());
        assert_eq!((m.len(), m.get(&9), m.contains_key(&4)), (b.len(), b.get(&9), false));
    }

    /// The first entry is kept in place, not in a node; the next ones take
    /// one slot each; the last removals free them.
    #[test]
    fn one_entry_is_in_place_and_the_next_take_one_slot_each() {
        let mut m = VecMap::default();
        m.insert(1u64, 'a');
        assert!(matches!(m.0, Small::One(Some(_))));
        m.insert(2, 'b');
        assert_eq!(m.0.capacity(), 2);
        m.remove(&1);
        assert!(matches!(m.0, Small::One(Some(_))));
        m.remove(&2);
        assert!(matches!(m.0, Small::One(None)));
    }

    /// Serialized as the `BTreeMap` it replaces, both ways (snapshot compatibility).
    #[test]
    fn serializes_as_the_btreemap_did() {
        let b: BTreeMap<u64, String> = [(3, "c".to_string()), (1, "a".to_string())].into();
        let m: VecMap<u64, String> = serde_json::from_str(&serde_json::to_string(&b).unwrap()).unwrap();
        assert_eq!(serde_json::to_string(&m).unwrap(), serde_json::to_string(&b).unwrap());
        assert_eq!(m.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [1, 3]);
    }
}
