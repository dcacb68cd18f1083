//! The node layout: a lock's parent path (`{base}/{enc(name)}`), the names
//! of the contender nodes and their order, the ACLs and create modes of the
//! nodes the backend makes, and which paths ZooKeeper accepts.
//!
//! Where it sits: under [`super::ZkBackend`]; the recipe, the shared locks
//! and the election all name their nodes through it.

use zookeeper_client as zk;

use super::session::Login;
use super::ZkBackend;

/// Name prefix of the contender nodes under a lock's parent.
pub(super) const NODE_PREFIX: &str = "lock-";

/// The ACL of the nodes the backend creates: anyone may do anything without
/// a login; with a digest login, only that identity (`creator_all`), so a
/// client without it can neither take these locks nor delete their nodes.
fn acls(login: &Login) -> zk::Acls<'static> {
    if login.auth.is_some() {
        zk::Acls::creator_all()
    } else {
        zk::Acls::anyone_all()
    }
}

pub(super) fn own_node(login: &Login) -> zk::CreateOptions<'static> {
    zk::CreateMode::EphemeralSequential.with_acls(acls(login))
}

pub(super) fn lock_node(login: &Login) -> zk::CreateOptions<'static> {
    zk::CreateMode::Container.with_acls(acls(login))
}

pub(super) fn base_node(login: &Login) -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(acls(login))
}

impl ZkBackend {
    /// The parent node of lock `name`.
    pub(super) fn lock_path(&self, name: &str) -> String {
        format!("{}/{}", self.base, encode_name(name))
    }
}

/// Keeps the contender nodes among `children` and sorts them by sequence number.
pub(super) fn queue_order(children: Vec<String>) -> Vec<String> {
    let mut queue: Vec<(i64, String)> = children.into_iter().filter_map(|c| Some((sequence(&c)?, c))).collect();
    queue.sort_unstable();
    queue.into_iter().map(|(_, c)| c).collect()
}

/// The sequence number of a contender node `lock-{nonce}-{digits}`; `None` for
/// any other name.
fn sequence(child: &str) -> Option<i64> {
    let (_, digits) = child.strip_prefix(NODE_PREFIX)?.rsplit_once('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The ZooKeeper path component of lock `name`: every byte outside
/// `[A-Za-z0-9_-]` as `%XX`. Injective (`%` itself is encoded), never `.` or
/// `..`, never a `/` or a character ZooKeeper refuses.
pub fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
    out
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Is `path` an absolute ZooKeeper path other than `/` that ZooKeeper accepts?
pub(super) fn check_path(path: &str) -> Result<(), &'static str> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("is not absolute");
    };
    for part in rest.split('/') {
        match part {
            "" => return Err("has an empty component"),
            "." | ".." => return Err("has a . or .. component"),
            _ if part.chars().any(refused_in_path) => return Err("has a character ZooKeeper refuses"),
            _ => {}
        }
    }
    Ok(())
}

/// Characters ZooKeeper's `PathUtils.validatePath` refuses (surrogates are no `char`).
fn refused_in_path(c: char) -> bool {
    c.is_control() || ('\u{e000}'..='\u{f8ff}').contains(&c) || ('\u{fff0}'..='\u{ffff}').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_encode_injectively_into_one_path_component() {
        let names = ["jobs/nightly", "jobs", "jobs/nightly/x", "..", ".", "%2F", "/", "ключ", "a b", "a-b_C9"];
        let encoded: Vec<String> = names.iter().map(|n| encode_name(n)).collect();
        for (name, enc) in names.iter().zip(&encoded) {
            assert!(!enc.contains('/') && !enc.contains('.') && !enc.is_empty(), "{name:?} → {enc:?}");
            assert!(check_path(&format!("/{enc}")).is_ok(), "{name:?} → {enc:?}");
        }
        let mut unique = encoded.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{encoded:?}");
        assert_eq!(encode_name("a-b_C9"), "a-b_C9");
        assert_eq!(encode_name("%2F"), "%252F");
        assert_eq!(encode_name("/"), "%2F");
    }

    #[test]
    fn the_queue_is_ordered_by_sequence_and_ignores_foreign_nodes() {
        let children = ["lock-ab-0000000010", "other", "lock-cd-0000000002", "lock-x-", "lock-ef-0000000007"];
        let queue = queue_order(children.iter().map(|c| c.to_string()).collect());
        assert_eq!(queue, ["lock-cd-0000000002", "lock-ef-0000000007", "lock-ab-0000000010"]);
        assert_eq!(sequence("lock-0123abcd-0000000042"), Some(42));
        assert_eq!(sequence("lock-0123abcd-"), None);
    }
}
