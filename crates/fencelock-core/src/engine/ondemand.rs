//! [`OnDemand`]: a collection that is usually empty, boxed only while it has
//! entries (a null pointer otherwise).
//!
//! Where it sits: `state.rs`'s records each hold a collection that is empty
//! for almost every record: a lease's waits (most leases wait for nothing)
//! and a lock's queue (most locks have no waiter). Inline, an empty `Vec`
//! costs every record 24 bytes and an empty `VecDeque` 32; behind an
//! `OnDemand`, 8, and a box while it has entries (issue 38 §3). It reads as
//! the collection (`Deref`; an empty one when it has none), changes through
//! [`OnDemand::add`] and [`OnDemand::change`] (the one place that frees the
//! box a change leaves empty), and serializes, compares and reads back as the
//! collection itself, so snapshots read and are written as before.

use std::{fmt, ops::Deref};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A collection an [`OnDemand`] can hold.
pub(crate) trait Collection: Default + 'static {
    /// The empty collection, which an `OnDemand` without a box reads as.
    fn none() -> &'static Self;

    fn has_none(&self) -> bool;
}

/// A collection boxed while it has entries; see the module docs.
#[derive(Clone)]
pub(crate) struct OnDemand<T>(Option<Box<T>>);

impl<T> Default for OnDemand<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T: Collection> OnDemand<T> {
    /// Changes the collection with `f`, boxing an empty one first (to add).
    pub fn add<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> R {
        let out = f(&mut **self.0.get_or_insert_with(Box::default));
        self.free_if_empty();
        out
    }

    /// Changes the collection with `f` if it has entries (to remove or change
    /// in place); `None` if it has none.
    pub fn change<R>(&mut self, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        let out = f(self.0.as_deref_mut()?);
        self.free_if_empty();
        Some(out)
    }

    fn free_if_empty(&mut self) {
        if self.0.as_deref().is_some_and(T::has_none) {
            self.0 = None;
        }
    }
}

impl<T: Collection> From<T> for OnDemand<T> {
    fn from(collection: T) -> Self {
        let mut boxed = Self(Some(Box::new(collection)));
        boxed.free_if_empty();
        boxed
    }
}

impl<T: Collection> Deref for OnDemand<T> {
    type Target = T;

    fn deref(&self) -> &T {
        match self.0.as_deref() {
            Some(collection) => collection,
            None => T::none(),
        }
    }
}

impl<T: Collection + PartialEq> PartialEq for OnDemand<T> {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl<T: Collection + Eq> Eq for OnDemand<T> {}

impl<T: Collection + fmt::Debug> fmt::Debug for OnDemand<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

impl<T: Collection + Serialize> Serialize for OnDemand<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(s)
    }
}

impl<'de, T: Collection + Deserialize<'de>> Deserialize<'de> for OnDemand<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        T::deserialize(d).map(Self::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
    struct List(Vec<u32>);

    static NONE: List = List(Vec::new());

    impl Collection for List {
        fn none() -> &'static Self {
            &NONE
        }

        fn has_none(&self) -> bool {
            self.0.is_empty()
        }
    }

    /// It has a box only while it has entries: a change that empties it frees
    /// the box, and a change of an empty one does nothing.
    #[test]
    fn boxed_only_while_it_has_entries() {
        let mut d = OnDemand::<List>::default();
        assert_eq!(d.change(|l| l.0.pop()), None);
        assert!(d.0.is_none());
        d.add(|l| l.0.push(7));
        assert_eq!((d.0.as_deref(), &*d), (Some(&List(vec![7])), &List(vec![7])));
        assert_eq!(d.change(|l| l.0.pop()), Some(Some(7)));
        assert!(d.0.is_none(), "the change that emptied it freed the box");
        assert_eq!(std::mem::size_of::<OnDemand<List>>(), 8);
    }

    /// It serializes as the collection, both ways, and an empty one read back
    /// has no box; equality is the collection's.
    #[test]
    fn serializes_and_compares_as_the_collection() {
        for list in [List(vec![]), List(vec![1, 2])] {
            let d = OnDemand::from(list.clone());
            assert_eq!(serde_json::to_string(&d).unwrap(), serde_json::to_string(&list).unwrap());
            let back: OnDemand<List> = serde_json::from_str(&serde_json::to_string(&list).unwrap()).unwrap();
            assert_eq!((back.0.is_none(), &*back), (list.0.is_empty(), &list));
            assert_eq!(back, d);
        }
    }
}
