//! The key layout: every key of lock `N` under `P/N/` (the prefix and the
//! name encoded so that no lock's keys nest under another's), one key per
//! request named by its lease, `P/N/{lease id:016x}`, followed by its
//! [`Kind`] (nothing for a writer, `r` for a reader, `s{k}.{n}` for k permits
//! of n; the rules of which kind holds are in `shared`).
//!
//! Where it sits: under [`super::EtcdBackend`]; the recipe, the shared locks
//! and the election all name their keys through it. [`mismatch`], the
//! refusal of a request whose permits differ from the lock's first key's,
//! is here too: both the exclusive recipe and the shared locks give it.

use super::EtcdBackend;
use crate::error::Error;
use crate::types::{LockMode, LockOptions};

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

/// The kind of an acquire's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// The exclusive lock, a read-write lock's writer.
    Writer,
    Reader,
    /// `weight` permits of a semaphore of `of`.
    Permits {
        weight: u32,
        of: u32,
    },
}

impl Kind {
    /// The kind `opts` asks for.
    pub(super) fn of_request(opts: &LockOptions) -> Kind {
        if opts.permits > 0 {
            Kind::Permits { weight: opts.weight, of: opts.permits }
        } else if opts.mode == LockMode::Shared {
            Kind::Reader
        } else {
            Kind::Writer
        }
    }

    /// What follows the lease id in the key's name.
    pub(super) fn suffix(self) -> String {
        match self {
            Kind::Writer => String::new(),
            Kind::Reader => "r".into(),
            Kind::Permits { weight, of } => format!("s{weight}.{of}"),
        }
    }

    /// The kind of `key`, a key of the lock `lock` (a name it cannot parse is
    /// a writer's: it excludes everyone).
    pub(super) fn of_key(lock: &[u8], key: &[u8]) -> Kind {
        let suffix = key.strip_prefix(lock).and_then(|rest| rest.get(16..)).unwrap_or_default();
        match suffix {
            b"r" => Kind::Reader,
            [b's', rest @ ..] => std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.split_once('.'))
                .and_then(|(w, n)| Some(Kind::Permits { weight: w.parse().ok()?, of: n.parse().ok()? }))
                .unwrap_or(Kind::Writer),
            _ => Kind::Writer,
        }
    }

    /// The semaphore size this kind takes part in (0: none).
    pub(super) fn permits(self) -> u32 {
        match self {
            Kind::Permits { of, .. } => of,
            _ => 0,
        }
    }
}

/// The refusal of a request for `asked` permits (0: not a semaphore) of a
/// lock whose first key says `kept`.
pub(super) fn mismatch(kept: u32, asked: u32) -> Error {
    Error::InvalidArgument(format!(
        "permits mismatch: the lock has {kept} permits, the acquire asked for {asked} (0 = not a semaphore)"
    ))
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

    #[test]
    fn keys_say_their_kind() {
        let lock = b"fencelock/a/";
        let key = |suffix: &str| [&lock[..], b"00000000000004d2", suffix.as_bytes()].concat();
        assert_eq!(Kind::of_key(lock, &key("")), Kind::Writer);
        assert_eq!(Kind::of_key(lock, &key("r")), Kind::Reader);
        assert_eq!(Kind::of_key(lock, &key("s2.5")), Kind::Permits { weight: 2, of: 5 });
        assert_eq!(Kind::of_key(lock, &key("sx")), Kind::Writer, "unparsable: a writer");
        for kind in [Kind::Writer, Kind::Reader, Kind::Permits { weight: 2, of: 3 }] {
            assert_eq!(Kind::of_key(lock, &key(&kind.suffix())), kind);
        }
    }
}
