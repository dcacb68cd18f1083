//! [`Small`]: a vector that keeps one entry in place, for the engine's
//! collections that usually hold exactly one.
//!
//! Where it sits: who holds a lock (`state.rs`'s `Lock::holders`) and what a
//! lease holds (`vecmap.rs`'s [`super::vecmap::VecMap`]) are, for almost every
//! lock and lease, one grant. A `Vec` keeps that one in an allocation of its
//! own beside the record, which pays 24 bytes for the `Vec` besides; a
//! `Small` keeps it in the record, and moves to a `Vec` when a second entry
//! comes (back in place when one is left). The `Vec` grows one slot at a time
//! up to [`EXACT_UP_TO`] entries (issue 38 §3; issue 19 §4 for the growth).
//! Reads and changes in place see a slice (`Deref`); it serializes, compares
//! and reads back as the `Vec` it replaces, so snapshots read and are
//! written as before.

use std::ops::{Deref, DerefMut};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Up to this many entries, the vector grows one slot at a time; beyond, as a
/// `Vec` does (amortized doubling).
const EXACT_UP_TO: usize = 4;

/// Whether a small collection of `len` entries in `capacity` slots, about to
/// get one more, should grow by exactly one slot (see [`EXACT_UP_TO`]): the
/// engine's per-lease and per-lock collections usually hold one entry, where a
/// `Vec`'s first growth makes room for four.
pub(crate) fn grows_by_one(len: usize, capacity: usize) -> bool {
    len == capacity && len < EXACT_UP_TO
}

/// A vector with one entry in place; see the module docs.
#[derive(Debug, Clone)]
pub(crate) enum Small<T> {
    /// No entry, or one.
    One(Option<T>),
    /// Two or more.
    Many(Vec<T>),
}

impl<T> Default for Small<T> {
    fn default() -> Self {
        Small::One(None)
    }
}

impl<T> Small<T> {
    /// No entry (no allocation).
    pub const fn new() -> Self {
        Small::One(None)
    }

    /// Puts `entry` at `at`, moving the entries after it up.
    pub fn insert(&mut self, at: usize, entry: T) {
        match self {
            Small::One(None) if at == 0 => *self = Small::One(Some(entry)),
            Small::One(one) => {
                let mut many = Vec::with_capacity(2);
                many.extend(one.take());
                many.insert(at, entry);
                *self = Small::Many(many);
            }
            Small::Many(many) => {
                if grows_by_one(many.len(), many.capacity()) {
                    many.reserve_exact(1);
                }
                many.insert(at, entry);
            }
        }
    }

    pub fn push(&mut self, entry: T) {
        self.insert(self.len(), entry);
    }

    /// Takes out the entry at `at`, moving the entries after it down; the
    /// last one left goes back in place.
    pub fn remove(&mut self, at: usize) -> T {
        match self {
            Small::One(one) => match (at, one.take()) {
                (0, Some(entry)) => entry,
                _ => panic!("removal index {at} is out of a small vector's bounds"),
            },
            Small::Many(many) => {
                let entry = many.remove(at);
                if many.len() <= 1 {
                    *self = Small::One(many.pop());
                }
                entry
            }
        }
    }

    /// Frees the slots beyond its length (see `decode.rs`).
    pub fn shrink_to_fit(&mut self) {
        if let Small::Many(many) = self {
            many.shrink_to_fit();
        }
    }

    /// The entries it has room for without growing.
    #[cfg(test)]
    pub fn capacity(&self) -> usize {
        match self {
            Small::One(_) => 1,
            Small::Many(many) => many.capacity(),
        }
    }

    #[cfg(test)]
    pub fn clear(&mut self) {
        *self = Small::new();
    }
}

impl<T> From<Vec<T>> for Small<T> {
    fn from(mut entries: Vec<T>) -> Self {
        match entries.len() {
            0 | 1 => Small::One(entries.pop()),
            _ => Small::Many(entries),
        }
    }
}

impl<T> Deref for Small<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        match self {
            Small::One(one) => one.as_slice(),
            Small::Many(many) => many,
        }
    }
}

impl<T> DerefMut for Small<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Small::One(one) => one.as_mut_slice(),
            Small::Many(many) => many,
        }
    }
}

impl<T: PartialEq> PartialEq for Small<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Eq> Eq for Small<T> {}

impl<T: Serialize> Serialize for Small<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Small<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Vec::deserialize(d).map(Small::from)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Inserts and removals answer as a `Vec`'s, whatever the order; one
        /// entry is kept in place, and it serializes as the `Vec` does.
        #[test]
        fn behaves_and_serializes_as_a_vec(ops in prop::collection::vec((any::<bool>(), 0usize..8, any::<u8>()), 0..40)) {
            let (mut small, mut vec) = (Small::new(), Vec::new());
            for (add, at, x) in ops {
                match add {
                    true => {
                        let at = at.min(vec.len());
                        small.insert(at, x);
                        vec.insert(at, x);
                    }
                    false if at < vec.len() => prop_assert_eq!(small.remove(at), vec.remove(at)),
                    false => {}
                }
                prop_assert_eq!(&*small, &vec[..]);
                prop_assert_eq!(matches!(small, Small::One(_)), vec.len() <= 1);
            }
            let json = serde_json::to_string(&small).unwrap();
            prop_assert_eq!(&json, &serde_json::to_string(&vec).unwrap());
            prop_assert_eq!(serde_json::from_str::<Small<u8>>(&json).unwrap(), small);
        }
    }
}
