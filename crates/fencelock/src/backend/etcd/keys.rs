//! The key layout: every key of lock `N` under `P/N/` (the prefix and the
//! name encoded so that no lock's keys nest under another's), one key per
//! request named by its lease, `P/N/{lease id:016x}`.
//!
//! Where it sits: under [`super::EtcdBackend`]; the recipe, the shared locks
//! and the election all name their keys through it.

use super::EtcdBackend;

impl EtcdBackend {
    /// `P/N/`: the prefix of every key of lock `name`.
    pub(super) fn lock_prefix(&self, name: &str) -> Vec<u8> {
        let mut key = self.prefix.clone();
        encode(name, &mut key);
        key.push(b'/');
        key
    }
}

/// Appends `s` with `%` as `%25` and `/` as `%2F` (injective, and the result
/// has no `/`).
pub(super) fn encode(s: &str, out: &mut Vec<u8>) {
    for b in s.bytes() {
        match b {
            b'%' => out.extend_from_slice(b"%25"),
            b'/' => out.extend_from_slice(b"%2F"),
            b => out.push(b),
        }
    }
}

/// The key of lease `lease_id`'s request on `lock`.
pub(super) fn key_of(lock: &[u8], lease_id: i64) -> Vec<u8> {
    let mut key = lock.to_vec();
    key.extend_from_slice(format!("{lease_id:016x}").as_bytes());
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_injectively_and_never_nest() {
        let names = ["jobs/nightly", "jobs", "jobs/nightly/x", "..", "%2F", "/", "ключ", "a b", "%", "%25"];
        let mut encoded: Vec<Vec<u8>> = Vec::new();
        for name in names {
            let mut e = Vec::new();
            encode(name, &mut e);
            assert!(!e.contains(&b'/'), "{name:?}");
            e.push(b'/');
            for other in &encoded {
                assert!(!e.starts_with(other) && !other.starts_with(&e), "{name:?} nests with {other:?}");
            }
            encoded.push(e);
        }
    }

    #[test]
    fn keys_sort_under_their_lock() {
        assert_eq!(key_of(b"fencelock/a/", 0x1234), b"fencelock/a/0000000000001234");
    }
}
