//! The node layout: a lock's parent path (`{base}/{enc(name)}`), the names
//! of the contender nodes and their order, a reader's mark (`__READ__`) and
//! whom each node of the queue waits for ([`blocker`], [`holders`]; the
//! read-write lock is described in `shared`), the ACLs and create modes of
//! the nodes the backend makes, and which paths ZooKeeper accepts.
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

/// The mark of a reader's node, after its nonce.
const READ_MARK: &str = "__READ__-";

/// The `(prefix, mark)` of a queue node's stem: a reader's or a writer's.
pub(super) fn queue_stem(shared: bool) -> (&'static str, &'static str) {
    (NODE_PREFIX, if shared { READ_MARK } else { "" })
}

/// Is the queue node `child` a reader's?
fn is_reader(child: &str) -> bool {
    child.strip_prefix(NODE_PREFIX).is_some_and(|rest| rest.contains(&format!("-{READ_MARK}")))
}

/// The index of the node that the node at `pos` of `queue` waits for: `None`
/// if it is granted. A writer waits for the node before it, a reader for the
/// last writer before it.
pub(super) fn blocker(queue: &[String], pos: usize) -> Option<usize> {
    if pos == 0 {
        return None;
    }
    if !is_reader(&queue[pos]) {
        return Some(pos - 1);
    }
    queue[..pos].iter().rposition(|c| !is_reader(c))
}

/// The nodes of `queue` that hold the lock: the first if it is a writer,
/// else every reader before the first writer.
pub(super) fn holders(queue: &[String]) -> &[String] {
    match queue.first() {
        Some(first) if !is_reader(first) => &queue[..1],
        _ => &queue[..queue.iter().position(|c| !is_reader(c)).unwrap_or(queue.len())],
    }
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

    /// A writer waits for the node before it, a reader for the last writer
    /// before it (INV-16: a queued writer blocks later readers).
    #[test]
    fn a_reader_waits_for_the_last_writer_before_it_and_a_writer_for_its_predecessor() {
        let queue =
            nodes(&["lock-a-__READ__-01", "lock-b-__READ__-02", "lock-c-03", "lock-d-__READ__-04", "lock-e-05"]);
        assert_eq!(blocker(&queue, 0), None);
        assert_eq!(blocker(&queue, 1), None, "readers share");
        assert_eq!(blocker(&queue, 2), Some(1), "a writer waits for the node before it");
        assert_eq!(blocker(&queue, 3), Some(2), "a reader behind a queued writer waits for it");
        assert_eq!(blocker(&queue, 4), Some(3));
        assert_eq!(holders(&queue), &queue[..2]);
        assert_eq!(holders(&queue[2..]), &queue[2..3]);
        assert!(holders(&[]).is_empty());
    }

    #[test]
    fn readers_are_marked() {
        assert!(is_reader("lock-0123-__READ__-0000000001") && !is_reader("lock-0123-0000000001"));
    }

    fn nodes(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }
}
